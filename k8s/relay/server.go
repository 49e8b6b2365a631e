package relay

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
)

// PodsPath is the one path the relay serves, as the API server does.
const PodsPath = "/api/v1/pods"

// NodeHeader names the node a request is for: other nodes' pods are sent
// without what it does not read of them (all but the start of their UIDs,
// trim.ShortUID). A request without it (flock-policy before v0.21) is
// sent every pod whole. It grants nothing: whoever may ask may read every
// pod.
const NodeHeader = "Flock-Node"

// Authorizer decides whether the bearer of token may read every pod.
type Authorizer interface {
	// Authorize returns nil if it may, an error wrapping ErrUnauthorized
	// or ErrForbidden if not, any other error if it could not tell.
	Authorize(ctx context.Context, token string) error
}

// The answers of an Authorizer that said no.
var (
	ErrUnauthorized = errors.New("relay: unauthorized")
	ErrForbidden    = errors.New("relay: forbidden")
)

// Server answers list and watch of every pod from a Cache.
type Server struct {
	Cache *Cache
	Auth  Authorizer
	Log   *slog.Logger
	// Bookmark is how often a watch that allows bookmarks is sent one
	// (default 1m, as the API server): a watcher that resumes then does
	// so from a recent resource version.
	Bookmark time.Duration
	// MaxWatch ends watches after about this long (default 10m, the API
	// server's range), so that watchers spread over relays again.
	MaxWatch time.Duration
	// Metrics, if set, counts what the watchers are sent.
	Metrics *Metrics
	// WriteTimeout is how long a write to a watcher may take (default
	// 30s): one that stopped reading is let go.
	WriteTimeout time.Duration
	// Wait is how long a request for a resource version the cache has
	// not reached waits for it before a 504 (default 3s, as the API
	// server's watch cache).
	Wait time.Duration
	// Coalesce is the least time between two flushes of a watch's
	// events (default 250ms; negative: none). An event after a quiet
	// spell goes out at once; under churn the events of the interval
	// go out together, which compresses them in about a third fewer
	// bytes than one flush each (a flush ends a deflate block, and each block
	// starts its own code tables), and the node's flock-policy, woken
	// once for them, handles them together: at 500 nodes' churn it used
	// 1.9 % of a core with 50ms, 1.1 % with 250ms. It is small beside
	// flock-policy's own pacing (a patch at most once a second).
	Coalesce time.Duration

	stopMu  sync.Mutex
	stopped chan struct{} // closed by Stop
}

// Stop ends every watch (and every one to come): before the HTTP server's
// Shutdown, which waits for them, so that nodes go elsewhere at once.
func (s *Server) Stop() {
	ch := s.stopCh()
	s.stopMu.Lock()
	defer s.stopMu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

func (s *Server) stopCh() chan struct{} {
	s.stopMu.Lock()
	defer s.stopMu.Unlock()
	if s.stopped == nil {
		s.stopped = make(chan struct{})
	}
	return s.stopped
}

// Metrics counts what the relay sends.
type Metrics struct {
	Watchers prometheus.Gauge
	Events   prometheus.Counter
	Bytes    prometheus.Counter // as written, after compression
	Lists    prometheus.Counter
}

// NewMetrics registers the relay's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Watchers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "flock_relay_watchers", Help: "Watches of the relay's pods open now."}),
		Events:   prometheus.NewCounter(prometheus.CounterOpts{Name: "flock_relay_events_sent_total", Help: "Watch events sent, bookmarks and initial events included."}),
		Bytes:    prometheus.NewCounter(prometheus.CounterOpts{Name: "flock_relay_sent_bytes_total", Help: "Bytes of list and watch bodies written, after compression."}),
		Lists:    prometheus.NewCounter(prometheus.CounterOpts{Name: "flock_relay_lists_total", Help: "Lists served (initial events of watches not counted)."}),
	}
	reg.MustRegister(m.Watchers, m.Events, m.Bytes, m.Lists)
	return m
}

var podsResource = schema.GroupResource{Resource: "pods"}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != PodsPath {
		s.fail(w, apierrors.NewNotFound(schema.GroupResource{}, r.URL.Path))
		return
	}
	if r.Method != http.MethodGet {
		s.fail(w, apierrors.NewMethodNotSupported(podsResource, r.Method))
		return
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		s.fail(w, apierrors.NewUnauthorized("relay: no bearer token"))
		return
	}
	if err := s.Auth.Authorize(r.Context(), token); err != nil {
		switch {
		case errors.Is(err, ErrUnauthorized):
			s.fail(w, apierrors.NewUnauthorized(err.Error()))
		case errors.Is(err, ErrForbidden):
			s.fail(w, apierrors.NewForbidden(podsResource, "", err))
		default:
			s.fail(w, apierrors.NewServiceUnavailable(err.Error()))
		}
		return
	}
	if !acceptsProtobuf(r.Header.Get("Accept")) {
		s.fail(w, apierrors.NewGenericServerResponse(http.StatusNotAcceptable, "get", podsResource, "",
			fmt.Sprintf("relay: Accept %q: the relay speaks only %s", r.Header.Get("Accept"), mediaType), 0, false))
		return
	}
	q := r.URL.Query()
	for _, k := range []string{"labelSelector", "fieldSelector"} {
		if v := q.Get(k); v != "" {
			s.fail(w, apierrors.NewBadRequest(fmt.Sprintf("relay: %s %q: the relay serves every pod, unselected", k, v)))
			return
		}
	}
	if b, _ := strconv.ParseBool(q.Get("watch")); b {
		s.watch(w, r)
		return
	}
	s.list(w, r)
}

// acceptsProtobuf: client-go's typed clients with protobuf on ask for it
// first (and JSON for what has no protobuf).
func acceptsProtobuf(accept string) bool {
	for _, part := range strings.Split(accept, ",") {
		mt, _, _ := strings.Cut(strings.TrimSpace(part), ";")
		if mt == mediaType {
			return true
		}
	}
	return false
}

// notOlder makes a request for resource version v ("" or "0": any) wait
// briefly for the cache to reach it, as the API server's watch cache
// does; false if it did not (the request was answered).
func (s *Server) notOlder(w http.ResponseWriter, r *http.Request, v string) bool {
	if v == "" || v == "0" {
		return true
	}
	want, err := parseRV(v)
	if err != nil {
		s.fail(w, apierrors.NewBadRequest(err.Error()))
		return false
	}
	wait := s.Wait
	if wait <= 0 {
		wait = 3 * time.Second
	}
	if s.Cache.waitFor(r.Context(), want, wait) {
		return true
	}
	// 504 Too large resource version: the node asks elsewhere (another
	// relay, the API server) or lists afresh.
	s.fail(w, tooLarge(want, s.Cache.current()))
	return false
}

// tooLarge is the API server's answer to a resource version it has not
// reached (k8s.io/apiserver's storage.NewTooLargeResourceVersionError):
// client-go's reflector knows it by its cause.
func tooLarge(want, cur uint64) *apierrors.StatusError {
	err := apierrors.NewTimeoutError(fmt.Sprintf("Too large resource version: %d, current: %d", want, cur), 1)
	err.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge, Message: "Too large resource version"}}
	return err
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	if !s.notOlder(w, r, r.URL.Query().Get("resourceVersion")) {
		return
	}
	entries, rv, _, err := s.Cache.snapshot()
	if err != nil {
		s.fail(w, apierrors.NewServiceUnavailable(err.Error()))
		return
	}
	node := r.Header.Get(NodeHeader)
	list := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: formatRV(rv)}, Items: make([]corev1.Pod, 0, len(entries))}
	for _, e := range entries {
		if sendsWhole(node, e.pod.Spec.NodeName) {
			list.Items = append(list.Items, *e.pod.Core())
		} else if seenByOthers(e.pod) {
			p, _ := forOthers(e.pod)
			list.Items = append(list.Items, *p)
		}
	}
	out, closeOut := s.body(w, r)
	w.Header().Set("Content-Type", mediaType)
	w.WriteHeader(http.StatusOK)
	if err := podCodec.Encode(list, out); err != nil {
		s.Log.Debug("relay: list not sent", "err", err)
	}
	_ = closeOut()
	if s.Metrics != nil {
		s.Metrics.Lists.Inc()
	}
}

// body is where a response's body goes (gzip if the client takes it:
// Go's HTTP client asks for it and undoes it), and what ends it.
func (s *Server) body(w http.ResponseWriter, r *http.Request) (io.Writer, func() error) {
	var out io.Writer = w
	if s.Metrics != nil {
		out = countingWriter{out, s.Metrics.Bytes}
	}
	if !acceptsGzip(r.Header.Get("Accept-Encoding")) {
		return out, func() error { return nil }
	}
	w.Header().Set("Content-Encoding", "gzip")
	gz, _ := gzip.NewWriterLevel(out, gzip.DefaultCompression)
	return gz, gz.Close
}

func acceptsGzip(v string) bool {
	for _, part := range strings.Split(v, ",") {
		enc, _, _ := strings.Cut(strings.TrimSpace(part), ";")
		if enc == "gzip" {
			return true
		}
	}
	return false
}

type countingWriter struct {
	w io.Writer
	c prometheus.Counter
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.c.Add(float64(n))
	return n, err
}

type flusher interface{ Flush() error }

func (s *Server) watch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	node := r.Header.Get(NodeHeader)
	initial, _ := strconv.ParseBool(q.Get("sendInitialEvents"))
	bookmarks, _ := strconv.ParseBool(q.Get("allowWatchBookmarks"))
	if initial && !bookmarks {
		s.fail(w, apierrors.NewBadRequest("relay: sendInitialEvents needs allowWatchBookmarks (the end of the initial events is a bookmark)"))
		return
	}
	var (
		seq     uint64
		entries []*entry
		rv      uint64
		err     error
	)
	// Events up to since are the node's already (a plain watch from a
	// resource version newer than the cache: it moved from a source that
	// was ahead); they are not sent again.
	var since uint64
	switch v := q.Get("resourceVersion"); {
	case initial:
		if !s.notOlder(w, r, v) {
			return
		}
		entries, rv, seq, err = s.Cache.snapshot()
	case v == "" || v == "0":
		// From now on.
		_, rv, seq, err = s.Cache.snapshot()
	default:
		if since, err = parseRV(v); err != nil {
			s.fail(w, apierrors.NewBadRequest(err.Error()))
			return
		}
		seq, err = s.Cache.from(since)
	}
	var expired errExpired
	isExpired := errors.As(err, &expired)
	if err != nil && !isExpired {
		s.fail(w, apierrors.NewServiceUnavailable(err.Error()))
		return
	}
	timeout := s.MaxWatch
	if timeout <= 0 {
		timeout = 10 * time.Minute
	}
	if t, terr := strconv.Atoi(q.Get("timeoutSeconds")); terr == nil && t > 0 && time.Duration(t)*time.Second < timeout {
		timeout = time.Duration(t) * time.Second
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	rc := http.NewResponseController(w)
	out, closeOut := s.body(w, r)
	defer func() { _ = closeOut() }()
	w.Header().Set("Content-Type", mediaType+";stream=watch")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(http.StatusOK)
	// The headers now: client-go's Watch returns only once it has them,
	// and a quiet cluster may send nothing for a while.
	_ = rc.Flush()
	if s.Metrics != nil {
		s.Metrics.Watchers.Inc()
		defer s.Metrics.Watchers.Dec()
	}
	// write queues frames in the body; flush sends what is queued.
	write := func(frames ...[]byte) error {
		// A watcher that stopped reading is let go, not waited for. The
		// deadline stays set until the flush, which may come a coalesce
		// later (HTTP/2 resets a stream whose deadline passes).
		_ = rc.SetWriteDeadline(time.Now().Add(s.writeTimeout() + s.coalesce()))
		for _, f := range frames {
			if _, err := out.Write(f); err != nil {
				return err
			}
		}
		if s.Metrics != nil {
			s.Metrics.Events.Add(float64(len(frames)))
		}
		return nil
	}
	var lastFlush time.Time
	flush := func() error {
		_ = rc.SetWriteDeadline(time.Now().Add(s.writeTimeout()))
		if f, ok := out.(flusher); ok {
			if err := f.Flush(); err != nil {
				return err
			}
		}
		if err := rc.Flush(); err != nil {
			return err
		}
		lastFlush = time.Now()
		// No deadline while the watch is quiet: HTTP/2 resets a stream
		// whose deadline passes, written to or not (and client-go lists
		// afresh after a watch that failed).
		_ = rc.SetWriteDeadline(time.Time{})
		return nil
	}
	send := func(frames ...[]byte) error {
		if err := write(frames...); err != nil {
			return err
		}
		return flush()
	}
	if isExpired {
		s.sendExpired(send, expired)
		return
	}
	if initial {
		const batch = 256
		frames := make([][]byte, 0, batch)
		for _, e := range entries {
			raw, ferr := e.forNode(node)
			if ferr != nil {
				s.Log.Warn("relay: initial event not encoded", "err", ferr)
				return
			}
			if raw == nil {
				continue // not the node's to be sent
			}
			f, ferr := frame(watch.Added, raw)
			if ferr != nil {
				s.Log.Warn("relay: initial event not encoded", "err", ferr)
				return
			}
			frames = append(frames, f)
			if len(frames) == batch {
				if send(frames...) != nil {
					return
				}
				frames = frames[:0]
			}
		}
		entries = nil
		b, berr := bookmark(rv, true)
		if berr != nil || send(append(frames, b)...) != nil {
			return
		}
	}
	stopped := s.stopCh()
	tick := time.NewTicker(s.bookmarkEvery())
	defer tick.Stop()
	// due fires when events written since the last flush are to go out.
	due := time.NewTimer(time.Hour)
	due.Stop()
	defer due.Stop()
	pending := false
	for {
		evs, cur, nextSeq, wake, err := s.Cache.next(seq)
		if errors.As(err, &expired) {
			s.sendExpired(send, expired)
			return
		}
		if err != nil {
			return // the cache failed: the watcher goes elsewhere
		}
		if len(evs) > 0 {
			frames := make([][]byte, 0, len(evs))
			for i := range evs {
				if evs[i].rv <= since {
					continue
				}
				f, ferr := evs[i].forNode(node)
				if ferr != nil {
					s.Log.Warn("relay: event not encoded", "err", ferr)
					return
				}
				if f != nil { // nil: not the node's to be sent
					frames = append(frames, f)
				}
			}
			seq = nextSeq
			if len(frames) == 0 {
				continue
			}
			if write(frames...) != nil {
				return
			}
			switch wait := s.coalesce() - time.Since(lastFlush); {
			case wait <= 0:
				if flush() != nil {
					return
				}
				if pending {
					pending = false
					due.Stop()
				}
			case !pending:
				pending = true
				due.Reset(wait)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-stopped:
			return
		case <-wake:
		case <-due.C:
			pending = false
			if flush() != nil {
				return
			}
		case <-tick.C:
			if bookmarks {
				// Never behind what the node holds (since), nor ahead
				// of an event not yet flushed (it goes out with it).
				if b, err := bookmark(max(cur, since), false); err != nil || send(b) != nil {
					return
				}
				if pending {
					pending = false
					due.Stop()
				}
			}
		}
	}
}

func (s *Server) writeTimeout() time.Duration {
	if s.WriteTimeout > 0 {
		return s.WriteTimeout
	}
	return 30 * time.Second
}

func (s *Server) coalesce() time.Duration {
	switch {
	case s.Coalesce < 0:
		return 0
	case s.Coalesce == 0:
		return 250 * time.Millisecond
	}
	return s.Coalesce
}

func (s *Server) bookmarkEvery() time.Duration {
	if s.Bookmark > 0 {
		return s.Bookmark
	}
	return time.Minute
}

// sendExpired ends a watch as the API server does one from a resource
// version it no longer holds: the watcher lists again.
func (s *Server) sendExpired(send func(...[]byte) error, e errExpired) {
	st := apierrors.NewResourceExpired(e.Error()).ErrStatus
	f, err := statusFrame(&st)
	if err != nil {
		s.Log.Warn("relay: expiry not encoded", "err", err)
		return
	}
	_ = send(f)
}

// fail answers with err's status, as the API server does.
func (s *Server) fail(w http.ResponseWriter, err apierrors.APIStatus) {
	st := err.Status()
	if st.Code == http.StatusUnauthorized || st.Code == http.StatusForbidden || st.Code == http.StatusServiceUnavailable {
		s.Log.Info("relay: request refused", "code", st.Code, "reason", st.Reason, "message", st.Message)
	}
	w.Header().Set("Content-Type", mediaType)
	w.WriteHeader(int(st.Code))
	_ = podCodec.Encode(&st, w)
}
