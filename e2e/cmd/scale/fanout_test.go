package main

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A process's watches are kept once each, without the resourceVersion
// and the knobs a replay sets itself, with their selectors and encoding.
func TestRecordWatch(t *testing.T) {
	p := &apiProxy{}
	for _, u := range []string{
		"/api/v1/pods?allowWatchBookmarks=true&fieldSelector=spec.nodeName%3Dn1&resourceVersion=10&timeoutSeconds=300&watch=true",
		"/api/v1/pods?allowWatchBookmarks=true&fieldSelector=spec.nodeName%3Dn1&resourceVersion=99&timeout=7m9s&timeoutSeconds=412&watch=true",
		"/api/v1/watch/namespaces?resourceVersion=5",
		"/apis/discovery.k8s.io/v1/endpointslices?labelSelector=%21service.kubernetes.io%2Fheadless&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&watch=1",
	} {
		r := httptest.NewRequest(http.MethodGet, u, nil)
		r.Header.Set("Accept", "application/vnd.kubernetes.protobuf")
		p.recordWatch(r)
	}
	var got []string
	for _, w := range p.watchReqs() {
		got = append(got, w.key()+" "+w.accept)
	}
	want := []string{
		"/api/v1/namespaces? application/vnd.kubernetes.protobuf",
		"/api/v1/pods?fieldSelector=spec.nodeName%3Dn1 application/vnd.kubernetes.protobuf",
		"/apis/discovery.k8s.io/v1/endpointslices?labelSelector=%21service.kubernetes.io%2Fheadless application/vnd.kubernetes.protobuf",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("recorded:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Each copy lists for a resourceVersion, watches from it with the
// recorded selectors and encoding, and watches again when the server ends
// the watch; what the copies are sent is counted.
func TestReplay(t *testing.T) {
	var lists, watches atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("fieldSelector") != "spec.nodeName=n1" {
			http.Error(w, "selector lost: "+r.URL.RawQuery, http.StatusBadRequest)
			return
		}
		if q.Get("watch") != "true" {
			lists.Add(1)
			if q.Get("limit") != "1" {
				http.Error(w, "a full list", http.StatusBadRequest)
				return
			}
			fmt.Fprint(w, `{"metadata":{"resourceVersion":"42"},"items":[]}`)
			return
		}
		if q.Get("resourceVersion") != "42" || r.Header.Get("Accept") != "application/json" {
			http.Error(w, "watch "+r.URL.RawQuery, http.StatusBadRequest)
			return
		}
		watches.Add(1)
		w.Header().Set("Content-Type", "application/json")
		for range 3 { // three events, then the server ends the watch
			fmt.Fprintln(w, `{"type":"MODIFIED","object":{}}`)
		}
	}))
	defer srv.Close()
	tlsCfg := &tls.Config{RootCAs: nil, InsecureSkipVerify: true} //nolint:gosec // the test's own server
	reqs := []watchReq{{path: "/api/v1/pods", query: map[string][]string{"fieldSelector": {"spec.nodeName=n1"}}, accept: "application/json"}}
	rp := startReplay(srv.URL, tlsCfg, reqs, 3)
	// The server counts a watch before the copy has read its events: wait
	// for what the copies counted, two watches each at least.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ev, b := rp.count.snapshot().watchTotal()
		if ev >= 18 && b > 0 && watches.Load() >= 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("counted %d events, %d bytes over %d watches, %d lists; errors %v", ev, b, watches.Load(), lists.Load(), rp.stop())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if errs := rp.stop(); len(errs) > 0 {
		t.Fatalf("replay errors: %v", errs)
	}
}

func TestPerWatcher(t *testing.T) {
	rows := []fanoutRow{
		{kind: "", cpuPct: 8, rssMB: 490},
		{kind: "", cpuPct: 12, rssMB: 510},
		{kind: "flock", watchers: 10, cpuPct: 20, rssMB: 520, bytesSec: 10 * 1024},
		{kind: "flock", watchers: 40, cpuPct: 50, rssMB: 580, bytesSec: 40 * 1024},
		{kind: "kube-proxy", watchers: 40, cpuPct: 14, rssMB: 504, bytesSec: 400},
	}
	c, ok := perWatcher(rows, "flock")
	if !ok || c.cpuPct != 1 || c.bytesSec != 1024 || c.cpuRes != 0.1 {
		t.Fatalf("flock: %+v %v, want 1 %% ± 0.1 and 1024 B/s a node", c, ok)
	}
	if c, ok := perWatcher(rows, "kube-proxy"); !ok || c.cpuPct != 0.1 {
		t.Fatalf("kube-proxy: %+v %v", c, ok)
	}
	if _, ok := perWatcher(rows[2:], "flock"); ok {
		t.Fatal("a slope without the window without copies")
	}
	// 40 copies were sent a third of what a copy of 10 got: saturated,
	// the slope is 10's.
	rows[3].bytesSec, rows[3].eventsSec, rows[2].eventsSec = 40*1024, 1200, 1000
	if !saturated(rows, rows[3]) || saturated(rows, rows[2]) {
		t.Fatalf("saturation: 40 copies %v, 10 %v", saturated(rows, rows[3]), saturated(rows, rows[2]))
	}
	if c, ok := perWatcher(rows, "flock"); !ok || c.cpuPct != 1 || c.cpuRes != 0.4 || c.eventsSec != 100 {
		t.Fatalf("flock with 40 saturated: %+v %v, want 10's: 1 %% ± 0.4, 100 events/s", c, ok)
	}
	// Against what the real processes got: 10 copies at 100 each are
	// saturated too when a real node got 400.
	for i := range rows {
		rows[i].realEventsSec = 400
	}
	if !saturated(rows, rows[2]) {
		t.Fatal("10 copies at a quarter of the real rate: not saturated")
	}
	if _, ok := perWatcher(rows, "flock"); ok {
		t.Fatal("a slope from saturated counts only")
	}
}

// The section says what the windows read: a slope inside the drift of the
// windows without copies is not projected, the bytes are.
func TestFanoutSection(t *testing.T) {
	r := sizeResult{env: full.scaled(0.1), fanout: []fanoutRow{
		{kind: "", cpuPct: 82.9, rssMB: 2878},
		{kind: "flock", watchers: 10, cpuPct: 97.8, rssMB: 4731, eventsSec: 4404, bytesSec: 18528 * 1024, realEventsSec: 410},
		{kind: "kube-proxy", watchers: 10, cpuPct: 95.8, rssMB: 3842, eventsSec: 100, bytesSec: 180 * 1024, realEventsSec: 10},
		{kind: "", cpuPct: 96.0, rssMB: 3821},
	}}
	s := fanoutSection([]sizeResult{r})
	for _, want := range []string{
		"| 500 nodes (10%) | watch bytes sent | 1852.8 KB/s | 18.0 KB/s | 9047 MB/s | 88 MB/s |",
		"| 500 nodes (10%) | API server CPU (of a core) | below the resolution (±1.31 %) | below the resolution (±1.31 %) | — | — |",
		"| 500 nodes (10%) | watch events sent a second | 440 | 10 | 2,202,000 | 50,000 |",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("no row %q in:\n%s", want, s)
		}
	}
}

func TestParseCounts(t *testing.T) {
	if got, err := parseCounts("5, 10"); err != nil || fmt.Sprint(got) != "[5 10]" {
		t.Fatalf("5, 10: %v %v", got, err)
	}
	if got, err := parseCounts(""); err != nil || got != nil {
		t.Fatalf("empty: %v %v", got, err)
	}
	for _, bad := range []string{"5,x", "0", "-3", "5,,10"} {
		if _, err := parseCounts(bad); err == nil || !strings.Contains(err.Error(), "is not a positive count") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// Copies of a node's watches are held to what the node got from the API
// server, not what flock-policy got from the relay (which no copy
// replays): else every count would look saturated.
func TestRealEventsLeaveTheRelayOut(t *testing.T) {
	churn := map[string]usage{procAgent: {events: 10}, procPolicy: {events: 280, relayEvents: 279}, procProxy: {events: 10}}
	if got := realEvents(churn); got["flock"] != 11 || got["kube-proxy"] != 10 {
		t.Fatalf("%v, want flock 11 (agent 10, policy 1 from the API server), kube-proxy 10", got)
	}
}
