package ipam

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// AlgoKind selects how an address is chosen inside a range.
type AlgoKind int

const (
	// Random picks a uniformly random free address (the default).
	Random AlgoKind = iota
	// Sequential picks the next free address after the range's cursor.
	Sequential
	// Embed encodes identity hashes in the host bits (IPv6 only).
	Embed
)

// Field is one identity hash placed in the host bits by Embed.
type Field struct {
	Name string // "ns", "app" or "image"
	Bits int    // 1..32
}

// Algo is a parsed ip-algo value.
type Algo struct {
	Kind   AlgoKind
	Layout []Field // Embed only; empty means the default layout
}

const (
	minFieldBits = 1
	maxFieldBits = 32
	// minInstanceBits is the number of host bits Embed leaves for the
	// per-pod instance part at the least.
	minInstanceBits = 4
)

// defaultLayout is the layout of a bare "embed".
func defaultLayout() []Field {
	return []Field{{"ns", 8}, {"app", 16}, {"image", 8}}
}

const algoWant = "want random, sequential, embed or embed:<field>/<bits>[,<field>/<bits>...]"

// ParseAlgo parses an ip-algo value: "random", "sequential", "embed" or
// "embed:<field>/<bits>[,<field>/<bits>...]" with fields ns, app and image,
// each at most once, 1..32 bits each. The value is matched exactly: no
// trimming, lowercase only. Errors wrap ErrBadAlgo.
func ParseAlgo(s string) (Algo, error) {
	switch s {
	case "":
		return Algo{}, algoErr(s, "empty value ("+algoWant+")")
	case "random":
		return Algo{Kind: Random}, nil
	case "sequential":
		return Algo{Kind: Sequential}, nil
	case "embed":
		return Algo{Kind: Embed, Layout: defaultLayout()}, nil
	}
	rest, ok := strings.CutPrefix(s, "embed:")
	if !ok {
		return Algo{}, algoErr(s, "unknown algorithm ("+algoWant+")")
	}
	if rest == "" {
		return Algo{}, algoErr(s, `malformed: empty field list after "embed:" (want <field>/<bits>[,<field>/<bits>...])`)
	}
	var layout []Field
	for _, part := range strings.Split(rest, ",") {
		name, bitStr, ok := strings.Cut(part, "/")
		if !ok || name == "" {
			return Algo{}, algoErr(s, fmt.Sprintf("malformed field %q (want <field>/<bits>, e.g. ns/8)", part))
		}
		n, ok := parseBits(bitStr)
		if !ok {
			return Algo{}, algoErr(s, fmt.Sprintf("malformed bit count %q for field %q (want a decimal number %d..%d)", bitStr, name, minFieldBits, maxFieldBits))
		}
		layout = append(layout, Field{Name: name, Bits: n})
	}
	if problem := checkLayout(layout); problem != "" {
		return Algo{}, algoErr(s, problem)
	}
	return Algo{Kind: Embed, Layout: layout}, nil
}

// parseBits accepts a plain decimal number without sign or leading zeros.
func parseBits(s string) (int, bool) {
	if s == "" || len(s) > 3 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// checkLayout validates an Embed layout and returns a problem description,
// or "" when it is fine.
func checkLayout(layout []Field) string {
	seen := map[string]bool{}
	for _, f := range layout {
		switch f.Name {
		case "ns", "app", "image":
		default:
			return fmt.Sprintf("unknown field %q (want ns, app or image)", f.Name)
		}
		if seen[f.Name] {
			return fmt.Sprintf("duplicate field %q", f.Name)
		}
		seen[f.Name] = true
		if f.Bits < minFieldBits || f.Bits > maxFieldBits {
			return fmt.Sprintf("field %q: %d bits out of range (want %d..%d)", f.Name, f.Bits, minFieldBits, maxFieldBits)
		}
	}
	return ""
}

// check validates an Algo built by hand (ParseAlgo output always passes).
func (a Algo) check() error {
	switch a.Kind {
	case Random, Sequential:
		return nil
	case Embed:
		if problem := checkLayout(a.Layout); problem != "" {
			return algoErr(a.String(), problem)
		}
		return nil
	}
	return algoErr(a.String(), "unknown algorithm kind")
}

// layout returns the effective Embed layout.
func (a Algo) layout() []Field {
	if len(a.Layout) == 0 {
		return defaultLayout()
	}
	return a.Layout
}

// String returns the canonical form, which round-trips through ParseAlgo.
// Embed is always rendered with its explicit layout, e.g.
// "embed:ns/8,app/16,image/8".
func (a Algo) String() string {
	switch a.Kind {
	case Random:
		return "random"
	case Sequential:
		return "sequential"
	case Embed:
		var b strings.Builder
		b.WriteString("embed:")
		for i, f := range a.layout() {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(f.Name)
			b.WriteByte('/')
			b.WriteString(strconv.Itoa(f.Bits))
		}
		return b.String()
	}
	return "AlgoKind(" + strconv.Itoa(int(a.Kind)) + ")"
}

func algoErr(value, problem string) error {
	return &ipamError{msg: fmt.Sprintf("ipam: ip-algo %q: %s", value, problem), kind: ErrBadAlgo}
}

// fnv32a returns FNV-1a-32 of s.
func fnv32a(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}

// fieldValue returns the value of one embed field for an identity: the low
// f.Bits bits of FNV-1a-32 of the identity string.
func fieldValue(f Field, id Identity, owner string) uint64 {
	var s string
	switch f.Name {
	case "ns":
		s = id.Namespace
	case "app":
		s = id.App
	case "image":
		s = id.Image
		if s == "" {
			s = id.ContainerID
			if s == "" {
				s = owner
			}
		}
	}
	return uint64(fnv32a(s)) & (uint64(1)<<f.Bits - 1)
}
