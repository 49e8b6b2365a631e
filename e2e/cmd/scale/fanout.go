package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/procfs"
)

// The API server's side: what it pays for each node's watchers. A node's
// processes are not needed for that, only their watches: the API server
// serializes each event once per encoding and writes it to every watcher
// whose selectors take it, whatever the watcher does with it. So the
// watches the real processes made (the apiProxies record them) are
// replayed n times at once, each copy on a connection of its own as a
// process has, and the API server's CPU and RSS are read beside a window
// without them. Two counts show whether the cost grows linearly in the
// watchers; the projection to 5,000 nodes assumes it does.

// watchReq is one watch a process made, as it made it.
type watchReq struct {
	path   string
	query  url.Values // without the resourceVersion a replay picks itself
	accept string
}

func (w watchReq) key() string { return w.path + "?" + w.query.Encode() }

// recordWatch keeps a watch request of the proxy's process (each distinct
// one once: a reflector watches again with a new resourceVersion and a
// new random timeout, the same watch).
func (p *apiProxy) recordWatch(r *http.Request) {
	q := r.URL.Query()
	for _, k := range []string{"resourceVersion", "resourceVersionMatch", "sendInitialEvents", "timeoutSeconds", "timeout", "watch", "allowWatchBookmarks"} {
		q.Del(k)
	}
	path := strings.Replace(r.URL.Path, "/watch/", "/", 1)
	w := watchReq{path: path, query: q, accept: r.Header.Get("Accept")}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.watches == nil {
		p.watches = map[string]watchReq{}
	}
	p.watches[w.key()] = w
}

// watchReqs are the distinct watches the process made, sorted.
func (p *apiProxy) watchReqs() []watchReq {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []watchReq
	for _, w := range p.watches {
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b watchReq) int { return strings.Compare(a.key(), b.key()) })
	return out
}

// replay is n copies of a set of watches against the API server.
type replay struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	count  *apiProxy // counts what the copies are sent (its watch map)
	mu     sync.Mutex
	errs   []string
}

// startReplay opens n copies of reqs at base (the API server's URL) with
// tlsCfg (the lab's admin): each copy lists each resource once with its
// selectors (limit 1: only for a resourceVersion) and watches from there,
// again whenever the API server ends the watch.
func startReplay(base string, tlsCfg *tls.Config, reqs []watchReq, n int) *replay {
	ctx, cancel := context.WithCancel(context.Background())
	r := &replay{cancel: cancel, count: &apiProxy{watch: map[string]*watchStat{}}}
	for range n {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg.Clone(), ForceAttemptHTTP2: true}}
		for _, w := range reqs {
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				defer hc.CloseIdleConnections()
				for ctx.Err() == nil {
					if err := r.watchOnce(ctx, hc, base, w); err != nil && ctx.Err() == nil {
						r.fail(err)
						select {
						case <-ctx.Done():
						case <-time.After(time.Second):
						}
					}
				}
			}()
		}
	}
	return r
}

func (r *replay) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) < 5 {
		r.errs = append(r.errs, err.Error())
	}
}

func (r *replay) watchOnce(ctx context.Context, hc *http.Client, base string, w watchReq) error {
	q := url.Values{}
	for k, v := range w.query {
		q[k] = v
	}
	q.Set("limit", "1")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+w.path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	var list struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || err != nil {
		return fmt.Errorf("list %s: %s %v", w.path, resp.Status, err)
	}
	q.Del("limit")
	q.Set("watch", "true")
	q.Set("allowWatchBookmarks", "true")
	q.Set("resourceVersion", list.Metadata.ResourceVersion)
	req, err = http.NewRequestWithContext(ctx, http.MethodGet, base+w.path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	if w.accept != "" {
		req.Header.Set("Accept", w.accept)
	}
	resp, err = hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("watch %s: %s", w.path, resp.Status)
	}
	res := resourceOf(w.path)
	r.count.mu.Lock()
	ws := r.count.watch[res]
	if ws == nil {
		ws = &watchStat{}
		r.count.watch[res] = ws
	}
	r.count.mu.Unlock()
	ec := &eventCounter{ReadCloser: resp.Body, p: r.count, ws: ws, proto: strings.Contains(resp.Header.Get("Content-Type"), "protobuf")}
	_, err = io.Copy(io.Discard, ec)
	if ctx.Err() != nil {
		return nil
	}
	return err // nil: the API server ended the watch; watch again
}

func (r *replay) stop() []string {
	r.cancel()
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs
}

// fanoutRow is one window of the API server.
type fanoutRow struct {
	kind      string // "" (none), "flock" or "kube-proxy"
	watchers  int    // copies of the kind's watches
	cpuPct    float64
	rssMB     float64
	eventsSec float64 // sent to the copies, a second
	bytesSec  float64
	errs      []string
	err       error
	// realEventsSec is what the real processes of the kind were sent
	// under the same churn (0: not known): what a copy must get.
	realEventsSec float64
}

// apiServerWindow reads the API server's CPU over d and its RSS at the end.
func apiServerWindow(pid int, d time.Duration) (cpuPct, rssMB float64, err error) {
	pr, err := procfs.Watch("kube-apiserver", pid)
	if err != nil {
		return 0, 0, err
	}
	if cpuPct, err = pr.IdleCPU(d); err != nil {
		return 0, 0, err
	}
	rssMB, err = pr.RSS()
	return cpuPct, rssMB, err
}

// realEvents is the watch events a second the node's processes got from
// the API server under churn, which a full copy of their watches gets:
// what flock-policy gets from the relay is no part of it.
func realEvents(churn map[string]usage) map[string]float64 {
	return map[string]float64{"flock": churn[procAgent].events + churn[procPolicy].events - churn[procPolicy].relayEvents, "kube-proxy": churn[procProxy].events}
}

// measureFanout reads the API server under the running churn: alone (but
// for the measured node), then with each count of copies of flock's
// watches (flock-agent's and flock-policy's: one node's) and of
// kube-proxy's.
func (m *measuredNode) measureFanout(copies []int, settle, d time.Duration, churn map[string]usage) []fanoutRow {
	var rows []fanoutRow
	real := realEvents(churn)
	window := func(kind string, n int, reqs []watchReq) {
		row := fanoutRow{kind: kind, watchers: n, realEventsSec: real[kind]}
		var rp *replay
		if n > 0 {
			rp = startReplay(m.apiURL, m.apiTLS, reqs, n)
			time.Sleep(settle) // the lists done and the watches open
		}
		var before counts
		if rp != nil {
			before = rp.count.snapshot()
		}
		t0 := time.Now()
		row.cpuPct, row.rssMB, row.err = apiServerWindow(m.apiPID, d)
		if rp != nil {
			ev, b := rp.count.snapshot().sub(before).watchTotal()
			el := time.Since(t0).Seconds()
			row.eventsSec, row.bytesSec = float64(ev)/el, float64(b)/el
			row.errs = rp.stop()
		}
		logf("API server with %d copies of %s's watches: %s", n, kindName(kind), row)
		rows = append(rows, row)
	}
	flock := append(m.proxies[procAgent].watchReqs(), m.proxies[procPolicy].watchReqs()...)
	kp := m.proxies[procProxy].watchReqs()
	for kind, reqs := range map[string][]watchReq{"flock": flock, "kube-proxy": kp} {
		var ks []string
		for _, w := range reqs {
			ks = append(ks, w.key())
		}
		logf("%s's watches, replayed: %s", kind, strings.Join(ks, ", "))
	}
	// Without copies before and after: the API server's own drift over
	// the windows (the churn's objects pile up) is averaged out.
	window("", 0, nil)
	for _, n := range copies {
		window("flock", n, flock)
		window("kube-proxy", n, kp)
	}
	window("", 0, nil)
	return rows
}

// baseOf is the mean of the windows without copies.
func baseOf(rows []fanoutRow) (cpuPct, rssMB float64, ok bool) {
	n := 0
	for _, r := range rows {
		if r.kind == "" && r.err == nil {
			cpuPct += r.cpuPct
			rssMB += r.rssMB
			n++
		}
	}
	if n == 0 {
		return 0, 0, false
	}
	return cpuPct / float64(n), rssMB / float64(n), true
}

func kindName(kind string) string {
	if kind == "" {
		return "no one"
	}
	return kind
}

func (r fanoutRow) String() string {
	if r.err != nil {
		return "error: " + r.err.Error()
	}
	s := fmt.Sprintf("CPU %.1f %%, RSS %.0f MB, %.0f events/s and %.1f KB/s sent to the copies", r.cpuPct, r.rssMB, r.eventsSec, r.bytesSec/1024)
	if len(r.errs) > 0 {
		s += fmt.Sprintf(" (replay errors: %s)", strings.Join(r.errs, "; "))
	}
	return s
}

// saturated says whether the copies of r were sent less than 90 % of
// the events the real processes of its kind were under the same churn
// (unknown: than a copy of the smallest count of its kind was): the
// machine (two cores for the API server, the churn and the copies' TLS)
// could not serve them all, and its CPU is no longer what that many
// nodes cost.
func saturated(rows []fanoutRow, r fanoutRow) bool {
	if r.realEventsSec > 0 && r.watchers > 0 {
		return r.eventsSec/float64(r.watchers) < 0.9*r.realEventsSec
	}
	var least *fanoutRow
	for i := range rows {
		if x := &rows[i]; x.err == nil && x.kind == r.kind && x.watchers > 0 && (least == nil || x.watchers < least.watchers) {
			least = x
		}
	}
	if least == nil || r.watchers == 0 || least.eventsSec == 0 {
		return false
	}
	return r.eventsSec/float64(r.watchers) < 0.9*least.eventsSec/float64(least.watchers)
}

// nodeCost is what one more node of a kind costs the API server.
type nodeCost struct {
	cpuPct float64 // the slope of its CPU, % of a core
	// cpuRes is the slope's resolution: the drift between the windows
	// without copies, over the copies.
	cpuRes              float64
	eventsSec, bytesSec float64 // sent to one node
}

// atFullChurn is c, measured under share pace of the churn,
// at the full churn: what a watcher is sent, and the API server's work
// for it, follow the events the churn makes.
func (c nodeCost) atFullChurn(pace float64) nodeCost {
	if !isPaced(pace) {
		return c
	}
	return nodeCost{cpuPct: c.cpuPct / pace, cpuRes: c.cpuRes / pace, eventsSec: c.eventsSec / pace, bytesSec: c.bytesSec / pace}
}

// perWatcher is the API server's cost of one more node of kind: the
// slope from the windows without copies to the one with the most copies
// that were not saturated.
func perWatcher(rows []fanoutRow, kind string) (c nodeCost, ok bool) {
	baseCPU, _, ok := baseOf(rows)
	var top *fanoutRow
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range rows {
		r := &rows[i]
		if r.err != nil {
			continue
		}
		if r.kind == "" {
			lo, hi = min(lo, r.cpuPct), max(hi, r.cpuPct)
		}
		if r.kind == kind && r.watchers > 0 && !saturated(rows, *r) && (top == nil || r.watchers > top.watchers) {
			top = r
		}
	}
	if !ok || top == nil {
		return c, false
	}
	n := float64(top.watchers)
	return nodeCost{cpuPct: (top.cpuPct - baseCPU) / n, cpuRes: (hi - lo) / n, eventsSec: top.eventsSec / n, bytesSec: top.bytesSec / n}, true
}
