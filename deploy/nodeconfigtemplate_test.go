package deploy_test

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/nodetemplate"
)

const (
	templateExample = "examples/nodeconfigtemplate.yaml"
	templateCRDFile = "crd/flock.fritzlab.net_nodeconfigtemplates.yaml"
)

// exampleNode is node-a of the address plan as the template sees it:
// in rack1, its first server port's address its InternalIP, the ToR's
// address annotated, its pod CIDRs carved by kube-controller-manager from
// --cluster-cidr 2001:db8:100::/49,198.51.100.0/25 (masks /64, /28).
func exampleNode() *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a",
			Labels:      map[string]string{"flock.fritzlab.net/rack": "rack1"},
			Annotations: map[string]string{"flock.fritzlab.net/tor-address": "2001:db8:0:1::2"}},
		Spec:   corev1.NodeSpec{PodCIDRs: []string{"2001:db8:100:1::/64", "198.51.100.0/28"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "2001:db8:0:1::1"}}},
	}
}

// The example template parses into the API type, passes the CRD's schema,
// selects node-a, and renders for it the example NodeConfig (the router
// ID apart: hashed from the name): what deploy/tor's ToRs peer with. Its
// pod CIDRs come from the cluster CIDR it names.
func TestExampleNodeConfigTemplate(t *testing.T) {
	docs := readDocs(t, templateExample)
	if len(docs) != 1 || docs[0].kind != v1alpha1.NodeConfigTemplateKind {
		t.Fatalf("%s: want one NodeConfigTemplate", templateExample)
	}
	tpl := strict[v1alpha1.NodeConfigTemplate](t, docs[0])
	if tpl.APIVersion != v1alpha1.GroupVersion.String() || tpl.Namespace != "" {
		t.Errorf("apiVersion %q namespace %q", tpl.APIVersion, tpl.Namespace)
	}
	var obj any
	if err := yaml.Unmarshal(docs[0].data, &obj); err != nil {
		t.Fatal(err)
	}
	for _, e := range validate("", obj, crdSchema(t, templateCRDFile)) {
		t.Errorf("%s: %s", templateExample, e)
	}

	n := exampleNode()
	sel, err := metav1.LabelSelectorAsSelector(&tpl.Spec.NodeSelector)
	if err != nil || !sel.Matches(labels.Set(n.Labels)) {
		t.Fatalf("the template does not select node-a (labels %v): %v", n.Labels, err)
	}
	spec, err := nodetemplate.Render(tpl, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := nodeconfig.Validate(&spec); err != nil {
		t.Errorf("the rendered NodeConfig is invalid: %v", err)
	}
	nc := strict[v1alpha1.NodeConfig](t, readDocs(t, example)[0])
	want := nc.Spec
	want.RouterID = nodetemplate.HashRouterID("node-a")
	if !equality.Semantic.DeepEqual(spec, want) {
		t.Errorf("node-a renders\n%+v\nwant (%s, the router ID hashed)\n%+v", spec, example, want)
	}
	clusterCIDR := []netip.Prefix{netip.MustParsePrefix("2001:db8:100::/49"), netip.MustParsePrefix("198.51.100.0/25")}
	for _, p := range spec.Pools {
		pfx := netip.MustParsePrefix(p.CIDR)
		if !clusterCIDR[0].Contains(pfx.Addr()) && !clusterCIDR[1].Contains(pfx.Addr()) {
			t.Errorf("pool %s outside the cluster CIDR %v", pfx, clusterCIDR)
		}
	}
}

// The schema refuses what a template must not say: a literal router ID
// or pools, no router ID or pool source, a node address that is no
// InternalIP of a family.
func TestTemplateSchemaRejects(t *testing.T) {
	sch := crdSchema(t, templateCRDFile)
	const ok = "nodeSelector: {}, asn: 64512, routerIDFrom: {hash: NodeName}, poolsFrom: {podCIDRs: true}"
	for _, tc := range []struct{ name, spec string }{
		{"a literal routerID", ok + ", routerID: 192.0.2.1"},
		{"literal pools", ok + ", pools: [{cidr: '2001:db8:100:1::/64'}]"},
		{"no nodeSelector", "asn: 64512, routerIDFrom: {hash: NodeName}, poolsFrom: {podCIDRs: true}"},
		{"no routerIDFrom", "nodeSelector: {}, asn: 64512, poolsFrom: {podCIDRs: true}"},
		{"no poolsFrom", "nodeSelector: {}, asn: 64512, routerIDFrom: {hash: NodeName}"},
		{"routerIDFrom an IPv6 address", "nodeSelector: {}, asn: 64512, routerIDFrom: {nodeAddress: InternalIPv6}, poolsFrom: {podCIDRs: true}"},
		{"routerIDFrom hash of something else", "nodeSelector: {}, asn: 64512, routerIDFrom: {hash: UID}, poolsFrom: {podCIDRs: true}"},
		{"asn 0", "nodeSelector: {}, asn: 0, routerIDFrom: {hash: NodeName}, poolsFrom: {podCIDRs: true}"},
		{"localAddressFrom an ExternalIP", ok + ", template: {bgp: {peers: [{addressFrom: {annotation: tor}, asn: 64513, localAddressFrom: {nodeAddress: ExternalIP}}]}}"},
		{"an unknown peer field", ok + ", template: {bgp: {peers: [{addressFrom: {annotation: tor}, asn: 64513, addressFromLabel: x}]}}"},
		{"a peer without asn", ok + ", template: {bgp: {peers: [{interface: eth1}]}}"},
	} {
		var obj any
		if err := yaml.Unmarshal([]byte("apiVersion: flock.fritzlab.net/v1alpha1\nkind: NodeConfigTemplate\nmetadata: {name: x}\nspec: {"+tc.spec+"}\n"), &obj); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if errs := validate("", obj, sch); len(errs) == 0 {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	var obj any
	if err := yaml.Unmarshal([]byte("apiVersion: flock.fritzlab.net/v1alpha1\nkind: NodeConfigTemplate\nmetadata: {name: x}\nspec: {"+ok+"}\n"), &obj); err != nil {
		t.Fatal(err)
	}
	if errs := validate("", obj, sch); len(errs) > 0 {
		t.Errorf("the minimal template refused: %v", errs)
	}
}
