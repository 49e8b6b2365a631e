package nodetemplate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynfake "k8s.io/client-go/dynamic/fake"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/nodeconfigs"
)

// api is a fake API server: client-go's fakes, with what the controller's
// safety rests on and the fakes lack. Every write through the dynamic
// client gets a resourceVersion (and a create a UID and generation 1); an
// update must carry the stored resourceVersion (a conflict otherwise, as
// for a custom resource); a delete's preconditions are checked; a status
// update changes the status only, any other update keeps it. The fake
// serializes its reactions (one lock), so a check and its write are one
// step, as in the API server.
type api struct {
	t   testing.TB
	dyn *dynfake.FakeDynamicClient
	cs  *k8sfake.Clientset
	rv  int64 // under the fake's lock
}

func newAPI(t testing.TB, node *corev1.Node) *api {
	a := &api{t: t}
	a.dyn = dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		GVR: "NodeConfigTemplateList", nodeconfigs.GVR: "NodeConfigList", eventsGVR: "EventList",
	})
	a.cs = k8sfake.NewClientset(node)
	tr := a.dyn.Tracker()
	next := func() string {
		a.rv++
		return strconv.FormatInt(a.rv, 10)
	}
	a.dyn.PrependReactor("create", "*", func(act clienttesting.Action) (bool, runtime.Object, error) {
		ca := act.(clienttesting.CreateAction)
		u := ca.GetObject().(*unstructured.Unstructured).DeepCopy()
		if u.GetUID() == "" {
			u.SetUID(types.UID("uid-" + next()))
		}
		u.SetResourceVersion(next())
		u.SetGeneration(1)
		if err := tr.Create(ca.GetResource(), u, ca.GetNamespace()); err != nil {
			return true, nil, err
		}
		return true, u.DeepCopy(), nil
	})
	a.dyn.PrependReactor("update", "*", func(act clienttesting.Action) (bool, runtime.Object, error) {
		ua := act.(clienttesting.UpdateAction)
		u := ua.GetObject().(*unstructured.Unstructured).DeepCopy()
		gvr, ns := ua.GetResource(), ua.GetNamespace()
		obj, err := tr.Get(gvr, ns, u.GetName())
		if err != nil {
			return true, nil, err
		}
		cur := obj.(*unstructured.Unstructured)
		if u.GetResourceVersion() == "" || u.GetResourceVersion() != cur.GetResourceVersion() ||
			(u.GetUID() != "" && u.GetUID() != cur.GetUID()) {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), u.GetName(), errors.New("the object has been modified"))
		}
		if ua.GetSubresource() == "status" {
			st := u.Object["status"]
			u = cur.DeepCopy()
			u.Object["status"] = st
		} else {
			if st, ok := cur.Object["status"]; ok {
				u.Object["status"] = st
			} else {
				delete(u.Object, "status")
			}
			u.SetUID(cur.GetUID())
			u.SetGeneration(cur.GetGeneration())
			if !equality.Semantic.DeepEqual(u.Object["spec"], cur.Object["spec"]) {
				u.SetGeneration(cur.GetGeneration() + 1)
			}
		}
		u.SetResourceVersion(next())
		if err := tr.Update(gvr, u, ns); err != nil {
			return true, nil, err
		}
		return true, u.DeepCopy(), nil
	})
	a.dyn.PrependReactor("delete", "*", func(act clienttesting.Action) (bool, runtime.Object, error) {
		da := act.(clienttesting.DeleteAction)
		gvr, ns := da.GetResource(), da.GetNamespace()
		obj, err := tr.Get(gvr, ns, da.GetName())
		if err != nil {
			return true, nil, err
		}
		cur := obj.(*unstructured.Unstructured)
		if p := da.GetDeleteOptions().Preconditions; p != nil {
			if (p.UID != nil && *p.UID != cur.GetUID()) || (p.ResourceVersion != nil && *p.ResourceVersion != cur.GetResourceVersion()) {
				return true, nil, apierrors.NewConflict(gvr.GroupResource(), da.GetName(), errors.New("precondition failed"))
			}
		}
		return true, nil, tr.Delete(gvr, ns, da.GetName())
	})
	return a
}

var ctxb = context.Background()

// genAnn counts the test's edits of a Node.
const genAnn = "test/gen"

func toU(t testing.TB, obj any, apiVersion, kind string) *unstructured.Unstructured {
	t.Helper()
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: raw}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	return u
}

// putTemplate creates or replaces a template (its UID kept).
func (a *api) putTemplate(tpl *v1alpha1.NodeConfigTemplate) {
	a.t.Helper()
	res := a.dyn.Resource(GVR)
	for {
		u := toU(a.t, tpl, v1alpha1.GroupVersion.String(), v1alpha1.NodeConfigTemplateKind)
		delete(u.Object, "status")
		cur, err := res.Get(ctxb, tpl.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if _, err = res.Create(ctxb, u, metav1.CreateOptions{}); err == nil {
				return
			}
		} else if err == nil {
			u.SetResourceVersion(cur.GetResourceVersion())
			u.SetUID(cur.GetUID())
			if _, err = res.Update(ctxb, u, metav1.UpdateOptions{}); err == nil {
				return
			}
		}
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			a.t.Errorf("template %s: %v", tpl.Name, err)
			return
		}
	}
}

func (a *api) deleteTemplate(name string) {
	a.t.Helper()
	if err := a.dyn.Resource(GVR).Delete(ctxb, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		a.t.Errorf("delete template %s: %v", name, err)
	}
}

// template reads a template back (status included).
func (a *api) template(name string) (*v1alpha1.NodeConfigTemplate, bool) {
	a.t.Helper()
	u, err := a.dyn.Resource(GVR).Get(ctxb, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		a.t.Fatal(err)
	}
	var tpl v1alpha1.NodeConfigTemplate
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &tpl); err != nil {
		a.t.Fatal(err)
	}
	return &tpl, true
}

func (a *api) templates() []*v1alpha1.NodeConfigTemplate {
	a.t.Helper()
	l, err := a.dyn.Resource(GVR).List(ctxb, metav1.ListOptions{})
	if err != nil {
		a.t.Fatal(err)
	}
	var objs []any
	for i := range l.Items {
		objs = append(objs, &l.Items[i])
	}
	out, problems := templates(objs)
	if len(problems) > 0 {
		a.t.Fatal(problems)
	}
	return out
}

// nodeConfig reads a NodeConfig.
func (a *api) nodeConfig(name string) (*v1alpha1.NodeConfig, bool) {
	a.t.Helper()
	u, err := a.dyn.Resource(nodeconfigs.GVR).Get(ctxb, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		a.t.Fatal(err)
	}
	var nc v1alpha1.NodeConfig
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &nc); err != nil {
		a.t.Fatal(err)
	}
	return &nc, true
}

// handMade creates a NodeConfig without the template label; it returns
// the stored object (its resourceVersion) or the API's error.
func (a *api) handMade(name string, asn uint32) (*unstructured.Unstructured, error) {
	nc := &v1alpha1.NodeConfig{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"by": "hand"}},
		Spec: v1alpha1.NodeConfigSpec{ASN: asn, RouterID: "192.0.2.99", Pools: []v1alpha1.Pool{{CIDR: "2001:db8:999::/64"}}}}
	u := toU(a.t, nc, v1alpha1.GroupVersion.String(), v1alpha1.NodeConfigKind)
	delete(u.Object, "status")
	return a.dyn.Resource(nodeconfigs.GVR).Create(ctxb, u, metav1.CreateOptions{})
}

func (a *api) deleteNodeConfig(name string) {
	a.t.Helper()
	if err := a.dyn.Resource(nodeconfigs.GVR).Delete(ctxb, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		a.t.Errorf("delete NodeConfig %s: %v", name, err)
	}
}

// node reads the Node.
func (a *api) node(name string) *corev1.Node {
	a.t.Helper()
	n, err := a.cs.CoreV1().Nodes().Get(ctxb, name, metav1.GetOptions{})
	if err != nil {
		a.t.Fatal(err)
	}
	return n
}

// editNode changes the Node.
func (a *api) editNode(name string, f func(*corev1.Node)) {
	a.t.Helper()
	n := a.node(name)
	f(n)
	// The witness settle compares (the fake sets no resourceVersion).
	gen, _ := strconv.Atoi(n.Annotations[genAnn])
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations[genAnn] = strconv.Itoa(gen + 1)
	if _, err := a.cs.CoreV1().Nodes().Update(ctxb, n, metav1.UpdateOptions{}); err != nil {
		a.t.Errorf("update node: %v", err)
	}
}

// events lists the Warning Events on Nodes, as "reason: message".
func (a *api) events() []string {
	a.t.Helper()
	l, err := a.dyn.Resource(eventsGVR).Namespace("default").List(ctxb, metav1.ListOptions{})
	if err != nil {
		a.t.Fatal(err)
	}
	var out []string
	for _, u := range l.Items {
		var ev corev1.Event
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ev); err != nil {
			a.t.Fatal(err)
		}
		if ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.Kind != "Node" || ev.InvolvedObject.Name == "" || ev.InvolvedObject.UID == "" {
			a.t.Errorf("event %+v", ev)
		}
		out = append(out, ev.Reason+": "+ev.Message)
	}
	return out
}

// running is a controller run by a test.
type running struct {
	t    testing.TB
	c    *Controller
	log  *testutil.SyncBuffer
	stop func()
}

// start runs a controller for node1 against a until the test ends, and
// waits for its first pass.
func start(t testing.TB, a *api, validate func(*v1alpha1.NodeConfigSpec) error) *running {
	t.Helper()
	lb := &testutil.SyncBuffer{}
	c := New(Config{Node: "node1", Dyn: a.dyn, Nodes: fakeNodes{a.cs.CoreV1().Nodes()}, Validate: validate,
		Log: slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	_, stop := testutil.Run(t, c.Run)
	r := &running{t: t, c: c, log: lb, stop: stop}
	r.waitPasses(1)
	return r
}

func (r *running) passes() int {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.c.passes
}

// waitPasses waits until the controller has finished n passes.
func (r *running) waitPasses(n int) {
	r.t.Helper()
	testutil.Eventually(r.t, fmt.Sprintf("pass %d of the controller", n), func() (bool, string) {
		p := r.passes()
		return p >= n, fmt.Sprintf("%d passes", p)
	})
}

// kickAndWait waits for a pass that started after change was made and
// seen: change must make an informer event.
func (r *running) kickAndWait(change func()) {
	r.t.Helper()
	n := r.passes()
	change()
	r.waitPasses(n + 1)
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

func describe(nc *v1alpha1.NodeConfig) string {
	if nc == nil {
		return "no NodeConfig"
	}
	return fmt.Sprintf("NodeConfig %s labels %v owners %v rv %s spec %+v", nc.Name, nc.Labels, nc.OwnerReferences, nc.ResourceVersion, nc.Spec)
}

// settle waits until the controller's last pass read the current state
// (Node, NodeConfig, templates) — so it acted on it, and changed nothing
// more.
func (r *running) settle(a *api) {
	r.t.Helper()
	testutil.Eventually(r.t, "the controller to act on the current state", func() (bool, string) {
		return r.settled(a)
	})
}

func (r *running) settled(a *api) (bool, string) { return settled(r.c, a) }

// settled tells whether c's last pass read the current state of a.
func settled(c *Controller, a *api) (bool, string) {
	c.mu.Lock()
	obs := c.observed
	c.mu.Unlock()
	n := a.node("node1")
	if obs.node == nil || obs.node.Annotations[genAnn] != n.Annotations[genAnn] {
		return false, "the Node"
	}
	rv := ""
	if u, err := a.dyn.Resource(nodeconfigs.GVR).Get(ctxb, "node1", metav1.GetOptions{}); err == nil {
		rv = u.GetResourceVersion()
	}
	if obs.nodeConfig != rv {
		return false, fmt.Sprintf("NodeConfig read at %q, now %q", obs.nodeConfig, rv)
	}
	l, err := a.dyn.Resource(GVR).List(ctxb, metav1.ListOptions{})
	if err != nil {
		return false, err.Error()
	}
	want := map[string]string{}
	for _, u := range l.Items {
		want[u.GetName()] = fmt.Sprintf("%s/%d", u.GetUID(), u.GetGeneration())
	}
	if !maps.Equal(obs.templates, want) {
		return false, fmt.Sprintf("templates read %v, now %v", obs.templates, want)
	}
	return true, ""
}

// fakeNodes tells the reflector the typed fake cannot stream a list.
type fakeNodes struct {
	kubeclient.ListerWatcher[*corev1.NodeList]
}

func (fakeNodes) IsWatchListSemanticsUnSupported() bool { return true }
