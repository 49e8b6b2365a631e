package nodeconfig_test

import (
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
)

// Every error names the document and the field by its path, with list
// indexes, the value and why: decode errors (a wrong type, an unknown
// field, a number out of range) as Validate's own.
func TestParseFieldErrors(t *testing.T) {
	const nc = `apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata: {name: node-a}
spec:
  asn: 64512
  routerID: 192.0.2.1
  pools: [{cidr: "fd00:10:1::/64"}]
  bgp:
    peers:
    - {address: "fd00::2", asn: 64513}
    - {address: "fd00::3", asn: 64514}
    - address: "fd00::4"
      asn: 64515
      timers: {holdTime: 90}
`
	const edge = `apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: edge}
spec:
  cidrs: ["2001:db8:200::/120", 198.51.100.0/28]
  use: [addresses]
  namespaces: [edge]
`
	const doc1 = "document 1 (NodeConfig/node-a, line 1): "
	const doc2 = "document 2 (AddressPool/edge, line 16): "
	edit := func(t *testing.T, doc, old, new string) string {
		t.Helper()
		if !strings.Contains(doc, old) {
			t.Fatalf("%q not in %q", old, doc)
		}
		return strings.Replace(doc, old, new, 1)
	}
	for _, tc := range []struct {
		name string
		yaml func(t *testing.T) string
		want []string // the error, line by line
	}{
		{
			name: "wrong type deep in a list",
			yaml: func(t *testing.T) string { return edit(t, nc, "holdTime: 90", "holdTime: ninety") },
			want: []string{doc1 + `spec.bgp.peers[2].timers.holdTime: cannot unmarshal string "ninety" into an integer`},
		},
		{
			name: "unknown field in a list element",
			yaml: func(t *testing.T) string {
				return edit(t, nc, "{address: \"fd00::2\", asn: 64513}", "{address: \"fd00::2\", asn: 64513, holdtime: 5}")
			},
			want: []string{doc1 + `spec.bgp.peers[0].holdtime: unknown field (did you mean timers.holdTime?)`},
		},
		{
			name: "misspelt field in a list element",
			yaml: func(t *testing.T) string { return edit(t, nc, "timers: {holdTime: 90}", "timer: {holdTime: 90}") },
			want: []string{doc1 + `spec.bgp.peers[2].timer: unknown field (did you mean timers?)`},
		},
		{
			name: "number out of its field's range",
			yaml: func(t *testing.T) string {
				return edit(t, nc, "{address: \"fd00::3\", asn: 64514}", "{address: \"fd00::3\", asn: 64514, ttlSecurityMin: 256, port: -1}")
			},
			want: []string{
				doc1 + `spec.bgp.peers[1].port: cannot unmarshal number -1 into an integer of 0..65535`,
				doc1 + `spec.bgp.peers[1].ttlSecurityMin: cannot unmarshal number 256 into an integer of 0..255`,
			},
		},
		{
			name: "a list for an object, an object for a list, a string for a boolean",
			yaml: func(t *testing.T) string {
				return edit(t, edit(t, nc, "timers: {holdTime: 90}", "timers: [90]\n      bfd: {enabled: \"yes\"}"), `pools: [{cidr: "fd00:10:1::/64"}]`, `pools: {cidr: "fd00:10:1::/64"}`)
			},
			want: []string{
				doc1 + `spec.bgp.peers[2].bfd.enabled: cannot unmarshal string "yes" into a boolean`,
				doc1 + `spec.bgp.peers[2].timers: cannot unmarshal a list into an object`,
				doc1 + `spec.pools: cannot unmarshal an object into a list`,
			},
		},
		{
			name: "bad enum",
			yaml: func(t *testing.T) string {
				return edit(t, edit(t, nc, "timers: {holdTime: 90}", "families: [ipv6, evpn]"), "  bgp:\n", "  bgp:\n    importPolicy: maybe\n")
			},
			want: []string{
				doc1 + `spec.bgp.importPolicy: "maybe", want reject or accept`,
				doc1 + `spec.bgp.peers[2].families[1]: "evpn", want ipv4 or ipv6`,
			},
		},
		{
			name: "bad enum in an AddressPool",
			yaml: func(t *testing.T) string {
				return nc + "---\n" + edit(t, edge, "use: [addresses]", "use: [addresses, loadbalancer]")
			},
			want: []string{doc2 + `addresspool "edge": spec.use[1]: "loadbalancer" is not a use; want pod, anycast, addresses, loadBalancer, externalIP`},
		},
		{
			name: "bad IPs and CIDRs name the field and the value",
			yaml: func(t *testing.T) string {
				y := edit(t, nc, "routerID: 192.0.2.1", "routerID: 10")
				y = edit(t, y, `pools: [{cidr: "fd00:10:1::/64"}]`, `pools: [{cidr: "fd00:10:1::/64"}, {cidr: "10.1.1.1/24"}]`)
				y = edit(t, y, `{address: "fd00::3", asn: 64514}`, `{address: "fd00::3::", asn: 64514, localAddress: 192.0.2.1}`)
				return edit(t, y, `- address: "fd00::4"`, `- address: "fd00::4"`+"\n      localAddress: 192.0.2.1")
			},
			want: []string{
				doc1 + `spec.routerID: "10" is not an IPv4 dotted quad`,
				doc1 + `spec.pools[1].cidr: "10.1.1.1/24" has host bits set (did you mean 10.1.1.0/24?)`,
				doc1 + `spec.bgp.peers[1].address: "fd00::3::" is not an IP address (for a link-local peer use interface)`,
				doc1 + `spec.bgp.peers[2].localAddress: 192.0.2.1 is not of the same family as address fd00::4`,
			},
		},
		{
			name: "document index and name in a multi-document file",
			yaml: func(t *testing.T) string { return nc + "---\n" + edit(t, edge, "198.51.100.0/28", "198.51.100.0/33") },
			want: []string{doc2 + `addresspool "edge": spec.cidrs[1]: "198.51.100.0/33" is not a CIDR`},
		},
		{
			name: "decode errors of several documents together",
			yaml: func(t *testing.T) string {
				return edit(t, nc, "asn: 64513", "asn: [64513]") + "---\n" + edit(t, edge, "use: [addresses]", "use: addresses\n  namespace: [edge]")
			},
			want: []string{
				doc1 + `spec.bgp.peers[0].asn: cannot unmarshal a list into an integer`,
				doc2 + `spec.namespace: unknown field (did you mean namespaces?)`,
				doc2 + `spec.use: cannot unmarshal string "addresses" into a list`,
			},
		},
		{
			name: "a document that is no object",
			yaml: func(t *testing.T) string { return nc + "---\n- a list\n" },
			want: []string{"document 2 (line 16): cannot unmarshal a list into an object"},
		},
		{
			name: "a wrong type in the NodeConfig's header",
			yaml: func(t *testing.T) string {
				return edit(t, nc, "metadata: {name: node-a}", "metadata: {name: [node-a]}")
			},
			want: []string{"document 1 (NodeConfig, line 1): metadata.name: cannot unmarshal a list into a string"},
		},
		{
			name: "a wrong type in the header",
			yaml: func(t *testing.T) string {
				return nc + "---\n" + edit(t, edge, "metadata: {name: edge}", "metadata: {name: {edge: 1}}")
			},
			want: []string{"document 2 (AddressPool, line 16): metadata.name: cannot unmarshal an object into a string"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.yaml(t)
			f, err := nodeconfig.Parse([]byte(data))
			if err == nil || f != nil {
				t.Fatalf("Parse(\n%s) = %v, %v; want an error", data, f, err)
			}
			if got := strings.Split(err.Error(), "\n"); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("error\n %s\nwant\n %s", strings.Join(got, "\n "), strings.Join(tc.want, "\n "))
			}
		})
	}
}
