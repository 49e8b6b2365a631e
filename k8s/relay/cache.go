// Package relay serves every node's flock-policy the cluster's pods,
// trimmed, from one watch of the API server (as Calico's Typha does), so
// that a pod change costs the API server one watcher per relay rather
// than one per node, and costs each node only what flock-policy reads of
// it. The relay is an informer of the API server's pods (trimmed by
// k8s/netpol/trim) whose changes it keeps in order, and an HTTP server
// that answers list and watch of /api/v1/pods as the API server does, to
// client-go's typed clients: a node's informer reads it unchanged. Updates
// that change nothing trim keeps (the kubelet's conditions, a graceful
// delete's first step) are not sent.
//
// Resource versions are the API server's: a node that cannot reach a
// relay follows the API server from where it was, and one that moves to
// another relay resumes there if that relay has seen everything since.
package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// DefaultHistory is how many events a relay keeps for watchers that
// resume (about 10 minutes of 100 pod changes a second).
const DefaultHistory = 64 << 10

// errRelist is the upstream informer listing again (its watch expired): it
// delivers the difference out of order, which the history cannot hold.
var errRelist = errors.New("relay: the API server's pods were listed again (events out of order): the relay must start over")

// entry is a pod the relay holds.
type entry struct {
	pod *trim.Pod
	raw []byte // encoded for other nodes (forOthers), as list items and initial events carry it
	// whole is the pod encoded with its whole UID, if raw lacks part of
	// it: what its own node and requests that name no node are sent.
	whole *lazy
}

// event is a change watchers are sent.
type event struct {
	rv uint64
	// frame is the event for other nodes (othersEvent); nil: they are
	// not sent it.
	frame []byte
	// whole is the event as it is, with the pod's whole UID, if frame
	// differs from it.
	whole *lazy
}

// lazy is an encoding made when first asked for, once: a pod's node asks
// for few, but requests that name no node (flock-policy before v0.21)
// ask for every one.
type lazy struct {
	once sync.Once
	pod  *trim.Pod
	t    watch.EventType // "": a list item, not a frame
	b    []byte
	err  error
}

func (l *lazy) get() ([]byte, error) {
	l.once.Do(func() {
		if l.b, l.err = encodePod(l.pod.Core()); l.err == nil && l.t != "" {
			l.b, l.err = frame(l.t, l.b)
		}
	})
	return l.b, l.err
}

// forOthers is p as other nodes are sent it, and whether that lacks part
// of its UID: a node reads the whole UID only of its own pods; of others,
// enough to tell incarnations apart (trim.ShortUID). A UID is random:
// after compression it was half the bytes of a pod's event, which every
// node is sent.
func forOthers(p *trim.Pod) (*corev1.Pod, bool) {
	c := p.Core()
	short := trim.ShortUID(c.UID)
	if short == c.UID {
		return c, false
	}
	c.UID = short
	return c, true
}

// sendsWhole: a watcher for node (""; none named) is sent the whole of
// a pod on podNode.
func sendsWhole(node, podNode string) bool { return node == "" || node == podNode }

// seenByOthers: other nodes than p's are sent p only while it has
// addresses (status.podIPs). What they read of another node's pod is
// who holds an address (a peer of their pods' policies, the holder of an
// `addresses` or anycast IP, which is judged as its pod only once the
// pod's own addresses are known too); a pod without any, one just made
// or scheduled most often, is none. Its making is a third of a churn's
// events, which every node was sent. What a node holds of other nodes'
// pods is so a function of the pods (no matter which relay it followed):
// the pods with addresses.
func seenByOthers(p *trim.Pod) bool { return len(p.Status.PodIPs) > 0 }

// othersEvent is the event other nodes are sent for t, a change of a pod
// they were sent before it (before) and are sent after it (after): a pod
// that gains its addresses is added, one that loses them deleted; ""
// for none. A delete is always sent: a node that followed the API server
// for a while holds pods without addresses too, and is rid of them so.
func othersEvent(t watch.EventType, before, after bool) watch.EventType {
	switch {
	case t == watch.Deleted:
		return watch.Deleted
	case before && after:
		return watch.Modified
	case after:
		return watch.Added
	case before:
		return watch.Deleted
	}
	return ""
}

// forNode is e encoded as a request for node is sent it; nil: none (a
// pod of another node that it is not sent, seenByOthers).
func (e *entry) forNode(node string) ([]byte, error) {
	if !sendsWhole(node, e.pod.Spec.NodeName) {
		if !seenByOthers(e.pod) {
			return nil, nil
		}
		return e.raw, nil
	}
	if e.whole == nil {
		return e.raw, nil
	}
	return e.whole.get()
}

// forNode is ev's frame as a watcher for node is sent it; nil: none.
func (ev *event) forNode(node string) ([]byte, error) {
	if ev.whole == nil || !sendsWhole(node, ev.whole.pod.Spec.NodeName) {
		return ev.frame, nil
	}
	return ev.whole.get()
}

// Cache holds the pods and the recent changes, in order. Feed it with
// Handler on an informer of trimmed pods; Live opens it to watchers once
// that informer synced.
type Cache struct {
	mu   sync.Mutex
	pods map[string]*entry
	// ring holds the last events; seq is the sequence number of ring[0]
	// (ring[i] is event seq+i, watchers keep their next sequence number).
	ring []event
	seq  uint64
	max  int
	// start: a watch from resource version x is served iff x >= start
	// (every change after start is in ring or to come); cur: the newest
	// resource version seen.
	start, cur uint64
	live       bool
	// wake is closed and replaced on every change: watchers wait on it.
	wake chan struct{}
	err  error // the cache can no longer serve (errRelist)
	// failed is closed when err is set.
	failed chan struct{}
	// listsServed counts the snapshots served (lists, initial events).
	listsServed atomic.Int64
}

// NewCache keeps up to history events (DefaultHistory if 0).
func NewCache(history int) *Cache {
	if history <= 0 {
		history = DefaultHistory
	}
	return &Cache{pods: map[string]*entry{}, max: history, wake: make(chan struct{}), failed: make(chan struct{})}
}

// Handler is the upstream informer's event handler.
func (c *Cache) Handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { c.put(obj, nil) },
		UpdateFunc: func(old, obj any) {
			c.put(obj, old)
		},
		DeleteFunc: c.delete,
	}
}

// Live opens the cache to watchers once the informer synced: rv is the
// resource version of its first list (Upstream.ListRV), after which
// every change reaches Handler in order. (Not the informer's
// LastSyncResourceVersion: that runs ahead of the handler.)
func (c *Cache) Live(rv string) error {
	v, err := parseRV(rv)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live, c.start = true, max(v, c.cur)
	c.cur = c.start
	c.notifyLocked()
	return nil
}

// Failed is closed once the cache can no longer serve; Err says why.
func (c *Cache) Failed() <-chan struct{} { return c.failed }

// Err is why the cache failed, or nil.
func (c *Cache) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// relisting is the upstream informer listing: once live, the cache
// fails (the relist's objects come out of order).
func (c *Cache) relisting() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live {
		c.failLocked(errRelist)
	}
}

// prepare is obj as the cache keeps it (trimmed: the informer's
// transform did it already, and a whole pod is trimmed here), its
// resource version, its encoding for other nodes and whether that lacks
// its UID (forOthers), outside the lock; not ok if obj is no pod, or if
// the cache failed on it.
func (c *Cache) prepare(obj any) (p *trim.Pod, rv uint64, raw []byte, own bool, ok bool) {
	switch o := obj.(type) {
	case *trim.Pod:
		p = o
	case *corev1.Pod:
		p = trim.NewPod(o)
	default:
		return nil, 0, nil, false, false
	}
	rv, err := parseRV(p.ResourceVersion)
	if err != nil {
		c.fail(err)
		return nil, 0, nil, false, false
	}
	others, own := forOthers(p)
	if raw, err = encodePod(others); err != nil {
		c.fail(err)
		return nil, 0, nil, false, false
	}
	return p, rv, raw, own, true
}

func (c *Cache) put(obj, old any) {
	p, rv, raw, own, ok := c.prepare(obj)
	if !ok {
		return
	}
	key := p.Namespace + "/" + p.Name
	c.mu.Lock()
	defer c.mu.Unlock()
	prev, had := c.pods[key]
	e := &entry{pod: p, raw: raw}
	if own {
		e.whole = &lazy{pod: p}
	}
	c.pods[key] = e
	if !c.advanceLocked(rv) {
		return
	}
	if had && trim.Unchanged(prev.pod, p) {
		return // nothing a reader reads changed: not sent
	}
	t := watch.Added
	if had {
		t = watch.Modified
	}
	c.appendOthersLocked(rv, t, prev, had, p, raw, own)
}

// appendOthersLocked appends the event t of p (resource version rv, raw
// and own as prepare made them), prev the pod before it if had: other
// nodes are sent othersEvent. When it deletes, for them, a pod they
// hold, they are sent the pod as they hold it, with the addresses it
// leaves: a handler removes a deleted pod from where it was by the
// deleted object (the pods by IP), not by what the informer held.
func (c *Cache) appendOthersLocked(rv uint64, t watch.EventType, prev *entry, had bool, p *trim.Pod, raw []byte, own bool) {
	before := had && seenByOthers(prev.pod)
	others := othersEvent(t, before, seenByOthers(p))
	if others != watch.Deleted || !before || seenByOthers(p) {
		c.appendLocked(rv, t, others, p, raw, own, false)
		return
	}
	held, _ := forOthers(prev.pod)
	held.ResourceVersion = p.ResourceVersion
	b, err := encodePod(held)
	if err != nil {
		c.failLocked(err)
		return
	}
	c.appendLocked(rv, t, others, p, b, own, true)
}

func (c *Cache) delete(obj any) {
	if _, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		// Only a relist misses a delete.
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.live {
			c.failLocked(errRelist)
		}
		// Before Live: the store is all that counts.
		if d := obj.(cache.DeletedFinalStateUnknown); d.Key != "" {
			delete(c.pods, d.Key)
		}
		return
	}
	p, rv, raw, own, ok := c.prepare(obj)
	if !ok {
		return
	}
	key := p.Namespace + "/" + p.Name
	c.mu.Lock()
	defer c.mu.Unlock()
	prev, had := c.pods[key]
	delete(c.pods, key)
	if c.advanceLocked(rv) {
		c.appendOthersLocked(rv, watch.Deleted, prev, had, p, raw, own)
	}
}

// advanceLocked takes rv as the newest resource version and reports
// whether the change is one watchers are sent (the cache is live). A
// resource version not newer than one seen means the informer listed
// again: the cache fails.
func (c *Cache) advanceLocked(rv uint64) bool {
	if c.err != nil {
		return false // nothing more is sent
	}
	if !c.live {
		c.cur = max(c.cur, rv)
		return false
	}
	if rv <= c.cur {
		c.failLocked(fmt.Errorf("%w: resource version %d after %d", errRelist, rv, c.cur))
		return false
	}
	c.cur = rv
	return true
}

// appendLocked appends the event t of p (resource version rv), others
// for other nodes ("": none): raw is what they are sent of the pod
// (p, or the pod before it if held), lacking its UID if own.
func (c *Cache) appendLocked(rv uint64, t, others watch.EventType, p *trim.Pod, raw []byte, own, held bool) {
	ev := event{rv: rv}
	if others != "" {
		f, err := frame(others, raw)
		if err != nil {
			c.failLocked(err)
			return
		}
		ev.frame = f
	}
	if own || held || others != t {
		ev.whole = &lazy{pod: p, t: t}
	}
	if len(c.ring) == c.max {
		// The oldest goes: a watch from before it can no longer resume.
		// (Its slot is not cleared: watchers may be reading it.)
		c.start = c.ring[0].rv
		c.ring = c.ring[1:]
		c.seq++
	}
	c.ring = append(c.ring, ev)
	c.notifyLocked()
}

func (c *Cache) notifyLocked() {
	close(c.wake)
	c.wake = make(chan struct{})
}

func (c *Cache) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failLocked(err)
}

func (c *Cache) failLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	close(c.failed)
	c.notifyLocked()
}

// snapshot is the pods and the resource version they are at, and the
// sequence number of the next event.
func (c *Cache) snapshot() ([]*entry, uint64, uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.readyLocked(); err != nil {
		return nil, 0, 0, err
	}
	c.listsServed.Add(1)
	out := make([]*entry, 0, len(c.pods))
	for _, e := range c.pods {
		out = append(out, e)
	}
	return out, c.cur, c.seq + uint64(len(c.ring)), nil
}

// waitFor waits up to d for the cache to reach resource version rv,
// and reports whether it did.
func (c *Cache) waitFor(ctx context.Context, rv uint64, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		c.mu.Lock()
		cur, wake, err := c.cur, c.wake, c.err
		c.mu.Unlock()
		if err != nil {
			return false
		}
		if cur >= rv {
			return true
		}
		select {
		case <-wake:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// current is the newest resource version the cache holds.
func (c *Cache) current() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// errNotReady: the cache has not synced yet.
var errNotReady = errors.New("relay: not synced with the API server yet")

func (c *Cache) readyLocked() error {
	if c.err != nil {
		return c.err
	}
	if !c.live {
		return errNotReady
	}
	return nil
}

// errExpired: a watch from before what the relay holds.
type errExpired struct{ rv, start uint64 }

func (e errExpired) Error() string {
	return fmt.Sprintf("relay: too old resource version: %d (the relay holds changes after %d)", e.rv, e.start)
}

// from is the sequence number of the first event after resource version
// rv, if the cache holds every change after rv.
func (c *Cache) from(rv uint64) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.readyLocked(); err != nil {
		return 0, err
	}
	if rv < c.start {
		return 0, errExpired{rv, c.start}
	}
	// The first event newer than rv (the ring is in order).
	lo, hi := 0, len(c.ring)
	for lo < hi {
		m := (lo + hi) / 2
		if c.ring[m].rv <= rv {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return c.seq + uint64(lo), nil
}

// next is the events from sequence number seq on (nil if none yet), the
// resource version watchers are at after them, and what is closed on the
// next change. A watcher that fell behind what the cache holds gets
// errExpired.
func (c *Cache) next(seq uint64) ([]event, uint64, uint64, <-chan struct{}, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil, 0, 0, nil, c.err
	}
	if seq < c.seq {
		return nil, 0, 0, nil, errExpired{0, c.start}
	}
	i := int(seq - c.seq)
	evs := c.ring[i:len(c.ring):len(c.ring)]
	return evs, c.cur, c.seq + uint64(len(c.ring)), c.wake, nil
}

// Ready is nil once the cache serves: synced, not failed.
func (c *Cache) Ready() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readyLocked()
}

// Has reports whether the pod namespace/name exists.
func (c *Cache) Has(namespace, name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.pods[namespace+"/"+name]
	return ok
}

// Len is how many pods the cache holds.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pods)
}

func parseRV(s string) (uint64, error) {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("relay: resource version %q: want a decimal number (the API server's etcd revision): %w", s, err)
	}
	return v, nil
}

func formatRV(v uint64) string { return strconv.FormatUint(v, 10) }
