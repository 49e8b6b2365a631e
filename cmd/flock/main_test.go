package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// `flock --version` prints the build version; the CNI commands, VERSION
// among them, are as they were.
func TestVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the plugin")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	bin := filepath.Join(t.TempDir(), "flock")
	const pkg = "code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo"
	if out, err := exec.Command(goBin, "build", "-ldflags", "-X "+pkg+".version=v9.8.7-test -X "+pkg+".commit=abc1234", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name   string
		args   []string
		env    []string
		stdin  string
		code   int
		stdout string // exactly, or (cni) parsed below
		stderr string // contained
	}{
		{name: "--version", args: []string{"--version"}, stdout: "flock v9.8.7-test (commit abc1234, " + runtime.Version() + ")\n"},
		{name: "-version", args: []string{"-version"}, stdout: "flock v9.8.7-test (commit abc1234, " + runtime.Version() + ")\n"},
		{name: "CNI VERSION", env: []string{"CNI_COMMAND=VERSION"}, stdout: "cni"},
		{name: "no CNI_COMMAND: the about text", stderr: "CNI protocol versions supported"},
		{name: "unknown CNI_COMMAND", env: []string{"CNI_COMMAND=FROB", "CNI_PATH=/nonexistent"}, stdin: `{"cniVersion":"1.0.0","name":"n","type":"flock"}`, code: 1, stdout: "cni-error"},
	} {
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = append(slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "CNI_") }), tc.env...)
		cmd.Stdin = strings.NewReader(tc.stdin)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("%s: exit %d, stderr %q; want %d with %q", tc.name, code, stderr.String(), tc.code, tc.stderr)
		}
		switch tc.stdout {
		case "cni":
			var v struct {
				CNIVersion        string   `json:"cniVersion"`
				SupportedVersions []string `json:"supportedVersions"`
			}
			if err := json.Unmarshal(stdout.Bytes(), &v); err != nil || v.CNIVersion == "" || !slices.Contains(v.SupportedVersions, "1.0.0") {
				t.Errorf("%s: stdout %q, want the CNI version result (%v)", tc.name, stdout.String(), err)
			}
		case "cni-error":
			var v struct {
				Code int    `json:"code"`
				Msg  string `json:"msg"`
			}
			if err := json.Unmarshal(stdout.Bytes(), &v); err != nil || v.Code == 0 {
				t.Errorf("%s: stdout %q, want a CNI error (%v)", tc.name, stdout.String(), err)
			}
		default:
			if stdout.String() != tc.stdout {
				t.Errorf("%s: stdout %q, want %q", tc.name, stdout.String(), tc.stdout)
			}
		}
	}
}

// The plugin is exec'd once per pod: what it links is start-up time on
// every ADD (jsonlite's package comment has the figures). These stay out.
func TestLinksNoHeavyPackages(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, heavy := range []string{"encoding/json", "net", "log/slog", "regexp", "github.com/containernetworking/cni/", "code.fritzlab.net/fritzlab/flock/cni/wire"} {
			if dep == heavy || strings.HasSuffix(heavy, "/") && strings.HasPrefix(dep, heavy) || strings.HasPrefix(dep, heavy+"/") {
				t.Errorf("the plugin links %s", dep)
			}
		}
	}
}
