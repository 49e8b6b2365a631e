// Package pods is the Kubernetes pod metadata source: an informer on the
// pods of this node only (field selector spec.nodeName), answering the
// agent's ADD-time lookups from its cache and reporting readiness changes
// and deletions as they happen.
package pods

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/identity"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// Client is the pod API of one namespace ("" for all of them, to list and
// watch): kubeclient's and client-go's typed clients both fit.
type Client interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Pod, error)
}

// Events receives what the informer sees, from the informer's goroutine.
type Events interface {
	// PodReady reports the pod's Ready condition (on add, and on every change).
	PodReady(id podmeta.ID, ready bool)
	// PodGone reports a pod deleted from the API.
	PodGone(id podmeta.ID)
}

// DefaultWait bounds how long ADD waits for the informer to see a pod that
// was just created (kubelet can be faster than our watch).
const DefaultWait = 3 * time.Second

// Source implements podmeta.Source from the API. Use: New, run the
// factory and wait for its sync, then Lookup.
type Source struct {
	client   func(namespace string) Client
	informer cache.SharedIndexInformer
	// Wait bounds the ADD-time wait for a pod the cache does not have yet.
	// Set it before the first Lookup.
	Wait time.Duration
}

// New takes the informer of node's pods from f. client returns the pod
// API of a namespace. events (may be nil) is wired here, before the
// informer runs.
func New(f *kubeclient.Factory, client func(namespace string) Client, node string, events Events) *Source {
	inf := f.Informer("pods/node="+node, func() cache.SharedIndexInformer {
		return kubeclient.NewInformer(client(metav1.NamespaceAll), &corev1.Pod{}, func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		})
	})
	s := &Source{client: client, informer: inf, Wait: DefaultWait}
	if events == nil {
		return s
	}
	_, _ = s.informer.AddEventHandler(handler(events))
	return s
}

// handler reports readiness on add and on every change, and a pod
// replaced under its name (a relist after a watch gap shows it as an
// update) as the old one gone and the new one added.
func handler(events Events) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*corev1.Pod); ok {
				events.PodReady(ID(p), Ready(p))
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Pod)
			n, ok2 := newObj.(*corev1.Pod)
			switch {
			case !ok1 || !ok2:
			case ID(o) != ID(n):
				events.PodGone(ID(o))
				events.PodReady(ID(n), Ready(n))
			case Ready(o) != Ready(n):
				events.PodReady(ID(n), Ready(n))
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				events.PodGone(ID(p))
			}
		},
	}
}

// ID is the pod's identity; a mirror pod's carries its static pod's UID.
func ID(p *corev1.Pod) podmeta.ID { return MetaID(&p.ObjectMeta) }

// MetaID is ID from a pod's metadata (a cache that keeps no more).
func MetaID(m *metav1.ObjectMeta) podmeta.ID {
	return podmeta.ID{Namespace: m.Namespace, Name: m.Name, UID: string(m.UID), StaticUID: m.Annotations[MirrorAnnotation]}
}

// Ready reports the pod's Ready condition.
func Ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ErrNotFound is a pod neither the cache nor the API knows.
var ErrNotFound = errors.New("pod not found")

// MirrorAnnotation is set by kubelet on the mirror pod of a static pod: its
// value is the static pod's UID, which is the UID the runtime passes in
// K8S_POD_UID (the mirror pod in the API has a UID of its own).
const MirrorAnnotation = "kubernetes.io/config.mirror"

// Is reports whether p is the pod incarnation the runtime means by uid: the
// same UID, or the mirror of the static pod with that UID. An empty uid
// (a runtime that does not pass one) matches any.
func Is(p *corev1.Pod, uid string) bool {
	return uid == "" || string(p.UID) == uid || p.Annotations[MirrorAnnotation] == uid
}

// Lookup implements podmeta.Source: namespace and name come from CNI_ARGS,
// the rest from the Pod object. The result carries the API object's UID
// and, for a static pod, the static UID that readiness events of every
// later mirror carry too.
func (s *Source) Lookup(ctx context.Context, args podmeta.Args) (podmeta.Pod, error) {
	id, err := args.PodID()
	if err != nil {
		return podmeta.Pod{}, err
	}
	p, err := s.get(ctx, id)
	if err != nil {
		return podmeta.Pod{}, err
	}
	return podmeta.Pod{ID: ID(p), Annotations: p.Annotations, App: identity.App(p), Image: identity.Image(p)}, nil
}

// get waits (bounded) for the cache to hold the pod the runtime means,
// then asks the API itself before giving up.
func (s *Source) get(ctx context.Context, id podmeta.ID) (*corev1.Pod, error) {
	deadline := time.Now().Add(s.Wait)
	for {
		if p, ok := s.cached(id); ok && Is(p, id.UID) {
			return p, nil
		}
		if time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
	p, err := s.client(id.Namespace).Get(ctx, id.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%w: %s is not in the API", ErrNotFound, id)
	case err != nil:
		return nil, fmt.Errorf("pod %s: %w", id, err)
	case !Is(p, id.UID):
		has := string(p.UID)
		if m := p.Annotations[MirrorAnnotation]; m != "" {
			has += " (mirror of static pod " + m + ")"
		}
		return nil, fmt.Errorf("%w: %s has UID %s in the API, the runtime asked for %s", ErrNotFound, id, has, id.UID)
	}
	return p, nil
}

// cached returns the cache's pod namespace/name (shared with the cache:
// do not modify).
func (s *Source) cached(id podmeta.ID) (*corev1.Pod, bool) {
	obj, ok, err := s.informer.GetIndexer().GetByKey(id.Namespace + "/" + id.Name)
	if err != nil || !ok {
		return nil, false
	}
	p, ok := obj.(*corev1.Pod)
	return p, ok
}

// StaticUID implements podmeta.Mirrors from the cache.
func (s *Source) StaticUID(id podmeta.ID) string {
	if p, ok := s.cached(id); ok && string(p.UID) == id.UID {
		return p.Annotations[MirrorAnnotation]
	}
	return ""
}

// Exists asks the API (not the cache) whether the pod still exists; with a
// UID, only that incarnation counts. Deleting a mirror pod makes kubelet
// re-create it with a new UID while the static pod keeps running (and
// kubelet itself sends DEL when the static pod goes): with a static UID,
// any mirror of that static pod counts; without one (an AddressClaim, a
// record from an older agent), any mirror under the name does.
func (s *Source) Exists(ctx context.Context, id podmeta.ID) (bool, error) {
	p, err := s.client(id.Namespace).Get(ctx, id.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if m := p.Annotations[MirrorAnnotation]; m != "" {
		return id.StaticUID == "" || m == id.StaticUID, nil
	}
	return Is(p, id.UID), nil
}
