// Package nodeconfigs watches this node's NodeConfig object (cluster
// scoped, named after the node) and writes its status.
package nodeconfigs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/decode"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// GVR of NodeConfig.
var GVR = schema.GroupVersionResource{Group: "flock.fritzlab.net", Version: "v1alpha1", Resource: "nodeconfigs"}

// Watcher follows one NodeConfig.
type Watcher struct {
	dyn      dynamic.Interface
	node     string
	informer cache.SharedIndexInformer
	changed  chan struct{}
}

// New follows the NodeConfig named node with the NodeConfig informer of
// f (the one NewAll(f, dyn, node) uses: every node's NodeConfig is watched
// anyway, for the summaries' overlaps).
func New(f *kubeclient.Factory, dyn dynamic.Interface, node string) *Watcher {
	return newWatcher(dyn, node, everyNode(f, dyn, node))
}

// NewNamed follows the NodeConfig named node with an informer of f that
// lists and watches that object alone (a field selector on its name): for
// a process that does not watch every NodeConfig anyway, so that other
// nodes' NodeConfigs cost it nothing. It is not the informer New and All
// share.
func NewNamed(f *kubeclient.Factory, dyn dynamic.Interface, node string) *Watcher {
	inf := f.Informer(GVR.String()+"/"+node, func() cache.SharedIndexInformer {
		return kubeclient.NewDynamicInformer(dyn, GVR, func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", node).String()
		})
	})
	return newWatcher(dyn, node, inf)
}

func newWatcher(dyn dynamic.Interface, node string, inf cache.SharedIndexInformer) *Watcher {
	w := &Watcher{dyn: dyn, node: node, informer: inf, changed: make(chan struct{}, 1)}
	_, _ = inf.AddEventHandler(specChanges(func(u *unstructured.Unstructured) {
		if u.GetName() == node {
			notify(w.changed)
		}
	}))
	return w
}

// Changed receives a value (coalesced) after the spec changed: a new
// generation. Status writes (ours) bump resourceVersion, not generation,
// and do not count.
func (w *Watcher) Changed() <-chan struct{} { return w.changed }

// Current is the NodeConfig as cached: its spec and generation. A spec
// that does not convert is an error (Wait and the agent's validation
// report it); no object is one too.
func (w *Watcher) Current() (*v1alpha1.NodeConfigSpec, int64, error) {
	obj, ok, err := w.informer.GetStore().GetByKey(w.node)
	if err != nil {
		return nil, 0, err
	}
	u, isU := obj.(*unstructured.Unstructured)
	if !ok || !isU {
		return nil, 0, fmt.Errorf("NodeConfig %q does not exist", w.node)
	}
	spec, err := SpecOf(u)
	return spec, u.GetGeneration(), err
}

// Status is this node's NodeConfig status as the cache holds it: ok is
// false if the cache has no such object; an object without a status (or
// one that does not decode) has the empty status.
func (w *Watcher) Status() (st v1alpha1.NodeConfigStatus, ok bool) {
	obj, found, err := w.informer.GetStore().GetByKey(w.node)
	u, isU := obj.(*unstructured.Unstructured)
	if err != nil || !found || !isU {
		return st, false
	}
	if raw, has := u.Object["status"].(map[string]any); has {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &st); err != nil {
			return v1alpha1.NodeConfigStatus{}, true
		}
	}
	return st, true
}

// specChanges calls f with every object added, deleted, or updated with a
// new generation (a spec change: status writes do not count).
func specChanges(f func(*unstructured.Unstructured)) cache.ResourceEventHandler {
	call := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if u, ok := obj.(*unstructured.Unstructured); ok {
			f(u)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: call,
		UpdateFunc: func(o, n any) {
			ou, ok1 := o.(*unstructured.Unstructured)
			nu, ok2 := n.(*unstructured.Unstructured)
			if ok1 && ok2 && ou.GetGeneration() == nu.GetGeneration() {
				return
			}
			call(n)
		},
		DeleteFunc: call,
	}
}

// oneError makes a joined error one line, its errors separated by "; ":
// for a log line or a status field.
func oneError(err error) error {
	if !strings.Contains(err.Error(), "\n") {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), "\n", "; "))
}

// notify never blocks an informer: a pending value covers every change.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// SpecOf converts an object's spec. An error names every field that does
// not convert by its path ("spec.bgp.peers[2].timers.holdTime: cannot
// unmarshal string "ninety" into an integer"); the API server's schema
// makes that rare (a CRD older than the agent, a schema not installed).
func SpecOf(u *unstructured.Unstructured) (*v1alpha1.NodeConfigSpec, error) {
	raw, ok := u.Object["spec"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("nodeconfig %s: no spec", u.GetName())
	}
	var spec v1alpha1.NodeConfigSpec
	if err := decode.FromUnstructured(raw, &spec, "spec"); err != nil {
		return nil, fmt.Errorf("nodeconfig %s: %w", u.GetName(), oneError(err))
	}
	return &spec, nil
}

// WaitOptions configure Wait.
type WaitOptions struct {
	// Timeout is how long to wait for the NodeConfig to be created.
	Timeout time.Duration
	// Poll is the time between two reads (0: a second).
	Poll time.Duration
	// Progress, if set, is called after every read that did not return
	// the NodeConfig: with nil while the NodeConfig does not exist (the
	// object: it is yet to be created), else with what keeps it from
	// being read (see Explain), e.g. RBAC denying the agent.
	Progress func(err error)
}

// tryTimeout bounds one read: an API server that does not answer is an
// error to show, not a wait without end.
const tryTimeout = 10 * time.Second

// Wait returns the NodeConfig, waiting up to o.Timeout for it to be
// created. A NodeConfig that does not convert is an error at once (see
// SpecOf); so is ctx ending. Any other error (RBAC, no CRD, credentials,
// the API server unreachable) is retried until the timeout and reported
// to o.Progress as it happens.
func (w *Watcher) Wait(ctx context.Context, o WaitOptions) (*v1alpha1.NodeConfigSpec, int64, error) {
	deadline := time.Now().Add(o.Timeout)
	poll := o.Poll
	if poll <= 0 {
		poll = time.Second
	}
	for {
		try, cancel := context.WithTimeout(ctx, tryTimeout)
		u, err := w.dyn.Resource(GVR).Get(try, w.node, metav1.GetOptions{})
		cancel()
		if err == nil {
			spec, err := SpecOf(u)
			return spec, u.GetGeneration(), err
		}
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		why := Explain(err)
		if o.Progress != nil {
			o.Progress(why)
		}
		if time.Now().After(deadline) {
			if why == nil {
				return nil, 0, fmt.Errorf("NodeConfig %q does not exist (waited %s): create one for this node (see deploy/examples/nodeconfig.yaml)", w.node, o.Timeout)
			}
			return nil, 0, fmt.Errorf("NodeConfig %q (waited %s): %w", w.node, o.Timeout, why)
		}
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// Causes of an APIError: what keeps a NodeConfig from being read.
const (
	CauseForbidden    = "Forbidden"    // RBAC denies the agent (403)
	CauseUnauthorized = "Unauthorized" // the API server does not accept the agent's credentials (401)
	CauseNoCRD        = "NoCRD"        // the NodeConfig resource does not exist: the CRD is not installed
	CauseUnreachable  = "Unreachable"  // no answer from the API server (connection, TLS, timeout)
	CauseAPI          = "APIError"     // any other error the API server answered with
)

// APIError is an error reading a NodeConfig, with its cause and what to
// do about it.
type APIError struct {
	Cause string // one of the Cause constants
	Err   error  // as client-go returned it
	hint  string
}

func (e *APIError) Error() string {
	var msg string
	switch e.Cause {
	case CauseForbidden:
		msg = "forbidden by RBAC: " + e.Err.Error()
	case CauseUnauthorized:
		msg = "unauthorized: " + e.Err.Error()
	case CauseNoCRD:
		msg = fmt.Sprintf("the API server serves no nodeconfigs.%s/%s: the NodeConfig CRD is not installed, or does not serve the version this agent reads, %s (%s)", GVR.Group, GVR.Version, GVR.Version, e.Err.Error())
	case CauseUnreachable:
		msg = "the API server cannot be reached: " + e.Err.Error()
	default:
		msg = "the API server answered: " + e.Err.Error()
	}
	if e.hint != "" {
		msg += "; " + e.hint
	}
	return msg
}

func (e *APIError) Unwrap() error { return e.Err }

// Explain says what an error reading a NodeConfig means: nil when
// the NodeConfig does not exist (the object: the resource is there), else
// an *APIError with the cause and what to do.
func Explain(err error) error {
	if err == nil {
		return nil
	}
	var ae *APIError
	if errors.As(err, &ae) {
		return ae
	}
	e := &APIError{Cause: CauseAPI, Err: err}
	switch {
	case apierrors.IsNotFound(err) && !missingResource(err):
		return nil
	case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
		e.Cause, e.hint = CauseNoCRD, fmt.Sprintf("`kubectl get crd nodeconfigs.%s -o jsonpath='{.spec.versions[*].name}'` lists the versions served; apply this release's deploy/ (kubectl apply -k deploy/)", GVR.Group)
	case apierrors.IsForbidden(err):
		e.Cause, e.hint = CauseForbidden, fmt.Sprintf("the agent's ServiceAccount needs get, list and watch on nodeconfigs.%s (deploy/rbac.yaml)", GVR.Group)
	case apierrors.IsUnauthorized(err):
		e.Cause, e.hint = CauseUnauthorized, "the API server does not accept the agent's credentials (its ServiceAccount token, or --kubeconfig)"
	case unreachable(err):
		e.Cause = CauseUnreachable
	}
	return e
}

// missingResource tells a 404 for the resource (no such path: client-go
// made the error up from a body that is no Status) from one for the
// object (the API server's own Status).
func missingResource(err error) bool {
	if apierrors.HasStatusCause(err, metav1.CauseTypeUnexpectedServerResponse) {
		return true
	}
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		st := se.Status()
		return strings.HasPrefix(st.Message, "the server could not find the requested resource")
	}
	return false
}

// unreachable tells whether err is the API server not answering: a
// transport error (connection refused or reset, DNS, TLS), a timeout.
func unreachable(err error) bool {
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err)
	}
	var ue *url.Error
	var ne net.Error
	return errors.As(err, &ue) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.ErrUnexpectedEOF)
}

// UpdateStatus writes status through the status subresource.
func (w *Watcher) UpdateStatus(ctx context.Context, status v1alpha1.NodeConfigStatus) error {
	u, err := w.dyn.Resource(GVR).Get(ctx, w.node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("NodeConfig %q status: %w", w.node, err)
	}
	st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&status)
	if err != nil {
		return fmt.Errorf("NodeConfig %q status: %w", w.node, err)
	}
	u.Object["status"] = st
	if _, err := w.dyn.Resource(GVR).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("NodeConfig %q status: %w", w.node, err)
	}
	return nil
}
