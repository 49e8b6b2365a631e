package main

import (
	"math"
	"strings"
	"testing"
)

// A figure whose measurement failed part-way is never met, whatever the
// samples taken before the failure say; one measured within its limit is.
func TestVerdict(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    figure
		want string
	}{
		{"met", figure{Name: "x", Value: 1, Base: math.NaN(), Unit: "ms", Max: true, Limit: 2}, "met"},
		{"over", figure{Name: "x", Value: 3, Base: math.NaN(), Unit: "ms", Max: true, Limit: 2}, "**not met**: 3.00 ms"},
		{"failed part-way", figure{Name: "x", Value: 1, Base: math.NaN(), Unit: "ms", Max: true, Limit: 2, Err: "ADD 137: boom"}, "**not met**: the measurement failed"},
		{"no target", figure{Name: "x", Value: 1, Base: math.NaN(), Unit: "ms", Limit: math.NaN(), Err: "boom"}, ""},
	} {
		cells := tc.f.cells()
		if got := cells[len(cells)-1]; !strings.HasPrefix(got, tc.want) || (tc.want == "" && got != "") {
			t.Errorf("%s: verdict %q, want %q", tc.name, got, tc.want)
		}
	}
}
