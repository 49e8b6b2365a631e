package relay

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// Audience is what a node's token for the relays is made for (a projected
// service account token): the relays accept no other, so a token a node
// sends them is good for nothing else.
const Audience = "flock-relay"

// PodSource lists and watches every pod from a relay, or from the API
// server when no relay answers: the ListerWatcher of flock-policy's pod
// informer. Resource versions are the API server's either way, so a watch
// resumes wherever it goes next.
type PodSource struct {
	// API is the API server's pods, and Directory its ConfigMaps in
	// flock's namespace (where ConfigMapName is).
	API       corev1client.PodInterface
	Directory corev1client.ConfigMapInterface
	// Node spreads the nodes over the relays (each node its own order).
	Node string
	// TokenFile is the node's token for the relays (audience Audience),
	// read again as it is rotated.
	TokenFile string
	Log       *slog.Logger
	// Refresh is how long the directory is trusted (default 30s).
	Refresh time.Duration
	// NoWatchList makes informers list, then watch, rather than stream
	// the first list through a watch (client-go's fakes cannot).
	NoWatchList bool

	mu      sync.Mutex
	seen    uint64 // the newest resource version given to the informer
	read    time.Time
	relays  []relayClient
	clients map[Entry]relayClient
	using   string // what the last answer came from, for the log
}

// relayClient is a relay's pods: listed as corev1.Pods, watched as
// *trim.Pod (decoded straight into them: trimming).
type relayClient struct {
	name        string
	pods, watch corev1client.PodInterface
}

// IsWatchListSemanticsUnSupported tells client-go's reflector whether
// to stream its first list (relays and the API server both can).
func (s *PodSource) IsWatchListSemanticsUnSupported() bool { return s.NoWatchList }

// List lists from the first relay that answers, else the API server.
func (s *PodSource) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	l, err := try(ctx, s, s.notBehind(opts), opts, false, func(p corev1client.PodInterface, o metav1.ListOptions) (*corev1.PodList, error) {
		return p.List(ctx, o)
	})
	if err == nil {
		s.saw(l.ResourceVersion)
	}
	return l, err
}

// Watch watches from the first relay that answers, else the API server.
// Its events' pods are *trim.Pod, whatever they came from: the
// informer's expected type (an informer drops events of another).
func (s *PodSource) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	relayOpts := opts
	if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
		relayOpts = s.notBehind(opts) // a watch-list: a list through a watch
	}
	w, err := try(ctx, s, relayOpts, opts, true, func(p corev1client.PodInterface, o metav1.ListOptions) (watch.Interface, error) {
		return p.Watch(ctx, o)
	})
	if err != nil {
		return nil, err
	}
	return s.recording(w), nil
}

// recording passes w's events on, their pods as *trim.Pod (the API
// server's are decoded as corev1.Pods), and records the resource version
// of each one the informer takes (bookmarks too).
func (s *PodSource) recording(w watch.Interface) watch.Interface {
	return passing(w, func(e *watch.Event) func() {
		if e.Type == watch.Error {
			return nil
		}
		if p, ok := e.Object.(*corev1.Pod); ok {
			e.Object = trim.NewPod(p)
		}
		m, err := meta.Accessor(e.Object)
		if err != nil {
			return nil
		}
		rv := m.GetResourceVersion()
		return func() { s.saw(rv) }
	})
}

// passing passes w's events on: read is given each one before the reader
// has it (the reader owns the object then: an informer's transform
// changes it in place), and what it returns (nil: nothing) is called once
// the reader has it. Unlike watch.Filter's, its goroutine ends when the
// watch is stopped with an event in hand (a reflector reads no more once
// it stops a watch).
func passing(w watch.Interface, read func(*watch.Event) func()) watch.Interface {
	p := &passingWatch{in: w, out: make(chan watch.Event), done: make(chan struct{})}
	go func() {
		defer close(p.out)
		for e := range w.ResultChan() {
			taken := read(&e)
			select {
			case p.out <- e:
			case <-p.done:
				return
			}
			if taken != nil {
				taken()
			}
		}
	}()
	return p
}

type passingWatch struct {
	in   watch.Interface
	out  chan watch.Event
	done chan struct{}
	once sync.Once
}

func (p *passingWatch) ResultChan() <-chan watch.Event { return p.out }

func (p *passingWatch) Stop() {
	p.once.Do(func() { close(p.done) })
	p.in.Stop()
}

// notBehind is what a list (or watch-list) asks of the relays. The
// reflector asks for "" (the newest state, which the API server reads
// from etcd) after a source said it had not reached the version the node
// has, or no longer holds it; a relay answers "" from its own cache,
// which may be older than what the node already has from another relay
// or the API server. So the relays are asked for state not older than
// what the node has seen, and the API server alone for "".
func (s *PodSource) notBehind(opts metav1.ListOptions) metav1.ListOptions {
	if opts.ResourceVersion != "" {
		return opts
	}
	s.mu.Lock()
	seen := s.seen
	s.mu.Unlock()
	if seen == 0 {
		return opts // the node has nothing yet
	}
	opts.ResourceVersion = strconv.FormatUint(seen, 10)
	opts.ResourceVersionMatch = metav1.ResourceVersionMatchNotOlderThan
	return opts
}

// saw records a resource version the informer was given.
func (s *PodSource) saw(rv string) {
	v, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return
	}
	s.mu.Lock()
	s.seen = max(s.seen, v)
	s.mu.Unlock()
}

// try calls each relay with relayOpts (its watching client if watching),
// then the API server with opts.
func try[T any](ctx context.Context, s *PodSource, relayOpts, opts metav1.ListOptions, watching bool, call func(corev1client.PodInterface, metav1.ListOptions) (T, error)) (T, error) {
	var errs []error
	for _, r := range s.candidates(ctx) {
		c := r.pods
		if watching {
			c = r.watch
		}
		out, err := call(c, relayOpts)
		if err == nil {
			s.use("relay "+r.name, nil)
			return out, nil
		}
		if ctx.Err() != nil {
			return out, err
		}
		errs = append(errs, fmt.Errorf("relay %s: %w", r.name, err))
	}
	out, err := call(s.API, opts)
	if err == nil {
		s.use("the API server", errs)
	}
	return out, err
}

// Using is what the last answer came from: "relay NAME", "the API
// server", or "" before any.
func (s *PodSource) Using() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.using
}

// use logs a change of source.
func (s *PodSource) use(what string, errs []error) {
	s.mu.Lock()
	changed := s.using != what
	s.using = what
	s.mu.Unlock()
	if changed && s.Log != nil {
		if len(errs) > 0 {
			s.Log.Warn("pods from "+what+": no relay answered", "err", errors.Join(errs...))
		} else {
			s.Log.Info("pods from " + what)
		}
	}
}

// candidates is the relays in this node's order (rendezvous hashing: each
// relay's share of nodes moves only when relays come or go).
func (s *PodSource) candidates(ctx context.Context) []relayClient {
	s.mu.Lock()
	defer s.mu.Unlock()
	refresh := s.Refresh
	if refresh <= 0 {
		refresh = 30 * time.Second
	}
	if !s.read.IsZero() && time.Since(s.read) < refresh {
		return s.relays
	}
	s.read = time.Now()
	entries, bad, err := Lookup(ctx, s.Directory)
	for _, b := range bad {
		s.logWarn("relay directory entry left out", b)
	}
	if err != nil {
		s.logWarn("relay directory not read: keeping the relays known", err)
		return s.relays
	}
	if s.clients == nil {
		s.clients = map[Entry]relayClient{}
	}
	var out []relayClient
	keep := map[Entry]relayClient{}
	for name, e := range entries {
		c, ok := s.clients[e]
		if !ok {
			if c, err = s.newClient(e); err != nil {
				s.logWarn("relay "+name+" left out", err)
				continue
			}
		}
		keep[e] = c
		c.name = name
		out = append(out, c)
	}
	s.clients = keep
	slices.SortFunc(out, func(a, b relayClient) int {
		ha, hb := rendezvous(s.Node, a.name), rendezvous(s.Node, b.name)
		switch {
		case ha > hb:
			return -1
		case ha < hb:
			return 1
		}
		return 0
	})
	s.relays = out
	return out
}

func (s *PodSource) logWarn(msg string, err error) {
	if s.Log != nil {
		s.Log.Warn(msg, "err", err)
	}
}

func rendezvous(node, relay string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(node))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(relay))
	return h.Sum64()
}

// newClient is the typed clients of e, trusting only e's certificate.
func (s *PodSource) newClient(e Entry) (relayClient, error) {
	cfg := &rest.Config{
		Host:            e.URL,
		BearerTokenFile: s.TokenFile,
		ContentConfig:   rest.ContentConfig{ContentType: mediaType, AcceptContentTypes: mediaType},
		TLSClientConfig: rest.TLSClientConfig{CAData: []byte(e.Certificate), ServerName: e.ServerName},
		// A relay that does not answer is left for the next quickly.
		Dial: (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	}
	if s.Node != "" {
		// This node's pods come with what only it reads of them.
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return nodeHeader{rt, s.Node} }
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return relayClient{}, fmt.Errorf("relay client for %s: %w", e.URL, err)
	}
	// The watching client: the core client's configuration, but trimming
	// (kubernetes.NewForConfig sets its own codecs).
	wc := rest.CopyConfig(cfg)
	wc.GroupVersion, wc.APIPath, wc.NegotiatedSerializer = &corev1.SchemeGroupVersion, "/api", trimming
	rc, err := rest.RESTClientFor(wc)
	if err != nil {
		return relayClient{}, fmt.Errorf("relay client for %s: %w", e.URL, err)
	}
	return relayClient{pods: cs.CoreV1().Pods(""), watch: corev1client.New(rc).Pods("")}, nil
}

// nodeHeader names the node in each request (NodeHeader).
type nodeHeader struct {
	rt   http.RoundTripper
	node string
}

func (n nodeHeader) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set(NodeHeader, n.node)
	return n.rt.RoundTrip(req)
}
