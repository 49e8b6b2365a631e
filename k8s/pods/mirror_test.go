package pods

import (
	"slices"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// event is one report, in order.
type event struct {
	gone  bool
	id    podmeta.ID
	ready bool
}

type events struct {
	mu  sync.Mutex
	got []event
}

func (e *events) PodReady(id podmeta.ID, ready bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, event{id: id, ready: ready})
}

func (e *events) PodGone(id podmeta.ID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, event{gone: true, id: id})
}

func (e *events) list() []event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.got)
}

// Issue 18, defect 3: kubelet re-creates a deleted mirror pod with a new
// UID. Every report names the static pod by its static UID, so the new
// mirror's readiness reaches the sandbox set up through the old one.
func TestMirrorRecreatedReportsStaticUID(t *testing.T) {
	cs := fake.NewClientset(mirror("etcd-vm", "vm", "static-uid"))
	ev := &events{}
	s := New(kubeclient.NewFactory(), podsOf(cs), "vm", ev)
	ctx := run(t, s, cs)
	api := cs.CoreV1().Pods("shop")
	if err := api.Delete(ctx, "etcd-vm", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := mirror("etcd-vm", "vm", "static-uid")
	again.UID = "mirror-uid-2"
	if _, err := api.Create(ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := podmeta.ID{Namespace: "shop", Name: "etcd-vm", UID: "mirror-uid", StaticUID: "static-uid"}
	second := podmeta.ID{Namespace: "shop", Name: "etcd-vm", UID: "mirror-uid-2", StaticUID: "static-uid"}
	want := []event{{id: first, ready: true}, {gone: true, id: first}, {id: second, ready: true}}
	testutil.WaitFor(t, "three reports", func() bool { return len(ev.list()) >= len(want) })
	if got := ev.list(); !slices.Equal(got, want) {
		t.Errorf("reports %+v, want %+v", got, want)
	}
	if got := s.StaticUID(second); got != "static-uid" {
		t.Errorf("StaticUID(current mirror) = %q", got)
	}
	if got := s.StaticUID(first); got != "" {
		t.Errorf("StaticUID(deleted mirror) = %q, want none: the cache no longer has it", got)
	}
	if got := s.StaticUID(podmeta.ID{Namespace: "shop", Name: "etcd-vm"}); got != "" {
		t.Errorf("StaticUID without a UID = %q", got)
	}
}

// A relist after a watch gap shows a pod replaced under its name as an
// update: the old one is gone, the new one is reported even when both
// are Ready.
func TestReplacedPodSeenAsUpdate(t *testing.T) {
	ev := &events{}
	h := handler(ev)
	old := mirror("etcd-vm", "vm", "static-uid")
	repl := mirror("etcd-vm", "vm", "static-uid")
	repl.UID = "mirror-uid-2"
	h.OnUpdate(old, repl)
	h.OnUpdate(repl, repl) // a resync: nothing to report
	sts := pod("web-0", "vm", true)
	sts2 := pod("web-0", "vm", true)
	sts2.UID = "uid-web-0-again"
	h.OnUpdate(sts, sts2)
	want := []event{
		{gone: true, id: ID(old)}, {id: ID(repl), ready: true},
		{gone: true, id: ID(sts)}, {id: ID(sts2), ready: true},
	}
	if got := ev.list(); !slices.Equal(got, want) {
		t.Errorf("reports %+v, want %+v", got, want)
	}
}
