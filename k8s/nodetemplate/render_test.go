package nodetemplate

import (
	"fmt"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

const (
	asnLabel = "flock.fritzlab.net/asn"
	torAnn   = "flock.fritzlab.net/tor"
	ridAnn   = "flock.fritzlab.net/router-id"
	poolsAnn = "flock.fritzlab.net/pools"
)

// testNode is node1 of the example address plan: rack AS by label, the
// server port 2001:db8:0:1::/64 (node ::1, ToR ::2), pod CIDRs from
// kube-controller-manager.
func testNode() *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node1", UID: "node1-uid",
			Labels:      map[string]string{asnLabel: "64512", "rack": "r1"},
			Annotations: map[string]string{torAnn: "2001:db8:0:1::2", ridAnn: "192.0.2.11", poolsAnn: "2001:db8:200:1::/64, 203.0.113.16/28"},
		},
		Spec: corev1.NodeSpec{PodCIDR: "2001:db8:100:1::/64", PodCIDRs: []string{"2001:db8:100:1::/64", "198.51.100.16/28"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "node1"},
			{Type: corev1.NodeExternalIP, Address: "203.0.113.9"},
			{Type: corev1.NodeInternalIP, Address: "2001:db8:0:1::1"},
			{Type: corev1.NodeInternalIP, Address: "192.0.2.1"},
		}},
	}
}

// testTemplate is the example template: AS from the rack label, router ID
// from the InternalIPv4, pools from podCIDRs, the ToR from an annotation.
func testTemplate() *v1alpha1.NodeConfigTemplate {
	yes := true
	return &v1alpha1.NodeConfigTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "rack", UID: "rack-uid"},
		Spec: v1alpha1.NodeConfigTemplateSpec{
			ASNFrom:      &v1alpha1.ValueFrom{Label: asnLabel},
			RouterIDFrom: v1alpha1.RouterIDFrom{NodeAddress: v1alpha1.NodeAddressInternalIPv4},
			PoolsFrom:    v1alpha1.PoolsFrom{PodCIDRs: true},
			Template: v1alpha1.TemplateSpec{
				Defaults: v1alpha1.Defaults{IPv6: &yes, IPv4: true, IPAlgo: "sequential"},
				BGP: v1alpha1.TemplateBGP{Peers: []v1alpha1.TemplatePeer{{
					Peer: v1alpha1.Peer{ASN: 64513, PasswordSecretKey: "tor", Families: []string{"ipv6", "ipv4"},
						BFD: v1alpha1.BFD{Enabled: true, IntervalMs: 300, Multiplier: 3}, TTLSecurityMin: 255,
						GracefulRestart: v1alpha1.GracefulRestart{RestartTime: 120}},
					AddressFrom:      &v1alpha1.ValueFrom{Annotation: torAnn},
					LocalAddressFrom: &v1alpha1.AddressFrom{NodeAddress: v1alpha1.NodeAddressInternalIPv6},
				}}},
			},
		},
	}
}

func wantSpec() v1alpha1.NodeConfigSpec {
	yes := true
	return v1alpha1.NodeConfigSpec{
		ASN: 64512, RouterID: "192.0.2.1",
		Pools:    []v1alpha1.Pool{{CIDR: "2001:db8:100:1::/64"}, {CIDR: "198.51.100.16/28"}},
		Defaults: v1alpha1.Defaults{IPv6: &yes, IPv4: true, IPAlgo: "sequential"},
		BGP: v1alpha1.BGP{ImportPolicy: "reject", Peers: []v1alpha1.Peer{{
			Address: "2001:db8:0:1::2", LocalAddress: "2001:db8:0:1::1",
			ASN: 64513, PasswordSecretKey: "tor", Families: []string{"ipv6", "ipv4"},
			BFD: v1alpha1.BFD{Enabled: true, IntervalMs: 300, Multiplier: 3}, TTLSecurityMin: 255,
			GracefulRestart: v1alpha1.GracefulRestart{RestartTime: 120},
		}}},
	}
}

// Every source of every per-node value.
func TestRender(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		name string
		tpl  func(*v1alpha1.NodeConfigTemplate)
		node func(*corev1.Node)
		want func(*v1alpha1.NodeConfigSpec)
	}{
		{name: "the example"},
		{name: "asn literal",
			tpl:  func(t *v1alpha1.NodeConfigTemplate) { t.Spec.ASN, t.Spec.ASNFrom = 65001, nil },
			want: func(s *v1alpha1.NodeConfigSpec) { s.ASN = 65001 }},
		{name: "asn from an annotation",
			tpl:  func(t *v1alpha1.NodeConfigTemplate) { t.Spec.ASNFrom = &v1alpha1.ValueFrom{Annotation: "asn"} },
			node: func(n *corev1.Node) { n.Annotations["asn"] = "4200000001" },
			want: func(s *v1alpha1.NodeConfigSpec) { s.ASN = 4200000001 }},
		{name: "router ID from a label",
			tpl:  func(t *v1alpha1.NodeConfigTemplate) { t.Spec.RouterIDFrom = v1alpha1.RouterIDFrom{Label: "rid"} },
			node: func(n *corev1.Node) { n.Labels["rid"] = "10.0.0.7" },
			want: func(s *v1alpha1.NodeConfigSpec) { s.RouterID = "10.0.0.7" }},
		{name: "router ID from an annotation",
			tpl:  func(t *v1alpha1.NodeConfigTemplate) { t.Spec.RouterIDFrom = v1alpha1.RouterIDFrom{Annotation: ridAnn} },
			want: func(s *v1alpha1.NodeConfigSpec) { s.RouterID = "192.0.2.11" }},
		{name: "router ID hashed from the name (an IPv6-only node)",
			tpl: func(t *v1alpha1.NodeConfigTemplate) {
				t.Spec.RouterIDFrom = v1alpha1.RouterIDFrom{Hash: v1alpha1.HashNodeName}
			},
			node: func(n *corev1.Node) {
				n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "2001:db8:0:1::1"}}
			},
			want: func(s *v1alpha1.NodeConfigSpec) { s.RouterID = HashRouterID("node1") }},
		{name: "the IPv4-mapped form of an InternalIP",
			node: func(n *corev1.Node) {
				n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "::ffff:192.0.2.5"}, {Type: corev1.NodeInternalIP, Address: "2001:db8:0:1::1"}}
			},
			want: func(s *v1alpha1.NodeConfigSpec) { s.RouterID = "192.0.2.5" }},
		{name: "the singular podCIDR of an older Node",
			node: func(n *corev1.Node) { n.Spec.PodCIDRs = nil },
			want: func(s *v1alpha1.NodeConfigSpec) { s.Pools = s.Pools[:1] }},
		{name: "pools from an annotation",
			tpl: func(t *v1alpha1.NodeConfigTemplate) { t.Spec.PoolsFrom = v1alpha1.PoolsFrom{Annotation: poolsAnn} },
			want: func(s *v1alpha1.NodeConfigSpec) {
				s.Pools = []v1alpha1.Pool{{CIDR: "2001:db8:200:1::/64"}, {CIDR: "203.0.113.16/28"}}
			}},
		{name: "pools from podCIDRs and an annotation, each once",
			tpl:  func(t *v1alpha1.NodeConfigTemplate) { t.Spec.PoolsFrom.Annotation = poolsAnn },
			node: func(n *corev1.Node) { n.Annotations[poolsAnn] = "2001:db8:200:1::/64,198.51.100.16/28" },
			want: func(s *v1alpha1.NodeConfigSpec) {
				s.Pools = append(s.Pools, v1alpha1.Pool{CIDR: "2001:db8:200:1::/64"})
			}},
		{name: "an unnumbered peer and a route server",
			tpl: func(t *v1alpha1.NodeConfigTemplate) {
				t.Spec.Template.BGP.Peers = []v1alpha1.TemplatePeer{
					{Peer: v1alpha1.Peer{Interface: "eth1", ASN: 64513}},
					{Peer: v1alpha1.Peer{Address: "2001:db8:ff::1", ASN: 64999, EBGPMultihop: 4}, LocalAddressFrom: &v1alpha1.AddressFrom{NodeAddress: v1alpha1.NodeAddressInternalIPv6}},
				}
			},
			want: func(s *v1alpha1.NodeConfigSpec) {
				s.BGP.Peers = []v1alpha1.Peer{{Interface: "eth1", ASN: 64513}, {Address: "2001:db8:ff::1", ASN: 64999, EBGPMultihop: 4, LocalAddress: "2001:db8:0:1::1"}}
			}},
		{name: "an IPv4 ToR from a label, the local address the InternalIPv4",
			tpl: func(t *v1alpha1.NodeConfigTemplate) {
				p := &t.Spec.Template.BGP.Peers[0]
				p.AddressFrom = &v1alpha1.ValueFrom{Label: "tor4"}
				p.LocalAddressFrom = &v1alpha1.AddressFrom{NodeAddress: v1alpha1.NodeAddressInternalIPv4}
				p.Families = []string{"ipv4"}
			},
			node: func(n *corev1.Node) { n.Labels["tor4"] = "192.0.2.2" },
			want: func(s *v1alpha1.NodeConfigSpec) {
				p := &s.BGP.Peers[0]
				p.Address, p.LocalAddress, p.Families = "192.0.2.2", "192.0.2.1", []string{"ipv4"}
			}},
		{name: "the local address from a label and an annotation",
			tpl: func(t *v1alpha1.NodeConfigTemplate) {
				ps := t.Spec.Template.BGP.Peers
				ps[0].LocalAddressFrom = &v1alpha1.AddressFrom{Annotation: "local6"}
				p2 := *ps[0].DeepCopy()
				p2.AddressFrom = &v1alpha1.ValueFrom{Label: "tor4"}
				p2.LocalAddressFrom = &v1alpha1.AddressFrom{Label: "local4"}
				t.Spec.Template.BGP.Peers = append(ps, p2)
			},
			node: func(n *corev1.Node) {
				n.Annotations["local6"] = "2001:db8:0:1::a"
				n.Labels["tor4"], n.Labels["local4"] = "192.0.2.2", "192.0.2.1"
			},
			want: func(s *v1alpha1.NodeConfigSpec) {
				s.BGP.Peers[0].LocalAddress = "2001:db8:0:1::a"
				p2 := *s.BGP.Peers[0].DeepCopy()
				p2.Address, p2.LocalAddress = "192.0.2.2", "192.0.2.1"
				s.BGP.Peers = append(s.BGP.Peers, p2)
			}},
		{name: "defaults, listen port and import policy copied",
			tpl: func(t *v1alpha1.NodeConfigTemplate) {
				t.Spec.Template.Defaults = v1alpha1.Defaults{IPv6: &no, IPv4: true}
				t.Spec.Template.BGP.ListenPort, t.Spec.Template.BGP.ImportPolicy = -1, "accept"
			},
			want: func(s *v1alpha1.NodeConfigSpec) {
				s.Defaults = v1alpha1.Defaults{IPv6: &no, IPv4: true}
				s.BGP.ListenPort, s.BGP.ImportPolicy = -1, "accept"
			}},
		{name: "the CRD's defaults filled in (ipv6, importPolicy)",
			tpl:  func(t *v1alpha1.NodeConfigTemplate) { t.Spec.Template.Defaults.IPv6 = nil },
			want: func(s *v1alpha1.NodeConfigSpec) { s.Defaults.IPv6 = &yes }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tpl, n, want := testTemplate(), testNode(), wantSpec()
			if tc.tpl != nil {
				tc.tpl(tpl)
			}
			if tc.node != nil {
				tc.node(n)
			}
			if tc.want != nil {
				tc.want(&want)
			}
			before := tpl.DeepCopy()
			got, err := Render(tpl, n)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
			if !reflect.DeepEqual(tpl, before) {
				t.Error("Render changed the template")
			}
			// The rendering shares no memory with the template.
			if len(got.BGP.Peers) > 0 && len(got.BGP.Peers[0].Families) > 0 {
				got.BGP.Peers[0].Families[0] = "x"
				if reflect.DeepEqual(tpl, before) == false {
					t.Error("the rendering shares memory with the template")
				}
			}
		})
	}
}

// Every bad input fails with the template, the field, the node and the
// value named, and renders nothing.
func TestRenderErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		tpl  func(*v1alpha1.NodeConfigTemplate)
		node func(*corev1.Node)
		want string
	}{
		{"asn label missing", nil, func(n *corev1.Node) { delete(n.Labels, asnLabel) },
			"NodeConfigTemplate rack: spec.asnFrom.label: node node1 has no label flock.fritzlab.net/asn"},
		{"asn label not a number", nil, func(n *corev1.Node) { n.Labels[asnLabel] = "rack-7" },
			`NodeConfigTemplate rack: spec.asnFrom.label: node node1: label flock.fritzlab.net/asn="rack-7" is not an AS number (1..4294967294)`},
		{"asn label 0", nil, func(n *corev1.Node) { n.Labels[asnLabel] = "0" },
			`NodeConfigTemplate rack: spec.asnFrom.label: node node1: label flock.fritzlab.net/asn="0" is not an AS number (1..4294967294)`},
		{"asn label reserved 4294967295", nil, func(n *corev1.Node) { n.Labels[asnLabel] = "4294967295" },
			`NodeConfigTemplate rack: spec.asnFrom.label: node node1: label flock.fritzlab.net/asn="4294967295" is not an AS number (1..4294967294)`},
		{"asn label beyond 32 bits", nil, func(n *corev1.Node) { n.Labels[asnLabel] = "4294967296" },
			`NodeConfigTemplate rack: spec.asnFrom.label: node node1: label flock.fritzlab.net/asn="4294967296" is not an AS number (1..4294967294)`},
		{"asn annotation missing", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.ASNFrom = &v1alpha1.ValueFrom{Annotation: "asn"} }, nil,
			"NodeConfigTemplate rack: spec.asnFrom.annotation: node node1 has no annotation asn"},
		{"asn annotation negative", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.ASNFrom = &v1alpha1.ValueFrom{Annotation: "asn"} },
			func(n *corev1.Node) { n.Annotations["asn"] = "-5" },
			`NodeConfigTemplate rack: spec.asnFrom.annotation: node node1: annotation asn="-5" is not an AS number (1..4294967294)`},
		{"neither asn nor asnFrom", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.ASNFrom = nil }, nil,
			"NodeConfigTemplate rack: spec.asn: set asn or asnFrom"},
		{"asn and asnFrom", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.ASN = 1 }, nil,
			"NodeConfigTemplate rack: spec.asn and spec.asnFrom: set only one"},
		{"no IPv4 InternalIP", nil, func(n *corev1.Node) {
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeExternalIP, Address: "203.0.113.9"}, {Type: corev1.NodeInternalIP, Address: "2001:db8:0:1::1"}}
		}, "NodeConfigTemplate rack: spec.routerIDFrom.nodeAddress: node node1 has no IPv4 InternalIP (its InternalIPs: [2001:db8:0:1::1])"},
		{"router ID nodeAddress InternalIPv6", func(t *v1alpha1.NodeConfigTemplate) {
			t.Spec.RouterIDFrom.NodeAddress = v1alpha1.NodeAddressInternalIPv6
		}, nil, `NodeConfigTemplate rack: spec.routerIDFrom.nodeAddress: "InternalIPv6", want InternalIPv4 (a router ID is 32 bits)`},
		{"router ID annotation IPv6", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.RouterIDFrom = v1alpha1.RouterIDFrom{Annotation: ridAnn} },
			func(n *corev1.Node) { n.Annotations[ridAnn] = "2001:db8::1" },
			`NodeConfigTemplate rack: spec.routerIDFrom.annotation: node node1: annotation flock.fritzlab.net/router-id="2001:db8::1" is not a router ID (a dotted quad other than 0.0.0.0)`},
		{"router ID label 0.0.0.0", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.RouterIDFrom = v1alpha1.RouterIDFrom{Label: "rid"} },
			func(n *corev1.Node) { n.Labels["rid"] = "0.0.0.0" },
			`NodeConfigTemplate rack: spec.routerIDFrom.label: node node1: label rid="0.0.0.0" is not a router ID (a dotted quad other than 0.0.0.0)`},
		{"router ID label missing", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.RouterIDFrom = v1alpha1.RouterIDFrom{Label: "rid"} }, nil,
			"NodeConfigTemplate rack: spec.routerIDFrom.label: node node1 has no label rid"},
		{"two router ID sources", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.RouterIDFrom.Hash = v1alpha1.HashNodeName }, nil,
			"NodeConfigTemplate rack: spec.routerIDFrom: set exactly one of nodeAddress, label, annotation and hash"},
		{"podCIDRs empty", nil, func(n *corev1.Node) { n.Spec.PodCIDR, n.Spec.PodCIDRs = "", nil },
			"NodeConfigTemplate rack: spec.poolsFrom.podCIDRs: node node1 has no spec.podCIDRs (kube-controller-manager allocates them with --allocate-node-cidrs and --cluster-cidr)"},
		{"no pool source", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.PoolsFrom = v1alpha1.PoolsFrom{} }, nil,
			"NodeConfigTemplate rack: spec.poolsFrom: set podCIDRs: true and/or annotation"},
		{"pools annotation missing", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.PoolsFrom = v1alpha1.PoolsFrom{Annotation: "pools"} }, nil,
			"NodeConfigTemplate rack: spec.poolsFrom.annotation: node node1 has no annotation pools"},
		{"pools annotation empty", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.PoolsFrom = v1alpha1.PoolsFrom{Annotation: poolsAnn} },
			func(n *corev1.Node) { n.Annotations[poolsAnn] = " " },
			`NodeConfigTemplate rack: spec.poolsFrom.annotation: node node1: annotation flock.fritzlab.net/pools=" " holds no CIDR`},
		{"pools annotation not a CIDR", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.PoolsFrom = v1alpha1.PoolsFrom{Annotation: poolsAnn} },
			func(n *corev1.Node) { n.Annotations[poolsAnn] = "2001:db8:200:1::/64,198.51.100.300/28" },
			`NodeConfigTemplate rack: spec.poolsFrom.annotation: node node1: annotation flock.fritzlab.net/pools: "198.51.100.300/28" is not a CIDR`},
		{"pools annotation with host bits", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.PoolsFrom = v1alpha1.PoolsFrom{Annotation: poolsAnn} },
			func(n *corev1.Node) { n.Annotations[poolsAnn] = "2001:db8:200:1::1/64" },
			`NodeConfigTemplate rack: spec.poolsFrom.annotation: node node1: annotation flock.fritzlab.net/pools: "2001:db8:200:1::1/64" has host bits set`},
		{"a podCIDR not a CIDR", nil, func(n *corev1.Node) { n.Spec.PodCIDRs[1] = "bogus" },
			`NodeConfigTemplate rack: spec.poolsFrom.podCIDRs: node node1: spec.podCIDRs[1]: "bogus" is not a CIDR`},
		{"ToR annotation missing", nil, func(n *corev1.Node) { delete(n.Annotations, torAnn) },
			"NodeConfigTemplate rack: spec.template.bgp.peers[0].addressFrom.annotation: node node1 has no annotation flock.fritzlab.net/tor"},
		{"ToR annotation not an address", nil, func(n *corev1.Node) { n.Annotations[torAnn] = "tor1.example.com" },
			`NodeConfigTemplate rack: spec.template.bgp.peers[0].addressFrom.annotation: node node1: annotation flock.fritzlab.net/tor="tor1.example.com" is not an IP address`},
		{"ToR annotation with a zone", nil, func(n *corev1.Node) { n.Annotations[torAnn] = "fe80::1%eth0" },
			`NodeConfigTemplate rack: spec.template.bgp.peers[0].addressFrom.annotation: node node1: annotation flock.fritzlab.net/tor="fe80::1%eth0" is not an IP address`},
		{"no IPv6 InternalIP for the local address", nil, func(n *corev1.Node) {
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}}
		}, "NodeConfigTemplate rack: spec.template.bgp.peers[0].localAddressFrom.nodeAddress: node node1 has no IPv6 InternalIP (its InternalIPs: [192.0.2.1])"},
		{"local address label missing", func(t *v1alpha1.NodeConfigTemplate) {
			t.Spec.Template.BGP.Peers[0].LocalAddressFrom = &v1alpha1.AddressFrom{Label: "local"}
		}, nil, "NodeConfigTemplate rack: spec.template.bgp.peers[0].localAddressFrom.label: node node1 has no label local"},
		{"address and addressFrom", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.Template.BGP.Peers[0].Address = "2001:db8::9" }, nil,
			"NodeConfigTemplate rack: spec.template.bgp.peers[0]: set exactly one of address, interface (unnumbered) and addressFrom"},
		{"localAddress and localAddressFrom", func(t *v1alpha1.NodeConfigTemplate) { t.Spec.Template.BGP.Peers[0].LocalAddress = "2001:db8::9" }, nil,
			"NodeConfigTemplate rack: spec.template.bgp.peers[0].localAddressFrom: set only one of localAddress and localAddressFrom"},
		{"every problem at once", nil, func(n *corev1.Node) {
			n.Labels, n.Annotations, n.Spec.PodCIDR, n.Spec.PodCIDRs, n.Status.Addresses = nil, nil, "", nil, nil
		}, "NodeConfigTemplate rack: spec.asnFrom.label: node node1 has no label flock.fritzlab.net/asn; " +
			"spec.routerIDFrom.nodeAddress: node node1 has no IPv4 InternalIP (its InternalIPs: []); " +
			"spec.poolsFrom.podCIDRs: node node1 has no spec.podCIDRs (kube-controller-manager allocates them with --allocate-node-cidrs and --cluster-cidr); " +
			"spec.template.bgp.peers[0].addressFrom.annotation: node node1 has no annotation flock.fritzlab.net/tor; " +
			"spec.template.bgp.peers[0].localAddressFrom.nodeAddress: node node1 has no IPv6 InternalIP (its InternalIPs: [])"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tpl, n := testTemplate(), testNode()
			if tc.tpl != nil {
				tc.tpl(tpl)
			}
			if tc.node != nil {
				tc.node(n)
			}
			got, err := Render(tpl, n)
			if err == nil {
				t.Fatalf("rendered %+v", got)
			}
			if err.Error() != tc.want {
				t.Errorf("error\n got %s\nwant %s", err, tc.want)
			}
			if !IsRenderError(err) {
				t.Errorf("%T is not a RenderError", err)
			}
			if !reflect.DeepEqual(got, v1alpha1.NodeConfigSpec{}) {
				t.Errorf("a failed render returned %+v", got)
			}
		})
	}
}

func TestHashRouterID(t *testing.T) {
	// FNV-1a-32 of the name, big-endian: the same on every agent and
	// across restarts.
	if got := HashRouterID("node1"); got != "15.78.40.116" {
		t.Errorf("node1 → %s, want 15.78.40.116", got)
	}
	// 1000 nodes: no duplicate (a 32-bit hash; the agent reports one
	// when it happens).
	seen := map[string]string{}
	for i := range 1000 {
		n := fmt.Sprintf("rack%d-node%03d", i/40, i)
		r := HashRouterID(n)
		if o, dup := seen[r]; dup {
			t.Errorf("%s and %s both hash to %s", o, n, r)
		}
		seen[r] = n
	}
}
