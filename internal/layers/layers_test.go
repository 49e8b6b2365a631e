package layers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// A rule says what the packages under From may not import of the module.
// Paths are relative to the module and match a directory and everything
// under it ("k8s" is k8s and k8s/...).
type rule struct {
	From string
	// MayNot: the module's packages From may not import; "" is all of
	// them (a leaf: From imports nothing of flock's).
	MayNot []string
	// Except: what From may import all the same.
	Except []string
	// TestsMay: what From's tests (_test.go files) may import all the same.
	TestsMay []string
	Why      string
}

// testHelpers is what every package's tests may import: the shared test
// helpers, which import nothing of flock's themselves (a rule below).
var testHelpers = []string{"e2e/testutil"}

var rules = []rule{
	{
		From:   "k8s",
		MayNot: []string{"agent", "cmd", "bgp", "e2e"},
		// nodetemplate renders NodeConfigs; its tests check them with the
		// agent's own validator (the controller has it passed in: the
		// package itself does not import it).
		TestsMay: []string{"agent/nodeconfig"},
		Why:      "k8s sits below the agent and beside bgp",
	},
	{
		From:   "bgp",
		MayNot: []string{"k8s", "agent", "cmd", "e2e"},
		// The speaker takes its peers as the NodeConfig's API type; the
		// API types import nothing of flock's (their own rule below).
		Except: []string{"k8s/apis"},
		Why:    "bgp sits below the agent and beside k8s",
	},
	{From: "ipam", MayNot: []string{"agent", "k8s", "cmd", "e2e"}, Why: "ipam sits below the agent"},
	{From: "dataplane", MayNot: []string{"agent", "k8s", "cmd", "e2e"}, Why: "dataplane sits below the agent"},
	{From: "cni", MayNot: []string{"agent", "k8s", "cmd", "e2e"}, Why: "cni sits below the agent"},
	{From: "advert", MayNot: []string{""}, Why: "advert is shared by the agent, k8s and bgp: a leaf"},
	{From: "k8s/apis", MayNot: []string{""}, Why: "the API types are imported by bgp and k8s: a leaf"},
	{From: "e2e/testutil", MayNot: []string{""}, Why: "every package's tests import the test helpers: a leaf"},
}

// under tells whether path is dir or under it; "" is every path.
func under(path, dir string) bool {
	return dir == "" || path == dir || strings.HasPrefix(path, dir+"/")
}

func underAny(path string, dirs []string) bool {
	return slices.ContainsFunc(dirs, func(d string) bool { return under(path, d) })
}

// pkg is what the test reads of `go list -json`.
type pkg struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
	Error        *struct{ Err string }
}

// violations checks the packages of module against rules and returns one
// line for every import that breaks one, sorted; seen counts the packages
// each rule applied to.
func violations(module string, pkgs []pkg, rules []rule) (bad []string, seen map[string]int) {
	seen = map[string]int{}
	rel := func(path string) (string, bool) {
		if path == module {
			return ".", true
		}
		r, ok := strings.CutPrefix(path, module+"/")
		return r, ok
	}
	for _, p := range pkgs {
		from, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		for _, r := range rules {
			if !under(from, r.From) {
				continue
			}
			seen[r.From]++
			check := func(imports []string, tests bool) {
				for _, imp := range imports {
					to, ok := rel(imp)
					if !ok || under(to, from) || !underAny(to, r.MayNot) || underAny(to, r.Except) {
						continue
					}
					if tests && (underAny(to, testHelpers) || underAny(to, r.TestsMay)) {
						continue
					}
					what := from
					if tests {
						what += " (its tests)"
					}
					bad = append(bad, fmt.Sprintf("%s imports %s: %s", what, to, r.Why))
				}
			}
			check(p.Imports, false)
			check(slices.Concat(p.TestImports, p.XTestImports), true)
		}
	}
	slices.Sort(bad)
	return slices.Compact(bad), seen
}

// list runs `go list -json` on the module's packages.
func list(t *testing.T) (module string, pkgs []pkg) {
	t.Helper()
	goBin, err := exec.LookPath("go") // go test puts GOROOT/bin first in PATH
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(goBin, "list", "-m").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	module = strings.TrimSpace(string(out))
	var stderr bytes.Buffer
	cmd := exec.Command(goBin, "list", "-e", "-json", module+"/...")
	cmd.Stderr = &stderr
	out, err = cmd.Output()
	if err != nil {
		t.Fatalf("go list -json: %v\n%s", err, stderr.String())
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list -json output: %v", err)
		}
		if p.Error != nil {
			t.Errorf("%s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
	return module, pkgs
}

func TestImportsPointDown(t *testing.T) {
	module, pkgs := list(t)
	bad, seen := violations(module, pkgs, rules)
	for _, b := range bad {
		t.Error(b)
	}
	// A rule that applies to nothing checks nothing: a moved or renamed
	// directory must move its rule too.
	for _, r := range rules {
		if seen[r.From] == 0 {
			t.Errorf("no package under %s: the rule for it checks nothing", r.From)
		}
	}
}

// The checker itself: every kind of bad edge is named, the allowed ones
// are not.
func TestViolations(t *testing.T) {
	const m = "example.com/m"
	pkgs := []pkg{
		{ImportPath: m + "/k8s/services", Imports: []string{m + "/bgp/advert", m + "/k8s/apis/v1alpha1", m + "/advert", "fmt"}},
		{ImportPath: m + "/k8s/lbcontroller", Imports: []string{m + "/agent/authz"}, TestImports: []string{m + "/e2e/testutil", m + "/agent"}},
		{ImportPath: m + "/k8s/nodetemplate", TestImports: []string{m + "/agent/nodeconfig"}, XTestImports: []string{m + "/e2e/testutil"}},
		{ImportPath: m + "/k8s/nodeconfigs", Imports: []string{m + "/agent/nodeconfig"}},
		{ImportPath: m + "/bgp", Imports: []string{m + "/k8s/apis/v1alpha1", m + "/advert", m + "/bgp/session"}, XTestImports: []string{m + "/cmd/x"}},
		{ImportPath: m + "/bgp/session", Imports: []string{m + "/k8s/claims"}},
		{ImportPath: m + "/cni/plugin", Imports: []string{m + "/e2e/lab", m + "/cni/wire", m + "/bgp"}},
		{ImportPath: m + "/ipam", Imports: []string{m + "/k8s/podmeta"}},
		{ImportPath: m + "/dataplane/anycast", Imports: []string{m + "/dataplane", m + "/agent/nodestate"}},
		{ImportPath: m + "/advert", Imports: []string{m + "/k8s/apis/v1alpha1"}},
		{ImportPath: m + "/k8s/apis/v1alpha1", Imports: []string{"k8s.io/apimachinery/pkg/runtime"}},
		{ImportPath: m + "/e2e/testutil", Imports: []string{m + "/ipam"}},
		{ImportPath: m + "/agent", Imports: []string{m + "/k8s/authz", m + "/bgp", m + "/advert"}},
	}
	bad, seen := violations(m, pkgs, rules)
	want := []string{
		"advert imports k8s/apis/v1alpha1: advert is shared by the agent, k8s and bgp: a leaf",
		"bgp (its tests) imports cmd/x: bgp sits below the agent and beside k8s",
		"bgp/session imports k8s/claims: bgp sits below the agent and beside k8s",
		"dataplane/anycast imports agent/nodestate: dataplane sits below the agent",
		"e2e/testutil imports ipam: every package's tests import the test helpers: a leaf",
		"ipam imports k8s/podmeta: ipam sits below the agent",
		"k8s/lbcontroller (its tests) imports agent: k8s sits below the agent and beside bgp",
		"k8s/lbcontroller imports agent/authz: k8s sits below the agent and beside bgp",
		"k8s/nodeconfigs imports agent/nodeconfig: k8s sits below the agent and beside bgp",
		"k8s/services imports bgp/advert: k8s sits below the agent and beside bgp",
		"cni/plugin imports e2e/lab: cni sits below the agent",
	}
	slices.Sort(want)
	if !slices.Equal(bad, want) {
		t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(bad, "\n"), strings.Join(want, "\n"))
	}
	if seen["k8s"] != 5 || seen["k8s/apis"] != 1 || seen["bgp"] != 2 || seen["agent"] != 0 {
		t.Errorf("seen = %v", seen)
	}
}
