package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// apiProxy stands between one process and the API server and counts
// what it asks and what it is sent: requests by verb and resource, and
// for watches the events and bytes streamed, by resource. It ends TLS
// with the API server's own certificate (the lab's: the process's
// kubeconfig stays valid but for the port) and makes the request again
// to the API server with the same client certificate as the process, so
// the API server sees the same user. Bytes are the response bodies as
// sent (compressed if the API server compressed them).
type apiProxy struct {
	name string
	srv  *http.Server
	l    net.Listener

	mu       sync.Mutex
	requests map[string]int        // "verb resource"
	watch    map[string]*watchStat // by resource
	listB    map[string]int64      // bytes of non-watch responses, by resource
	watches  map[string]watchReq   // the distinct watches made (fanout.go)
}

type watchStat struct {
	events, bytes int64
}

// counts is a copy of a proxy's counters at one moment.
type counts struct {
	requests map[string]int
	watch    map[string]watchStat
	listB    map[string]int64
}

func (c counts) watchTotal() (events, bytes int64) {
	for _, w := range c.watch {
		events += w.events
		bytes += w.bytes
	}
	return
}

func (c counts) requestTotal() int {
	n := 0
	for _, v := range c.requests {
		n += v
	}
	return n
}

// sub is c − o, counter by counter.
func (c counts) sub(o counts) counts {
	d := counts{requests: map[string]int{}, watch: map[string]watchStat{}, listB: map[string]int64{}}
	for k, v := range c.requests {
		if v-o.requests[k] != 0 {
			d.requests[k] = v - o.requests[k]
		}
	}
	for k, v := range c.watch {
		d.watch[k] = watchStat{v.events - o.watch[k].events, v.bytes - o.watch[k].bytes}
	}
	for k, v := range c.listB {
		d.listB[k] = v - o.listB[k]
	}
	return d
}

// requestList is "n verb resource" lines, most first.
func (c counts) requestList() string {
	var ks []string
	for k := range c.requests {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool {
		if c.requests[ks[i]] != c.requests[ks[j]] {
			return c.requests[ks[i]] > c.requests[ks[j]]
		}
		return ks[i] < ks[j]
	})
	var b strings.Builder
	for i, k := range ks {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d %s", c.requests[k], k)
	}
	return b.String()
}

func (p *apiProxy) snapshot() counts {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := counts{requests: map[string]int{}, watch: map[string]watchStat{}, listB: map[string]int64{}}
	for k, v := range p.requests {
		c.requests[k] = v
	}
	for k, v := range p.watch {
		c.watch[k] = *v
	}
	for k, v := range p.listB {
		c.listB[k] = v
	}
	return c
}

// startAPIProxy listens on listen inside ns and forwards to upstream
// (https://host:port, the API server seen from the test's namespace); nil
// ns: the test's own.
// serverCert is what it shows the process; clientCert what it shows the
// API server.
func startAPIProxy(name string, ns *lab.NS, listen, upstream string, serverCert, clientCert tls.Certificate, roots *x509.CertPool) (*apiProxy, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, fmt.Errorf("proxy %s: upstream %q: %w", name, upstream, err)
	}
	p := &apiProxy{name: name, requests: map[string]int{}, watch: map[string]*watchStat{}, listB: map[string]int64{}}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1 // watches stream
	rp.Transport = &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{clientCert}},
		ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 100, IdleConnTimeout: 90 * time.Second,
		// Compression is passed through as the process asked for it.
		DisableCompression: true,
	}
	rp.ErrorLog = nil
	rp.ModifyResponse = func(resp *http.Response) error {
		r := resp.Request
		res := resourceOf(r.URL.Path)
		if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" || strings.Contains(r.URL.Path, "/watch/") {
			p.mu.Lock()
			ws := p.watch[res]
			if ws == nil {
				ws = &watchStat{}
				p.watch[res] = ws
			}
			p.mu.Unlock()
			proto := strings.Contains(resp.Header.Get("Content-Type"), "protobuf")
			resp.Body = &eventCounter{ReadCloser: resp.Body, p: p, ws: ws, proto: proto}
			return nil
		}
		resp.Body = &byteCounter{ReadCloser: resp.Body, p: p, res: res}
		return nil
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.requests[verbOf(r)+" "+resourceOf(r.URL.Path)]++
		p.mu.Unlock()
		if verbOf(r) == "watch" {
			p.recordWatch(r)
		}
		rp.ServeHTTP(w, r)
	})
	var l net.Listener
	listenIn := func() (err error) {
		l, err = net.Listen("tcp", listen)
		return err
	}
	if ns != nil {
		err = ns.InNS(listenIn)
	} else {
		err = listenIn() // the test's own namespace
	}
	if err != nil {
		return nil, fmt.Errorf("proxy %s: listen %s: %w", name, listen, err)
	}
	p.l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{serverCert}, NextProtos: []string{"h2", "http/1.1"}})
	p.srv = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(p.l) }()
	return p, nil
}

func (p *apiProxy) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := p.srv.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		logf("proxy %s: %v", p.name, err)
	}
	_ = p.srv.Close()
}

// verbOf names the request as the API server's audit log would.
func verbOf(r *http.Request) string {
	q := r.URL.Query()
	switch r.Method {
	case http.MethodGet:
		if q.Get("watch") == "true" || q.Get("watch") == "1" || strings.Contains(r.URL.Path, "/watch/") {
			return "watch"
		}
		return "get/list"
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return strings.ToLower(r.Method)
}

// resourceOf is the resource of an API path (with its subresource):
// /api/v1/namespaces/ns/pods/name/status → pods/status.
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	// Drop the prefix (api/v1 or apis/group/version) and "watch".
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return path
	}
	if len(parts) > 0 && parts[0] == "watch" {
		parts = parts[1:]
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) != 2 {
		parts = parts[2:] // a namespaced resource
	}
	switch len(parts) {
	case 0:
		return "discovery"
	case 1, 2:
		return parts[0]
	default:
		return parts[0] + "/" + parts[2]
	}
}

type byteCounter struct {
	io.ReadCloser
	p   *apiProxy
	res string
}

func (b *byteCounter) Read(buf []byte) (int, error) {
	n, err := b.ReadCloser.Read(buf)
	if n > 0 {
		b.p.mu.Lock()
		b.p.listB[b.res] += int64(n)
		b.p.mu.Unlock()
	}
	return n, err
}

// eventCounter counts a watch stream's events as they pass: a JSON
// stream has one event a line (strings in JSON hold no raw newline), a
// protobuf stream one event a frame of a 4-byte big-endian length.
type eventCounter struct {
	io.ReadCloser
	p     *apiProxy
	ws    *watchStat
	proto bool
	// protobuf framing state: the length bytes read so far, and the
	// bytes of the current frame still to come.
	hdr  []byte
	left int
}

func (e *eventCounter) Read(buf []byte) (int, error) {
	n, err := e.ReadCloser.Read(buf)
	if n > 0 {
		events := e.count(buf[:n])
		e.p.mu.Lock()
		e.ws.bytes += int64(n)
		e.ws.events += int64(events)
		e.p.mu.Unlock()
	}
	return n, err
}

func (e *eventCounter) count(b []byte) int {
	if !e.proto {
		return bytes.Count(b, []byte{'\n'})
	}
	events := 0
	for len(b) > 0 {
		if e.left > 0 {
			k := min(e.left, len(b))
			e.left -= k
			b = b[k:]
			continue
		}
		need := 4 - len(e.hdr)
		k := min(need, len(b))
		e.hdr = append(e.hdr, b[:k]...)
		b = b[k:]
		if len(e.hdr) == 4 {
			e.left = int(binary.BigEndian.Uint32(e.hdr))
			e.hdr = e.hdr[:0]
			events++
		}
	}
	return events
}
