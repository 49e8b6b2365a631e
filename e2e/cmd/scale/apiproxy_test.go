package main

import (
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestResourceOf(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v1/pods":                                           "pods",
		"/api/v1/namespaces/ns/pods/p/status":                    "pods/status",
		"/api/v1/namespaces/ns/pods/p":                           "pods",
		"/api/v1/namespaces/ns":                                  "namespaces",
		"/api/v1/namespaces":                                     "namespaces",
		"/apis/flock.fritzlab.net/v1alpha1/nodeconfigs/n":        "nodeconfigs",
		"/apis/flock.fritzlab.net/v1alpha1/nodeconfigs/n/status": "nodeconfigs/status",
		"/apis/discovery.k8s.io/v1/endpointslices":               "endpointslices",
		"/api/v1/watch/namespaces/ns/pods":                       "pods",
		"/apis/coordination.k8s.io/v1/namespaces/x/leases/l":     "leases",
		"/api":                              "/api",
		"/apis/flock.fritzlab.net/v1alpha1": "discovery",
	} {
		if got := resourceOf(path); got != want {
			t.Errorf("resourceOf(%q) = %q, want %q", path, got, want)
		}
	}
}

// The proxy counts a JSON watch's events by line and a protobuf watch's
// by frame, however the stream is cut into reads, and counts requests by
// verb and resource; the client gets the bytes unchanged.
func TestAPIProxyCounts(t *testing.T) {
	var frames []byte
	for _, n := range []int{3, 0, 300, 70000} {
		frames = binary.BigEndian.AppendUint32(frames, uint32(n))
		frames = append(frames, make([]byte, n)...)
	}
	jsonStream := "{\"type\":\"ADDED\",\"object\":{\"a\":\"x\\ny\"}}\n{\"type\":\"MODIFIED\"}\n{\"type\":\"DELETED\"}\n"
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fl := w.(http.Flusher)
		switch {
		case r.URL.Query().Get("watch") == "true" && r.Header.Get("Accept") == "proto":
			w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf;stream=watch")
			for i := 0; i < len(frames); i += 7 { // odd cuts through the length prefixes
				w.Write(frames[i:min(i+7, len(frames))])
				fl.Flush()
			}
		case r.URL.Query().Get("watch") == "true":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, jsonStream)
		default:
			io.WriteString(w, `{"kind":"PodList"}`)
		}
	}))
	defer up.Close()
	srvCert := up.TLS.Certificates[0]
	p, err := startAPIProxy("test", nil, "127.0.0.1:0", up.URL, srvCert, tls.Certificate{}, up.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	hc := up.Client()
	get := func(path, accept string) []byte {
		req, _ := http.NewRequest("GET", "https://"+p.l.Addr().String()+path, nil)
		req.Header.Set("Accept", accept)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if b := get("/api/v1/pods?watch=true", "proto"); string(b) != string(frames) {
		t.Fatalf("protobuf stream changed: %d bytes, want %d", len(b), len(frames))
	}
	if b := get("/apis/discovery.k8s.io/v1/endpointslices?watch=true", ""); string(b) != jsonStream {
		t.Fatalf("JSON stream changed: %q", b)
	}
	get("/api/v1/namespaces/a/pods/x", "")
	c := p.snapshot()
	if w := c.watch["pods"]; w.events != 4 || w.bytes != int64(len(frames)) {
		t.Errorf("protobuf watch: %+v, want 4 events, %d bytes", w, len(frames))
	}
	if w := c.watch["endpointslices"]; w.events != 3 || w.bytes != int64(len(jsonStream)) {
		t.Errorf("JSON watch: %+v, want 3 events, %d bytes", w, len(jsonStream))
	}
	if got := c.requestList(); got != "1 get/list pods, 1 watch endpointslices, 1 watch pods" {
		t.Errorf("requests: %s", got)
	}
	if c.listB["pods"] != int64(len(`{"kind":"PodList"}`)) {
		t.Errorf("other bytes: %v", c.listB)
	}
	if d := p.snapshot().sub(c); d.requestTotal() != 0 {
		t.Errorf("a snapshot less itself: %s", fmt.Sprint(d.requests))
	}
}

// The relay's counters are read from its /metrics as Prometheus writes
// them (floats, large values in exponent form).
func TestParseRelayMetrics(t *testing.T) {
	ws, err := parseRelayMetrics([]byte("# HELP flock_relay_events_sent_total x\n# TYPE flock_relay_events_sent_total counter\nflock_relay_events_sent_total 1234\nflock_relay_sent_bytes_total 1.2345678e+07\nflock_relay_watchers 1\n"))
	if err != nil || ws.events != 1234 || ws.bytes != 12345678 {
		t.Fatalf("%+v, %v", ws, err)
	}
	if _, err := parseRelayMetrics([]byte("flock_relay_watchers 1\n")); err == nil {
		t.Fatal("metrics without the counters parsed")
	}
}
