// Package decode explains why a document does not decode into a Go type,
// field by field: each error names the field by its path, with list
// indexes ("spec.bgp.peers[2].timers.holdTime"), the value found and what
// was wanted, in the style of nodeconfig.Validate's errors.
//
// encoding/json (under sigs.k8s.io/yaml) and the API machinery's
// unstructured converter stop at the first problem and name it by the Go
// type ("Go struct field Peer.spec.bgp.peers.timers.holdTime of type
// uint32": no index, no value). Decoding itself is left to them, so what
// is accepted does not change; when they refuse, Explain walks the decoded
// tree (the generic JSON value) against the Go type, by reflection on the
// json tags, and names every problem.
//
// Its users decode the API types (k8s/apis): the node-config file
// (agent/nodeconfig), the NodeConfig and AddressPool objects
// (k8s/nodeconfigs, k8s/addresspools).
package decode

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
)

// Error is one field that does not decode.
type Error struct {
	// Path of the field from the document's root, e.g.
	// "spec.bgp.peers[2].timers.holdTime"; "" for the document itself.
	Path string
	// Msg says why, e.g. `cannot unmarshal string "ninety" into an
	// integer` or "unknown field (did you mean pools?)".
	Msg string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Options of Explain.
type Options struct {
	// Prefix is the path of the tree's root ("spec" when the tree is an
	// object's spec); "" for a whole document.
	Prefix string
	// Strict reports fields the Go type does not have (as
	// sigs.k8s.io/yaml's UnmarshalStrict and DisallowUnknownFields);
	// otherwise they are ignored (as the API machinery's converter).
	Strict bool
	// YAML: the tree comes from YAML through sigs.k8s.io/yaml, which turns
	// a number or boolean into the string a string field wants (routerID:
	// 10 is "10"), so those are no errors. The numbers of the tree are
	// json.Number (a json.Decoder with UseNumber).
	YAML bool
	// Max bounds the errors returned (0: 20); a last one says how many
	// more there were.
	Max int
}

// Explain checks tree, a decoded JSON value (map[string]any, []any,
// string, bool, json.Number or float64/int64 numbers, nil), against the
// Go type t as encoding/json (Options.YAML) or the unstructured converter
// decode it, and returns an error for every field that does not fit.
// Object keys are visited in sorted order, so the errors come in a stable
// order.
func Explain(tree any, t reflect.Type, o Options) []*Error {
	w := &walker{o: o, max: o.Max}
	if w.max <= 0 {
		w.max = 20
	}
	w.walk(tree, t, o.Prefix)
	if w.more > 0 {
		w.errs = append(w.errs, &Error{Path: o.Prefix, Msg: fmt.Sprintf("and %d more errors", w.more)})
	}
	return w.errs
}

// JSON explains why data, one JSON document, does not decode into a value
// of type t (see Explain). A document that is not JSON is one error.
func JSON(data []byte, t reflect.Type, o Options) []*Error {
	d := json.NewDecoder(strings.NewReader(string(data)))
	d.UseNumber()
	var tree any
	if err := d.Decode(&tree); err != nil {
		return []*Error{{Path: o.Prefix, Msg: err.Error()}}
	}
	return Explain(tree, t, o)
}

// FromUnstructured converts obj (an object's content as the dynamic client
// has it, or a part of it at the path prefix, e.g. "spec") into out, a
// pointer, with the API machinery's converter. If that fails, the error
// names every field that does not convert (Explain; fields out does not
// have are ignored, as the converter ignores them). The errors are joined
// (errors.Join).
func FromUnstructured(obj map[string]any, out any, prefix string) error {
	cerr := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, out)
	if cerr == nil {
		return nil
	}
	errs := Explain(obj, reflect.TypeOf(out).Elem(), Options{Prefix: prefix})
	if len(errs) == 0 {
		if prefix != "" {
			return fmt.Errorf("%s: %w", prefix, cerr)
		}
		return cerr
	}
	return Join(errs)
}

// Join joins errs into one error (errors.Join: a line each); nil if none.
func Join(errs []*Error) error {
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e
	}
	return errors.Join(out...)
}

type walker struct {
	o    Options
	max  int
	errs []*Error
	more int
}

func (w *walker) fail(path, format string, a ...any) {
	if len(w.errs) >= w.max {
		w.more++
		return
	}
	w.errs = append(w.errs, &Error{Path: path, Msg: fmt.Sprintf(format, a...)})
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
	byteSlice       = reflect.TypeFor[[]byte]()
	jsonNumber      = reflect.TypeFor[json.Number]()
)

// custom tells whether t decodes itself (metav1.Time, resource.Quantity,
// json.RawMessage, ...): such a value is checked by decoding it.
func custom(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return t.Implements(jsonUnmarshaler) || p.Implements(jsonUnmarshaler) ||
		t.Implements(textUnmarshaler) || p.Implements(textUnmarshaler)
}

func (w *walker) walk(v any, t reflect.Type, path string) {
	if v == nil {
		return // null: leaves the field as it is, or nil; never an error
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if custom(t) || t == jsonNumber {
		w.decodeWhole(v, t, path)
		return
	}
	switch t.Kind() {
	case reflect.Interface:
		if t.NumMethod() != 0 {
			w.decodeWhole(v, t, path)
		}
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			w.mismatch(v, t, path)
			return
		}
		fields := fieldsOf(t)
		for _, k := range sortedKeys(m) {
			f := fields.lookup(k)
			if f == nil {
				if w.o.Strict {
					w.fail(join(path, k), "unknown field%s", fields.suggest(k))
				}
				continue
			}
			if f.quoted {
				w.decodeQuoted(m[k], f.typ, join(path, k))
				continue
			}
			w.walk(m[k], f.typ, join(path, k))
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			w.mismatch(v, t, path)
			return
		}
		if t.Key().Kind() != reflect.String {
			w.decodeWhole(v, t, path)
			return
		}
		for _, k := range sortedKeys(m) {
			w.walk(m[k], t.Elem(), path+"["+mapKey(k)+"]")
		}
	case reflect.Slice, reflect.Array:
		if t == byteSlice || (t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8) {
			w.decodeWhole(v, t, path) // base64
			return
		}
		l, ok := v.([]any)
		if !ok {
			w.mismatch(v, t, path)
			return
		}
		if t.Kind() == reflect.Array {
			w.decodeWhole(v, t, path)
			return
		}
		for i, x := range l {
			w.walk(x, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	case reflect.String:
		switch v.(type) {
		case string:
		case bool, json.Number, float64, float32, int, int32, int64, uint64:
			if !w.o.YAML {
				w.mismatch(v, t, path)
			}
		default:
			w.mismatch(v, t, path)
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			w.mismatch(v, t, path)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		w.integer(v, t, path)
	case reflect.Float32, reflect.Float64:
		switch n := v.(type) {
		case json.Number:
			if _, err := strconv.ParseFloat(string(n), t.Bits()); err != nil {
				w.fail(path, "cannot unmarshal number %s into a number of %d bits", n, t.Bits())
			}
		case float64, float32, int, int32, int64, uint64:
		default:
			w.mismatch(v, t, path)
		}
	default:
		w.decodeWhole(v, t, path)
	}
}

// integer checks a number for an integer field: a whole number in range.
func (w *walker) integer(v any, t reflect.Type, path string) {
	signed := t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64
	var lo, hi string
	if signed {
		lo, hi = strconv.FormatInt(-1<<(t.Bits()-1), 10), strconv.FormatInt(1<<(t.Bits()-1)-1, 10)
	} else {
		lo, hi = "0", strconv.FormatUint(1<<t.Bits()-1, 10)
		if t.Bits() == 64 {
			hi = strconv.FormatUint(math.MaxUint64, 10)
		}
	}
	outOfRange := func(n string) {
		w.fail(path, "cannot unmarshal number %s into an integer of %s..%s", n, lo, hi)
	}
	switch n := v.(type) {
	case json.Number:
		s := string(n)
		if signed {
			i, err := strconv.ParseInt(s, 10, 64)
			switch {
			case err != nil && !isWhole(s):
				w.fail(path, "cannot unmarshal number %s into an integer", s)
			case err != nil || reflect.New(t).Elem().OverflowInt(i):
				outOfRange(s)
			}
			return
		}
		u, err := strconv.ParseUint(s, 10, 64)
		switch {
		case err != nil && !isWhole(s):
			w.fail(path, "cannot unmarshal number %s into an integer", s)
		case err != nil || reflect.New(t).Elem().OverflowUint(u):
			outOfRange(s)
		}
	case int64:
		w.intRange(n, t, path, outOfRange)
	case int:
		w.intRange(int64(n), t, path, outOfRange)
	case int32:
		w.intRange(int64(n), t, path, outOfRange)
	case uint64:
		if signed || reflect.New(t).Elem().OverflowUint(n) {
			outOfRange(strconv.FormatUint(n, 10))
		}
	case float64:
		if n != math.Trunc(n) || math.IsInf(n, 0) {
			w.fail(path, "cannot unmarshal number %s into an integer", strconv.FormatFloat(n, 'g', -1, 64))
			return
		}
		if n < -(1<<63) || n >= 1<<64 {
			outOfRange(strconv.FormatFloat(n, 'g', -1, 64))
			return
		}
		if n < 0 {
			w.intRange(int64(n), t, path, outOfRange)
		} else if signed {
			if n >= 1<<63 {
				outOfRange(strconv.FormatFloat(n, 'g', -1, 64))
				return
			}
			w.intRange(int64(n), t, path, outOfRange)
		} else if reflect.New(t).Elem().OverflowUint(uint64(n)) {
			outOfRange(strconv.FormatFloat(n, 'g', -1, 64))
		}
	default:
		w.mismatch(v, t, path)
	}
}

func (w *walker) intRange(n int64, t reflect.Type, path string, outOfRange func(string)) {
	bad := false
	if t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64 {
		bad = reflect.New(t).Elem().OverflowInt(n)
	} else {
		bad = n < 0 || reflect.New(t).Elem().OverflowUint(uint64(n))
	}
	if bad {
		outOfRange(strconv.FormatInt(n, 10))
	}
}

var wholeNumber = regexp.MustCompile(`^-?[0-9]+$`)

func isWhole(s string) bool { return wholeNumber.MatchString(s) }

// decodeWhole checks a value a type decodes itself, or one the walker does
// not model, by decoding it.
func (w *walker) decodeWhole(v any, t reflect.Type, path string) {
	b, err := json.Marshal(v)
	if err != nil {
		w.fail(path, "cannot unmarshal %s into %s: %v", describe(v), kind(t), err)
		return
	}
	if err := json.Unmarshal(b, reflect.New(t).Interface()); err != nil {
		msg := strings.TrimPrefix(err.Error(), "json: ")
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			msg = fmt.Sprintf("cannot unmarshal %s into %s", describe(v), kind(t))
		}
		w.fail(path, "%s", oneLine(msg))
	}
}

// decodeQuoted checks the value of a `json:",string"` field (rare) by
// decoding it into such a field.
func (w *walker) decodeQuoted(v any, t reflect.Type, path string) {
	st := reflect.StructOf([]reflect.StructField{{Name: "V", Type: t, Tag: `json:"v,string"`}})
	b, err := json.Marshal(map[string]any{"v": v})
	if err == nil {
		err = json.Unmarshal(b, reflect.New(st).Interface())
	}
	if err != nil {
		w.fail(path, "%s", oneLine(strings.TrimPrefix(err.Error(), "json: ")))
	}
}

func (w *walker) mismatch(v any, t reflect.Type, path string) {
	w.fail(path, "cannot unmarshal %s into %s", describe(v), kind(t))
}

// kind says what a Go type wants, in JSON's terms.
func kind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 && t.Kind() == reflect.Slice {
			return "a base64 string"
		}
		return "a list"
	case reflect.Struct, reflect.Map:
		if custom(t) {
			return t.Name()
		}
		return "an object"
	}
	return t.String()
}

// describe names a JSON value with its type: `string "ninety"`, `number
// 7`, `boolean true`, "an object", "a list".
func describe(v any) string {
	switch x := v.(type) {
	case string:
		return "string " + quote(x)
	case bool:
		return "boolean " + strconv.FormatBool(x)
	case json.Number:
		return "number " + string(x)
	case float64:
		return "number " + strconv.FormatFloat(x, 'g', -1, 64)
	case float32:
		return "number " + strconv.FormatFloat(float64(x), 'g', -1, 32)
	case int, int32, int64, uint64:
		return fmt.Sprintf("number %d", x)
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// quote quotes a value for a message: one line, at most 64 characters.
func quote(s string) string {
	r := []rune(s)
	if len(r) > 64 {
		return strconv.Quote(string(r[:61])) + "..."
	}
	return strconv.Quote(s)
}

func oneLine(s string) string { return strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(s) }

// join appends a field name to a path: ".name", or `["odd key"]` for a key
// that is not a plain name.
func join(path, key string) string {
	if !plainKey.MatchString(key) {
		return path + "[" + strconv.Quote(key) + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// mapKey renders a map key for a path, as Kubernetes' field paths do
// (metadata.labels[app]), quoted if it holds what would confuse that.
func mapKey(k string) string {
	if k == "" || strings.ContainsFunc(k, func(r rune) bool {
		return r == '[' || r == ']' || r == '"' || r <= ' ' || r == 0x7f || r > 0x7e
	}) {
		return strconv.Quote(k)
	}
	return k
}

var plainKey = regexp.MustCompile(`^[A-Za-z_$][A-Za-z0-9_$-]*$`)

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// field is one JSON field of a struct, as encoding/json sees it.
type field struct {
	name   string
	typ    reflect.Type
	depth  int  // of embedding
	tagged bool // named by its tag
	quoted bool // the ",string" option
}

type fieldSet []field

// lookup finds the field a key decodes into: as encoding/json, an exact
// match first, else one equal but for case.
func (fs fieldSet) lookup(k string) *field {
	for i := range fs {
		if fs[i].name == k {
			return &fs[i]
		}
	}
	for i := range fs {
		if strings.EqualFold(fs[i].name, k) {
			return &fs[i]
		}
	}
	return nil
}

// suggest offers a field for an unknown key: a close spelling here, or the
// same name one level down ("holdTime" on a peer is "timers.holdTime").
func (fs fieldSet) suggest(k string) string {
	best, bestD := "", 3
	for _, f := range fs {
		d := distance(strings.ToLower(k), strings.ToLower(f.name))
		limit := 2
		if len(f.name) <= 4 {
			limit = 1
		}
		if d <= limit && d < bestD {
			best, bestD = f.name, d
		}
	}
	if best != "" {
		return " (did you mean " + best + "?)"
	}
	for _, f := range fs {
		t := f.typ
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || custom(t) {
			continue
		}
		if sub := fieldsOf(t).lookup(k); sub != nil {
			return " (did you mean " + f.name + "." + sub.name + "?)"
		}
	}
	return ""
}

// distance is the edit distance of two strings (Damerau-Levenshtein,
// optimal string alignment: a swap of two neighbours is one edit).
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			c := 1
			if ra[i-1] == rb[j-1] {
				c = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+c)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

var fieldCache sync.Map // reflect.Type → fieldSet

// fieldsOf lists the JSON fields of a struct type with encoding/json's
// rules: tags, "-", embedded structs without a name promoted (the
// shallowest wins, then the tagged one; an ambiguous name is dropped).
func fieldsOf(t reflect.Type) fieldSet {
	if fs, ok := fieldCache.Load(t); ok {
		return fs.(fieldSet)
	}
	var all []field
	var collect func(t reflect.Type, depth int, seen map[reflect.Type]bool)
	collect = func(t reflect.Type, depth int, seen map[reflect.Type]bool) {
		if seen[t] {
			return
		}
		seen[t] = true
		defer delete(seen, t)
		for i := range t.NumField() {
			sf := t.Field(i)
			tag := sf.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			ft := sf.Type
			if sf.Anonymous && name == "" {
				et := ft
				if et.Kind() == reflect.Pointer {
					et = et.Elem()
				}
				if et.Kind() == reflect.Struct {
					if !sf.IsExported() && ft.Kind() == reflect.Pointer {
						continue // encoding/json cannot set it
					}
					collect(et, depth+1, seen)
					continue
				}
			}
			if !sf.IsExported() {
				continue
			}
			tagged := name != ""
			if !tagged {
				name = sf.Name
			}
			quoted := false
			for o := range strings.SplitSeq(opts, ",") {
				if o == "string" {
					switch ft.Kind() {
					case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
						reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
						reflect.Float32, reflect.Float64, reflect.String:
						quoted = true
					}
				}
			}
			all = append(all, field{name: name, typ: ft, depth: depth, tagged: tagged, quoted: quoted})
		}
	}
	collect(t, 0, map[reflect.Type]bool{})
	// Dominant field per name.
	byName := map[string][]field{}
	var order []string
	for _, f := range all {
		if _, ok := byName[f.name]; !ok {
			order = append(order, f.name)
		}
		byName[f.name] = append(byName[f.name], f)
	}
	var out fieldSet
	for _, name := range order {
		fs := byName[name]
		slices.SortStableFunc(fs, func(a, b field) int {
			if a.depth != b.depth {
				return a.depth - b.depth
			}
			switch {
			case a.tagged && !b.tagged:
				return -1
			case b.tagged && !a.tagged:
				return 1
			}
			return 0
		})
		if len(fs) > 1 && fs[0].depth == fs[1].depth && fs[0].tagged == fs[1].tagged {
			continue // ambiguous: encoding/json ignores the name
		}
		out = append(out, fs[0])
	}
	fieldCache.Store(t, out)
	return out
}
