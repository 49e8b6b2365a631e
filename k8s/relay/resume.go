package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// Resume is how a resuming watch waits between failed watches: doubling
// from First up to Most, or what the API server asked for; and how long
// it goes on failing before the relay gives up and starts over (a relay
// cut off from the API server must stop serving, so that nodes read the
// API server, or a relay that reaches it).
type Resume struct {
	First, Most, GiveUp time.Duration
}

// DefaultResume is an Upstream's Resume.
var DefaultResume = Resume{First: 100 * time.Millisecond, Most: 10 * time.Second, GiveUp: time.Minute}

// errUpstream is the relay giving up on the API server's pods.
var errUpstream = errors.New("relay: the API server's pods")

// resumingWatch follows the API server's pods through the ends of its
// watches. The reflector lists again after any watch that ends with an
// error, or after less than a second with nothing in it, and a relist
// once the relay is live means the relay must start over (its objects
// come in list order): every node's watch would drop on an API server's
// restart, or a load balancer's 503. So once the list is in (its
// initial events passed, or the watch came after a list), a watch that
// ends, or fails for a reason that passes (the connection, 429, 5xx), is
// watched again from the last resource version passed on. An expired
// version (410) reaches the reflector, where starting over is the only
// way; so does an end while a list still streams. Any other refusal
// (401, 403, a version too large: an etcd restored), or failures for
// longer than Resume.GiveUp, fail the cache: the relay starts over.
type resumingWatch struct {
	u    *Upstream
	opts metav1.ListOptions // the reflector's: selectors, timeout
	out  chan watch.Event

	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once

	// A watch from "" or "0" starts with the state in no order, and is
	// never resumed (the reflector watches from a list's version).
	never   bool
	rv      string // the last resource version passed on
	initial bool   // a list still streams
}

func (u *Upstream) resuming(ctx context.Context, w watch.Interface, opts metav1.ListOptions, initial bool) *resumingWatch {
	r := &resumingWatch{u: u, opts: opts, out: make(chan watch.Event), rv: opts.ResourceVersion, initial: initial,
		never: !initial && (opts.ResourceVersion == "" || opts.ResourceVersion == "0")}
	r.ctx, r.cancel = context.WithCancel(ctx)
	go r.run(w)
	return r
}

func (r *resumingWatch) ResultChan() <-chan watch.Event { return r.out }

func (r *resumingWatch) Stop() { r.once.Do(r.cancel) }

func (r *resumingWatch) run(w watch.Interface) {
	defer close(r.out)
	failing := time.Now() // since the last watch that passed anything on, or lasted
	fails := 0
	for {
		start := time.Now()
		again, passed, err := r.follow(w)
		if !again {
			return
		}
		// The reflector's rule for a short watch: under a second, with
		// nothing in it.
		if passed || time.Since(start) >= time.Second {
			failing, fails = time.Now(), 0
		}
		if w = r.redial(failing, &fails, err); w == nil {
			return
		}
	}
}

// follow passes w's events on until it ends. It says whether to watch
// again, whether anything was passed, and the error it ended with.
func (r *resumingWatch) follow(w watch.Interface) (again, passed bool, err error) {
	defer w.Stop()
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-r.ctx.Done():
			return false, passed, nil
		case ev, ok = <-w.ResultChan():
		}
		if !ok {
			return r.resumable(), passed, nil
		}
		if ev.Type == watch.Error {
			err := apierrors.FromObject(ev.Object)
			if !r.resumable() || expired(err) {
				r.send(ev)
				return false, passed, nil
			}
			if !transient(err) {
				r.giveUp(err)
				return false, passed, nil
			}
			return true, passed, err
		}
		var listed func()
		if m, ok := ev.Object.(metav1.Object); ok {
			// The bookmark that ends a list's initial events carries the
			// list's resource version, from which the watch resumes.
			if ev.Type == watch.Bookmark && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" && r.initial {
				rv := m.GetResourceVersion()
				listed = func() { r.u.listed(rv); r.initial, r.rv = false, rv }
			}
			if !r.initial {
				r.rv = m.GetResourceVersion()
			}
		}
		if !r.send(ev) {
			return false, passed, nil
		}
		passed = true
		if listed != nil {
			// Once the reflector has the bookmark: the first list is in.
			listed()
		}
	}
}

// resumable: a list no longer streams and there is a version to resume
// from.
func (r *resumingWatch) resumable() bool {
	return !r.never && !r.initial && r.rv != "" && r.rv != "0"
}

// redial watches again from r.rv, after err (nil: the watch ended),
// waiting between failures (fails: since failing); nil when the watch is stopped, the version
// expired (sent on as the reflector's cue to list), or the relay gave up.
func (r *resumingWatch) redial(failing time.Time, fails *int, err error) watch.Interface {
	b := r.u.Resume
	for {
		wait := retryAfter(err)
		if *fails > 0 {
			wait = max(wait, min(b.First<<min(*fails-1, 16), b.Most))
		}
		if *fails > 0 && time.Since(failing)+wait > b.GiveUp {
			if err == nil {
				err = errors.New("each watch ended at once")
			}
			r.giveUp(fmt.Errorf("no watch for %v: %w", time.Since(failing).Round(time.Second), err))
			return nil
		}
		if err != nil {
			r.u.Log.Warn("the API server's pods: watching again", "from", r.rv, "in", wait, "err", err)
		}
		*fails++
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-r.ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
		opts := r.opts
		opts.ResourceVersion, opts.ResourceVersionMatch, opts.SendInitialEvents = r.rv, "", nil
		opts.AllowWatchBookmarks = true
		// A dial is bounded by what is left of GiveUp: client-go's own
		// retries of a connection that is not answered (30 s each, ten
		// times) would hold a cut-off relay serving for minutes.
		dial, late := context.WithCancel(r.ctx)
		timer := time.AfterFunc(b.GiveUp-time.Since(failing), late)
		var w watch.Interface
		w, err = r.u.lw.Watch(dial, opts)
		inTime := timer.Stop()
		switch {
		case r.ctx.Err() != nil:
			if w != nil {
				w.Stop()
			}
			return nil
		case !inTime:
			if w != nil {
				w.Stop()
			}
			r.giveUp(fmt.Errorf("no watch for %v: the API server did not answer one in time (%v)", time.Since(failing).Round(time.Second), err))
			return nil
		case err == nil:
			return stopping{w, late} // dial carries the watch until it stops
		case expired(err):
			var status apierrors.APIStatus
			if errors.As(err, &status) {
				s := status.Status()
				r.send(watch.Event{Type: watch.Error, Object: &s})
			}
			return nil
		case !transient(err):
			late()
			r.giveUp(err)
			return nil
		}
		late()
	}
}

// stopping is a watch that also ends its context when stopped.
type stopping struct {
	watch.Interface
	cancel context.CancelFunc
}

func (s stopping) Stop() {
	s.Interface.Stop()
	s.cancel()
}

// giveUp fails the cache: the relay starts over, and serves no node
// meanwhile.
func (r *resumingWatch) giveUp(err error) {
	r.u.c.fail(fmt.Errorf("%w: watching from %s: %w", errUpstream, r.rv, err))
}

func (r *resumingWatch) send(ev watch.Event) bool {
	select {
	case r.out <- ev:
		return true
	case <-r.ctx.Done():
		return false
	}
}

func expired(err error) bool { return apierrors.IsResourceExpired(err) || apierrors.IsGone(err) }

// transient: an error that passes by itself, for which a watch is tried
// again. The API server's 429 and 5xx (but a version it has not reached:
// it goes on not having it), and anything not from the API server (the
// connection refused, reset or timed out while it restarts).
func transient(err error) bool {
	if apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code == 429 || code >= 500
	}
	return true
}

func retryAfter(err error) time.Duration {
	if s, ok := apierrors.SuggestsClientDelay(err); ok {
		return time.Duration(s) * time.Second
	}
	return 0
}

// discard is the log of an Upstream given none.
var discard = slog.New(slog.DiscardHandler)
