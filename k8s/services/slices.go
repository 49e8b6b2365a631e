package services

import (
	"context"
	"log/slog"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/delivery"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// The EndpointSlices of a cluster are the largest and busiest thing a
// Service proxy watches, and a node needs only those of the Services
// whose addresses it decides: LoadBalancers and Services with external
// IPs, most often a small share. Their slices are watched by a label
// selector on the Services' names (the endpointslice controller labels
// each slice with its Service's name); a Service that starts to need its
// slices gets a new watch, which takes over once it has listed. Past
// maxSelector bytes of selector (some proxies refuse long request
// lines) every slice is watched, as kube-proxy does.

// maxSelector is the longest label selector sent; above it, every slice
// is watched. A variable for tests.
var maxSelector = 4096

// wantsSlices: the Service has an address whose delivery ForService
// decides from its EndpointSlices (a LoadBalancer's ingress, an external
// IP). Of the others no slice is read.
func wantsSlices(s *corev1.Service) bool {
	return s.Spec.Type == corev1.ServiceTypeLoadBalancer || len(s.Spec.ExternalIPs) > 0
}

// sliceSource keeps a watch of the EndpointSlices of the Services that
// want them.
type sliceSource struct {
	lw  kubeclient.ListerWatcher[*discoveryv1.EndpointSliceList]
	log *slog.Logger
	// onEvent marks a slice's Service; swapped is told when a new watch
	// took over (every Service is decided again from it).
	onEvent cache.ResourceEventHandler
	swapped func()

	mu sync.Mutex
	// wanted are the Services that want slices (key → name), and names
	// how many of them have each name (the selector is by name alone).
	wanted map[string]string
	names  map[string]int
	// cur answers reads; next lists, and replaces cur once it has.
	cur, next *sliceWatch
	changed   chan struct{}
	// watches counts the watches started (tests).
	watches int
}

// sliceWatch is one informer of the slices of names (nil: every slice).
type sliceWatch struct {
	names map[string]bool
	inf   cache.SharedIndexInformer // nil: no name, nothing to watch
	stop  context.CancelFunc
}

func newSliceSource(lw kubeclient.ListerWatcher[*discoveryv1.EndpointSliceList], log *slog.Logger, onEvent cache.ResourceEventHandler, swapped func()) *sliceSource {
	return &sliceSource{lw: lw, log: log, onEvent: onEvent, swapped: swapped,
		wanted: map[string]string{}, names: map[string]int{}, changed: make(chan struct{}, 1)}
}

// service follows a Service's change (cur nil: deleted).
func (s *sliceSource) service(key string, cur *corev1.Service) {
	s.mu.Lock()
	defer s.mu.Unlock()
	name, had := s.wanted[key]
	want := cur != nil && wantsSlices(cur)
	if had == want {
		return
	}
	if had {
		delete(s.wanted, key)
		if s.names[name]--; s.names[name] == 0 {
			delete(s.names, name)
		}
	} else {
		s.wanted[key] = cur.Name
		s.names[cur.Name]++
	}
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// selectorFor is the label selector of the slices of names (nil: every
// slice); ok is false when it would be longer than maxSelector.
func selectorFor(names map[string]bool) (sel string, ok bool) {
	if names == nil {
		return sliceLabels, true
	}
	vals := make([]string, 0, len(names))
	for n := range names {
		vals = append(vals, n)
	}
	slices.Sort(vals)
	r, err := labels.NewRequirement(discoveryv1.LabelServiceName, selection.In, vals)
	if err != nil {
		return "", false // not a label value: not a Service's name either
	}
	sel = labels.NewSelector().Add(notLabelled(delivery.LabelHeadless), *r).String()
	return sel, len(sel) <= maxSelector
}

// covers: a watch of have holds every slice of want (nil: every slice).
func covers(have, want map[string]bool) bool {
	if have == nil {
		return true
	}
	if want == nil {
		return false
	}
	for n := range want {
		if !have[n] {
			return false
		}
	}
	return true
}

// target is the set of names to watch now (nil: every slice). Under mu.
func (s *sliceSource) target() map[string]bool {
	want := make(map[string]bool, len(s.names))
	for n := range s.names {
		want[n] = true
	}
	if _, ok := selectorFor(want); !ok {
		return nil
	}
	return want
}

// wide: a watch of have carries much more than want needs (names no
// Service wants any longer, or every slice where a selector would do):
// worth a new list. The margin keeps a Service that comes and goes from
// restarting the watch each time.
func wide(have, want map[string]bool) bool {
	if want == nil {
		return false
	}
	if have == nil {
		sel, _ := selectorFor(want)
		return 2*len(sel) <= maxSelector
	}
	return len(have) > 2*len(want)+8
}

// Run keeps a watch of the slices wanted until ctx ends; the first once
// listed (the Services' handler has seen every Service of the first
// list), not one for each Service as they arrive.
func (s *sliceSource) Run(ctx context.Context, listed cache.InformerSynced) error {
	defer func() {
		s.mu.Lock()
		for _, w := range []*sliceWatch{s.cur, s.next} {
			if w != nil && w.stop != nil {
				w.stop()
			}
		}
		s.mu.Unlock()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), listed) {
		return nil
	}
	for {
		s.ensure(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-s.changed:
		}
	}
}

// ensure starts a watch of what is wanted now, unless one that covers it
// answers, or one is listing: that one is left to finish (restarting it
// for each Service of a burst would starve them all, and cost a list
// each); once it took over, what it lacks gets a watch of its own.
func (s *sliceSource) ensure(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.next != nil {
		return
	}
	want := s.target()
	if s.cur != nil && covers(s.cur.names, want) && !wide(s.cur.names, want) {
		return
	}
	w := &sliceWatch{names: want}
	s.watches++
	if want != nil && len(want) == 0 {
		// Nothing to watch: an empty answer, at once.
		w.stop = func() {}
		s.promoteLocked(w)
		return
	}
	sel, _ := selectorFor(want)
	w.inf = newSliceInformer(s.lw, sel)
	_, _ = w.inf.AddEventHandler(s.onEvent)
	wctx, cancel := context.WithCancel(ctx)
	w.stop = cancel
	s.next = w
	s.log.Debug("services: watching EndpointSlices", "services", len(want), "all", want == nil)
	go w.inf.RunWithContext(wctx)
	go func() {
		if !cache.WaitForCacheSync(wctx.Done(), w.inf.HasSynced) {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.next != w {
			return
		}
		s.next = nil
		if s.improves(w) {
			s.promoteLocked(w)
		} else {
			w.stop()
		}
		// What is wanted now, again: the wanted set may have moved while
		// w listed.
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}()
}

// improves: w holds the slices of every wanted Service the current watch
// holds (it may lack some wanted since it began listing, which the
// current one lacks too): taking over withdraws nothing. Under mu.
func (s *sliceSource) improves(w *sliceWatch) bool {
	if s.cur == nil || w.names == nil {
		return true
	}
	for n := range s.names {
		held := s.cur.names == nil || s.cur.names[n]
		if held && !w.names[n] {
			return false
		}
	}
	return true
}

// newSliceInformer is an informer of the slices sel selects, trimmed and
// indexed by their Service.
func newSliceInformer(lw kubeclient.ListerWatcher[*discoveryv1.EndpointSliceList], sel string) cache.SharedIndexInformer {
	inf := kubeclient.NewInformer(lw, &discoveryv1.EndpointSlice{}, func(o *metav1.ListOptions) {
		o.LabelSelector = sel
	})
	_ = inf.SetTransform(trimSlice)
	_ = inf.AddIndexers(cache.Indexers{byService: func(obj any) ([]string, error) {
		if key := sliceService(obj); key != "" {
			return []string{key}, nil
		}
		return nil, nil
	}})
	return inf
}

// promoteLocked makes w the watch reads go to. Under mu.
func (s *sliceSource) promoteLocked(w *sliceWatch) {
	old := s.cur
	s.cur = w
	if old != nil {
		old.stop()
	}
	s.swapped()
}

// synced: a listed watch covers every Service that wants slices.
func (s *sliceSource) synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur != nil && covers(s.cur.names, s.target())
}

// slices are the slices of the Service key, as the current watch holds
// them.
func (s *sliceSource) slices(key string) []*discoveryv1.EndpointSlice {
	s.mu.Lock()
	w := s.cur
	s.mu.Unlock()
	if w == nil || w.inf == nil {
		return nil
	}
	objs, err := w.inf.GetIndexer().ByIndex(byService, key)
	if err != nil {
		return nil
	}
	out := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if sl, ok := o.(*discoveryv1.EndpointSlice); ok {
			out = append(out, sl)
		}
	}
	return out
}
