package trim

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"code.fritzlab.net/fritzlab/flock/k8s/pods"
)

// randomPod is a pod with every field Pod keeps drawn from small sets
// (so that labels and containers repeat and are shared), sometimes
// absent or empty, and bulk Pod drops.
func randomPod(r *rand.Rand) *corev1.Pod {
	pick := func(s ...string) string { return s[r.IntN(len(s))] }
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: fmt.Sprintf("pod-%d", r.IntN(1000)), Namespace: pick("", "default", "shop", "kube-system"),
		UID: types.UID(fmt.Sprintf("uid-%d", r.Uint64())), ResourceVersion: fmt.Sprint(r.Uint64()),
		GenerateName: "pod-", Generation: r.Int64(), Finalizers: []string{"example.com/f"},
	}}
	if r.IntN(4) > 0 {
		p.Labels = map[string]string{}
		for range r.IntN(4) {
			p.Labels[pick("app", "tier", "pod-template-hash", "", "x/y")] = pick("web", "db", "", "7d9f8b6c5d", fmt.Sprint(r.IntN(3)))
		}
	}
	if r.IntN(2) == 0 {
		p.Annotations = map[string]string{"kubectl.kubernetes.io/restartedAt": "2026", "flock.fritzlab.net/addresses": "2001:db8::1"}
		for range r.IntN(3) {
			p.Annotations[pick(pods.MirrorAnnotation, AnycastAnnotation, metav1.InitialEventsAnnotationKey, "other")] = pick("", "true", "2001:db8:a::80")
		}
	}
	p.Spec.NodeName = pick("", "node-1", "node-2")
	p.Spec.HostNetwork = r.IntN(4) == 0
	p.Spec.ServiceAccountName = "sa"
	for i := range r.IntN(4) {
		c := corev1.Container{Name: pick("web", "sidecar", "", fmt.Sprint("c", i)), Image: "registry.example/x:1", Args: []string{"-v"}}
		for range r.IntN(3) {
			c.Ports = append(c.Ports, corev1.ContainerPort{Name: pick("", "http", "dns"), ContainerPort: []int32{80, 53, 0, -1, 65535}[r.IntN(5)],
				Protocol: corev1.Protocol(pick("", "TCP", "UDP", "SCTP")), HostPort: r.Int32N(3), HostIP: pick("", "192.0.2.1")})
		}
		p.Spec.Containers = append(p.Spec.Containers, c)
	}
	if r.IntN(3) == 0 {
		p.Spec.InitContainers = []corev1.Container{{Name: "init", Ports: []corev1.ContainerPort{{ContainerPort: 7000}}}}
	}
	p.Status.Phase = corev1.PodPhase(pick("", "Pending", "Running", "Succeeded", "Failed", "Unknown", "Odd"))
	p.Status.PodIP = "192.0.2.9"
	for range r.IntN(3) {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: pick("2001:db8::7", "192.0.2.7", "")})
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	return p
}

// TestDecodePodIsNewPod: the pod DecodePod decodes is the pod NewPod
// makes of the generated Unmarshal's corev1.Pod, for random pods, for
// messages that give a field twice (which the generated code merges) and
// for fields it does not know; and it shares their labels and containers.
func TestDecodePodIsNewPod(t *testing.T) {
	seed := uint64(20261202)
	r := rand.New(rand.NewPCG(seed, seed))
	for i := range 3000 {
		p := randomPod(r)
		b, err := p.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		switch i % 3 {
		case 1: // a second pod's fields after the first's: merged
			q, err := randomPod(r).Marshal()
			if err != nil {
				t.Fatal(err)
			}
			b = append(b, q...)
		case 2: // a field no version of Pod has (number 999, each wire type)
			b = append(b, 0xb8, 0x3e, 0x05) // 999 varint 5
			b = append(b, 0xba, 0x3e, 0x02, 'h', 'i')
			b = append(b, 0xbd, 0x3e, 1, 2, 3, 4)
		}
		var want corev1.Pod
		if err := want.Unmarshal(b); err != nil {
			t.Fatalf("seed %d pod %d: the generated Unmarshal: %v", seed, i, err)
		}
		got, err := DecodePod(b)
		if err != nil {
			t.Fatalf("seed %d pod %d: %v", seed, i, err)
		}
		w := NewPod(&want)
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("seed %d pod %d: DecodePod\n %#v\nNewPod\n %#v", seed, i, got, w)
		}
		if len(w.Labels) > 0 && reflect.ValueOf(got.Labels).UnsafePointer() != reflect.ValueOf(w.Labels).UnsafePointer() {
			t.Fatalf("seed %d pod %d: labels not shared with NewPod's", seed, i)
		}
		if len(w.Spec.Containers) > 0 && &got.Spec.Containers[0] != &w.Spec.Containers[0] {
			t.Fatalf("seed %d pod %d: containers not shared with NewPod's", seed, i)
		}
	}
}

// TestDecodePodKeepsNothingOfTheBuffer: what DecodePod keeps is copied
// out of the bytes it was given (a watch's buffer, reused for the next
// event): overwriting them changes no decoded pod, new labels and
// containers included.
func TestDecodePodKeepsNothingOfTheBuffer(t *testing.T) {
	p := fatPod()
	p.Labels = map[string]string{"decode-test": "unique-to-this-test"}
	p.Spec.Containers[0].Name = "decode-test-container"
	p.Annotations[metav1.InitialEventsAnnotationKey] = "true"
	b, err := p.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodePod(b)
	if err != nil {
		t.Fatal(err)
	}
	want := got.DeepCopyObject()
	for i := range b {
		b[i] = 'X'
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the decoded pod changed with its buffer:\n%#v", got)
	}
	if got.Annotations[metav1.InitialEventsAnnotationKey] != "true" || got.Labels["decode-test"] != "unique-to-this-test" {
		t.Fatalf("decoded %#v", got)
	}
}

// TestDecodePodBadInput: a message cut short or with a kept field of the
// wrong wire type is an error naming the field, never a panic or a pod.
func TestDecodePodBadInput(t *testing.T) {
	b, err := fatPod().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n < len(b); n += 7 {
		var want corev1.Pod
		if want.Unmarshal(b[:n]) == nil {
			continue // a cut between fields is a shorter pod
		}
		if p, err := DecodePod(b[:n]); err == nil {
			t.Fatalf("cut at %d of %d: no error, pod %v", n, len(b), p)
		}
	}
	// metadata (1) as a varint.
	if _, err := DecodePod([]byte{0x08, 0x01}); err == nil || err.Error() != "trim: decode pod: field 1: wrong wire type" {
		t.Fatalf("metadata as a varint: %v", err)
	}
}

func FuzzDecodePod(f *testing.F) {
	b, _ := fatPod().Marshal()
	f.Add(b)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var want corev1.Pod
		got, err := DecodePod(b)
		if want.Unmarshal(b) != nil || err != nil {
			return // the two may differ on what is malformed in fields not kept
		}
		if w := NewPod(&want); !reflect.DeepEqual(got, w) {
			t.Fatalf("DecodePod %#v\nNewPod %#v", got, w)
		}
	})
}

func BenchmarkDecodePod(b *testing.B) {
	buf, err := fatPod().Marshal()
	if err != nil {
		b.Fatal(err)
	}
	b.Run("DecodePod", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodePod(buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Unmarshal+NewPod", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var p corev1.Pod
			if err := p.Unmarshal(buf); err != nil {
				b.Fatal(err)
			}
			_ = NewPod(&p)
		}
	})
}
