package relay

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// The watching client's decoder: a watch event's pod (decoded without an
// object to decode into) is a *trim.Pod, NewPod's; a Status (an ERROR
// event's) and anything decoded into an object are client-go's.
func TestTrimmingDecoder(t *testing.T) {
	info, ok := runtime.SerializerInfoForMediaType(trimming.SupportedMediaTypes(), mediaType)
	if !ok {
		t.Fatal("no protobuf")
	}
	dec := trimming.DecoderToVersion(info.Serializer, corev1.SchemeGroupVersion)
	p := testPod("ns", "p1", 1)
	p.Annotations = map[string]string{"unread": "x", trim.AnycastAnnotation: "2001:db8::1"}
	raw, err := encodePod(p)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := dec.Decode(raw, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tp, ok := got.(*trim.Pod); !ok || !reflect.DeepEqual(tp, trim.NewPod(p)) {
		t.Fatalf("a watch event's pod decoded as %#v, want trim.NewPod's %#v", got, trim.NewPod(p))
	}
	into, _, err := dec.Decode(raw, nil, &corev1.Pod{})
	if cp, ok := into.(*corev1.Pod); err != nil || !ok || cp.Annotations["unread"] != "x" {
		t.Fatalf("a pod decoded into a corev1.Pod: %#v, %v", into, err)
	}
	st := apierrors.NewResourceExpired("too old").ErrStatus
	var b []byte
	if b, err = runtime.Encode(podCodec, &st); err != nil {
		t.Fatal(err)
	}
	if s, _, err := dec.Decode(b, nil, nil); err != nil || s.(*metav1.Status).Reason != metav1.StatusReasonExpired {
		t.Fatalf("a status decoded as %#v, %v", s, err)
	}
	// A pod message cut short is an error, not a pod.
	if o, _, err := dec.Decode(raw[:len(raw)-3], nil, nil); err == nil {
		t.Fatalf("a pod cut short decoded as %#v", o)
	}
}
