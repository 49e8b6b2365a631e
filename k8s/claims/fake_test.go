package claims

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// fakeAPI is the fake dynamic client plus what the real API server does and
// the fake does not: UIDs, resourceVersions, creationTimestamps and delete
// preconditions. Reactors run under the fake's lock, so each check-and-act
// is atomic, as in etcd.
type fakeAPI struct {
	*dynfake.FakeDynamicClient
	seq atomic.Int64
	now atomic.Int64 // unix nanoseconds of the API server's clock
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newFakeAPI() *fakeAPI {
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{GVR: v1alpha1.AddressClaimKind + "List"})
	a := &fakeAPI{FakeDynamicClient: dyn}
	a.setNow(t0)
	tr := dyn.Tracker()
	dyn.PrependReactor("create", GVR.Resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
		u, ok := action.(clienttesting.CreateAction).GetObject().(*unstructured.Unstructured)
		if !ok {
			return false, nil, nil
		}
		u = u.DeepCopy()
		n := a.seq.Add(1)
		u.SetUID(types.UID(fmt.Sprintf("uid-%d", n)))
		u.SetResourceVersion(strconv.FormatInt(n, 10))
		u.SetCreationTimestamp(metav1.NewTime(a.clock()))
		if err := tr.Create(GVR, u, ""); err != nil {
			return true, nil, err
		}
		return true, u.DeepCopy(), nil
	})
	// An update must carry the resourceVersion stored (optimistic
	// concurrency), and gets a new one.
	dyn.PrependReactor("update", GVR.Resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
		u, ok := action.(clienttesting.UpdateAction).GetObject().(*unstructured.Unstructured)
		if !ok {
			return false, nil, nil
		}
		u = u.DeepCopy()
		obj, err := tr.Get(GVR, "", u.GetName())
		if err != nil {
			return true, nil, err
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return true, nil, err
		}
		if u.GetResourceVersion() != m.GetResourceVersion() {
			return true, nil, apierrors.NewConflict(GVR.GroupResource(), u.GetName(),
				fmt.Errorf("the object has been modified: resourceVersion %s, stored %s", u.GetResourceVersion(), m.GetResourceVersion()))
		}
		u.SetUID(m.GetUID())
		u.SetCreationTimestamp(m.GetCreationTimestamp())
		u.SetResourceVersion(strconv.FormatInt(a.seq.Add(1), 10))
		if err := tr.Update(GVR, u, ""); err != nil {
			return true, nil, err
		}
		return true, u.DeepCopy(), nil
	})
	dyn.PrependReactor("delete", GVR.Resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
		d := action.(clienttesting.DeleteAction)
		obj, err := tr.Get(GVR, "", d.GetName())
		if err != nil {
			return true, nil, err
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return true, nil, err
		}
		if pre := d.GetDeleteOptions().Preconditions; pre != nil {
			if pre.UID != nil && *pre.UID != m.GetUID() {
				return true, nil, apierrors.NewConflict(GVR.GroupResource(), d.GetName(),
					fmt.Errorf("precondition failed: UID in precondition: %v, UID in object meta: %v", *pre.UID, m.GetUID()))
			}
			if pre.ResourceVersion != nil && *pre.ResourceVersion != m.GetResourceVersion() {
				return true, nil, apierrors.NewConflict(GVR.GroupResource(), d.GetName(),
					fmt.Errorf("precondition failed: ResourceVersion in precondition: %v, ResourceVersion in object meta: %v", *pre.ResourceVersion, m.GetResourceVersion()))
			}
		}
		return true, nil, tr.Delete(GVR, "", d.GetName())
	})
	return a
}

func (a *fakeAPI) setNow(t time.Time) { a.now.Store(t.UnixNano()) }
func (a *fakeAPI) clock() time.Time   { return time.Unix(0, a.now.Load()).UTC() }

// get reads a claim straight from the tracker.
func (a *fakeAPI) get(t *testing.T, ip string) (*unstructured.Unstructured, bool) {
	t.Helper()
	obj, err := a.Tracker().Get(GVR, "", ClaimName(netip.MustParseAddr(ip)))
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return obj.(*unstructured.Unstructured), true
}

// replace swaps a stored claim for a new incarnation (new UID and
// resourceVersion), as another writer deleting and re-creating it would;
// call it only from a reactor (under the fake's lock) or with no reactor
// running.
func (a *fakeAPI) replace(name string, mutate func(u *unstructured.Unstructured)) error {
	obj, err := a.Tracker().Get(GVR, "", name)
	if err != nil {
		return err
	}
	u := obj.(*unstructured.Unstructured).DeepCopy()
	n := a.seq.Add(1)
	u.SetUID(types.UID(fmt.Sprintf("uid-%d", n)))
	u.SetResourceVersion(strconv.FormatInt(n, 10))
	if mutate != nil {
		mutate(u)
	}
	return a.Tracker().Update(GVR, u, "")
}

// deletes counts the delete actions.
func (a *fakeAPI) deletes() []clienttesting.DeleteAction {
	var out []clienttesting.DeleteAction
	for _, act := range a.Actions() {
		if d, ok := act.(clienttesting.DeleteAction); ok && act.GetVerb() == "delete" {
			out = append(out, d)
		}
	}
	return out
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// start runs c's informer until the test ends and waits for it to list and
// to watch (the fake drops events between its list and its watch).
func start(t *testing.T, a *fakeAPI, c *Claims) {
	t.Helper()
	testutil.RunInformer(t, c.informer)
	testutil.WaitWatching(t, a, GVR.Resource)
}

func pod(ns, name string) podmeta.ID {
	return podmeta.ID{Namespace: ns, Name: name, UID: "uid-" + ns + "-" + name}
}

func claim(ip, use, pool string, id podmeta.ID, node, container string) Claim {
	return Claim{IP: netip.MustParseAddr(ip), Use: use, Pool: pool, Pod: id, Node: node, ContainerID: container}
}
