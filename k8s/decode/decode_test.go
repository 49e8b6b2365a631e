package decode_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/decode"
)

type inner struct {
	HoldTime uint32 `json:"holdTime,omitempty"`
	Port     uint16 `json:"port"`
	Delta    int8   `json:"delta"`
	Ratio    float32
}

type embedded struct {
	Kind string `json:"kind"`
}

type doc struct {
	embedded `json:",inline"`
	Name     string            `json:"name"`
	Enabled  bool              `json:"enabled"`
	Items    []inner           `json:"items"`
	Labels   map[string]string `json:"labels"`
	Ptr      *inner            `json:"ptr"`
	When     metav1.Time       `json:"when"`
	Raw      []byte            `json:"raw"`
	Any      any               `json:"any"`
	Skipped  string            `json:"-"`
	Count    int64             `json:"count,string"`
}

// JSON decodes data as encoding/json with UseNumber would.
func tree(t *testing.T, y string) any {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(strings.NewReader(string(j)))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestExplain(t *testing.T) {
	typ := reflect.TypeFor[doc]()
	for _, tc := range []struct {
		name string
		yaml string
		o    decode.Options
		want []string // every error, in order
	}{
		{"fits", "kind: x\nname: a\nenabled: true\nitems: [{holdTime: 3, port: 179}]\nlabels: {a: b}\nwhen: '2026-01-02T03:04:05Z'\nraw: aGk=\nany: [1, {x: y}]\ncount: '7'\n",
			decode.Options{Strict: true, YAML: true}, nil},
		{"wrong type deep in a list", "items: [{port: 1}, {port: 2}, {holdTime: ninety}]\n", decode.Options{},
			[]string{`items[2].holdTime: cannot unmarshal string "ninety" into an integer`}},
		{"unknown field in a list element", "items: [{port: 1, holdtime: 3}]\n", decode.Options{Strict: true},
			nil /* holdtime matches holdTime but for case, as encoding/json */},
		{"misspelt field in a list element", "items: [{port: 1}, {prot: 2, hold: 3}]\n", decode.Options{Strict: true},
			[]string{"items[1].hold: unknown field", "items[1].prot: unknown field (did you mean port?)"}},
		{"unknown fields ignored unless strict", "items: [{prot: 2}]\nbogus: 1\n", decode.Options{}, nil},
		{"field one level down", "holdTime: 5\n", decode.Options{Strict: true}, []string{"holdTime: unknown field"}},
		{"out of range", "items: [{port: 65536, delta: -129}, {port: -1, delta: 127}]\n", decode.Options{},
			[]string{"items[0].delta: cannot unmarshal number -129 into an integer of -128..127",
				"items[0].port: cannot unmarshal number 65536 into an integer of 0..65535",
				"items[1].port: cannot unmarshal number -1 into an integer of 0..65535"}},
		{"not a whole number", "items: [{port: 1.5}]\n", decode.Options{}, []string{"items[0].port: cannot unmarshal number 1.5 into an integer"}},
		{"object for a list", "items: {port: 1}\n", decode.Options{}, []string{"items: cannot unmarshal an object into a list"}},
		{"list for an object", "ptr: [1]\n", decode.Options{}, []string{"ptr: cannot unmarshal a list into an object"}},
		{"number for a string, JSON", "name: 10\n", decode.Options{}, []string{"name: cannot unmarshal number 10 into a string"}},
		{"number for a string, YAML", "name: 10\nenabled: yes\n", decode.Options{YAML: true}, nil},
		{"string for a boolean", "enabled: 'yes'\n", decode.Options{YAML: true}, []string{`enabled: cannot unmarshal string "yes" into a boolean`}},
		{"string option", "count: 7\n", decode.Options{}, []string{"count: invalid use of ,string struct tag"}},
		{"map values", "labels: {app: [x], 'odd key': 1, flock.fritzlab.net/x: {}}\n", decode.Options{},
			[]string{"labels[app]: cannot unmarshal a list into a string", `labels[flock.fritzlab.net/x]: cannot unmarshal an object into a string`,
				`labels["odd key"]: cannot unmarshal number 1 into a string`}},
		{"a type that decodes itself", "when: yesterday\n", decode.Options{}, []string{`when: parsing time "yesterday"`}},
		{"base64", "raw: '!!'\n", decode.Options{}, []string{"raw: illegal base64 data"}},
		{"json -", "Skipped: x\n", decode.Options{Strict: true}, []string{"Skipped: unknown field"}},
		{"odd unknown key", "'a b': 1\n", decode.Options{Strict: true}, []string{`["a b"]: unknown field`}},
		{"prefix", "items: [{port: x}]\n", decode.Options{Prefix: "spec"}, []string{`spec.items[0].port: cannot unmarshal string "x" into an integer`}},
		{"document not an object", "[1]\n", decode.Options{}, []string{"cannot unmarshal a list into an object"}},
		{"null is fine", "items: [null]\nname: null\nptr: null\n", decode.Options{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := decode.Explain(tree(t, tc.yaml), typ, tc.o)
			var msgs []string
			for _, e := range got {
				msgs = append(msgs, e.Error())
			}
			if len(msgs) != len(tc.want) {
				t.Fatalf("errors\n %q\nwant\n %q", msgs, tc.want)
			}
			for i := range msgs {
				if !strings.HasPrefix(msgs[i], tc.want[i]) {
					t.Errorf("error %d: %q, want %q", i, msgs[i], tc.want[i])
				}
			}
			// What Explain finds wrong, encoding/json refuses too.
			if len(tc.want) > 0 && !tc.o.YAML {
				var out doc
				j, _ := json.Marshal(tree(t, tc.yaml))
				d := json.NewDecoder(strings.NewReader(string(j)))
				if tc.o.Strict {
					d.DisallowUnknownFields()
				}
				if err := d.Decode(&out); err == nil && tc.o.Prefix == "" {
					t.Errorf("encoding/json accepts what Explain refuses: %s", j)
				}
			}
		})
	}
}

// Every error is reported, up to Max, and then how many more there were.
func TestExplainMax(t *testing.T) {
	var items []string
	for range 30 {
		items = append(items, "{port: x}")
	}
	got := decode.Explain(tree(t, "items: ["+strings.Join(items, ", ")+"]\n"), reflect.TypeFor[doc](), decode.Options{})
	if len(got) != 21 || got[19].Path != "items[19].port" || got[20].Error() != "and 10 more errors" {
		t.Fatalf("%d errors, last %v", len(got), got[len(got)-1])
	}
}

// The unstructured converter's numbers (int64, float64) and the API types.
func TestFromUnstructured(t *testing.T) {
	obj := map[string]any{
		"asn":      int64(4294967296),
		"routerID": "192.0.2.1",
		"pools":    []any{map[string]any{"cidr": "fd00::/64"}, map[string]any{"cidr": "10.1.1.0/24", "shared": "yes"}},
		"bgp": map[string]any{"listenPort": float64(1.5), "peers": []any{
			map[string]any{"address": "fd00::2", "asn": int64(1), "timers": map[string]any{"holdTime": "ninety"}, "families": "ipv6"},
		}},
		"unknown": true, // ignored, as the converter ignores it
	}
	var spec v1alpha1.NodeConfigSpec
	err := decode.FromUnstructured(obj, &spec, "spec")
	want := strings.Join([]string{
		"spec.asn: cannot unmarshal number 4294967296 into an integer of 0..4294967295",
		"spec.bgp.listenPort: cannot unmarshal number 1.5 into an integer",
		`spec.bgp.peers[0].families: cannot unmarshal string "ipv6" into a list`,
		`spec.bgp.peers[0].timers.holdTime: cannot unmarshal string "ninety" into an integer`,
		`spec.pools[1].shared: cannot unmarshal string "yes" into a boolean`,
	}, "\n")
	if err == nil || err.Error() != want {
		t.Fatalf("FromUnstructured:\n got %v\nwant %s", err, want)
	}
	good := map[string]any{"asn": int64(65001), "routerID": "192.0.2.1", "pools": []any{map[string]any{"cidr": "fd00::/64"}}, "unknown": 1}
	spec = v1alpha1.NodeConfigSpec{}
	if err := decode.FromUnstructured(good, &spec, "spec"); err != nil || spec.ASN != 65001 || spec.Pools[0].CIDR != "fd00::/64" {
		t.Fatalf("FromUnstructured(good) = %+v, %v", spec, err)
	}
	// A whole object: metadata and status are checked too.
	var ap v1alpha1.AddressPool
	err = decode.FromUnstructured(map[string]any{
		"metadata": map[string]any{"name": "p", "creationTimestamp": "yesterday", "labels": map[string]any{"a": int64(1)}},
		"spec":     map[string]any{"cidrs": []any{"2001:db8::/64"}, "use": "pod"},
		"status":   map[string]any{"claims": "many"},
	}, &ap, "")
	for _, w := range []string{`metadata.creationTimestamp: parsing time "yesterday"`, "metadata.labels[a]: cannot unmarshal number 1 into a string",
		`spec.use: cannot unmarshal string "pod" into a list`, `status.claims: cannot unmarshal string "many" into an integer`} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("FromUnstructured(AddressPool): %v, want %q", err, w)
		}
	}
}
