package nodeconfig_test

import (
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
)

const bgpBase = `apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata: {name: n}
spec:
  asn: 64512
  routerID: 192.0.2.1
  pools: [{cidr: "fd00:10:1::/64"}]
  bgp:
`

func TestBGPValid(t *testing.T) {
	y := bgpBase + `    listenPort: -1
    importPolicy: accept
    peers:
    - address: fd00::2
      asn: 64513
      localAddress: fd00::1
      timers: {holdTime: 9, keepaliveTime: 3}
      bfd: {enabled: true, intervalMs: 300, multiplier: 3}
      families: [ipv6, ipv4]
      communities: {pod: ["64512:100"]}
      largeCommunities: {anycast: ["64512:1:2"]}
    - interface: eth1
      asn: 64514
    - address: 192.0.2.9
      asn: 64515
      families: [ipv4]
      ebgpMultihop: 2
`
	if _, err := nodeconfig.Parse([]byte(y)); err != nil {
		t.Fatal(err)
	}
}

func TestBGPErrors(t *testing.T) {
	for _, tc := range []struct {
		name, peers string
		want        []string
	}{
		{"listen port", "    listenPort: 70000\n", []string{"spec.bgp.listenPort", "70000"}},
		{"import policy", "    importPolicy: maybe\n", []string{"spec.bgp.importPolicy", `"maybe"`}},
		{"no address nor interface", "    peers: [{asn: 1}]\n", []string{"spec.bgp.peers[0]", "address or interface"}},
		{"both", "    peers: [{address: fd00::2, interface: eth1, asn: 1}]\n", []string{"spec.bgp.peers[0]", "exclusive", "eth1"}},
		{"bad address", "    peers: [{address: nope, asn: 1}]\n", []string{"spec.bgp.peers[0].address", `"nope"`}},
		{"zoned address", "    peers: [{address: 'fe80::1%eth0', asn: 1}]\n", []string{"spec.bgp.peers[0].address", "interface"}},
		{"bad interface", "    peers: [{interface: a/b, asn: 1}]\n", []string{"spec.bgp.peers[0].interface", `"a/b"`}},
		{"asn zero", "    peers: [{address: fd00::2, asn: 0}]\n", []string{"spec.bgp.peers[0].asn", "0"}},
		{"local address family", "    peers: [{address: fd00::2, asn: 1, localAddress: 192.0.2.1}]\n", []string{"spec.bgp.peers[0].localAddress", "192.0.2.1"}},
		{"ipv6 over ipv4", "    peers: [{address: 192.0.2.9, asn: 1, families: [ipv6]}]\n", []string{"spec.bgp.peers[0].families[0]", "IPv4 session"}},
		{"unknown family", "    peers: [{address: fd00::2, asn: 1, families: [ipx]}]\n", []string{"spec.bgp.peers[0].families[0]", `"ipx"`}},
		{"two passwords", "    peers: [{address: fd00::2, asn: 1, passwordFile: /p, passwordSecretKey: k}]\n", []string{"spec.bgp.peers[0].passwordFile", "only one"}},
		{"hold time", "    peers: [{address: fd00::2, asn: 1, timers: {holdTime: 2}}]\n", []string{"spec.bgp.peers[0].timers.holdTime", "2"}},
		{"keepalive", "    peers: [{address: fd00::2, asn: 1, timers: {holdTime: 9, keepaliveTime: 9}}]\n", []string{"spec.bgp.peers[0].timers.keepaliveTime", "9"}},
		{"restart time", "    peers: [{address: fd00::2, asn: 1, gracefulRestart: {restartTime: 5000}}]\n", []string{"spec.bgp.peers[0].gracefulRestart.restartTime", "5000"}},
		{"bfd interval", "    peers: [{address: fd00::2, asn: 1, bfd: {enabled: true, intervalMs: 5}}]\n", []string{"spec.bgp.peers[0].bfd.intervalMs", "5"}},
		{"gtsm and multihop", "    peers: [{address: fd00::2, asn: 1, ebgpMultihop: 2, ttlSecurityMin: 255}]\n", []string{"spec.bgp.peers[0].ttlSecurityMin", "exclusive"}},
		{"community", "    peers: [{address: fd00::2, asn: 1, communities: {pod: ['1:2:3']}}]\n", []string{"spec.bgp.peers[0].communities.pod[0]", `"1:2:3"`}},
		{"large community", "    peers: [{address: fd00::2, asn: 1, largeCommunities: {anycast: ['1:x:3']}}]\n", []string{"spec.bgp.peers[0].largeCommunities.anycast[0]", `"1:x:3"`}},
		{"duplicate peer", "    peers: [{address: 'fd00::2', asn: 1}, {address: 'fd00:0::2', asn: 2}]\n", []string{"spec.bgp.peers[1]", "spec.bgp.peers[0]", "fd00::2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := nodeconfig.Parse([]byte(bgpBase + tc.peers))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
