package nodetemplate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/nodeconfigs"
)

// GVR of NodeConfigTemplate.
var GVR = v1alpha1.GroupVersion.WithResource(v1alpha1.NodeConfigTemplateResource)

// eventsGVR: core/v1 Events (kubectl describe node shows them).
var eventsGVR = schema.GroupVersionResource{Version: "v1", Resource: "events"}

// Reasons of the Warning Events on the Node.
const (
	ReasonConflict    = "NodeConfigTemplateConflict"
	ReasonRenderError = "NodeConfigTemplateError"
	ReasonDuplicateID = "NodeConfigTemplateDuplicateRouterID"
)

// Config of a Controller.
type Config struct {
	// Node is the node the controller renders for: its own.
	Node string
	// Dyn reads NodeConfigTemplates and writes NodeConfigs, templates'
	// status and Events.
	Dyn dynamic.Interface
	// Nodes lists and watches Nodes (only Node is asked for).
	Nodes kubeclient.ListerWatcher[*corev1.NodeList]
	// Validate, if set, checks a rendered spec before it is written (the
	// agent's nodeconfig.Validate): an invalid one is a render error.
	Validate func(*v1alpha1.NodeConfigSpec) error
	Log      *slog.Logger
	// Resync is the period of a pass without a change (a safety net;
	// default 10 minutes).
	Resync time.Duration
	// Retry is the first back-off after a failed write (default 1 s,
	// doubling up to a minute).
	Retry time.Duration
	// EventNamespace holds the Events on the Node (default "default", as
	// kubelet's).
	EventNamespace string
}

// Controller keeps this node's NodeConfig rendered from the one
// NodeConfigTemplate selecting the node (see the package doc). Run it
// with Run; Err and Changed report its problem.
type Controller struct {
	cfg     Config
	changed chan struct{}

	mu     sync.Mutex
	err    error
	errMsg string
	// applied is the template rendered into the NodeConfig by the last
	// pass ("": none).
	applied string
	// passes counts finished passes, and observed is what the last one
	// read: tests wait for a pass that acted on the current state.
	passes   int
	observed observed
}

// observed is what a pass read from the caches.
type observed struct {
	node       *corev1.Node      // nil: none
	nodeConfig string            // its resourceVersion, "": none
	templates  map[string]string // name → "uid/generation" (status writes are not read)
}

// New returns a controller; nothing runs until Run.
func New(cfg Config) *Controller {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 10 * time.Minute
	}
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	if cfg.EventNamespace == "" {
		cfg.EventNamespace = metav1.NamespaceDefault
	}
	return &Controller{cfg: cfg, changed: make(chan struct{}, 1)}
}

// Err is what keeps the node's NodeConfig from following its template:
// two templates selecting the node, a template that does not render for
// it, a NodeConfig the API refused. nil when the NodeConfig is rendered,
// hand-made, or no template selects the node.
func (c *Controller) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Applied is the template whose rendering the node's NodeConfig is, as
// of the last pass ("": none).
func (c *Controller) Applied() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.applied
}

// Changed receives a value (coalesced) when Err changes.
func (c *Controller) Changed() <-chan struct{} { return c.changed }

// Run renders until ctx ends. Every Run has informers of its own (a
// stopped Run may be started again). It returns nil when ctx ends; API
// errors are retried with back-off, never returned.
func (c *Controller) Run(ctx context.Context) error {
	kick := make(chan struct{}, 1)
	poke := func() { notify(kick) }
	byName := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", c.cfg.Node).String()
	}
	v := view{
		templates: kubeclient.NewDynamicInformer(c.cfg.Dyn, GVR, nil),
		ncs:       kubeclient.NewDynamicInformer(c.cfg.Dyn, nodeconfigs.GVR, byName),
		nodes:     kubeclient.NewInformer(c.cfg.Nodes, &corev1.Node{}, byName),
	}
	for _, h := range []struct {
		inf     cache.SharedIndexInformer
		changed func(o, n any) bool
	}{{v.templates, specOrMetaChanged}, {v.ncs, specOrMetaChanged}, {v.nodes, nodeChanged}} {
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { poke() },
			DeleteFunc: func(any) { poke() },
			UpdateFunc: func(o, n any) {
				if h.changed(o, n) {
					poke()
				}
			},
		}); err != nil {
			return fmt.Errorf("NodeConfigTemplates: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for _, inf := range []cache.SharedIndexInformer{v.templates, v.ncs, v.nodes} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inf.RunWithContext(ctx)
		}()
	}
	if !cache.WaitForCacheSync(ctx.Done(), v.templates.HasSynced, v.ncs.HasSynced, v.nodes.HasSynced) {
		return nil
	}
	backoff := time.Duration(0)
	for {
		wait := c.cfg.Resync
		obs, err := c.pass(ctx, v)
		c.mu.Lock()
		c.passes++
		c.observed = obs
		c.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			backoff = min(max(2*backoff, c.cfg.Retry), time.Minute)
			wait = backoff
			c.cfg.Log.Debug("NodeConfigTemplate: retrying", "node", c.cfg.Node, "in", backoff, "err", err)
		} else {
			backoff = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-kick:
		case <-t.C:
		}
		t.Stop()
	}
}

// view is what one Run sees.
type view struct {
	templates, ncs, nodes cache.SharedIndexInformer
}

// pass brings the node's NodeConfig in line once, from the caches, and
// says what it read. Its error is one to retry (a write the API refused);
// a template's problem is reported (setErr) and waits for a change
// instead.
func (c *Controller) pass(ctx context.Context, v view) (observed, error) {
	node := c.cfg.Node
	var nc *unstructured.Unstructured
	if obj, ok, _ := v.ncs.GetStore().GetByKey(node); ok {
		nc, _ = obj.(*unstructured.Unstructured)
	}
	var n *corev1.Node
	if obj, ok, _ := v.nodes.GetStore().GetByKey(node); ok {
		n, _ = obj.(*corev1.Node)
	}
	cached := v.templates.GetStore().List()
	obs := observed{node: n, templates: map[string]string{}}
	if nc != nil {
		obs.nodeConfig = nc.GetResourceVersion()
	}
	for _, o := range cached {
		if u, ok := o.(*unstructured.Unstructured); ok {
			obs.templates[u.GetName()] = fmt.Sprintf("%s/%d", u.GetUID(), u.GetGeneration())
		}
	}
	return obs, c.reconcile(ctx, nc, n, cached)
}

// reconcile brings the NodeConfig nc in line with the node n and the
// templates.
func (c *Controller) reconcile(ctx context.Context, nc *unstructured.Unstructured, n *corev1.Node, cached []any) error {
	node := c.cfg.Node
	if nc != nil && !Rendered(nc) {
		// Hand-made: it overrides every template.
		c.mu.Lock()
		c.applied = ""
		c.mu.Unlock()
		c.setErr(ctx, nil, nil, "")
		return nil
	}
	tpls, problems := templates(cached)
	if n == nil {
		if len(tpls)+len(problems) == 0 {
			c.setErr(ctx, nil, nil, "")
		} else {
			c.setErr(ctx, fmt.Errorf("node %s: no Node object of that name: NodeConfigTemplates are not rendered for it", node), nil, "")
		}
		return nil // nothing to render from: a rendered NodeConfig stays as it is
	}
	var selecting []*v1alpha1.NodeConfigTemplate
	for _, t := range tpls {
		sel, err := metav1.LabelSelectorAsSelector(&t.Spec.NodeSelector)
		if err != nil {
			problems = append(problems, &RenderError{Template: t.Name, Node: node, Problems: []string{fmt.Sprintf("spec.nodeSelector: %v", err)}})
			continue
		}
		if sel.Matches(labels.Set(n.Labels)) {
			selecting = append(selecting, t)
		}
	}
	if len(problems) > 0 {
		// A template that cannot be read might select the node: nothing
		// is changed until it is fixed.
		c.setErr(ctx, errors.Join(problems...), n, ReasonRenderError)
		return nil
	}
	switch len(selecting) {
	case 0:
		c.setErr(ctx, nil, nil, "")
		return c.apiErr(ctx, c.remove(ctx, nc))
	case 1:
	default:
		names := make([]string, len(selecting))
		for i, t := range selecting {
			names[i] = t.Name
		}
		slices.Sort(names)
		err := fmt.Errorf("node %s: NodeConfigTemplates %s select it: none is applied (make their nodeSelectors disjoint, or override them with a hand-made NodeConfig %s)",
			node, joinAnd(names), node)
		c.setErr(ctx, err, n, ReasonConflict)
		if err := c.remove(ctx, nc); err != nil {
			return err // retried; the conflict is the news
		}
		return nil
	}
	t := selecting[0]
	spec, err := Render(t, n)
	if err == nil && c.cfg.Validate != nil {
		if verr := c.cfg.Validate(&spec); verr != nil {
			err = &RenderError{Template: t.Name, Node: node, Problems: []string{fmt.Sprintf("node %s: the rendered NodeConfig is invalid: %s",
				node, strings.ReplaceAll(verr.Error(), "\n", "; "))}}
		}
	}
	if err != nil {
		c.setErr(ctx, err, n, ReasonRenderError)
		return nil // nothing is left behind: the NodeConfig stays as it was
	}
	if err := c.apiErr(ctx, c.write(ctx, nc, t, spec, n)); err != nil {
		return err
	}
	c.setErr(ctx, nil, nil, "")
	c.mu.Lock()
	c.applied = t.Name
	c.mu.Unlock()
	return nil
}

// apiErr reports a write the API refused (RBAC, validation, the API
// server down) as the controller's problem, and returns it to be retried.
// A race with another writer (a conflict, a NodeConfig made or deleted
// meanwhile) is no problem: it is retried once the caches catch up.
func (c *Controller) apiErr(ctx context.Context, err error) error {
	if err != nil && !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) && !apierrors.IsNotFound(err) {
		c.setErr(ctx, err, nil, "")
	}
	return err
}

// Rendered tells a NodeConfig an agent rendered (labelled) from a
// hand-made one.
func Rendered(nc metav1.Object) bool {
	_, ok := nc.GetLabels()[v1alpha1.TemplateLabel]
	return ok
}

// templates converts the cached templates, sorted by name; one that does
// not convert is a problem.
func templates(objs []any) ([]*v1alpha1.NodeConfigTemplate, []error) {
	var out []*v1alpha1.NodeConfigTemplate
	var problems []error
	for _, obj := range objs {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		var t v1alpha1.NodeConfigTemplate
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &t); err != nil {
			problems = append(problems, fmt.Errorf("NodeConfigTemplate %s: %w", u.GetName(), err))
			continue
		}
		out = append(out, &t)
	}
	slices.SortFunc(out, func(a, b *v1alpha1.NodeConfigTemplate) int { return strings.Compare(a.Name, b.Name) })
	return out, problems
}

// remove deletes the node's rendered NodeConfig, if any (never a
// hand-made one: the preconditions fail if it was replaced meanwhile).
func (c *Controller) remove(ctx context.Context, nc *unstructured.Unstructured) error {
	c.mu.Lock()
	c.applied = ""
	c.mu.Unlock()
	if nc == nil || !Rendered(nc) {
		return nil
	}
	was := nc.GetLabels()[v1alpha1.TemplateLabel]
	rv, uid := nc.GetResourceVersion(), nc.GetUID()
	pre := &metav1.Preconditions{ResourceVersion: &rv}
	if uid != "" {
		pre.UID = &uid
	}
	err := c.cfg.Dyn.Resource(nodeconfigs.GVR).Delete(ctx, c.cfg.Node, metav1.DeleteOptions{Preconditions: pre})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("NodeConfig %s (rendered from NodeConfigTemplate %s): delete: %w", c.cfg.Node, was, err)
	}
	c.cfg.Log.Info("NodeConfigTemplate: deleted the rendered NodeConfig (no template selects the node alone)", "node", c.cfg.Node, "template", was)
	c.count(ctx, was)
	return nil
}

// write creates or updates the node's NodeConfig as rendered from t.
func (c *Controller) write(ctx context.Context, nc *unstructured.Unstructured, t *v1alpha1.NodeConfigTemplate, spec v1alpha1.NodeConfigSpec, n *corev1.Node) error {
	owner := metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.NodeConfigTemplateKind,
		Name: t.Name, UID: t.UID, Controller: ptr(true)}
	was, oldRID := "", ""
	if nc != nil {
		was = nc.GetLabels()[v1alpha1.TemplateLabel]
		cur, err := nodeconfigs.SpecOf(nc)
		if err == nil {
			oldRID = cur.RouterID
		}
		if err == nil && was == t.Name && equality.Semantic.DeepEqual(*cur, spec) &&
			equality.Semantic.DeepEqual(nc.GetOwnerReferences(), []metav1.OwnerReference{owner}) {
			return nil // as rendered
		}
	}
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&spec)
	if err != nil {
		return fmt.Errorf("NodeConfig %s: %w", c.cfg.Node, err)
	}
	res := c.cfg.Dyn.Resource(nodeconfigs.GVR)
	if nc == nil {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.GroupVersion.String(), "kind": v1alpha1.NodeConfigKind,
			"metadata": map[string]any{"name": c.cfg.Node}, "spec": raw,
		}}
		u.SetLabels(map[string]string{v1alpha1.TemplateLabel: t.Name})
		u.SetOwnerReferences([]metav1.OwnerReference{owner})
		if _, err := res.Create(ctx, u, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("NodeConfig %s (rendered from NodeConfigTemplate %s): create: %w", c.cfg.Node, t.Name, err)
		}
		c.cfg.Log.Info("NodeConfigTemplate: created the node's NodeConfig", "node", c.cfg.Node, "template", t.Name)
	} else {
		u := nc.DeepCopy()
		u.Object["spec"] = raw
		l := maps.Clone(u.GetLabels())
		l[v1alpha1.TemplateLabel] = t.Name
		u.SetLabels(l)
		u.SetOwnerReferences([]metav1.OwnerReference{owner})
		// The cached resourceVersion: a NodeConfig replaced meanwhile (by a
		// hand-made one) is a conflict, not overwritten.
		if _, err := res.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("NodeConfig %s (rendered from NodeConfigTemplate %s): update: %w", c.cfg.Node, t.Name, err)
		}
		c.cfg.Log.Info("NodeConfigTemplate: updated the node's NodeConfig", "node", c.cfg.Node, "template", t.Name, "was", was)
	}
	if spec.RouterID != oldRID {
		c.duplicates(ctx, spec.RouterID, n)
	}
	c.count(ctx, t.Name)
	if was != "" && was != t.Name {
		c.count(ctx, was)
	}
	return nil
}

// duplicates reports (log, Warning Event) other NodeConfigs with the
// router ID the node's has just been given: a duplicate is reported, not
// left to fail at OPEN. Best effort.
func (c *Controller) duplicates(ctx context.Context, rid string, n *corev1.Node) {
	list, err := c.cfg.Dyn.Resource(nodeconfigs.GVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		c.cfg.Log.Debug("NodeConfigTemplate: duplicate router IDs not checked", "err", err)
		return
	}
	var others []string
	for i := range list.Items {
		u := &list.Items[i]
		if u.GetName() == c.cfg.Node {
			continue
		}
		if r, _, _ := unstructured.NestedString(u.Object, "spec", "routerID"); r == rid {
			others = append(others, u.GetName())
		}
	}
	if len(others) == 0 {
		return
	}
	slices.Sort(others)
	msg := fmt.Sprintf("node %s: router ID %s is also the router ID of NodeConfig %s: give the nodes distinct ones (routerIDFrom)", c.cfg.Node, rid, joinAnd(others))
	c.cfg.Log.Warn("NodeConfigTemplate: duplicate router ID", "node", c.cfg.Node, "routerID", rid, "also", others)
	c.event(ctx, n, ReasonDuplicateID, msg)
}

// count writes status.nodes of template name: the NodeConfigs rendered
// from it. Every agent recounts after its own write, reading the template
// before counting, and retries a conflict, so the last writer's count
// stands and is right. Best effort (the column is informational).
func (c *Controller) count(ctx context.Context, name string) {
	res := c.cfg.Dyn.Resource(GVR)
	for range 5 {
		t, err := res.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return // deleted, or unreadable
		}
		sel := labels.SelectorFromSet(labels.Set{v1alpha1.TemplateLabel: name}).String()
		list, err := c.cfg.Dyn.Resource(nodeconfigs.GVR).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			c.cfg.Log.Debug("NodeConfigTemplate: status not written", "template", name, "err", err)
			return
		}
		n := int64(0)
		for i := range list.Items {
			if list.Items[i].GetLabels()[v1alpha1.TemplateLabel] == name {
				n++
			}
		}
		if have, _, _ := unstructured.NestedInt64(t.Object, "status", "nodes"); have == n {
			return
		}
		if err := unstructured.SetNestedField(t.Object, n, "status", "nodes"); err != nil {
			return
		}
		_, err = res.UpdateStatus(ctx, t, metav1.UpdateOptions{})
		if err == nil || !apierrors.IsConflict(err) {
			if err != nil {
				c.cfg.Log.Debug("NodeConfigTemplate: status not written", "template", name, "err", err)
			}
			return
		}
	}
}

// setErr records the controller's problem; a new one is logged once and,
// with a reason, made a Warning Event on the Node n.
func (c *Controller) setErr(ctx context.Context, err error, n *corev1.Node, reason string) {
	msg := ""
	if err != nil {
		msg = strings.ReplaceAll(err.Error(), "\n", "; ")
		err = errors.New(msg)
	}
	c.mu.Lock()
	prev := c.errMsg
	c.err, c.errMsg = err, msg
	c.mu.Unlock()
	if msg == prev {
		return
	}
	notify(c.changed)
	if err == nil {
		c.cfg.Log.Info("NodeConfigTemplate: resolved", "node", c.cfg.Node, "was", prev)
		return
	}
	c.cfg.Log.Error("NodeConfigTemplate: this node's NodeConfig does not follow its template", "node", c.cfg.Node, "err", msg)
	if n != nil && reason != "" {
		c.event(ctx, n, reason, msg)
	}
}

// event makes a Warning Event on the Node (best effort).
func (c *Controller) event(ctx context.Context, n *corev1.Node, reason, msg string) {
	now := metav1.Now()
	ev := &corev1.Event{
		TypeMeta:       metav1.TypeMeta{APIVersion: "v1", Kind: "Event"},
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", n.Name, now.UnixNano()), Namespace: c.cfg.EventNamespace},
		InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID},
		Reason:         reason, Message: truncate(msg, 1024), Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "flock-agent", Host: n.Name},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "flock.fritzlab.net/agent", ReportingInstance: n.Name,
	}
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ev)
	if err != nil {
		return
	}
	if _, err := c.cfg.Dyn.Resource(eventsGVR).Namespace(c.cfg.EventNamespace).Create(ctx, &unstructured.Unstructured{Object: raw}, metav1.CreateOptions{}); err != nil {
		c.cfg.Log.Debug("NodeConfigTemplate: no Event", "node", n.Name, "err", err)
	}
}

// specOrMetaChanged: a new generation, labels or owners (a status write is
// none of these).
func specOrMetaChanged(o, n any) bool {
	ou, ok1 := o.(*unstructured.Unstructured)
	nu, ok2 := n.(*unstructured.Unstructured)
	if !ok1 || !ok2 {
		return true
	}
	return ou.GetGeneration() != nu.GetGeneration() || ou.GetGeneration() == 0 || ou.GetUID() != nu.GetUID() ||
		!maps.Equal(ou.GetLabels(), nu.GetLabels()) ||
		!equality.Semantic.DeepEqual(ou.GetOwnerReferences(), nu.GetOwnerReferences())
}

// nodeChanged: what Render reads (a heartbeat is none of it).
func nodeChanged(o, n any) bool {
	on, ok1 := o.(*corev1.Node)
	nn, ok2 := n.(*corev1.Node)
	if !ok1 || !ok2 {
		return true
	}
	return on.UID != nn.UID || !maps.Equal(on.Labels, nn.Labels) || !maps.Equal(on.Annotations, nn.Annotations) ||
		on.Spec.PodCIDR != nn.Spec.PodCIDR || !slices.Equal(on.Spec.PodCIDRs, nn.Spec.PodCIDRs) ||
		!slices.Equal(on.Status.Addresses, nn.Status.Addresses)
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func joinAnd(names []string) string {
	if len(names) <= 1 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

func ptr[T any](v T) *T { return &v }
