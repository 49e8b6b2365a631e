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

// A status is written only when an operator would see it change: the
// condition keeps its transition time while its status holds, an equal
// status is never written again, and the allocation count alone waits
// allocationsEvery after the last count written.
func TestPlanStatus(t *testing.T) {
	t0 := time.Unix(1000, 0)
	t1 := metav1.NewTime(t0)
	now := t0.Add(time.Hour)
	cond := func(status metav1.ConditionStatus, at metav1.Time) []metav1.Condition {
		return []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: status, Reason: "Serving", LastTransitionTime: at}}
	}
	have := &v1alpha1.NodeConfigStatus{Peers: "1/1", Allocations: 3, Conditions: cond(metav1.ConditionTrue, t1)}
	want := func(peers string, alloc int32, status metav1.ConditionStatus) v1alpha1.NodeConfigStatus {
		return v1alpha1.NodeConfigStatus{Peers: peers, Allocations: alloc, Conditions: cond(status, metav1.NewTime(now))}
	}
	for _, tc := range []struct {
		name      string
		want      v1alpha1.NodeConfigStatus
		have      *v1alpha1.NodeConfigStatus
		lastAlloc time.Time
		write     bool
		ltt       metav1.Time
	}{
		{"nothing known", want("1/1", 3, metav1.ConditionTrue), nil, t0, true, metav1.NewTime(now)},
		{"unchanged: not written, whatever the time", want("1/1", 3, metav1.ConditionTrue), have, t0, false, t1},
		{"a peer down", want("0/1", 3, metav1.ConditionTrue), have, now, true, t1},
		{"readiness changed: a new transition time", want("1/1", 3, metav1.ConditionFalse), have, now, true, metav1.NewTime(now)},
		{"the count alone, soon after the last", want("1/1", 4, metav1.ConditionTrue), have, now.Add(-time.Minute), false, t1},
		{"the count alone, long after", want("1/1", 4, metav1.ConditionTrue), have, now.Add(-allocationsEvery), true, t1},
		{"the count with a peer change", want("0/1", 4, metav1.ConditionTrue), have, now, true, t1},
	} {
		write, st := planStatus(tc.want, tc.have, tc.lastAlloc, now)
		if write != tc.write {
			t.Errorf("%s: write = %v, want %v", tc.name, write, tc.write)
		}
		if got := st.Conditions[0].LastTransitionTime; !got.Equal(&tc.ltt) {
			t.Errorf("%s: transition time %v, want %v", tc.name, got, tc.ltt)
		}
		if write && st.Allocations != tc.want.Allocations {
			t.Errorf("%s: wrote %d allocations, want %d", tc.name, st.Allocations, tc.want.Allocations)
		}
	}
	if !have.Conditions[0].LastTransitionTime.Equal(&t1) {
		t.Error("planStatus changed the cached status")
	}
}
