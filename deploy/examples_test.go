package deploy_test

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestSchemaCheckerRejects(t *testing.T) {
	sch := crdSchema(t, crdFile)
	for _, tc := range []struct{ name, yaml string }{
		{"unknown field", "spec: {asn: 1, routerID: 192.0.2.1, pools: [{cidr: fd00::/64}], bogus: 1}"},
		{"asn 0", "spec: {asn: 0, routerID: 192.0.2.1, pools: [{cidr: fd00::/64}]}"},
		{"routerID v6", "spec: {asn: 1, routerID: 'fd00::1', pools: [{cidr: fd00::/64}]}"},
		{"no pools", "spec: {asn: 1, routerID: 192.0.2.1}"},
		{"family", "spec: {asn: 1, routerID: 192.0.2.1, pools: [{cidr: fd00::/64}], bgp: {peers: [{address: 'fd00::2', asn: 2, families: [evpn]}]}}"},
		{"ipAlgo", "spec: {asn: 1, routerID: 192.0.2.1, pools: [{cidr: fd00::/64}], defaults: {ipAlgo: fancy}}"},
		{"holdTime over 65535", "spec: {asn: 1, routerID: 192.0.2.1, pools: [{cidr: fd00::/64}], bgp: {peers: [{address: 'fd00::2', asn: 2, timers: {holdTime: 65536}}]}}"},
		{"holdTime not a number", "spec: {asn: 1, routerID: 192.0.2.1, pools: [{cidr: fd00::/64}], bgp: {peers: [{address: 'fd00::2', asn: 2, timers: {holdTime: ninety}}]}}"},
		{"keepaliveTime over 65535", "spec: {asn: 1, routerID: 192.0.2.1, pools: [{cidr: fd00::/64}], bgp: {peers: [{address: 'fd00::2', asn: 2, timers: {keepaliveTime: 70000}}]}}"},
		{"maxPrefixes over 32 bits", "spec: {asn: 1, routerID: 192.0.2.1, pools: [{cidr: fd00::/64}], bgp: {peers: [{address: 'fd00::2', asn: 2, maxPrefixes: 4294967296}]}}"},
		{"negative bfd interval", "spec: {asn: 1, routerID: 192.0.2.1, pools: [{cidr: fd00::/64}], bgp: {peers: [{address: 'fd00::2', asn: 2, bfd: {enabled: true, intervalMs: -1}}]}}"},
		{"ttlSecurityMin 256", "spec: {asn: 1, routerID: 192.0.2.1, pools: [{cidr: fd00::/64}], bgp: {peers: [{address: 'fd00::2', asn: 2, ttlSecurityMin: 256}]}}"},
		{"routerID too long", "spec: {asn: 1, routerID: 192.000.002.001, pools: [{cidr: fd00::/64}]}"},
	} {
		var obj any
		if err := yaml.Unmarshal([]byte("apiVersion: flock.fritzlab.net/v1alpha1\nkind: NodeConfig\nmetadata: {name: x}\n"+tc.yaml), &obj); err != nil {
			t.Fatal(err)
		}
		if errs := validate("", obj, sch); len(errs) == 0 {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	poolSch := crdSchema(t, poolCRDFile)
	for _, tc := range []struct{ name, yaml string }{
		{"unknown field", "spec: {cidrs: ['2001:db8::/64'], use: [pod], namespaces: [a], namespace: b}"},
		{"no cidrs", "spec: {use: [pod], namespaces: [a]}"},
		{"empty cidrs", "spec: {cidrs: [], use: [pod], namespaces: [a]}"},
		{"no use", "spec: {cidrs: ['2001:db8::/64'], namespaces: [a]}"},
		{"empty use", "spec: {cidrs: ['2001:db8::/64'], use: [], namespaces: [a]}"},
		{"unknown use", "spec: {cidrs: ['2001:db8::/64'], use: [cidr6], namespaces: [a]}"},
		{"empty namespace", "spec: {cidrs: ['2001:db8::/64'], use: [pod], namespaces: ['']}"},
		{"matchLabels not strings", "spec: {cidrs: ['2001:db8::/64'], use: [pod], namespaceSelector: {matchLabels: {a: [b]}}}"},
		{"status claims not an integer", "spec: {cidrs: ['2001:db8::/64'], use: [pod], namespaces: [a]}\nstatus: {claims: many}"},
		{"namespace not a namespace name", "spec: {cidrs: ['2001:db8::/64'], use: [pod], namespaces: [Prod]}"},
		{"namespace with a space", "spec: {cidrs: ['2001:db8::/64'], use: [pod], namespaces: ['a b']}"},
		{"status conditions not a list", "spec: {cidrs: ['2001:db8::/64'], use: [pod], namespaces: [a]}\nstatus: {conditions: {type: Ready}}"},
		{"condition status not True, False or Unknown", "spec: {cidrs: ['2001:db8::/64'], use: [pod], namespaces: [a]}\nstatus: {conditions: [{type: Ready, status: Maybe, reason: Valid, message: '', lastTransitionTime: '2026-01-01T00:00:00Z'}]}"},
	} {
		var obj any
		if err := yaml.Unmarshal([]byte("apiVersion: flock.fritzlab.net/v1alpha1\nkind: AddressPool\nmetadata: {name: x}\n"+tc.yaml), &obj); err != nil {
			t.Fatal(err)
		}
		if errs := validate("", obj, poolSch); len(errs) == 0 {
			t.Errorf("AddressPool %s: accepted", tc.name)
		}
	}
}

func crdSchema(t *testing.T, crdFile string) schema {
	t.Helper()
	var c struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema schema `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	raw, err := os.ReadFile(crdFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &c); err != nil || len(c.Spec.Versions) != 1 {
		t.Fatalf("%s: %v", crdFile, err)
	}
	return c.Spec.Versions[0].Schema.OpenAPIV3Schema
}

// validate is a small OpenAPI checker for the keywords the CRD uses
// (metadata is the API server's).
func validate(path string, v any, s schema) []string {
	var errs []string
	bad := func(format string, a ...any) { errs = append(errs, path+": "+fmt.Sprintf(format, a...)) }
	switch s.Type {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			bad("want an object, got %T", v)
			return errs
		}
		if path == ".metadata" {
			return nil
		}
		for _, r := range s.Required {
			if _, ok := m[r]; !ok {
				bad("%s is required", r)
			}
		}
		for k, x := range m {
			sub, ok := s.Properties[k]
			if !ok && s.AdditionalProperties != nil {
				sub, ok = *s.AdditionalProperties, true
			}
			if !ok {
				bad("unknown field %q", k)
				continue
			}
			errs = append(errs, validate(path+"."+k, x, sub)...)
		}
	case "array":
		l, ok := v.([]any)
		if !ok {
			bad("want an array, got %T", v)
			return errs
		}
		if s.MinItems != nil && len(l) < *s.MinItems || s.MaxItems != nil && len(l) > *s.MaxItems {
			bad("%d items out of range", len(l))
		}
		for i, x := range l {
			errs = append(errs, validate(fmt.Sprintf("%s[%d]", path, i), x, *s.Items)...)
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			bad("want a string, got %T", v)
			return errs
		}
		if s.MinLength != nil && len(str) < *s.MinLength || s.MaxLength != nil && len(str) > *s.MaxLength {
			bad("length %d out of range", len(str))
		}
		if s.Pattern != "" && !regexp.MustCompile(s.Pattern).MatchString(str) {
			bad("%q does not match %s", str, s.Pattern)
		}
		if s.Format == "ipv4" && !ipv4.MatchString(str) {
			bad("%q is not ipv4", str)
		}
	case "integer":
		f, ok := v.(float64)
		if !ok || f != math.Trunc(f) {
			bad("want an integer, got %v", v)
			return errs
		}
		if s.Minimum != nil && f < *s.Minimum || s.Maximum != nil && f > *s.Maximum {
			bad("%v out of range", f)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			bad("want a boolean, got %T", v)
		}
	}
	if len(s.Enum) > 0 && !slices.Contains(s.Enum, v) {
		bad("%v not in %v", v, s.Enum)
	}
	return errs
}
