package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// crdNodeConfig is a valid NodeConfig the CRD validation cases edit.
const crdNodeConfig = `apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: crd-check
spec:
  asn: 64512
  routerID: 192.0.2.10
  pools:
  - cidr: 2001:db8:100:1::/64
    namespaces: [prod]
  bgp:
    importPolicy: reject
    peers:
    - address: 2001:db8:0:1::2
      asn: 64513
      localAddress: 2001:db8:0:1::1
      timers: {holdTime: 90, keepaliveTime: 30}
      bfd: {enabled: true, intervalMs: 300, multiplier: 3}
      families: [ipv6, ipv4]
`

// crdAddressPool is a valid AddressPool the cases edit.
const crdAddressPool = `apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata:
  name: crd-check
spec:
  cidrs: ["2001:db8:200::/120", 198.51.100.0/28]
  use: [addresses]
  namespaces: [edge]
`

// TestCRDValidation applies deploy/crd to a real API server and checks
// that it refuses at `kubectl apply` what the agent would refuse, with a
// message naming the field (spec.bgp.peers[0].timers.holdTime, not just
// "invalid"): ranges (AS numbers, timers, BFD, TTL security, 32-bit
// counters), IP, IPv4 and CIDR formats, enums, unknown fields, and the
// AddressPool rules (CIDRs, use, namespaces, who may use it). Every case
// is refused by the agent's own check (nodeconfig.Parse, the standalone
// file's) too, naming the same field; boundary values both accept. The
// shipped examples (deploy/examples/*.yaml) are accepted as they are
// (server-side dry run), and kubectl get shows the Ready column (and, in
// wide output, the reason and message) of NodeConfigs and AddressPools.
func TestCRDValidation(t *testing.T) {
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := apiOnlyLab(t)
	kubectl := func(stdin string, args ...string) string {
		t.Helper()
		return kubectlRetry(t, c, stdin, args...)
	}
	kubectl("", "apply", "-f", filepath.Join(root, "deploy", "crd"))
	kubectl("", "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
	// The unedited objects are accepted (and so the resources are served).
	kubectl(crdNodeConfig, "apply", "--dry-run=server", "-f", "-")
	kubectl(crdAddressPool, "apply", "--dry-run=server", "-f", "-")

	t.Run("refused", func(t *testing.T) {
		for _, tc := range crdRefused() {
			t.Run(tc.name, func(t *testing.T) {
				out, err := c.KubectlStdin(ctx, tc.yaml, "apply", "--dry-run=server", "-f", "-")
				if err == nil {
					t.Fatalf("the API server accepts:\n%s\n%s", tc.yaml, out)
				}
				for _, w := range append([]string{tc.field}, tc.why...) {
					if !strings.Contains(out, w) {
						t.Errorf("the API server's refusal does not say %q:\n%s", w, out)
					}
				}
				// The agent refuses it too, naming the same field.
				if err := parseAlone(tc.yaml); err == nil || !strings.Contains(err.Error(), tc.field) {
					t.Errorf("the agent's check: %v, want an error naming %s", err, tc.field)
				}
			})
		}
	})

	t.Run("accepted", func(t *testing.T) {
		// Boundary values: the API server accepts what the agent accepts.
		for _, tc := range crdAccepted() {
			t.Run(tc.name, func(t *testing.T) {
				if err := parseAlone(tc.yaml); err != nil {
					t.Fatalf("the agent refuses it: %v", err)
				}
				if out, err := c.KubectlStdin(ctx, tc.yaml, "apply", "--dry-run=server", "-f", "-"); err != nil {
					t.Errorf("the API server refuses what the agent accepts:\n%s\n%s", tc.yaml, out)
				}
			})
		}
	})

	t.Run("shipped examples", func(t *testing.T) {
		files, err := filepath.Glob(filepath.Join(root, "deploy", "examples", "*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("deploy/examples: %v %v", files, err)
		}
		for _, f := range files {
			if out, err := c.Kubectl(ctx, "apply", "--dry-run=server", "-f", f); err != nil {
				t.Errorf("%s refused: %v\n%s", filepath.Base(f), err, out)
			}
		}
	})

	t.Run("ready column", func(t *testing.T) {
		kubectl(crdNodeConfig, "apply", "-f", "-")
		kubectl(crdAddressPool, "apply", "-f", "-")
		setReady := func(kind, status, reason, message string) {
			t.Helper()
			patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":%q,"reason":%q,"message":%q,"lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`,
				status, reason, message)
			kubectl("", "patch", kind, "crd-check", "--subresource=status", "--type=merge", "-p", patch)
		}
		setReady("nodeconfig", "False", "ConfigError", "spec.bgp.peers[0]: bad")
		setReady("addresspool", "False", "InvalidSpec", `addresspool "crd-check": spec.cidrs[0]: overlaps`)
		for _, tc := range []struct {
			resource string
			wide     bool
			want     [][2]string // column, value
		}{
			{"nodeconfigs", false, [][2]string{{"READY", "False"}}},
			{"nodeconfigs", true, [][2]string{{"READY", "False"}, {"REASON", "ConfigError"}}},
			{"addresspools", false, [][2]string{{"READY", "False"}}},
			{"addresspools", true, [][2]string{{"READY", "False"}, {"REASON", "InvalidSpec"}, {"MESSAGE", `addresspool "crd-check": spec.cidrs[0]: overlaps`}}},
		} {
			args := []string{"get", tc.resource, "crd-check"}
			if tc.wide {
				args = append(args, "-o", "wide")
			}
			out := kubectl("", args...)
			for _, cv := range tc.want {
				if got := column(out, cv[0]); got != cv[1] {
					t.Errorf("kubectl %s: column %s = %q, want %q\n%s", strings.Join(args, " "), cv[0], got, cv[1], out)
				}
			}
			if !tc.wide && (strings.Contains(out, "REASON") || strings.Contains(out, "MESSAGE")) {
				t.Errorf("kubectl %s shows the wide columns:\n%s", strings.Join(args, " "), out)
			}
		}
		setReady("addresspool", "True", "Valid", "valid: the agents use the pool")
		if got := column(kubectl("", "get", "addresspools", "crd-check"), "READY"); got != "True" {
			t.Errorf("READY %q after the pool became valid, want True", got)
		}
	})
}

// crdCase is an object and what the API server's refusal says: the path
// of the field (which the agent's own check names too) and more.
type crdCase struct {
	name  string
	yaml  string
	field string
	why   []string
}

// mustEdit replaces old by new in doc; old must occur.
func mustEdit(doc, old, new string) string {
	if !strings.Contains(doc, old) {
		panic(fmt.Sprintf("%q not in %q", old, doc))
	}
	return strings.Replace(doc, old, new, 1)
}

func editNC(old, new string) string { return mustEdit(crdNodeConfig, old, new) }
func editAP(old, new string) string { return mustEdit(crdAddressPool, old, new) }

const crdPeer = "    - address: 2001:db8:0:1::2\n"

// crdRefused are objects both the API server and the agent refuse.
func crdRefused() []crdCase {
	nc, ap, edit, peer := editNC, editAP, mustEdit, crdPeer
	return []crdCase{
		{"asn 0", nc("asn: 64512", "asn: 0"), "spec.asn", []string{"greater than or equal to 1"}},
		{"asn 4294967295 (reserved)", nc("asn: 64512", "asn: 4294967295"), "spec.asn", []string{"less than or equal to 4294967294"}},
		{"peer asn out of range", nc("asn: 64513", "asn: 4294967296"), "spec.bgp.peers[0].asn", nil},
		{"routerID IPv6", nc("routerID: 192.0.2.10", `routerID: "fd00::1"`), "spec.routerID", []string{"ipv4"}},
		{"routerID a number", nc("routerID: 192.0.2.10", "routerID: 10"), "spec.routerID", nil},
		{"pool CIDR garbage", nc("cidr: 2001:db8:100:1::/64", "cidr: 2001:db8:100:1::/129"), "spec.pools[0].cidr", []string{"must be a CIDR"}},
		{"pool CIDR with host bits", nc("cidr: 2001:db8:100:1::/64", "cidr: 2001:db8:100:1::1/64"), "spec.pools[0].cidr", []string{"no host bits"}},
		{"pool namespace empty", nc("namespaces: [prod]", `namespaces: [""]`), "spec.pools[0].namespaces[0]", nil},
		{"peer address not an IP", nc("address: 2001:db8:0:1::2", "address: tor-1"), "spec.bgp.peers[0].address", []string{"must be an IPv6 or IPv4 address"}},
		{"localAddress of another family", nc("localAddress: 2001:db8:0:1::1", "localAddress: 192.0.2.1"), "spec.bgp.peers[0].localAddress", []string{"same family"}},
		{"address and interface", nc(peer, peer+"      interface: eth1\n"), "spec.bgp.peers[0]", []string{"exactly one of address and interface"}},
		{"two passwords", nc(peer, peer+"      passwordFile: /etc/pw\n      passwordSecretKey: tor\n"), "spec.bgp.peers[0].passwordFile", []string{"only one"}},
		{"holdTime 2", nc("holdTime: 90, keepaliveTime: 30", "holdTime: 2"), "spec.bgp.peers[0].timers.holdTime", []string{"3..65535"}},
		{"holdTime over 65535", nc("holdTime: 90, keepaliveTime: 30", "holdTime: 70000"), "spec.bgp.peers[0].timers.holdTime", []string{"65535"}},
		{"holdTime not a number", nc("holdTime: 90", "holdTime: ninety"), "spec.bgp.peers[0].timers.holdTime", []string{"integer"}},
		{"keepalive not below the hold time", nc("keepaliveTime: 30", "keepaliveTime: 90"), "spec.bgp.peers[0].timers.keepaliveTime", []string{"below the hold time"}},
		{"keepalive not below the default hold time", nc("holdTime: 90, keepaliveTime: 30", "keepaliveTime: 95"), "spec.bgp.peers[0].timers.keepaliveTime", []string{"below the hold time"}},
		{"BFD interval 5 ms", nc("intervalMs: 300", "intervalMs: 5"), "spec.bgp.peers[0].bfd.intervalMs", []string{"10..60000"}},
		{"BFD interval over a minute", nc("intervalMs: 300", "intervalMs: 60001"), "spec.bgp.peers[0].bfd.intervalMs", []string{"10..60000"}},
		{"BFD multiplier 256", nc("multiplier: 3", "multiplier: 256"), "spec.bgp.peers[0].bfd.multiplier", []string{"1..255"}},
		{"ttlSecurityMin 256", nc(peer, peer+"      ttlSecurityMin: 256\n"), "spec.bgp.peers[0].ttlSecurityMin", []string{"255"}},
		{"GTSM and multihop", nc(peer, peer+"      ttlSecurityMin: 255\n      ebgpMultihop: 2\n"), "spec.bgp.peers[0].ttlSecurityMin", []string{"exclusive"}},
		{"maxPrefixes over 32 bits", nc(peer, peer+"      maxPrefixes: 4294967296\n"), "spec.bgp.peers[0].maxPrefixes", nil},
		{"unknown family", nc("families: [ipv6, ipv4]", "families: [ipv6, evpn]"), "spec.bgp.peers[0].families[1]", []string{`"evpn"`}},
		{"ipv6 over an IPv4 session", edit(nc("address: 2001:db8:0:1::2", "address: 192.0.2.2"), "localAddress: 2001:db8:0:1::1", "localAddress: 192.0.2.1"),
			"spec.bgp.peers[0].families", []string{"ipv6 over an IPv4 session"}},
		{"unknown import policy", nc("importPolicy: reject", "importPolicy: maybe"), "spec.bgp.importPolicy", []string{`"maybe"`}},
		{"unknown field in a peer", nc(peer, peer+"      holdtime: 90\n"), "spec.bgp.peers[0].holdtime", []string{"unknown field"}},
		{"pool CIDR garbage (AddressPool)", ap("198.51.100.0/28", "198.51.100.0/33"), "spec.cidrs[1]", []string{"must be a CIDR"}},
		{"pool CIDR with host bits (AddressPool)", ap("198.51.100.0/28", "198.51.100.1/28"), "spec.cidrs[1]", []string{"no host bits"}},
		{"no CIDRs", ap(`cidrs: ["2001:db8:200::/120", 198.51.100.0/28]`, "cidrs: []"), "spec.cidrs", nil},
		{"unknown use", ap("use: [addresses]", "use: [addresses, loadbalancer]"), "spec.use[1]", []string{`"loadbalancer"`}},
		{"use twice", ap("use: [addresses]", "use: [addresses, addresses]"), "spec.use[1]", nil},
		{"empty namespace", ap("namespaces: [edge]", `namespaces: [""]`), "spec.namespaces[0]", nil},
		{"namespace not a namespace name", ap("namespaces: [edge]", "namespaces: [Edge]"), "spec.namespaces[0]", nil},
		{"nobody said who may use it", ap("  namespaces: [edge]\n", ""), "spec", []string{"say who may use the pool"}},
		{"unknown field in an AddressPool", ap("namespaces: [edge]", "namespace: [edge]"), "spec.namespace", []string{"unknown field"}},
		{"aggregate on a pool not of Service addresses", ap("use: [addresses]", "use: [addresses]\n  aggregate: true"), "spec", []string{"aggregate is for pools of use loadBalancer and externalIP only"}},
	}
}

// crdAccepted are boundary values both accept.
func crdAccepted() []crdCase {
	nc, ap, edit, peer := editNC, editAP, mustEdit, crdPeer
	return []crdCase{
		{name: "holdTime 3, keepalive 2", yaml: nc("holdTime: 90, keepaliveTime: 30", "holdTime: 3, keepaliveTime: 2")},
		{name: "keepalive below the default hold time", yaml: nc("holdTime: 90, keepaliveTime: 30", "keepaliveTime: 89")},
		{name: "holdTime 65535", yaml: nc("holdTime: 90, keepaliveTime: 30", "holdTime: 65535")},
		{name: "BFD limits", yaml: nc("intervalMs: 300, multiplier: 3", "intervalMs: 60000, multiplier: 255")},
		{name: "BFD off: its knobs are not checked", yaml: nc("enabled: true, intervalMs: 300, multiplier: 3", "enabled: false, intervalMs: 5, multiplier: 300")},
		{name: "GTSM 255", yaml: nc(peer, peer+"      ttlSecurityMin: 255\n")},
		{name: "largest AS numbers and counters", yaml: nc("asn: 64513", "asn: 4294967294\n      maxPrefixes: 4294967295")},
		{name: "IPv4 session, IPv4 family", yaml: edit(edit(nc("address: 2001:db8:0:1::2", "address: 192.0.2.2"), "localAddress: 2001:db8:0:1::1", "localAddress: 192.0.2.1"), "families: [ipv6, ipv4]", "families: [ipv4]")},
		{name: "unnumbered", yaml: nc("    - address: 2001:db8:0:1::2\n      asn: 64513\n      localAddress: 2001:db8:0:1::1\n", "    - interface: eth1\n      asn: 64513\n")},
		{name: "an AddressPool nobody may use", yaml: ap("namespaces: [edge]", "namespaces: []")},
		{name: "an AddressPool for every namespace", yaml: ap("namespaces: [edge]", "namespaceSelector: {}")},
		{name: "an aggregating pool of Service addresses", yaml: ap("use: [addresses]", "use: [loadBalancer, externalIP]\n  aggregate: true")},
	}
}

// parseAlone runs the agent's own check on one object: a NodeConfig as a
// node-config file, an AddressPool after a valid NodeConfig.
func parseAlone(doc string) error {
	data := doc
	if strings.Contains(doc, "kind: AddressPool") {
		data = "apiVersion: flock.fritzlab.net/v1alpha1\nkind: NodeConfig\nmetadata: {name: node}\nspec: {asn: 65001, routerID: 192.0.2.1, pools: [{cidr: \"fd00:10:1::/64\"}]}\n---\n" + doc
	}
	_, err := nodeconfig.Parse([]byte(data))
	return err
}

// column returns the value of a column of kubectl get's one row, by the
// header's offsets (values may hold spaces; columns are aligned).
func column(out, name string) string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) < 2 {
		return ""
	}
	header, row := lines[0], lines[1]
	start := strings.Index(header, name)
	if start < 0 || start >= len(row) {
		return ""
	}
	end := len(row)
	if rest := header[start+len(name):]; strings.TrimLeft(rest, " ") != "" {
		end = start + len(name) + (len(rest) - len(strings.TrimLeft(rest, " ")))
	}
	return strings.TrimSpace(row[start:min(end, len(row))])
}
