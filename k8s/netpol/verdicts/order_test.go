package verdicts

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// The program does not depend on the order the pods are listed in (a
// lister's is a map's): the compile sorts only what the order decides,
// the holders of one status IP (two running pods sharing one here, as
// the engine's pick among them is the compile's by name), and numbers its
// groups by address.
func TestCompileIgnoresThePodsOrder(t *testing.T) {
	s := seed(t)
	for i := range scaled(t, 300) {
		r := rand.New(rand.NewPCG(s, uint64(i)))
		w := newWorld(r)
		for j := range r.IntN(3) {
			held := w.in.Pods[r.IntN(len(w.in.Pods))]
			if held.Spec.HostNetwork {
				continue
			}
			twin := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pick(r, []string{"ns0", "ns1", "ns2"}), Name: fmt.Sprintf("twin%d", j), Labels: randLabels(r)}}
			twin.Spec.NodeName = pick(r, []string{"node-a", "node-b"})
			twin.Status.Phase = corev1.PodRunning
			twin.Status.PodIPs = held.Status.PodIPs
			w.in.Pods = append(w.in.Pods, twin)
		}
		want, _ := CompileDeps(w.in)
		shuffled := w.in
		shuffled.Pods = slices.Clone(w.in.Pods)
		r.Shuffle(len(shuffled.Pods), func(a, b int) { shuffled.Pods[a], shuffled.Pods[b] = shuffled.Pods[b], shuffled.Pods[a] })
		if got, _ := CompileDeps(shuffled); !reflect.DeepEqual(got, want) {
			t.Fatalf("seed %d world %d: the program changed with the pods' order:\n%s", s, i, describe(w))
		}
	}
}
