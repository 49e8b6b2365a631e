package nodeconfig_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
)

// FuzzParse feeds arbitrary node-config files (a NodeConfig and AddressPool
// documents) to Parse. A refused file yields no File and an error whose
// every line names its document (or says the NodeConfig is missing), and
// whose line numbers are lines of the file inside that document. An
// accepted file is valid as a whole: its spec passes Validate, each
// AddressPool authz.Validate, and its AddressPools with the implicit pools
// of the deprecated shared pools compile without error; and it stays
// accepted, with the same content, when re-marshalled to YAML (what the API
// server or an operator's tool would write back).
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := nodeconfig.Parse(data)
		if err != nil {
			if file != nil {
				t.Fatalf("Parse returned a file together with error %v", err)
			}
			starts := docStarts(data)
			// YAML breaks lines at CR, LF, CRLF, NEL, LS and PS: at most
			// this many lines.
			lines := 1
			for _, br := range []string{"\n", "\r", "\u0085", "\u2028", "\u2029"} {
				lines += bytes.Count(data, []byte(br))
			}
			for l := range strings.SplitSeq(err.Error(), "\n") {
				if strings.HasPrefix(l, "no NodeConfig document") {
					continue
				}
				m := docNumber.FindStringSubmatch(l)
				if m == nil {
					t.Fatalf("error line %q names no document (input %q)", l, data)
				}
				k, _ := strconv.Atoi(m[1])
				if k < 1 || k > len(starts) {
					t.Fatalf("error line %q names document %d of %d (input %q)", l, k, len(starts), data)
				}
				// A line number an error gives (the document's own, in
				// parentheses, is not followed by ':') is a line of the
				// file within the document, unless the input itself
				// says "line" somewhere.
				if bytes.Contains(data, []byte("line")) {
					continue
				}
				for _, n := range lineRef.FindAllStringSubmatch(l, -1) {
					if n, _ := strconv.Atoi(n[1]); n < starts[k-1] || n > lines+1 {
						t.Fatalf("error line %q: line %d is not in document %d (lines %d..%d) (input %q)", l, n, k, starts[k-1], lines, data)
					}
				}
			}
			return
		}
		checkValid(t, data, file)

		// Re-marshalled, document by document, it is accepted again and
		// says the same.
		docs := [][]byte{mustYAML(t, struct {
			APIVersion string                  `json:"apiVersion"`
			Kind       string                  `json:"kind"`
			Metadata   nodeconfig.Metadata     `json:"metadata"`
			Spec       v1alpha1.NodeConfigSpec `json:"spec"`
		}{file.APIVersion, file.Kind, file.Metadata, file.Spec})}
		for _, ap := range file.AddressPools {
			docs = append(docs, marshalPool(t, ap))
		}
		out := bytes.Join(docs, []byte("---\n"))
		again, err := nodeconfig.Parse(out)
		if err != nil {
			t.Fatalf("accepted file\n%s\nre-marshalled as\n%s\nis refused: %v", data, out, err)
		}
		checkValid(t, out, again)
		if a, b := mustJSON(t, file.Spec), mustJSON(t, again.Spec); !bytes.Equal(a, b) {
			t.Fatalf("spec changed by a re-marshal:\n%s\n%s", a, b)
		}
		if a, b := mustJSON(t, file.AddressPools), mustJSON(t, again.AddressPools); !bytes.Equal(a, b) {
			t.Fatalf("AddressPools changed by a re-marshal:\n%s\n%s", a, b)
		}
		if file.Metadata != again.Metadata || file.APIVersion != again.APIVersion || file.Kind != again.Kind {
			t.Fatalf("header changed by a re-marshal: %+v vs %+v", file, again)
		}
	})
}

var (
	docNumber = regexp.MustCompile(`^document (\d+) \(`)
	lineRef   = regexp.MustCompile(`\bline (\d+):`)
)

// docStarts returns the first line of each non-blank document of a
// node-config file, as the file format defines them: split at lines that
// start with "---" followed by nothing or a comment; documents holding only
// blanks and comments do not count.
func docStarts(data []byte) []int {
	var starts []int
	start, blank := 1, true
	for i, l := range strings.SplitAfter(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, "---"); ok {
			if r := strings.TrimSpace(rest); r == "" || r[0] == '#' {
				if !blank {
					starts = append(starts, start)
				}
				start, blank = i+2, true
				continue
			}
		}
		if t := strings.TrimSpace(l); t != "" && t[0] != '#' {
			blank = false
		}
	}
	if !blank {
		starts = append(starts, start)
	}
	return starts
}

func checkValid(t *testing.T, data []byte, f *nodeconfig.File) {
	t.Helper()
	if f == nil {
		t.Fatalf("Parse(%q) = nil, nil", data)
	}
	if f.APIVersion != nodeconfig.APIVersion || f.Kind != nodeconfig.Kind {
		t.Fatalf("Parse(%q) accepted apiVersion %q kind %q", data, f.APIVersion, f.Kind)
	}
	if err := nodeconfig.Validate(&f.Spec); err != nil {
		t.Fatalf("Parse(%q) accepted a spec Validate refuses: %v", data, err)
	}
	if _, err := nodeconfig.Pools(&f.Spec); err != nil {
		t.Fatalf("Parse(%q) accepted pools Pools refuses: %v", data, err)
	}
	var names []string
	for _, ap := range f.AddressPools {
		if err := authz.Validate(ap); err != nil {
			t.Fatalf("Parse(%q) accepted AddressPool %q, which authz.Validate refuses: %v", data, ap.Name, err)
		}
		if ap.APIVersion != nodeconfig.APIVersion || ap.Kind != v1alpha1.AddressPoolKind || ap.Namespace != "" ||
			(ap.Spec.Namespaces == nil && ap.Spec.NamespaceSelector == nil) || !reflect.DeepEqual(ap.Status, v1alpha1.AddressPoolStatus{}) {
			t.Fatalf("Parse(%q) accepted AddressPool %+v", data, ap)
		}
		names = append(names, ap.Name)
	}
	slices.Sort(names)
	if len(slices.Compact(names)) != len(f.AddressPools) {
		t.Fatalf("Parse(%q) accepted AddressPools of one name: %v", data, names)
	}
	legacy, _ := nodeconfig.LegacyPools(&f.Spec)
	set, err := authz.Compile(append(slices.Clone(f.AddressPools), legacy...))
	if err != nil {
		t.Fatalf("Parse(%q) accepted AddressPools that do not compile: %v", data, err)
	}
	if n := len(set.Pools()); n != len(f.AddressPools)+len(legacy) {
		t.Fatalf("Parse(%q): %d valid pools of %d", data, n, len(f.AddressPools)+len(legacy))
	}
}

// marshalPool renders an AddressPool as YAML. Known limitation, kept out
// of the property: "namespaces: []" (a pool that allows nobody, valid) is
// an empty list, which the API type's omitempty drops, and a pool without
// namespaces and namespaceSelector is refused; so an empty list is written
// back explicitly here, as kubectl and the API server (which keep the
// object as JSON) would.
func marshalPool(t *testing.T, ap v1alpha1.AddressPool) []byte {
	t.Helper()
	if ap.Spec.Namespaces == nil || len(ap.Spec.Namespaces) > 0 {
		return mustYAML(t, ap)
	}
	var obj map[string]any
	if err := json.Unmarshal(mustJSON(t, ap), &obj); err != nil {
		t.Fatal(err)
	}
	obj["spec"].(map[string]any)["namespaces"] = []any{}
	return mustYAML(t, obj)
}

func mustYAML(t *testing.T, v any) []byte {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatalf("yaml.Marshal(%+v): %v", v, err)
	}
	return b
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("json.Marshal(%+v): %v", v, err)
	}
	return b
}
