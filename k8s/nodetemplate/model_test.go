package nodetemplate

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/nodeconfigs"
)

// TestModel: goroutines change the templates, the Node's labels,
// annotations, pod CIDRs and addresses, make and delete hand-made
// NodeConfigs, and restart the controller, all at once; at every
// quiescent point the node's NodeConfig is what the model says:
//
//   - hand-made (the model knows it made one): exactly as made, untouched;
//   - else one template selects the node and renders: Render(template,
//     Node), labelled and owned by it; it renders not: the error says so,
//     and no NodeConfig or a rendered one (left as it was) exists;
//   - else (no template, or two or more): none, and two or more is an
//     error naming them all and the node.
//
// FLOCK_SEED=<n> repeats the choices (the interleaving is the
// scheduler's).
func TestModel(t *testing.T) {
	seed := testutil.Seed(t)
	rounds, ops := 60, 12
	if testing.Short() {
		rounds = 10
	}
	a := newAPI(t, nodeWithRack())
	lb := &testutil.SyncBuffer{}
	c := New(Config{Node: "node1", Dyn: a.dyn, Nodes: fakeNodes{a.cs.CoreV1().Nodes()}, Validate: nodeconfig.Validate,
		Log: slog.New(slog.NewTextHandler(lb, nil)), Retry: 10 * time.Millisecond})
	m := &model{}
	ctl := &restartable{t: t, c: c, a: a, gate: &m.gate}
	ctl.start()
	t.Cleanup(ctl.stop)

	seen := map[string]int{}
	for round := range rounds {
		rng := func(g uint64) *rand.Rand { return rand.New(rand.NewPCG(uint64(seed), uint64(round)<<8|g)) }
		a.dyn.ClearActions()
		a.cs.ClearActions()
		var wg sync.WaitGroup
		if round%6 == 5 {
			// Every outcome, one after the other, whatever the seed.
			wg.Go(func() { m.force(a, forced[round/6%len(forced)], rng(5)) })
			wg.Go(func() {
				if r := rng(4); r.IntN(2) == 0 {
					pause(r)
					ctl.stop()
					ctl.start()
				}
			})
		} else {
			wg.Go(func() { m.changeTemplates(a, rng(1), ops/3) })
			wg.Go(func() { m.changeNode(a, rng(2), ops) })
			wg.Go(func() {
				r := rng(3)
				if r.IntN(4) == 0 || m.handMade && r.IntN(3) > 0 {
					m.handMadeOp(a, r)
				}
			})
			wg.Go(func() {
				r := rng(4)
				for range 2 {
					pause(r)
					if r.IntN(3) == 0 {
						ctl.stop()
						pause(r)
						ctl.start()
					}
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.Fatalf("round %d (seed %d)", round, seed)
		}
		var outcome string
		deadline := time.Now().Add(testutil.Timeout)
		for {
			ok, why := settled(c, a)
			if ok {
				outcome, why = m.check(a, c)
				if why == "" {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d (seed %d): %s\nnode %+v\ntemplates %s\nlog:\n%s", round, seed, why,
					a.node("node1").ObjectMeta, templateNames(a), tail(lb.String(), 30))
			}
			time.Sleep(5 * time.Millisecond)
		}
		seen[outcome]++
	}
	t.Logf("outcomes at the %d quiescent points: %v", rounds, seen)
	if !testing.Short() {
		for _, o := range []string{"rendered", "hand-made", "none", "conflict", "render error"} {
			if seen[o] == 0 {
				t.Errorf("no quiescent point was %q: the model test does not reach it (outcomes %v)", o, seen)
			}
		}
	}
}

// forced are the outcomes the forced rounds make, in turn.
var forced = []string{"rendered", "conflict", "hand-made", "render error", "none"}

// force makes the state whose outcome is want: a valid Node in rack r1,
// and t-a alone selecting it (rendered), t-a and t-b (conflict), t-a and a
// hand-made NodeConfig (hand-made), t-a with the AS label gone (render
// error), no template selecting it (none).
func (m *model) force(a *api, want string, r *rand.Rand) {
	m.gate.RLock()
	a.editNode("node1", func(n *corev1.Node) {
		fresh := testNode()
		n.Labels, n.Spec, n.Status = fresh.Labels, fresh.Spec, fresh.Status
		for k, v := range fresh.Annotations {
			n.Annotations[k] = v
		}
		if want == "render error" {
			delete(n.Labels, asnLabel)
		}
	})
	for _, name := range modelTemplates {
		a.deleteTemplate(name)
	}
	if want != "none" {
		tpl := testTemplate()
		tpl.Name, tpl.UID = "t-a", ""
		tpl.Spec.NodeSelector = metav1.LabelSelector{MatchLabels: map[string]string{"rack": "r1"}}
		a.putTemplate(tpl)
		if want == "conflict" {
			tpl.Name = "t-b"
			tpl.Spec.NodeSelector = metav1.LabelSelector{}
			a.putTemplate(tpl)
		}
	}
	m.gate.RUnlock()
	if (want == "hand-made") != m.handMade {
		m.handMadeOp(a, r)
	}
	if want == "hand-made" && !m.handMade {
		m.handMadeOp(a, r) // the controller won the race for the name once
	}
}

// restartable runs the one controller, stopped and started again.
type restartable struct {
	t      *testing.T
	c      *Controller
	a      *api
	gate   *sync.RWMutex
	cancel context.CancelFunc
	done   chan error
}

// start starts the controller and returns once its informers watch. The
// fakes cannot replay what happens between an informer's list and its
// watch (a delete then is lost; the API server replays it from the
// list's resourceVersion), so the changes wait meanwhile (gate).
func (r *restartable) start() {
	if r.cancel != nil {
		return
	}
	r.gate.Lock()
	defer r.gate.Unlock()
	before := r.watches()
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan error, 1)
	go func() { r.done <- r.c.Run(ctx) }()
	deadline := time.Now().Add(testutil.Timeout)
	for r.watches() < before+3 {
		if time.Now().After(deadline) {
			r.t.Errorf("the controller's informers do not watch (%d watches)", r.watches()-before)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// watches counts the watches opened of templates, NodeConfigs and Nodes.
func (r *restartable) watches() int {
	n := 0
	for _, act := range append(r.a.dyn.Actions(), r.a.cs.Actions()...) {
		switch act.GetResource().Resource {
		case GVR.Resource, nodeconfigs.GVR.Resource, "nodes":
			if act.GetVerb() == "watch" {
				n++
			}
		}
	}
	return n
}

func (r *restartable) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			r.t.Errorf("Run: %v", err)
		}
	case <-time.After(testutil.Timeout):
		r.t.Errorf("Run still running %v after its context ended", testutil.Timeout)
	}
	r.cancel = nil
}

func pause(r *rand.Rand) { time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond) }

// model is what the test knows that the API does not say: whether the
// NodeConfig is its hand-made one. Only the hand-made goroutine writes
// it; check reads it after that goroutine is done.
type model struct {
	handMade   bool
	handMadeRV string
	// gate: every change holds it shared; a controller's start, while
	// its informers list and watch, holds it.
	gate sync.RWMutex
}

var modelTemplates = []string{"t-a", "t-b", "t-c"}

func (m *model) changeTemplates(a *api, r *rand.Rand, ops int) {
	for range ops {
		pause(r)
		name := modelTemplates[r.IntN(len(modelTemplates))]
		m.gate.RLock()
		if r.IntN(5) < 2 {
			a.deleteTemplate(name)
		} else {
			a.putTemplate(randomTemplate(r, name))
		}
		m.gate.RUnlock()
	}
}

func pick[T any](r *rand.Rand, v ...T) T { return v[r.IntN(len(v))] }

func randomTemplate(r *rand.Rand, name string) *v1alpha1.NodeConfigTemplate {
	t := &v1alpha1.NodeConfigTemplate{ObjectMeta: metav1.ObjectMeta{Name: name}}
	s := &t.Spec
	s.NodeSelector = pick(r,
		metav1.LabelSelector{MatchLabels: map[string]string{"rack": "r1"}},
		metav1.LabelSelector{MatchLabels: map[string]string{"rack": "r2"}},
		metav1.LabelSelector{},
		metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "rack", Operator: metav1.LabelSelectorOpIn, Values: []string{"r1", "r2"}}}},
		metav1.LabelSelector{MatchLabels: map[string]string{"zone": "z"}},
	)
	switch r.IntN(3) {
	case 0:
		s.ASN = uint32(65000 + r.IntN(10))
	case 1:
		s.ASNFrom = &v1alpha1.ValueFrom{Label: asnLabel}
	default:
		s.ASNFrom = &v1alpha1.ValueFrom{Annotation: "asn"}
	}
	s.RouterIDFrom = pick(r,
		v1alpha1.RouterIDFrom{NodeAddress: v1alpha1.NodeAddressInternalIPv4},
		v1alpha1.RouterIDFrom{Annotation: ridAnn},
		v1alpha1.RouterIDFrom{Hash: v1alpha1.HashNodeName},
		v1alpha1.RouterIDFrom{Hash: v1alpha1.HashNodeName})
	s.PoolsFrom = pick(r,
		v1alpha1.PoolsFrom{PodCIDRs: true},
		v1alpha1.PoolsFrom{PodCIDRs: true},
		v1alpha1.PoolsFrom{Annotation: poolsAnn},
		v1alpha1.PoolsFrom{PodCIDRs: true, Annotation: poolsAnn})
	s.Template.Defaults.IPv4 = r.IntN(4) == 0
	for range r.IntN(3) {
		s.Template.BGP.Peers = append(s.Template.BGP.Peers, pick(r,
			v1alpha1.TemplatePeer{Peer: v1alpha1.Peer{ASN: 64513, Families: []string{"ipv6", "ipv4"}},
				AddressFrom: &v1alpha1.ValueFrom{Annotation: torAnn}, LocalAddressFrom: &v1alpha1.AddressFrom{NodeAddress: v1alpha1.NodeAddressInternalIPv6}},
			v1alpha1.TemplatePeer{Peer: v1alpha1.Peer{Interface: "eth1", ASN: 64513}},
			v1alpha1.TemplatePeer{Peer: v1alpha1.Peer{Address: "2001:db8:ff::1", ASN: uint32(64900 + r.IntN(3)), EBGPMultihop: 4}},
		))
	}
	return t
}

func (m *model) changeNode(a *api, r *rand.Rand, ops int) {
	set := func(mp map[string]string, k string, v ...string) {
		if x := pick(r, v...); x == "" {
			delete(mp, k)
		} else {
			mp[k] = x
		}
	}
	for range ops {
		pause(r)
		m.gate.RLock()
		a.editNode("node1", func(n *corev1.Node) {
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			switch r.IntN(9) {
			case 0:
				set(n.Labels, "rack", "r1", "r2", "")
			case 1:
				set(n.Labels, asnLabel, "64512", "65001", "64512", "65001", "rack-7", "")
			case 2:
				set(n.Annotations, "asn", "65002", "")
			case 3:
				set(n.Annotations, torAnn, "2001:db8:0:1::2", "2001:db8:0:1::3", "2001:db8:0:1::2", "tor1", "")
			case 4:
				set(n.Annotations, ridAnn, "192.0.2.11", "192.0.2.12", "0.0.0.0", "")
			case 5:
				set(n.Annotations, poolsAnn, "2001:db8:200:1::/64,203.0.113.16/28", "2001:db8:200:1::/64,203.0.113.32/28", "2001:db8:200:1::/64", "junk", "")
			case 6:
				n.Spec.PodCIDRs = pick(r, []string{"2001:db8:100:1::/64", "198.51.100.16/28"}, []string{"2001:db8:100:2::/64", "198.51.100.32/28"}, []string{"2001:db8:100:3::/64"}, []string{"2001:db8:100:1::/64"}, nil)
				n.Spec.PodCIDR = ""
			case 7:
				v6 := corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "2001:db8:0:1::1"}
				v4 := corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}
				n.Status.Addresses = pick(r, []corev1.NodeAddress{v6, v4}, []corev1.NodeAddress{v4, v6}, []corev1.NodeAddress{v6}, []corev1.NodeAddress{v4})
			default:
				set(n.Labels, "zone", "z", "")
			}
		})
		m.gate.RUnlock()
	}
}

// handMadeOp takes the NodeConfig over by hand (deleting a rendered one
// first) or gives it back (deleting the hand-made one).
func (m *model) handMadeOp(a *api, r *rand.Rand) {
	res := a.dyn.Resource(nodeconfigs.GVR)
	pause(r)
	m.gate.RLock()
	defer m.gate.RUnlock()
	if m.handMade {
		rv := m.handMadeRV
		if err := res.Delete(ctxb, "node1", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}}); err != nil {
			a.t.Errorf("delete the hand-made NodeConfig: %v", err) // nobody else may touch it
			return
		}
		m.handMade = false
		return
	}
	if u, err := res.Get(ctxb, "node1", metav1.GetOptions{}); err == nil {
		rv := u.GetResourceVersion()
		if err := res.Delete(ctxb, "node1", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}}); err != nil &&
			!apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			a.t.Errorf("delete the rendered NodeConfig: %v", err)
		}
	}
	u, err := a.handMade("node1", uint32(65100+r.IntN(100)))
	switch {
	case err == nil:
		m.handMade, m.handMadeRV = true, u.GetResourceVersion()
	case apierrors.IsAlreadyExists(err): // the controller was quicker
	default:
		a.t.Errorf("create a hand-made NodeConfig: %v", err)
	}
}

// check compares the node's NodeConfig and the controller's error with
// the model; it returns the outcome and "" when they agree, else why not.
func (m *model) check(a *api, c *Controller) (outcome, why string) {
	nc, has := a.nodeConfig("node1")
	cerr := errString(c.Err())
	if m.handMade {
		if !has || Rendered(nc) || nc.ResourceVersion != m.handMadeRV {
			return "", fmt.Sprintf("the hand-made NodeConfig (rv %s) was touched: %s", m.handMadeRV, describe(nc))
		}
		if c.Err() != nil {
			return "", "a hand-made NodeConfig, yet the error " + cerr
		}
		return "hand-made", ""
	}
	if has && !Rendered(nc) {
		return "", "a NodeConfig without the template label nobody made: " + describe(nc)
	}
	node := a.node("node1")
	var selecting []string
	var tpl *v1alpha1.NodeConfigTemplate
	for _, t := range a.templates() {
		sel, err := metav1.LabelSelectorAsSelector(&t.Spec.NodeSelector)
		if err != nil {
			return "", err.Error()
		}
		if sel.Matches(labels.Set(node.Labels)) {
			selecting, tpl = append(selecting, t.Name), t
		}
	}
	switch len(selecting) {
	case 0:
		if has {
			return "", "no template selects the node, yet " + describe(nc)
		}
		if c.Err() != nil {
			return "", "no template selects the node, yet the error " + cerr
		}
		return "none", ""
	case 1:
	default:
		if has {
			return "", fmt.Sprintf("templates %v select the node, yet %s", selecting, describe(nc))
		}
		slices.Sort(selecting)
		list := strings.Join(selecting[:len(selecting)-1], ", ") + " and " + selecting[len(selecting)-1]
		want := "node node1: NodeConfigTemplates " + list + " select it: none is applied (make their nodeSelectors disjoint, or override them with a hand-made NodeConfig node1)"
		if cerr != want {
			return "", fmt.Sprintf("error %q, want %q", cerr, want)
		}
		return "conflict", ""
	}
	spec, err := Render(tpl, node)
	want := ""
	if err != nil {
		want = err.Error()
	} else if verr := nodeconfig.Validate(&spec); verr != nil {
		want = fmt.Sprintf("NodeConfigTemplate %s: node node1: the rendered NodeConfig is invalid: %s", tpl.Name, strings.ReplaceAll(verr.Error(), "\n", "; "))
	}
	if want != "" {
		if cerr != want {
			return "", fmt.Sprintf("error %q, want %q", cerr, want)
		}
		if has && nc.Labels[v1alpha1.TemplateLabel] == "" {
			return "", "not labelled: " + describe(nc)
		}
		return "render error", ""
	}
	switch {
	case !has:
		return "", fmt.Sprintf("template %s selects the node and renders, yet no NodeConfig", tpl.Name)
	case c.Err() != nil:
		return "", "rendered, yet the error " + cerr
	case nc.Labels[v1alpha1.TemplateLabel] != tpl.Name:
		return "", fmt.Sprintf("labels %v, want %s", nc.Labels, tpl.Name)
	case len(nc.OwnerReferences) != 1 || nc.OwnerReferences[0].UID != tpl.UID:
		return "", fmt.Sprintf("owners %+v, want %s", nc.OwnerReferences, tpl.UID)
	case !equality.Semantic.DeepEqual(nc.Spec, spec):
		return "", fmt.Sprintf("spec %+v, want %+v", nc.Spec, spec)
	}
	return "rendered", ""
}

func templateNames(a *api) string {
	var out []string
	for _, t := range a.templates() {
		out = append(out, fmt.Sprintf("%s %+v", t.Name, t.Spec))
	}
	return strings.Join(out, "\n")
}

func tail(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
