package nodetemplate

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/nodeconfigs"
)

// rackTemplate is testTemplate named name, selecting rack=r1.
func rackTemplate(name string) *v1alpha1.NodeConfigTemplate {
	t := testTemplate()
	t.Name, t.UID = name, ""
	t.Spec.NodeSelector = metav1.LabelSelector{MatchLabels: map[string]string{"rack": "r1"}}
	return t
}

// assertRendered checks the node's NodeConfig is tpl's rendering: the
// label, the owner, the spec.
func assertRendered(t *testing.T, a *api, tplName string) *v1alpha1.NodeConfig {
	t.Helper()
	nc, ok := a.nodeConfig("node1")
	if !ok {
		t.Fatalf("no NodeConfig node1, want one rendered from %s", tplName)
	}
	tpl, ok := a.template(tplName)
	if !ok {
		t.Fatalf("no template %s", tplName)
	}
	want, err := Render(tpl, a.node("node1"))
	if err != nil {
		t.Fatal(err)
	}
	if nc.Labels[v1alpha1.TemplateLabel] != tplName {
		t.Errorf("labels %v, want %s=%s", nc.Labels, v1alpha1.TemplateLabel, tplName)
	}
	if len(nc.OwnerReferences) != 1 || nc.OwnerReferences[0].UID != tpl.UID || nc.OwnerReferences[0].Kind != v1alpha1.NodeConfigTemplateKind ||
		nc.OwnerReferences[0].Name != tplName || nc.OwnerReferences[0].Controller == nil || !*nc.OwnerReferences[0].Controller {
		t.Errorf("owners %+v, want the template %s (%s)", nc.OwnerReferences, tplName, tpl.UID)
	}
	if !equality.Semantic.DeepEqual(nc.Spec, want) {
		t.Errorf("spec\n got %+v\nwant %+v", nc.Spec, want)
	}
	return nc
}

func nodeWithRack() *corev1.Node {
	n := testNode()
	n.Annotations[genAnn] = "0"
	return n
}

// A template selecting the node renders its NodeConfig: labelled, owned,
// the spec Render gives; the template counts it. It follows a label
// change, and goes when the node is no longer selected or the template
// is deleted.
func TestRenderFollowDelete(t *testing.T) {
	a := newAPI(t, nodeWithRack())
	a.putTemplate(rackTemplate("rack-r1"))
	r := start(t, a, nodeconfig.Validate)
	r.settle(a)
	nc := assertRendered(t, a, "rack-r1")
	if nc.Spec.ASN != 64512 {
		t.Errorf("asn %d", nc.Spec.ASN)
	}
	if err := nodeconfig.Validate(&nc.Spec); err != nil {
		t.Errorf("the rendered NodeConfig is invalid: %v", err)
	}
	if tpl, _ := a.template("rack-r1"); tpl.Status.Nodes != 1 {
		t.Errorf("status.nodes = %d, want 1", tpl.Status.Nodes)
	}
	if r.c.Err() != nil || r.c.Applied() != "rack-r1" {
		t.Errorf("Err %v, Applied %q", r.c.Err(), r.c.Applied())
	}

	// The rack's AS changes: the NodeConfig follows.
	a.editNode("node1", func(n *corev1.Node) { n.Labels[asnLabel] = "65010" })
	r.settle(a)
	if nc := assertRendered(t, a, "rack-r1"); nc.Spec.ASN != 65010 {
		t.Errorf("asn %d after the label change, want 65010", nc.Spec.ASN)
	}
	// So does the template.
	tpl := rackTemplate("rack-r1")
	tpl.Spec.Template.BGP.Peers[0].ASN = 64600
	a.putTemplate(tpl)
	r.settle(a)
	if nc := assertRendered(t, a, "rack-r1"); nc.Spec.BGP.Peers[0].ASN != 64600 {
		t.Errorf("peer asn %d after the template change", nc.Spec.BGP.Peers[0].ASN)
	}

	// Moved to another rack: deselected, the NodeConfig goes.
	a.editNode("node1", func(n *corev1.Node) { n.Labels["rack"] = "r2" })
	r.settle(a)
	if nc, ok := a.nodeConfig("node1"); ok {
		t.Errorf("deselected, still %s", describe(nc))
	}
	if tpl, _ := a.template("rack-r1"); tpl.Status.Nodes != 0 {
		t.Errorf("status.nodes = %d, want 0", tpl.Status.Nodes)
	}
	if r.c.Err() != nil {
		t.Errorf("Err %v", r.c.Err())
	}

	// Back, then the template deleted.
	a.editNode("node1", func(n *corev1.Node) { n.Labels["rack"] = "r1" })
	r.settle(a)
	assertRendered(t, a, "rack-r1")
	a.deleteTemplate("rack-r1")
	r.settle(a)
	if nc, ok := a.nodeConfig("node1"); ok {
		t.Errorf("template deleted, still %s", describe(nc))
	}
	if len(a.events()) != 0 {
		t.Errorf("events %v", a.events())
	}
}

// A hand-made NodeConfig (no template label) is never touched: not
// updated to the template's spec, not deleted when no template selects
// the node, not deleted on a conflict; and it silences both.
func TestHandMadeUntouched(t *testing.T) {
	a := newAPI(t, nodeWithRack())
	hm, err := a.handMade("node1", 65099)
	if err != nil {
		t.Fatal(err)
	}
	a.putTemplate(rackTemplate("rack-r1"))
	r := start(t, a, nodeconfig.Validate)
	check := func(what string) {
		t.Helper()
		r.settle(a)
		nc, ok := a.nodeConfig("node1")
		if !ok || nc.ResourceVersion != hm.GetResourceVersion() || nc.Spec.ASN != 65099 || nc.Labels["by"] != "hand" || len(nc.OwnerReferences) != 0 {
			t.Fatalf("%s: the hand-made NodeConfig was touched: %s", what, describe(nc))
		}
		if r.c.Err() != nil || r.c.Applied() != "" {
			t.Errorf("%s: Err %v, Applied %q", what, r.c.Err(), r.c.Applied())
		}
	}
	check("selected")
	a.editNode("node1", func(n *corev1.Node) { n.Labels[asnLabel] = "65010" })
	check("the node's labels changed")
	a.putTemplate(rackTemplate("other")) // two templates select the node
	check("two templates")
	a.deleteTemplate("other")
	a.deleteTemplate("rack-r1")
	check("no template")
	a.editNode("node1", func(n *corev1.Node) { delete(n.Labels, asnLabel) }) // would not render
	a.putTemplate(rackTemplate("rack-r1"))
	check("a render error")
	if ev := a.events(); len(ev) != 0 {
		t.Errorf("events %v", ev)
	}

	// Deleted by its owner: the template takes over.
	a.editNode("node1", func(n *corev1.Node) { n.Labels[asnLabel] = "64512" })
	a.deleteNodeConfig("node1")
	r.settle(a)
	assertRendered(t, a, "rack-r1")
}

// Two templates selecting the node: neither applies (a rendered NodeConfig
// goes), the error names both and the node, is logged once and made a
// Warning Event on the Node; one template less and the other applies.
func TestConflict(t *testing.T) {
	a := newAPI(t, nodeWithRack())
	a.putTemplate(rackTemplate("rack-r1"))
	r := start(t, a, nodeconfig.Validate)
	r.settle(a)
	assertRendered(t, a, "rack-r1")

	all := rackTemplate("all")
	all.Spec.NodeSelector = metav1.LabelSelector{}
	a.putTemplate(all)
	r.settle(a)
	if nc, ok := a.nodeConfig("node1"); ok {
		t.Errorf("in conflict, still %s", describe(nc))
	}
	want := "node node1: NodeConfigTemplates all and rack-r1 select it: none is applied (make their nodeSelectors disjoint, or override them with a hand-made NodeConfig node1)"
	if got := errString(r.c.Err()); got != want {
		t.Errorf("Err\n got %s\nwant %s", got, want)
	}
	// Another event, the same conflict: logged once.
	a.editNode("node1", func(n *corev1.Node) { n.Labels["unrelated"] = "x" })
	r.settle(a)
	if n := strings.Count(r.log.String(), "NodeConfigTemplates all and rack-r1 select it"); n != 1 {
		t.Errorf("the conflict logged %d times, want once:\n%s", n, r.log)
	}
	if ev := a.events(); !slices.Equal(ev, []string{ReasonConflict + ": " + want}) {
		t.Errorf("events %q", ev)
	}

	a.deleteTemplate("rack-r1")
	r.settle(a)
	assertRendered(t, a, "all")
	if r.c.Err() != nil {
		t.Errorf("Err %v", r.c.Err())
	}
	if !strings.Contains(r.log.String(), "NodeConfigTemplate: resolved") {
		t.Error("the conflict's end not logged")
	}
}

// A render error creates nothing, leaves a rendered NodeConfig as it was,
// and says what is wrong (Err, log, Event); fixed, the NodeConfig follows.
func TestRenderErrorLeavesNothing(t *testing.T) {
	n := nodeWithRack()
	delete(n.Labels, asnLabel)
	a := newAPI(t, n)
	a.putTemplate(rackTemplate("rack-r1"))
	r := start(t, a, nodeconfig.Validate)
	r.settle(a)
	if nc, ok := a.nodeConfig("node1"); ok {
		t.Fatalf("a render error created %s", describe(nc))
	}
	want := "NodeConfigTemplate rack-r1: spec.asnFrom.label: node node1 has no label flock.fritzlab.net/asn"
	if got := errString(r.c.Err()); got != want {
		t.Errorf("Err\n got %s\nwant %s", got, want)
	}
	if ev := a.events(); !slices.Equal(ev, []string{ReasonRenderError + ": " + want}) {
		t.Errorf("events %q", ev)
	}

	a.editNode("node1", func(n *corev1.Node) { n.Labels[asnLabel] = "64512" })
	r.settle(a)
	before := assertRendered(t, a, "rack-r1")
	if r.c.Err() != nil {
		t.Errorf("Err %v", r.c.Err())
	}

	// The ToR annotation goes bad: the NodeConfig stays as it was.
	a.editNode("node1", func(n *corev1.Node) { n.Annotations[torAnn] = "not-an-address" })
	r.settle(a)
	nc, ok := a.nodeConfig("node1")
	if !ok || nc.ResourceVersion != before.ResourceVersion {
		t.Errorf("a render error changed the NodeConfig: %s", describe(nc))
	}
	want = `NodeConfigTemplate rack-r1: spec.template.bgp.peers[0].addressFrom.annotation: node node1: annotation flock.fritzlab.net/tor="not-an-address" is not an IP address`
	if got := errString(r.c.Err()); got != want {
		t.Errorf("Err\n got %s\nwant %s", got, want)
	}

	// A rendering the agent would refuse is an error too (IPv4 pods by
	// default, no IPv4 pool).
	a.editNode("node1", func(n *corev1.Node) {
		n.Annotations[torAnn] = "2001:db8:0:1::2"
		n.Spec.PodCIDRs = n.Spec.PodCIDRs[:1]
	})
	r.settle(a)
	if nc, _ := a.nodeConfig("node1"); nc == nil || nc.ResourceVersion != before.ResourceVersion {
		t.Errorf("an invalid rendering changed the NodeConfig: %s", describe(nc))
	}
	want = "NodeConfigTemplate rack-r1: node node1: the rendered NodeConfig is invalid: spec.defaults.ipv4: true, but no pool is a (non-shared) IPv4 node summary; add one or set ipv4: false"
	if got := errString(r.c.Err()); got != want {
		t.Errorf("Err\n got %s\nwant %s", got, want)
	}
}

// The node missing from the API: nothing rendered, nothing deleted.
func TestNoNodeObject(t *testing.T) {
	a := newAPI(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other"}})
	a.putTemplate(rackTemplate("rack-r1"))
	r := start(t, a, nil)
	testErr := "node node1: no Node object of that name: NodeConfigTemplates are not rendered for it"
	testutil.WaitFor(t, "the error", func() bool { return errString(r.c.Err()) == testErr })
	if _, ok := a.nodeConfig("node1"); ok {
		t.Error("rendered without a Node")
	}
}

// A router ID another NodeConfig has is reported when it is written.
func TestDuplicateRouterID(t *testing.T) {
	a := newAPI(t, nodeWithRack())
	other := toU(t, &v1alpha1.NodeConfig{ObjectMeta: metav1.ObjectMeta{Name: "node7"},
		Spec: v1alpha1.NodeConfigSpec{ASN: 1, RouterID: "192.0.2.1", Pools: []v1alpha1.Pool{{CIDR: "2001:db8:7::/64"}}}},
		v1alpha1.GroupVersion.String(), v1alpha1.NodeConfigKind)
	if _, err := a.dyn.Resource(nodeconfigs.GVR).Create(ctxb, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.putTemplate(rackTemplate("rack-r1"))
	r := start(t, a, nodeconfig.Validate)
	r.settle(a)
	assertRendered(t, a, "rack-r1")
	want := ReasonDuplicateID + ": node node1: router ID 192.0.2.1 is also the router ID of NodeConfig node7: give the nodes distinct ones (routerIDFrom)"
	testutil.WaitFor(t, "the duplicate's Event", func() bool { return slices.Contains(a.events(), want) })
}
