package addresspools

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// readyIn is the Ready condition of a pool as the API server has it.
func readyIn(t *testing.T, dyn interface {
	Tracker() clienttesting.ObjectTracker
}, name string) *metav1.Condition {
	t.Helper()
	obj, err := dyn.Tracker().Get(GVR, "", name)
	if err != nil {
		t.Fatal(err)
	}
	conds, err := conditionsOf(obj.(*unstructured.Unstructured))
	if err != nil {
		t.Fatal(err)
	}
	return meta.FindStatusCondition(conds, v1alpha1.ConditionReady)
}

func TestVerdict(t *testing.T) {
	c := Verdict(3, nil)
	if c.Type != "Ready" || c.Status != metav1.ConditionTrue || c.Reason != "Valid" || c.Message != ValidMessage || c.ObservedGeneration != 3 {
		t.Errorf("Verdict(valid) = %+v", c)
	}
	c = Verdict(4, errors.New("spec.cidrs[0]: \"x\" is not a CIDR\nspec.use: empty"))
	if c.Status != metav1.ConditionFalse || c.Reason != "InvalidSpec" || c.Message != `spec.cidrs[0]: "x" is not a CIDR; spec.use: empty` || c.ObservedGeneration != 4 {
		t.Errorf("Verdict(invalid) = %+v", c)
	}
	if c := Verdict(1, errors.New(strings.Repeat("x", 10000))); len(c.Message) != maxMessage || !strings.HasSuffix(c.Message, "...") {
		t.Errorf("a long message is %d bytes", len(c.Message))
	}
}

// Ready is True for a valid pool and False, InvalidSpec, with the error
// for one authz refuses or that does not convert; a condition that
// already says so is not written again, and its transition time stays
// while the status does.
func TestUpdateReady(t *testing.T) {
	ctx := context.Background()
	broken := pool("c-broken", 0, []any{"2001:db8:c::/112"}, []any{"pod"}, []any{"x"})
	broken.Object["spec"].(map[string]any)["use"] = "pod" // a string, not a list
	dyn := fakeDyn(
		pool("a", 0, []any{"2001:db8:a::/112"}, []any{"pod"}, []any{"x"}),
		pool("b", 2, []any{"2001:db8:a::/120"}, []any{"pod"}, []any{"x"}),
		broken,
	)
	cs := fake.NewClientset()
	w := New(kubeclient.NewFactory(), dyn, fakeNamespaces{cs.CoreV1().Namespaces()}, quiet())
	run(t, w, dyn, cs)

	invalid := map[string]error{"b": errors.New(`addresspool "b": spec.cidrs[0]: 2001:db8:a::/120 overlaps addresspool "a" spec.cidrs[0] 2001:db8:a::/112, both for use pod`)}
	if err := w.UpdateReady(ctx, invalid); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(statusWrites(dyn), ","); got != "a,b,c-broken" {
		t.Fatalf("status writes %s, want a,b,c-broken", got)
	}
	for name, want := range map[string]struct {
		status metav1.ConditionStatus
		reason string
		msg    string
	}{
		"a":        {metav1.ConditionTrue, "Valid", ValidMessage},
		"b":        {metav1.ConditionFalse, "InvalidSpec", invalid["b"].Error()},
		"c-broken": {metav1.ConditionFalse, "InvalidSpec", `spec.use: cannot unmarshal string "pod" into a list`},
	} {
		c := readyIn(t, dyn, name)
		if c == nil || c.Status != want.status || c.Reason != want.reason || c.Message != want.msg || c.LastTransitionTime.IsZero() {
			t.Errorf("%s: Ready %+v, want %s %s %q", name, c, want.status, want.reason, want.msg)
		}
	}
	// The other status fields stay.
	if got := claimsIn(t, dyn, "b"); got != 2 {
		t.Errorf("b: status.claims %d after the Ready write, want 2", got)
	}

	// Idempotent: nothing to change, nothing written.
	testutil.WaitFor(t, "the cache has the conditions", func() bool {
		for _, u := range w.cached() {
			if c, _ := conditionsOf(u); len(c) == 0 {
				return false
			}
		}
		return true
	})
	dyn.ClearActions()
	if err := w.UpdateReady(ctx, invalid); err != nil {
		t.Fatal(err)
	}
	if got := statusWrites(dyn); len(got) != 0 {
		t.Fatalf("status writes %v with nothing to change", got)
	}

	// b fixed (a deleted): True, with a new transition time; a new message
	// alone keeps the time.
	before := readyIn(t, dyn, "b").LastTransitionTime
	time.Sleep(1100 * time.Millisecond) // condition times are in seconds
	if err := w.UpdateReady(ctx, map[string]error{"b": errors.New("another reason")}); err != nil {
		t.Fatal(err)
	}
	if c := readyIn(t, dyn, "b"); c.Message != "another reason" || !c.LastTransitionTime.Equal(&before) {
		t.Errorf("b: %+v, want the new message and the old transition time %v", c, before)
	}
	testutil.WaitFor(t, "the cache has b's new message", func() bool {
		for _, u := range w.cached() {
			if c, _ := conditionsOf(u); u.GetName() == "b" && len(c) == 1 && c[0].Message == "another reason" {
				return true
			}
		}
		return false
	})
	if err := w.UpdateReady(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if c := readyIn(t, dyn, "b"); c.Status != metav1.ConditionTrue || c.LastTransitionTime.Equal(&before) {
		t.Errorf("b: %+v, want True with a new transition time", c)
	}
}

// Several agents write the Ready condition: a conflict is retried against
// the object as it is now, unless another agent wrote the same verdict
// already or the spec moved on (this agent's cache is behind); a verdict
// on a newer generation is not overwritten.
func TestUpdateReadyConflict(t *testing.T) {
	ctx := context.Background()
	conflict := apierrors.NewConflict(GVR.GroupResource(), "a", errors.New("the object has been modified"))
	for name, tc := range map[string]struct {
		other      *metav1.Condition // written by another agent before our retry's get
		otherGen   int64             // the spec's generation by then
		conflicts  int
		wantWrites int
		wantErr    bool
		want       metav1.ConditionStatus
	}{
		"retry succeeds":               {conflicts: 1, otherGen: 1, wantWrites: 2, want: metav1.ConditionFalse},
		"another agent wrote the same": {conflicts: 1, otherGen: 1, other: &metav1.Condition{Status: metav1.ConditionFalse, Reason: "InvalidSpec", Message: "bad", ObservedGeneration: 1}, wantWrites: 1, want: metav1.ConditionFalse},
		"the spec moved on":            {conflicts: 1, otherGen: 2, other: &metav1.Condition{Status: metav1.ConditionTrue, Reason: "Valid", Message: ValidMessage, ObservedGeneration: 2}, wantWrites: 1, want: metav1.ConditionTrue},
		"conflict twice":               {conflicts: 2, otherGen: 1, wantWrites: 2, wantErr: true},
	} {
		t.Run(name, func(t *testing.T) {
			p := pool("a", 0, []any{"2001:db8:a::/112"}, []any{"pod"}, []any{"x"})
			p.SetGeneration(1)
			dyn := fakeDyn(p)
			cs := fake.NewClientset()
			w := New(kubeclient.NewFactory(), dyn, fakeNamespaces{cs.CoreV1().Namespaces()}, quiet())
			run(t, w, dyn, cs)
			left := tc.conflicts
			dyn.PrependReactor("update", GVR.Resource, func(a clienttesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "status" || left == 0 {
					return false, nil, nil
				}
				if left == tc.conflicts { // the other agent's write that made ours conflict
					obj, err := dyn.Tracker().Get(GVR, "", "a")
					if err != nil {
						return true, nil, err
					}
					u := obj.(*unstructured.Unstructured).DeepCopy()
					u.SetGeneration(tc.otherGen)
					if tc.other != nil {
						c := *tc.other
						c.Type, c.LastTransitionTime = v1alpha1.ConditionReady, metav1.Now()
						m, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(&c)
						u.Object["status"] = map[string]any{"conditions": []any{m}}
					}
					if err := dyn.Tracker().Update(GVR, u, ""); err != nil {
						return true, nil, err
					}
				}
				left--
				return true, nil, conflict
			})
			err := w.UpdateReady(ctx, map[string]error{"a": errors.New("bad")})
			if tc.wantErr {
				if !apierrors.IsConflict(err) || !strings.Contains(err.Error(), "AddressPool a") {
					t.Fatalf("UpdateReady: %v, want a Conflict naming AddressPool a", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if got := len(statusWrites(dyn)); got != tc.wantWrites {
				t.Fatalf("%d status writes, want %d", got, tc.wantWrites)
			}
			c := readyIn(t, dyn, "a")
			if tc.wantErr {
				if c != nil {
					t.Fatalf("Ready %+v after two conflicts, want none", c)
				}
				return
			}
			if c == nil || c.Status != tc.want {
				t.Fatalf("Ready %+v, want %s", c, tc.want)
			}
		})
	}

	// A verdict on a newer generation (an agent whose cache is ahead) is
	// left alone.
	p := pool("a", 0, []any{"2001:db8:a::/112"}, []any{"pod"}, []any{"x"})
	p.SetGeneration(1)
	m, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(&metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Valid",
		Message: ValidMessage, ObservedGeneration: 2, LastTransitionTime: metav1.Now()})
	p.Object["status"] = map[string]any{"conditions": []any{m}}
	dyn := fakeDyn(p)
	cs := fake.NewClientset()
	w := New(kubeclient.NewFactory(), dyn, fakeNamespaces{cs.CoreV1().Namespaces()}, quiet())
	run(t, w, dyn, cs)
	if err := w.UpdateReady(ctx, map[string]error{"a": errors.New("bad")}); err != nil {
		t.Fatal(err)
	}
	if got := statusWrites(dyn); len(got) != 0 {
		t.Fatalf("status writes %v over a newer generation's verdict", got)
	}
}

// A status that does not convert does not make the pool ignored (its
// spec is what counts), and Ready rewrites broken conditions.
func TestBrokenStatus(t *testing.T) {
	ctx := context.Background()
	p := pool("a", 0, []any{"2001:db8:a::/112"}, []any{"pod"}, []any{"x"})
	p.Object["status"] = map[string]any{"conditions": "junk"}
	dyn := fakeDyn(p)
	cs := fake.NewClientset()
	w := New(kubeclient.NewFactory(), dyn, fakeNamespaces{cs.CoreV1().Namespaces()}, quiet())
	run(t, w, dyn, cs)
	if got := w.Pools(); len(got) != 1 || got[0].Name != "a" {
		t.Fatalf("Pools() = %+v, want a", got)
	}
	if err := w.UpdateReady(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if c := readyIn(t, dyn, "a"); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("Ready %+v, want True", c)
	}
}
