package daemon

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/agent/status"
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

// A status is written only when an operator would see it change: the
// condition keeps its transition time while its status holds, an equal
// status is never written again, and the allocation count is not in it
// (it changes with every pod, and every write reaches every node).
func TestPlanStatus(t *testing.T) {
	t1 := metav1.NewTime(time.Unix(1000, 0))
	now := metav1.NewTime(time.Unix(5000, 0))
	cond := func(status metav1.ConditionStatus, at metav1.Time) []metav1.Condition {
		return []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: status, Reason: "Serving", LastTransitionTime: at}}
	}
	have := &v1alpha1.NodeConfigStatus{Peers: "1/1", Conditions: cond(metav1.ConditionTrue, t1)}
	want := func(peers string, status metav1.ConditionStatus) v1alpha1.NodeConfigStatus {
		return v1alpha1.NodeConfigStatus{Peers: peers, Conditions: cond(status, now)}
	}
	for _, tc := range []struct {
		name  string
		want  v1alpha1.NodeConfigStatus
		have  *v1alpha1.NodeConfigStatus
		write bool
		ltt   metav1.Time
	}{
		{"nothing known", want("1/1", metav1.ConditionTrue), nil, true, now},
		{"unchanged: not written", want("1/1", metav1.ConditionTrue), have, false, t1},
		{"a peer down", want("0/1", metav1.ConditionTrue), have, true, t1},
		{"readiness changed: a new transition time", want("1/1", metav1.ConditionFalse), have, true, now},
	} {
		write, st := planStatus(tc.want, tc.have)
		if write != tc.write {
			t.Errorf("%s: write = %v, want %v", tc.name, write, tc.write)
		}
		if got := st.Conditions[0].LastTransitionTime; !got.Equal(&tc.ltt) {
			t.Errorf("%s: transition time %v, want %v", tc.name, got, tc.ltt)
		}
	}
	if !have.Conditions[0].LastTransitionTime.Equal(&t1) {
		t.Error("planStatus changed the cached status")
	}
	// Pods come and go: the status stays the same.
	node := status.Node{Ready: true, Allocations: 3}
	a := nodeStatus(node, 1)
	node.Allocations = 30
	if write, _ := planStatus(nodeStatus(node, 1), &a); write {
		t.Error("a new allocation count makes a status write")
	}
}
