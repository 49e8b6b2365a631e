package daemon

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// sameStatus compares without the transition time and leaves the
// statuses it is given alone: it once zeroed the caller's time, and the
// API server then refused every later status write (lastTransitionTime
// is required), so `kubectl get nodeconfigs` froze at the first write.
func TestSameStatusLeavesItsArguments(t *testing.T) {
	t1, t2 := metav1.NewTime(time.Unix(100, 0)), metav1.NewTime(time.Unix(200, 0))
	a := v1alpha1.NodeConfigStatus{Peers: "1/1", Conditions: []metav1.Condition{{Type: "Ready", Status: "True", LastTransitionTime: t1}}}
	b := v1alpha1.NodeConfigStatus{Peers: "1/1", Conditions: []metav1.Condition{{Type: "Ready", Status: "True", LastTransitionTime: t2}}}
	if !sameStatus(a, b) {
		t.Error("statuses differing only in the transition time compare different")
	}
	if !a.Conditions[0].LastTransitionTime.Equal(&t1) || !b.Conditions[0].LastTransitionTime.Equal(&t2) {
		t.Errorf("sameStatus changed its arguments: %v, %v", a.Conditions[0].LastTransitionTime, b.Conditions[0].LastTransitionTime)
	}
	b.Peers = "0/1"
	if sameStatus(a, b) {
		t.Error("different statuses compare the same")
	}
}
