// Package nodeconfig loads and validates a NodeConfig spec: from the
// standalone YAML file here, from the API server in Kubernetes mode. Both
// paths share Validate, so a bad value gets the same error either way.
//
// The standalone file may hold several YAML documents separated by "---":
// exactly one NodeConfig and any number of AddressPools, the same objects
// the API server takes. The file is checked as a whole: one bad document,
// or one invalid AddressPool, and the file is refused (the agent keeps
// running the configuration it has) — unlike Kubernetes mode, where an
// invalid AddressPool is only ignored.
package nodeconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"code.fritzlab.net/fritzlab/flock/ipam"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
	"code.fritzlab.net/fritzlab/flock/k8s/decode"
)

// APIVersion of every document of a node-config file, and Kind of the one
// NodeConfig document (the others are v1alpha1.AddressPoolKind).
const (
	APIVersion = "flock.fritzlab.net/v1alpha1"
	Kind       = "NodeConfig"
)

// File is the standalone node-config file: a NodeConfig object whose spec is
// the CRD's spec type, plus the file's AddressPool documents.
type File struct {
	APIVersion string                  `json:"apiVersion"`
	Kind       string                  `json:"kind"`
	Metadata   Metadata                `json:"metadata"`
	Spec       v1alpha1.NodeConfigSpec `json:"spec"`
	// AddressPools are the file's AddressPool documents, in file order,
	// all valid: Parse has compiled them with authz.Compile, together with
	// the implicit pools of the NodeConfig's deprecated shared pools. Those
	// are not in this list: LegacyPools(&f.Spec) returns them (and their
	// deprecation warnings).
	AddressPools []v1alpha1.AddressPool `json:"-"`
	// Raw is the file's content as read by Load (the reload baseline).
	Raw []byte `json:"-"`
}

// Metadata is the subset of object metadata the NodeConfig document uses.
type Metadata struct {
	Name string `json:"name"`
}

// Load reads, parses and validates a node-config file.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("node config: %w", err)
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("node config %s: %w", path, err)
	}
	f.Raw = data
	return f, nil
}

// Parse parses and validates node-config YAML: exactly one NodeConfig
// document and any number of AddressPool documents, in any order. Unknown
// fields are errors: a misspelt knob must not be silently ignored. Every
// error names the document (its number among the file's non-empty
// documents, kind/name and first line), the field by its path with list
// indexes and the value — a document that does not decode as well as one
// that does not validate ("document 1 (NodeConfig/node-a, line 1): spec.
// bgp.peers[2].timers.holdTime: cannot unmarshal string "ninety" into an
// integer"); all of them are reported together, and any error refuses the
// whole file.
func Parse(data []byte) (*File, error) {
	var (
		errs   []error
		f      *File
		ncDoc  *document // the first NodeConfig document
		specOK bool
		pools  []v1alpha1.AddressPool
		poolAt = map[string]*document{} // AddressPool name → its document
	)
	for _, d := range splitDocuments(data) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		bad := d.decode(&head, false)
		// What did decode names the document, even when some field did not.
		d.kind, d.name = head.Kind, head.Metadata.Name
		if bad != nil {
			errs = append(errs, bad()...)
			if head.Kind == Kind && ncDoc == nil {
				ncDoc = d // the NodeConfig, with a bad header: not missing
			}
			continue
		}
		if head.APIVersion != APIVersion {
			errs = append(errs, d.errorf("apiVersion: %q, want %q", head.APIVersion, APIVersion))
			if head.Kind == Kind && ncDoc == nil {
				ncDoc = d // the NodeConfig, of a wrong version: not missing
			}
			continue
		}
		switch head.Kind {
		case Kind:
			if ncDoc != nil {
				errs = append(errs, d.errorf("kind: a second NodeConfig (%s is the first); a node-config file holds exactly one", ncDoc))
				continue
			}
			ncDoc = d
			var nc File
			if bad := d.decode(&nc, true); bad != nil {
				errs = append(errs, bad()...)
				continue
			}
			f = &nc
			if err := Validate(&nc.Spec); err != nil {
				errs = append(errs, d.wrap(err)...)
				continue
			}
			specOK = true
		case v1alpha1.AddressPoolKind:
			var ap v1alpha1.AddressPool
			if bad := d.decode(&ap, true); bad != nil {
				errs = append(errs, bad()...)
				continue
			}
			errs = append(errs, checkPoolObject(d, &ap)...)
			if ap.Name == "" {
				// Unnamed: checked alone (authz names the missing name and
				// any bad field); it cannot be told apart in the set.
				errs = append(errs, d.wrap(authz.Validate(ap))...)
				continue
			}
			if prev, dup := poolAt[ap.Name]; dup {
				errs = append(errs, d.errorf("metadata.name: %q is also the name of %s; AddressPool names are unique", ap.Name, prev))
				continue
			}
			poolAt[ap.Name] = d
			pools = append(pools, ap)
		case "":
			errs = append(errs, d.errorf("kind: missing, want %s or %s", Kind, v1alpha1.AddressPoolKind))
		default:
			errs = append(errs, d.errorf("kind: %q is not a kind of the node-config file, want %s or %s", head.Kind, Kind, v1alpha1.AddressPoolKind))
		}
	}
	if ncDoc == nil {
		errs = append([]error{fmt.Errorf("no %s document: a node-config file holds exactly one %s and any number of %ss", Kind, Kind, v1alpha1.AddressPoolKind)}, errs...)
	}

	// The AddressPools are compiled together with the implicit pools of
	// the NodeConfig's deprecated shared pools: the set the agent will use.
	set := slices.Clone(pools)
	legacyAt := map[string]int{} // implicit pool name → its spec.pools index
	var legacy []v1alpha1.AddressPool
	if specOK {
		legacy, _ = LegacyPools(&f.Spec)
		for i, p := range f.Spec.Pools {
			if p.Shared {
				legacyAt[LegacyPoolName(i)] = i
			}
		}
		for _, lp := range legacy {
			if d, clash := poolAt[lp.Name]; clash {
				errs = append(errs, d.errorf("metadata.name: %q is the name of the implicit AddressPool of the NodeConfig's deprecated shared pool spec.pools[%d] (%s); rename this AddressPool, or move that pool out of the NodeConfig", lp.Name, legacyAt[lp.Name], ncDoc))
				set = slices.DeleteFunc(set, func(p v1alpha1.AddressPool) bool { return p.Name == lp.Name })
			}
		}
		set = append(set, legacy...)
	}
	if s, err := authz.Compile(set); err != nil {
		invalid := s.Invalid()
		// hint says what an implicit pool named in an error is.
		hint := func(e error) error {
			for name, i := range legacyAt {
				if strings.Contains(e.Error(), strconv.Quote(name)) {
					return fmt.Errorf("%w (AddressPool %s is the NodeConfig's deprecated shared pool spec.pools[%d]: move that pool out of the NodeConfig into an AddressPool)", e, name, i)
				}
			}
			return e
		}
		for _, p := range pools {
			if _, implicit := legacyAt[p.Name]; implicit {
				continue // reported above; the error in the set is the implicit pool's
			}
			for _, e := range flatten(invalid[p.Name]) {
				errs = append(errs, poolAt[p.Name].errorf("%w", hint(e)))
			}
		}
		for _, lp := range legacy {
			for _, e := range flatten(invalid[lp.Name]) {
				errs = append(errs, ncDoc.errorf("spec.pools[%d] (deprecated shared pool, read as the implicit AddressPool %s): %w", legacyAt[lp.Name], lp.Name, e))
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	f.AddressPools = pools
	return f, nil
}

// Validate checks a spec and names the offending field and value.
func Validate(s *v1alpha1.NodeConfigSpec) error {
	var errs []error
	if s.ASN == 0 || s.ASN == 4294967295 {
		errs = append(errs, fmt.Errorf("spec.asn: %d is not a usable AS number (1..4294967294)", s.ASN))
	}
	if rid, err := netip.ParseAddr(s.RouterID); err != nil || !rid.Is4() {
		errs = append(errs, fmt.Errorf("spec.routerID: %q is not an IPv4 dotted quad", s.RouterID))
	}
	if len(s.Pools) == 0 {
		errs = append(errs, errors.New("spec.pools: at least one pool is required"))
	}
	if _, err := Pools(s); err != nil {
		errs = append(errs, err)
	}
	have := map[bool]bool{} // is4 → a non-shared pool of that family exists
	for _, p := range s.Pools {
		if pfx, err := netip.ParsePrefix(p.CIDR); err == nil && !p.Shared {
			have[pfx.Addr().Is4()] = true
		}
	}
	if s.Defaults.WantIPv6() && !have[false] {
		errs = append(errs, errors.New("spec.defaults.ipv6: pods get IPv6 by default, but no pool is a (non-shared) IPv6 node summary; add one or set ipv6: false"))
	}
	if s.Defaults.IPv4 && !have[true] {
		errs = append(errs, errors.New("spec.defaults.ipv4: true, but no pool is a (non-shared) IPv4 node summary; add one or set ipv4: false"))
	}
	errs = append(errs, validateBGP(&s.BGP)...)
	if s.Defaults.IPAlgo != "" {
		if _, err := ipam.ParseAlgo(s.Defaults.IPAlgo); err != nil {
			errs = append(errs, fmt.Errorf("spec.defaults.ipAlgo: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Pools converts the spec's pools to IPAM pools.
func Pools(s *v1alpha1.NodeConfigSpec) ([]ipam.Pool, error) {
	var errs []error
	var out []ipam.Pool
	for i, p := range s.Pools {
		field := fmt.Sprintf("spec.pools[%d].cidr", i)
		pfx, err := netip.ParsePrefix(p.CIDR)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not a CIDR", field, p.CIDR))
			continue
		}
		if pfx.Masked() != pfx {
			errs = append(errs, fmt.Errorf("%s: %q has host bits set (did you mean %s?)", field, p.CIDR, pfx.Masked()))
			continue
		}
		for j, prev := range out {
			if prev.Prefix.Overlaps(pfx) {
				errs = append(errs, fmt.Errorf("%s: %s overlaps spec.pools[%d] %s", field, pfx, j, prev.Prefix))
			}
		}
		for j, ns := range p.Namespaces {
			if strings.TrimSpace(ns) != "" && strings.TrimSpace(ns) != ns {
				errs = append(errs, fmt.Errorf("spec.pools[%d].namespaces[%d]: %q has surrounding spaces", i, j, ns))
				continue
			}
			if strings.TrimSpace(ns) == "" {
				errs = append(errs, fmt.Errorf("spec.pools[%d].namespaces[%d]: %q: empty namespace", i, j, ns))
			}
		}
		out = append(out, ipam.Pool{Prefix: pfx, Summary: !p.Shared, Namespaces: p.Namespaces})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if _, err := ipam.New(out); err != nil {
		return nil, fmt.Errorf("spec.pools: %w", err)
	}
	return out, nil
}

// Summaries returns the node summary prefixes (non-shared pools).
func Summaries(s *v1alpha1.NodeConfigSpec) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s.Pools {
		if pfx, err := netip.ParsePrefix(p.CIDR); err == nil && !p.Shared {
			out = append(out, pfx)
		}
	}
	return out
}

// document is one YAML document of a node-config file.
type document struct {
	index      int // 1-based, among the file's non-empty documents
	line       int // 1-based line of the file where it starts
	data       []byte
	kind, name string
}

// String names the document: "document 2 (AddressPool/pods, line 30)".
func (d *document) String() string {
	what := d.kind
	switch {
	case d.kind != "" && d.name != "":
		what += "/" + d.name
	case d.name != "":
		what = d.name
	}
	if what == "" {
		return fmt.Sprintf("document %d (line %d)", d.index, d.line)
	}
	return fmt.Sprintf("document %d (%s, line %d)", d.index, what, d.line)
}

func (d *document) errorf(format string, a ...any) error {
	err := fmt.Errorf("%s: "+format, append([]any{d}, a...)...)
	if strings.ContainsAny(err.Error(), "\r\n") {
		return oneLine{err} // a value with a line break must not split the error
	}
	return err
}

// oneLine is an error whose message shows line breaks escaped: one error a
// line in Parse's joined error.
type oneLine struct{ err error }

func (e oneLine) Error() string {
	return strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(e.err.Error())
}

func (e oneLine) Unwrap() error { return e.err }

// wrap prefixes each of the (joined) errors with the document.
func (d *document) wrap(err error) []error {
	var out []error
	for _, e := range flatten(err) {
		out = append(out, d.errorf("%w", e))
	}
	return out
}

// decode decodes the document into out (a pointer) as sigs.k8s.io/yaml
// does, strictly (unknown fields and duplicate keys are errors) or not.
// A YAML error is returned as YAML gives it, with the line made a line of
// the file; a document that is YAML but does not fit out's type gets an
// error per field that does not, named by its path with list indexes and
// with the value found and what was wanted ("spec.bgp.peers[2].timers.
// holdTime: cannot unmarshal string "ninety" into an integer", "spec.
// pool: unknown field (did you mean pools?)"), as Validate names fields.
// It returns nil if the document decodes, else a function that renders
// the errors (then, so they name the document as known by then).
func (d *document) decode(out any, strict bool) func() []error {
	unmarshal, toJSON := yaml.Unmarshal, yaml.YAMLToJSON
	if strict {
		unmarshal, toJSON = yaml.UnmarshalStrict, yaml.YAMLToJSONStrict
	}
	err := unmarshal(d.data, out)
	if err == nil {
		return nil
	}
	asIs := func() []error { return []error{d.errorf("%s", d.yamlError(err))} }
	j, jerr := toJSON(d.data)
	if jerr != nil {
		return asIs // not YAML, or not JSON-able
	}
	fields := decode.JSON(j, reflect.TypeOf(out).Elem(), decode.Options{Strict: strict, YAML: true})
	if len(fields) == 0 {
		// Unreachable unless the walker and encoding/json disagree: say
		// what encoding/json said.
		return asIs
	}
	return func() []error {
		errs := make([]error, len(fields))
		for i, e := range fields {
			errs[i] = d.errorf("%w", e)
		}
		return errs
	}
}

// yamlLine finds the line numbers of YAML errors: "yaml: line 3: ..." and
// each line of "yaml: unmarshal errors:\n  line 3: ...\n  line 5: ...".
var (
	yamlLine  = regexp.MustCompile(`(\byaml: |\n[ \t]*)line (\d+):`)
	yamlList  = regexp.MustCompile(`:[ \t]*\n[ \t]*`)
	yamlBreak = regexp.MustCompile(`[ \t]*\n[ \t]*`)
)

// yamlError makes the line numbers of a YAML error lines of the file, not
// of the document, and the error one line (a list of errors is joined
// with "; ").
func (d *document) yamlError(err error) string {
	msg := yamlLine.ReplaceAllStringFunc(err.Error(), func(m string) string {
		sm := yamlLine.FindStringSubmatch(m)
		n, _ := strconv.Atoi(sm[2])
		return fmt.Sprintf("%sline %d:", sm[1], d.line+n-1)
	})
	return yamlBreak.ReplaceAllString(yamlList.ReplaceAllString(msg, ": "), "; ")
}

// flatten splits an errors.Join into its errors (recursively); any other
// error, wrapped or not, is one.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	parts := j.Unwrap()
	var msgs []string
	for _, e := range parts {
		msgs = append(msgs, e.Error())
	}
	if err.Error() != strings.Join(msgs, "\n") {
		return []error{err} // fmt.Errorf with several %w: one error with context
	}
	var out []error
	for _, e := range parts {
		out = append(out, flatten(e)...)
	}
	return out
}

// splitDocuments splits YAML at "---" lines (like the API machinery's
// reader: "---" at the start of a line, then nothing or a comment) and
// drops the documents that hold nothing but blanks and comments.
func splitDocuments(data []byte) []*document {
	var out []*document
	var cur []byte
	start := 1
	flush := func() {
		if !blank(cur) {
			out = append(out, &document{index: len(out) + 1, line: start, data: cur})
		}
		cur = nil
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	for i, l := range lines {
		if rest, ok := bytes.CutPrefix(l, []byte("---")); ok {
			if r := bytes.TrimSpace(rest); len(r) == 0 || r[0] == '#' {
				flush()
				start = i + 2
				continue
			}
		}
		cur = append(cur, l...)
	}
	flush()
	return out
}

func blank(doc []byte) bool {
	for l := range bytes.SplitSeq(doc, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			return false
		}
	}
	return true
}

// checkPoolObject checks what the API server checks of an AddressPool
// beyond authz.Compile's validation of the spec: the name, the scope, and
// the CRD's rule that a pool says who may use it.
func checkPoolObject(d *document, ap *v1alpha1.AddressPool) []error {
	var errs []error
	if ap.Name != "" {
		if msgs := validation.IsDNS1123Subdomain(ap.Name); len(msgs) > 0 {
			errs = append(errs, d.errorf("metadata.name: %q is not a valid name: %s", ap.Name, strings.Join(msgs, "; ")))
		}
	}
	if ap.Namespace != "" {
		errs = append(errs, d.errorf("metadata.namespace: %q: an AddressPool is cluster-scoped, leave it out", ap.Namespace))
	}
	if ap.Spec.Namespaces == nil && ap.Spec.NamespaceSelector == nil {
		// The CRD's rule: an omission must not read as "nobody" by accident.
		errs = append(errs, d.errorf("spec: neither namespaces nor namespaceSelector: say who may use the pool (namespaceSelector {} selects every namespace)"))
	}
	if !reflect.DeepEqual(ap.Status, v1alpha1.AddressPoolStatus{}) {
		errs = append(errs, d.errorf("status: the agents write it (in Kubernetes mode), leave it out of the file"))
	}
	return errs
}

// LegacyPoolName is the name of the implicit AddressPool LegacyPools makes
// of the NodeConfig's shared pool spec.pools[index]: "nodeconfig-pool-<index>".
func LegacyPoolName(index int) string { return fmt.Sprintf("nodeconfig-pool-%d", index) }

// LegacyPools migrates the NodeConfig's shared pools (spec.pools[] with
// shared: true, and their namespaces), deprecated by AddressPools and read
// for one release: it returns one implicit AddressPool per shared pool,
// named LegacyPoolName(index), for use pod, allowing the namespaces listed —
// or, when the list is empty (which meant "every namespace"), every
// namespace (namespaceSelector {}). Each pool comes with a deprecation
// warning that names it and gives the AddressPool to write instead. The
// pools are not validated: authz.Compile does that.
func LegacyPools(spec *v1alpha1.NodeConfigSpec) (pools []v1alpha1.AddressPool, warnings []string) {
	for i, p := range spec.Pools {
		if !p.Shared {
			continue
		}
		ap := v1alpha1.AddressPool{
			TypeMeta:   metav1.TypeMeta{APIVersion: APIVersion, Kind: v1alpha1.AddressPoolKind},
			ObjectMeta: metav1.ObjectMeta{Name: LegacyPoolName(i)},
			Spec: v1alpha1.AddressPoolSpec{
				CIDRs:      []string{p.CIDR},
				Use:        []string{v1alpha1.UsePod},
				Namespaces: slices.Clone(p.Namespaces),
			},
		}
		who := "namespaces " + strings.Join(p.Namespaces, ", ")
		if len(p.Namespaces) == 0 {
			ap.Spec.NamespaceSelector = &metav1.LabelSelector{}
			who = "every namespace: its empty namespaces list meant every namespace, so the AddressPool has namespaceSelector {}; list only the namespaces that need it if you can"
		}
		pools = append(pools, ap)
		warnings = append(warnings, fmt.Sprintf("spec.pools[%d]: the shared pool %s is deprecated and read for this release only, as the implicit AddressPool %s (use pod, %s); move it out of the NodeConfig into an AddressPool: %s",
			i, p.CIDR, ap.Name, who, suggest(ap)))
	}
	return pools, warnings
}

// suggest renders an AddressPool to write, in one line (JSON is YAML).
func suggest(ap v1alpha1.AddressPool) string {
	b, err := json.Marshal(struct {
		APIVersion string                   `json:"apiVersion"`
		Kind       string                   `json:"kind"`
		Metadata   Metadata                 `json:"metadata"`
		Spec       v1alpha1.AddressPoolSpec `json:"spec"`
	}{ap.APIVersion, ap.Kind, Metadata{Name: ap.Name}, ap.Spec})
	if err != nil {
		return fmt.Sprintf("%+v", ap.Spec) // unreachable: the spec is plain data
	}
	return string(b)
}
