package policyips

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/k8s/claims"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// flock-policy may start before the CRDs `kubectl apply` created with it
// are established: the claims' list and watch answer 404 at first. The
// reflector retries on its backoff (0.8 s doubling, at most 30 s plus
// jitter), so the tracker's first answer comes soon after they are.
func TestTrackerWaitsOutACRDNotYetEstablished(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "a", UID: "u1"}, Spec: corev1.PodSpec{NodeName: node}}
	podIdx, nsIdx, dyn := trackerWorld(p)
	established := time.Now().Add(2 * time.Second)
	var lists atomic.Int32
	notFound := func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetResource() != claims.GVR || time.Now().After(established) {
			return false, nil, nil
		}
		lists.Add(1)
		return true, nil, apierrors.NewNotFound(claims.GVR.GroupResource(), "")
	}
	dyn.PrependReactor("list", "*", notFound)
	dyn.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		h, _, err := notFound(a)
		return h, nil, err
	})
	tr := NewTracker(node, dyn, "", slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		_ = tr.Run(ctx, trim.NewPodLister(podIdx), corelisters.NewNamespaceLister(nsIdx), nil, func(_, _ []string) {})
	}()
	defer func() { cancel(); <-done }()
	for !tr.HasSynced() {
		if time.Since(established) > 10*time.Second {
			t.Fatalf("no first answer after %s (%d lists refused)", time.Since(start), lists.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("first answer %s after start, %s after the CRD was established (%d lists refused)", time.Since(start), time.Since(established), lists.Load())
}
