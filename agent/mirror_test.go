package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
	"code.fritzlab.net/fritzlab/flock/k8s/pods"
)

// podEvents hands the informer's events to the agent, as the daemon does.
type podEvents struct{ a *agent.Agent }

func (p *podEvents) PodReady(id podmeta.ID, ready bool) { p.a.SetPodReady(id, ready) }
func (p *podEvents) PodGone(id podmeta.ID)              { p.a.ForgetPod(id) }

// mirrorPod is the API's mirror of the static pod staticUID, with its own
// UID uid.
func mirrorPod(uid, staticUID string, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "kube-system", Name: "dns-node", UID: types.UID(uid),
			Annotations: map[string]string{
				pods.MirrorAnnotation:        staticUID,
				"flock.fritzlab.net/anycast": "2001:db8:53::53",
				"flock.fritzlab.net/ipv4":    "false",
			},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Node", Name: "vm"}},
		},
		Spec:   corev1.PodSpec{NodeName: "vm", Containers: []corev1.Container{{Image: "dns:1"}}},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

// kubeEnv is an agent in Kubernetes mode on the pods of cs: its pod
// source is k8s/pods' informer, whose events reach the agent as in the
// daemon and are all known before the restore. Like a restart, it reuses
// the kernel and the store directory of prev (when not nil).
func kubeEnv(t *testing.T, cs *fake.Clientset, prev *env) *env {
	t.Helper()
	ev := &podEvents{}
	f := kubeclient.NewFactory()
	src := pods.New(f, func(ns string) pods.Client { return fakePods{cs.CoreV1().Pods(ns)} }, "vm", ev)
	src.Wait = time.Second
	var e *env
	if prev == nil {
		e = newEnv(t, func(c *envConfig) { c.Source = src })
	} else {
		prev.stop()
		e = &env{t: t, dp: prev.dp, sp: newFakeSpeaker(), st: prev.st, dir: prev.dir}
		e.build(envConfig{Config: agent.Config{Spec: testSpec(), Store: e.st, Dataplane: e.dp, Source: src, Log: discard}})
	}
	ev.a = e.a
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = f.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	if err := f.WaitForSync(sctx); err != nil {
		t.Fatal(err)
	}
	if err := e.run(); err != nil {
		t.Fatal(err)
	}
	return e
}

// waitRouted waits until p is advertised as kind and routed, or neither.
func (e *env) waitRouted(what string, p netip.Prefix, kind advert.Kind, want bool) {
	e.t.Helper()
	testutil.Eventually(e.t, what, func() (bool, string) {
		adv, routed := e.sp.Held()[p] == kind, len(e.dp.kernelRoutes()[p]) > 0
		return adv == want && routed == want, fmt.Sprintf("%s advertised %v, routed %v, want %v", p, adv, routed, want)
	})
}

var staticAnycast = netip.MustParsePrefix("2001:db8:53::53/128")

// Issue 18, defect 3: kubelet re-creates a static pod's mirror with a new
// UID (after a manual delete, an API-server restart); the static pod and
// its sandbox stay. Its anycast must follow the new mirror's readiness,
// not stay withdrawn for good.
func TestStaticPodMirrorRecreated(t *testing.T) {
	cs := fake.NewClientset(mirrorPod("mirror-1", "static-1", true))
	e := kubeEnv(t, cs, nil)
	ctx := context.Background()
	anycast := staticAnycast
	wait := func(what string, want bool) { t.Helper(); e.waitRouted(what, anycast, advert.Anycast, want) }
	// The runtime names the static pod by its own UID.
	if _, err := e.a.Add(ctx, "c1", netnsOf("c1"), "eth0", podArgs("kube-system", "dns-node", "K8S_POD_UID=static-1")); err != nil {
		t.Fatal(err)
	}
	wait("ADD of a Ready static pod", true)

	api := cs.CoreV1().Pods("kube-system")
	if err := api.Delete(ctx, "dns-node", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("mirror deleted", false)
	if _, err := api.Create(ctx, mirrorPod("mirror-2", "static-1", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("mirror re-created Ready", true)

	if _, err := api.UpdateStatus(ctx, mirrorPod("mirror-2", "static-1", false), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("re-created mirror NotReady", false)

	// Re-created again, NotReady at first, then Ready.
	if err := api.Delete(ctx, "dns-node", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Create(ctx, mirrorPod("mirror-3", "static-1", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("mirror re-created NotReady", false)
	if _, err := api.UpdateStatus(ctx, mirrorPod("mirror-3", "static-1", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("re-created mirror Ready", true)

	// A new manifest under the same name is another static pod: its
	// sandbox's readiness is not the old one's.
	if err := api.Delete(ctx, "dns-node", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Create(ctx, mirrorPod("mirror-4", "static-2", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.Add(ctx, "c2", netnsOf("c2"), "eth0", podArgs("kube-system", "dns-node", "K8S_POD_UID=static-2")); err != nil {
		t.Fatal(err)
	}
	readiness := func() map[string]bool {
		out := map[string]bool{}
		for _, a := range e.state.Attachments() {
			out[a.ContainerID] = a.Ready
		}
		return out
	}
	testutil.WaitFor(t, "the new static pod's sandbox Ready", func() bool { return readiness()["c2"] })
	if readiness()["c1"] {
		t.Error("the old static pod's sandbox took the new static pod's readiness")
	}
	e.settled()
	if nhs := e.dp.kernelRoutes()[anycast]; len(nhs) != 1 {
		t.Errorf("anycast next hops %v, want the new sandbox's only", nhs)
	}
}

// A record written before records carried static UIDs names a static pod
// by its mirror's UID alone. Restored while that mirror exists, it is
// completed (and written back), so a later mirror still matches it, after
// another restart too.
func TestStaticPodRecordFromBefore(t *testing.T) {
	cs := fake.NewClientset(mirrorPod("mirror-1", "static-1", true))
	prev := newEnv(t)
	rec := store.Allocation{
		ContainerID: "c1", State: store.Committed, Pod: podmeta.ID{Namespace: "kube-system", Name: "dns-node", UID: "mirror-1"},
		IPs: []netip.Addr{mustAddr("fd00:10:1::1")}, Anycast: []netip.Addr{staticAnycast.Addr()},
	}
	putRecord(t, prev.dir, rec)
	prev.dp.addVeth(dataplane.HostVethName("c1"))
	file := filepath.Join(prev.dir, "allocations", "c1.json")
	if raw, err := os.ReadFile(file); err != nil || strings.Contains(string(raw), "staticUID") {
		t.Fatalf("the old record format: %s %v", raw, err)
	}

	e := kubeEnv(t, cs, prev)
	e.waitRouted("restored, mirror Ready", staticAnycast, advert.Anycast, true)
	if raw, err := os.ReadFile(file); err != nil || !strings.Contains(string(raw), `"staticUID": "static-1"`) {
		t.Errorf("record not completed on disk: %s %v", raw, err)
	}
	ctx := context.Background()
	api := cs.CoreV1().Pods("kube-system")
	if err := api.Delete(ctx, "dns-node", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRouted("mirror deleted", staticAnycast, advert.Anycast, false)
	if _, err := api.Create(ctx, mirrorPod("mirror-2", "static-1", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRouted("mirror re-created Ready", staticAnycast, advert.Anycast, true)

	// Restarted while only the new mirror exists: the record on disk
	// still matches it.
	e = kubeEnv(t, cs, e)
	e.waitRouted("restarted", staticAnycast, advert.Anycast, true)
}

// fakePods is the fake's pod client, saying what the fake clientset says:
// it cannot stream a list through a watch (WatchList).
type fakePods struct{ pods.Client }

func (fakePods) IsWatchListSemanticsUnSupported() bool { return true }
