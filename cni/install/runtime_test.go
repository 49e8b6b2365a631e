package install

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestRuntimeVersions(t *testing.T) {
	for _, tc := range []struct {
		runtime, last string // last: the highest version; "" no bound
		err           string
	}{
		{runtime: "containerd://1.7.35", last: "1.0.0"},
		{runtime: "containerd://v1.6.20", last: "1.0.0"},
		{runtime: "containerd://2.4.2", last: "1.1.0"},
		{runtime: "containerd://2.0.0-rc.1", last: "1.1.0"},
		{runtime: "cri-o://1.34.1"}, // untested: no bound
		{runtime: "containerd", err: `runtime "containerd": want NAME://VERSION`},
		{runtime: "containerd://x.y", err: `runtime "containerd://x.y": version "x.y"`},
	} {
		vs, err := RuntimeVersions(tc.runtime)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want an error with %q", tc.runtime, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.runtime, err)
		case tc.last == "" && vs != nil:
			t.Errorf("%s: %v, want no bound", tc.runtime, vs)
		case tc.last != "" && (len(vs) == 0 || vs[len(vs)-1] != tc.last):
			t.Errorf("%s: %v, want up to %s", tc.runtime, vs, tc.last)
		}
	}
}

// containerd 1.7's libcni cannot decode a 1.1.0 result: with current
// plugins the conflist is 1.0.0 there, 1.1.0 on containerd 2; asking for
// 1.1.0 on containerd 1.7 is refused naming the runtime, and a bad
// runtime string is an error naming it. The report says which runtime.
func TestRuntimeBoundsTheVersion(t *testing.T) {
	for _, tc := range []struct{ runtime, want string }{
		{"containerd://1.7.35", "1.0.0"}, {"containerd://2.4.2", "1.1.0"}, {"", "1.1.0"},
	} {
		o := node(t)
		o.Portmap, o.Runtime = true, tc.runtime
		fakePlugin(t, o.CNIBinDir, "portmap", current...)
		res, err := Install(context.Background(), o)
		if err != nil {
			t.Fatalf("%q: %v", tc.runtime, err)
		}
		if c := readConflist(t, o); c.CNIVersion != tc.want {
			t.Errorf("runtime %q: cniVersion %s, want %s", tc.runtime, c.CNIVersion, tc.want)
		}
		if (res.Report.Runtime != nil) != (tc.runtime != "") || (res.Report.Runtime != nil && res.Report.Runtime.Path != tc.runtime) {
			t.Errorf("runtime %q: report's runtime %+v", tc.runtime, res.Report.Runtime)
		}
	}
	o := node(t)
	o.Portmap, o.Runtime, o.CNIVersion = true, "containerd://1.7.35", "1.1.0"
	fakePlugin(t, o.CNIBinDir, "portmap", current...)
	_, err := Install(context.Background(), o)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "the runtime containerd://1.7.35 (its libcni) runs [0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0]") {
		t.Errorf("1.1.0 on containerd 1.7: %v, want a refusal naming the runtime and its versions", err)
	}
	if got := names(t, o.CNIConfDir); slices.Contains(got, ConfName) {
		t.Errorf("a refused install left a conflist: %v", got)
	}
	o = node(t)
	o.Runtime = "docker"
	if _, err := Install(context.Background(), o); err == nil || !strings.Contains(err.Error(), `runtime "docker"`) {
		t.Errorf("bad runtime: %v", err)
	}
}
