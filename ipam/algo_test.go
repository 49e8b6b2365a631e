package ipam

import (
	"errors"
	"reflect"
	"testing"
)

func TestParseAlgo(t *testing.T) {
	const want = "want random, sequential, embed or embed:<field>/<bits>[,<field>/<bits>...]"
	good := []struct {
		in   string
		want Algo
		str  string
	}{
		{"random", Algo{Kind: Random}, "random"},
		{"sequential", Algo{Kind: Sequential}, "sequential"},
		{"embed", Algo{Kind: Embed, Layout: []Field{{"ns", 8}, {"app", 16}, {"image", 8}}}, "embed:ns/8,app/16,image/8"},
		{"embed:ns/8,app/16,image/8", Algo{Kind: Embed, Layout: []Field{{"ns", 8}, {"app", 16}, {"image", 8}}}, "embed:ns/8,app/16,image/8"},
		{"embed:app/12", Algo{Kind: Embed, Layout: []Field{{"app", 12}}}, "embed:app/12"},
		{"embed:image/32,ns/1", Algo{Kind: Embed, Layout: []Field{{"image", 32}, {"ns", 1}}}, "embed:image/32,ns/1"},
		{"embed:ns/32,app/32,image/32", Algo{Kind: Embed, Layout: []Field{{"ns", 32}, {"app", 32}, {"image", 32}}}, "embed:ns/32,app/32,image/32"},
	}
	for _, tc := range good {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseAlgo(tc.in)
			if err != nil {
				t.Fatalf("ParseAlgo(%q): %v", tc.in, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseAlgo(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
			if s := got.String(); s != tc.str {
				t.Fatalf("String() = %q, want %q", s, tc.str)
			}
			again, err := ParseAlgo(got.String())
			if err != nil || !reflect.DeepEqual(again, got) {
				t.Fatalf("round trip of %q: %+v, %v", got.String(), again, err)
			}
		})
	}

	bad := []struct{ in, msg string }{
		{"", `ipam: ip-algo "": empty value (` + want + `)`},
		{"Random", `ipam: ip-algo "Random": unknown algorithm (` + want + `)`},
		{" random", `ipam: ip-algo " random": unknown algorithm (` + want + `)`},
		{"random ", `ipam: ip-algo "random ": unknown algorithm (` + want + `)`},
		{"sequential:", `ipam: ip-algo "sequential:": unknown algorithm (` + want + `)`},
		{"hash", `ipam: ip-algo "hash": unknown algorithm (` + want + `)`},
		{"embed:", `ipam: ip-algo "embed:": malformed: empty field list after "embed:" (want <field>/<bits>[,<field>/<bits>...])`},
		{"embed:ns/8,foo/8", `ipam: ip-algo "embed:ns/8,foo/8": unknown field "foo" (want ns, app or image)`},
		{"embed:NS/8", `ipam: ip-algo "embed:NS/8": unknown field "NS" (want ns, app or image)`},
		{"embed:ns/8,ns/4", `ipam: ip-algo "embed:ns/8,ns/4": duplicate field "ns"`},
		{"embed:ns/0", `ipam: ip-algo "embed:ns/0": field "ns": 0 bits out of range (want 1..32)`},
		{"embed:app/33", `ipam: ip-algo "embed:app/33": field "app": 33 bits out of range (want 1..32)`},
		{"embed:app/999", `ipam: ip-algo "embed:app/999": field "app": 999 bits out of range (want 1..32)`},
		{"embed:ns", `ipam: ip-algo "embed:ns": malformed field "ns" (want <field>/<bits>, e.g. ns/8)`},
		{"embed:/8", `ipam: ip-algo "embed:/8": malformed field "/8" (want <field>/<bits>, e.g. ns/8)`},
		{"embed:ns/8,", `ipam: ip-algo "embed:ns/8,": malformed field "" (want <field>/<bits>, e.g. ns/8)`},
		{"embed:ns=8;app=16", `ipam: ip-algo "embed:ns=8;app=16": malformed field "ns=8;app=16" (want <field>/<bits>, e.g. ns/8)`},
		{"embed:ns/x", `ipam: ip-algo "embed:ns/x": malformed bit count "x" for field "ns" (want a decimal number 1..32)`},
		{"embed:ns/", `ipam: ip-algo "embed:ns/": malformed bit count "" for field "ns" (want a decimal number 1..32)`},
		{"embed:ns/+8", `ipam: ip-algo "embed:ns/+8": malformed bit count "+8" for field "ns" (want a decimal number 1..32)`},
		{"embed:ns/08", `ipam: ip-algo "embed:ns/08": malformed bit count "08" for field "ns" (want a decimal number 1..32)`},
		{"embed:ns/8/8", `ipam: ip-algo "embed:ns/8/8": malformed bit count "8/8" for field "ns" (want a decimal number 1..32)`},
	}
	for _, tc := range bad {
		t.Run("bad/"+tc.in, func(t *testing.T) {
			_, err := ParseAlgo(tc.in)
			if err == nil {
				t.Fatalf("ParseAlgo(%q) succeeded", tc.in)
			}
			if !errors.Is(err, ErrBadAlgo) {
				t.Errorf("error %v does not wrap ErrBadAlgo", err)
			}
			if err.Error() != tc.msg {
				t.Errorf("error text\n got: %s\nwant: %s", err, tc.msg)
			}
		})
	}
}

func TestAlgoString(t *testing.T) {
	tests := []struct {
		a    Algo
		want string
	}{
		{Algo{}, "random"},
		{Algo{Kind: Sequential}, "sequential"},
		{Algo{Kind: Embed}, "embed:ns/8,app/16,image/8"}, // empty layout = default
		{Algo{Kind: Embed, Layout: []Field{{"app", 4}}}, "embed:app/4"},
		{Algo{Kind: 7}, "AlgoKind(7)"},
	}
	for _, tc := range tests {
		if got := tc.a.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.a, got, tc.want)
		}
	}
}

func TestFNV32a(t *testing.T) {
	// Reference values of FNV-1a-32.
	tests := map[string]uint32{"": 0x811c9dc5, "a": 0xe40c292c, "foobar": 0xbf9cf968}
	for in, want := range tests {
		if got := fnv32a(in); got != want {
			t.Errorf("fnv32a(%q) = %#x, want %#x", in, got, want)
		}
	}
}
