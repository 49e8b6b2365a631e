package verdicts

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// Classify is sound: a pod change it calls Unchanged leaves the program
// compiled after it what it was before (program == f(state) holds with the
// change skipped), and one it calls Recompile leaves the context (what the
// next changes are classified with) as it was. Random clusters, random changes of pods of either node:
// added, deleted, relabelled, moved to another address (one another pod
// holds, or was holding), given or losing their addresses, their ports
// or their phase changed.
func TestAffectsIsSound(t *testing.T) {
	sd := seed(t)
	r := rand.New(rand.NewPCG(sd, 0xaffec7))
	worlds, changes, skipped, recompiled := scaled(t, 300), 0, 0, 0
	for range worlds {
		w := newWorld(r)
		for range 20 {
			prog, deps := CompileDeps(w.in)
			old, cur, pods := randPodChange(r, w)
			after := w.in
			after.Pods = pods
			live := liveAfter(w, pods)
			changes++
			switch Classify(live, deps, old, cur) {
			case Unchanged:
				skipped++
				if got := Compile(after); !reflect.DeepEqual(got, prog) {
					t.Fatalf("FLOCK_SEED=%d: %s → %s called Unchanged, but the program changed\nbefore:\n%s", sd, podString(old), podString(cur), describe(w))
				}
			case Recompile:
				recompiled++
				if _, d := CompileDeps(after); !sameContext(d, deps) {
					t.Fatalf("FLOCK_SEED=%d: %s → %s called Recompile, but the context changed\nbefore:\n%s", sd, podString(old), podString(cur), describe(w))
				}
			}
			w.in = after
		}
	}
	t.Logf("%d changes: %d unchanged, %d recompiled in the same context", changes, skipped, recompiled)
	if skipped == 0 || recompiled == 0 || skipped+recompiled == changes {
		t.Errorf("%d of %d changes unchanged, %d recompiled: want some of each kind", skipped, changes, recompiled)
	}
}

// randPodChange changes one pod of w (or adds one), returning the pod
// before and after (nil: none) and the pods after.
func randPodChange(r *rand.Rand, w *world) (old, cur *trim.Pod, pods []*trim.Pod) {
	pods = append([]*trim.Pod(nil), w.in.Pods...)
	if len(pods) == 0 || r.IntN(4) == 0 { // a new pod
		p := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pick(r, []string{"ns0", "ns1", "ns2", "ghost"}), Name: fmt.Sprintf("new%d", r.IntN(1000)), UID: types.UID(fmt.Sprintf("uid-new-%d", r.IntN(1000))), Labels: randLabels(r)}}
		p.Spec.NodeName = pick(r, []string{"node-a", "node-b", "node-b"})
		p.Status.Phase = corev1.PodRunning
		if r.IntN(2) == 0 {
			p.Spec.Containers = []corev1.Container{{Ports: []corev1.ContainerPort{{Name: pick(r, portNames), ContainerPort: 80, Protocol: protoTCP}}}}
		}
		switch r.IntN(3) {
		case 0: // not yet given an address
		case 1: // an address of its own
			p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("fd00:10:1::%x", 0x100+r.IntN(0x100))}}
		default: // another pod's
			if len(pods) > 0 {
				p.Status.PodIPs = pods[r.IntN(len(pods))].Status.PodIPs
			}
		}
		for _, q := range pods {
			if q.Namespace == p.Namespace && q.Name == p.Name {
				return nil, nil, pods // taken: no change
			}
		}
		return nil, p, append(pods, p)
	}
	i := r.IntN(len(pods))
	old = pods[i]
	if r.IntN(4) == 0 { // deleted
		return old, nil, append(pods[:i], pods[i+1:]...)
	}
	c := old.DeepCopyObject().(*trim.Pod)
	switch r.IntN(5) {
	case 0:
		c.Labels = randLabels(r)
	case 1:
		c.Status.PodIPs = nil
	case 2:
		c.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("fd00:10:1::%x", 0x200+r.IntN(0x100))}}
	case 3:
		c.Status.Phase = pick(r, []corev1.PodPhase{corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed})
	default:
		c.Spec.Containers = []corev1.Container{{Ports: []corev1.ContainerPort{{Name: pick(r, portNames), ContainerPort: int32(pick(r, []int{80, 53, 8080})), Protocol: protoTCP}}}}
	}
	pods[i] = c
	return old, c, pods
}

func podString(p *trim.Pod) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprintf("%s/%s node=%s host=%v labels=%v ips=%v phase=%s", p.Namespace, p.Name, p.Spec.NodeName, p.Spec.HostNetwork, p.Labels, p.Status.PodIPs, p.Status.Phase)
}

// sameContext: what Classify reads of d and e is the same.
func sameContext(d, e *Deps) bool {
	full := func(d *Deps) map[string]bool {
		out := map[string]bool{}
		for np := range d.full {
			out[np.Namespace+"/"+np.Name] = true
		}
		return out
	}
	judged := func(d *Deps) map[netip.Addr][]string {
		out := map[netip.Addr][]string{}
		for _, j := range d.judged {
			out[j.a] = []string{}
			for _, h := range j.h {
				out[j.a] = append(out[j.a], key(h))
			}
		}
		return out
	}
	return reflect.DeepEqual(d.c.prog.Selected, e.c.prog.Selected) && reflect.DeepEqual(full(d), full(e)) && reflect.DeepEqual(judged(d), judged(e))
}
