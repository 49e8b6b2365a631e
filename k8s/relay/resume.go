package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// Between the watches of a resuming watch that failed: doubling from
// resumeFirst up to resumeMost, or what the API server asked for.
var (
	resumeFirst = 100 * time.Millisecond
	resumeMost  = 30 * time.Second
)

// resumingWatch follows the API server's pods through the ends of its
// watches. The reflector lists again after any watch that ends with an
// error, or after less than a second with nothing in it, and a relist
// once the relay is live means the relay must start over (its objects
// come in list order): every node's watch would drop on an API server's
// restart, or a load balancer's 503. So once the list is in (its
// initial events passed, or the watch came after a list), a watch that
// ends or fails is watched again from the last resource version passed
// on, as client-go's RetryWatcher does. Only an expired resource version
// reaches the reflector, where starting over is the only way; so does
// an end while a list still streams.
type resumingWatch struct {
	u    *Upstream
	opts metav1.ListOptions // the reflector's: selectors, timeout
	out  chan watch.Event

	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once

	rv      string // the last resource version passed on
	initial bool   // a list still streams
}

func (u *Upstream) resuming(ctx context.Context, w watch.Interface, opts metav1.ListOptions, initial bool) *resumingWatch {
	r := &resumingWatch{u: u, opts: opts, out: make(chan watch.Event), rv: opts.ResourceVersion, initial: initial}
	r.ctx, r.cancel = context.WithCancel(ctx)
	go r.run(w)
	return r
}

func (r *resumingWatch) ResultChan() <-chan watch.Event { return r.out }

func (r *resumingWatch) Stop() { r.once.Do(r.cancel) }

func (r *resumingWatch) run(w watch.Interface) {
	defer close(r.out)
	fails := 0
	for {
		again, passed, after := r.follow(w)
		if !again {
			return
		}
		if passed {
			fails = 0
		}
		if w = r.redial(&fails, after); w == nil {
			return
		}
	}
}

// follow passes w's events on until it ends. It says whether to watch
// again, whether anything was passed, and the wait the API server asked
// for.
func (r *resumingWatch) follow(w watch.Interface) (again, passed bool, after time.Duration) {
	defer w.Stop()
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-r.ctx.Done():
			return false, passed, 0
		case ev, ok = <-w.ResultChan():
		}
		if !ok {
			return r.resumable(), passed, 0
		}
		if ev.Type == watch.Error {
			err := apierrors.FromObject(ev.Object)
			if !r.resumable() || expired(err) {
				r.send(ev)
				return false, passed, 0
			}
			r.logResume(err)
			return true, passed, retryAfter(err)
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
			return false, passed, 0
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
func (r *resumingWatch) resumable() bool { return !r.initial && r.rv != "" && r.rv != "0" }

// redial watches again from r.rv, waiting between failures; nil when
// the watch is stopped, or the version expired (sent on as the
// reflector's cue to list).
func (r *resumingWatch) redial(fails *int, after time.Duration) watch.Interface {
	for {
		wait := after
		if *fails > 0 {
			wait = max(wait, min(resumeFirst<<min(*fails-1, 16), resumeMost))
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
		w, err := r.u.lw.Watch(r.ctx, opts)
		switch {
		case err == nil:
			return w
		case r.ctx.Err() != nil:
			return nil
		case expired(err):
			var status apierrors.APIStatus
			if errors.As(err, &status) {
				s := status.Status()
				r.send(watch.Event{Type: watch.Error, Object: &s})
			}
			return nil
		}
		r.logResume(err)
		after = retryAfter(err)
	}
}

func (r *resumingWatch) send(ev watch.Event) bool {
	select {
	case r.out <- ev:
		return true
	case <-r.ctx.Done():
		return false
	}
}

func (r *resumingWatch) logResume(err error) {
	r.u.Log.Warn("the API server's pods: watching again", "from", r.rv, "err", err)
}

func expired(err error) bool { return apierrors.IsResourceExpired(err) || apierrors.IsGone(err) }

func retryAfter(err error) time.Duration {
	if s, ok := apierrors.SuggestsClientDelay(err); ok {
		return time.Duration(s) * time.Second
	}
	return 0
}

// discard is the log of an Upstream given none.
var discard = slog.New(slog.DiscardHandler)
