package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := func(mainVersion, rev, modified string) *debug.BuildInfo {
		bi := &debug.BuildInfo{Main: debug.Module{Path: "code.fritzlab.net/fritzlab/flock", Version: mainVersion}}
		if rev != "" {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs.revision", Value: rev})
		}
		if modified != "" {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs.modified", Value: modified})
		}
		return bi
	}
	const rev = "61707ed4a0b1c2d3e4f5061707ed4a0b1c2d3e4f"
	for _, tc := range []struct {
		name                 string
		bi                   *debug.BuildInfo
		ldVersion, ldCommit  string
		wantVersion, wantRev string
	}{
		{"no build info", nil, "", "", "dev", "unknown"},
		{"devel, no vcs", vcs("(devel)", "", ""), "", "", "dev", "unknown"},
		{"tagged clean", vcs("v0.3.0", rev, "false"), "", "", "v0.3.0", "61707ed"},
		{"pseudo-version, modified", vcs("v0.0.0-20260101120000-61707ed4a0b1+dirty", rev, "true"), "", "",
			"v0.0.0-20260101120000-61707ed4a0b1+dirty", "61707ed-dirty"},
		{"linker wins", vcs("v0.3.0", rev, "true"), "v0.4.0-rc1", "abc1234", "v0.4.0-rc1", "abc1234"},
		{"linker version only", vcs("(devel)", rev, "false"), "v0.4.0", "", "v0.4.0", "61707ed"},
		{"linker commit only (no .git)", nil, "", "deadbee", "dev", "deadbee"},
		{"short revision", vcs("", "abc", ""), "", "", "dev", "abc"},
	} {
		got := resolve(tc.bi, tc.ldVersion, tc.ldCommit)
		if got.Version != tc.wantVersion || got.Commit != tc.wantRev || got.GoVersion != runtime.Version() {
			t.Errorf("%s: %+v, want version %q commit %q go %s", tc.name, got, tc.wantVersion, tc.wantRev, runtime.Version())
		}
	}
}

func TestLine(t *testing.T) {
	got := Line("flock-agent")
	if !strings.HasPrefix(got, "flock-agent ") || !strings.HasSuffix(got, ", "+runtime.Version()+")") || !strings.Contains(got, " (commit ") {
		t.Errorf("Line: %q, want \"flock-agent VERSION (commit REV, %s)\"", got, runtime.Version())
	}
	if want := Get().Version + " (commit " + Get().Commit + ", " + runtime.Version() + ")"; Get().String() != want {
		t.Errorf("String: %q, want %q", Get().String(), want)
	}
}
