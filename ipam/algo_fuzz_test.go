package ipam

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseAlgo: an accepted ip-algo is valid (check passes: known, unique
// fields of 1..32 bits), is written in its canonical form (String() gives
// the input back, except a bare "embed" which names the default layout),
// and String() parses back to the same Algo. A refused one wraps ErrBadAlgo
// and quotes the value.
func FuzzParseAlgo(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAlgo(s)
		if err != nil {
			if !errors.Is(err, ErrBadAlgo) {
				t.Fatalf("ParseAlgo(%q) error %v does not wrap ErrBadAlgo", s, err)
			}
			if !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Fatalf("ParseAlgo(%q) error %q does not quote the value", s, err)
			}
			if !reflect.DeepEqual(a, Algo{}) {
				t.Fatalf("ParseAlgo(%q) returned %+v with error %v", s, a, err)
			}
			return
		}
		if err := a.check(); err != nil {
			t.Fatalf("ParseAlgo(%q) = %+v, which does not check: %v", s, a, err)
		}
		if (a.Kind == Embed) != (len(a.Layout) > 0) {
			t.Fatalf("ParseAlgo(%q) = %+v: a layout exactly for embed", s, a)
		}
		str := a.String()
		if str != s && s != "embed" {
			t.Fatalf("ParseAlgo(%q).String() = %q: accepted a non-canonical form", s, str)
		}
		again, err := ParseAlgo(str)
		if err != nil || !reflect.DeepEqual(again, a) {
			t.Fatalf("ParseAlgo(%q) = %+v, %v; want %+v (from %q)", str, again, err, a, s)
		}
		if again.String() != str {
			t.Fatalf("String() not stable: %q then %q", str, again.String())
		}
	})
}
