package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/nodeconfigs"
)

func nodeConfigObject(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "flock.fritzlab.net/v1alpha1",
		"kind":       "NodeConfig",
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{"asn": int64(65001), "routerID": "192.0.2.1", "pools": []any{map[string]any{"cidr": "fd00:10:1::/64"}}},
	}}
	u.SetGeneration(2)
	return u
}

// RBAC denies the agent its NodeConfig at first: the error shows at once
// — logged at Error, once however often the read fails, on /readyz and in
// the admin status's configError — while the agent goes on waiting; once
// the read succeeds the wait ends and the error is gone.
func TestWaitNodeConfigShowsAPIErrors(t *testing.T) {
	gvr := nodeconfigs.GVR
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{gvr: "NodeConfigList"}, nodeConfigObject("vm"))
	forbidden := apierrors.NewForbidden(gvr.GroupResource(), "vm",
		errors.New(`User "system:serviceaccount:flock-system:flock" cannot get resource "nodeconfigs" in API group "flock.fritzlab.net" at the cluster scope`))
	var (
		mu      sync.Mutex
		reads   int
		allowed = make(chan struct{}) // closed: RBAC fixed
	)
	dyn.PrependReactor("get", gvr.Resource, func(clienttesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		reads++
		mu.Unlock()
		select {
		case <-allowed:
			return false, nil, nil // the tracker has it
		default:
			return true, nil, forbidden
		}
	})
	var logs testutil.SyncBuffer
	dir := t.TempDir()
	o := Options{NodeName: "vm", Log: slog.New(slog.NewTextHandler(&logs, nil)),
		MetricsAddress: "127.0.0.1:0", AdminSocket: filepath.Join(dir, "admin.sock")}
	nc := nodeconfigs.New(kubeclient.NewFactory(), dyn, "vm")

	type result struct {
		gen int64
		err error
	}
	done := make(chan result, 1)
	started := make(chan *nodeConfigWait, 1)
	go func() {
		_, spec, gen, err := waitNodeConfigWith(context.Background(), o, nc, time.Minute, 5*time.Millisecond,
			func(w *nodeConfigWait) { started <- w })
		if err == nil && spec.ASN != 65001 {
			err = fmt.Errorf("spec %+v", spec)
		}
		done <- result{gen, err}
	}()
	w := <-started
	w.mu.Lock()
	addr := w.metricsAddr
	w.mu.Unlock()
	if addr == nil {
		t.Fatal("no /readyz while waiting")
	}
	readyz := func() (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr.String() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	client := admin.NewClient(o.AdminSocket)
	adminStatus := func() admin.Status {
		t.Helper()
		var st admin.Status
		if err := client.Get(context.Background(), "/v1/status", &st); err != nil {
			t.Fatal(err)
		}
		return st
	}

	// Before the wait ends: several reads refused, the error everywhere.
	testutil.WaitFor(t, "three reads refused", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return reads >= 3
	})
	code, body := readyz()
	const want = `waiting for NodeConfig "vm": forbidden by RBAC: nodeconfigs.flock.fritzlab.net "vm" is forbidden: User "system:serviceaccount:flock-system:flock" cannot get resource "nodeconfigs"`
	if code != http.StatusServiceUnavailable || !strings.Contains(body, want) || !strings.Contains(body, "deploy/rbac.yaml") {
		t.Errorf("/readyz while RBAC denies: %d %q, want 503 and %q", code, body, want)
	}
	st := adminStatus()
	if st.Ready || !strings.HasPrefix(st.ConfigError, want) || len(st.Problems) != 1 || st.Problems[0] != "config: "+st.ConfigError {
		t.Errorf("admin status while RBAC denies: %+v", st)
	}
	// The store is not read yet: no view may answer as if the node had no
	// pods (flock-policy would drop their extra IPs from NetworkPolicy).
	for _, path := range []string{"/v1/pods", "/v1/ipam", "/v1/routes", "/v1/bgp/neighbors", "/v1/bgp/routes", "/v1/services"} {
		var out []any
		err := client.Get(context.Background(), path, &out)
		if err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "does not know this node's pods yet") || !strings.Contains(err.Error(), want) {
			t.Errorf("GET %s while waiting: %v %v, want 503 saying the pods are not known and why", path, out, err)
		}
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 || !strings.Contains(logs.String(), "cannot read this node's NodeConfig; still waiting") {
		t.Errorf("%d Error lines for one error read again and again, want 1:\n%s", n, logs.String())
	}
	select {
	case r := <-done:
		t.Fatalf("the wait ended while RBAC denies: %+v", r)
	default:
	}

	// RBAC fixed: the wait ends with the NodeConfig, the error cleared,
	// and the listeners are closed again for the agent's own.
	close(allowed)
	r := <-done
	if r.err != nil || r.gen != 2 {
		t.Fatalf("wait: gen %d, %v", r.gen, r.err)
	}
	if err := w.apiError(); err != nil {
		t.Errorf("error after the NodeConfig was read: %v", err)
	}
	if !strings.Contains(logs.String(), "this node's NodeConfig can be read again") {
		t.Errorf("the clearing is not logged:\n%s", logs.String())
	}
	if _, err := http.Get("http://" + addr.String() + "/readyz"); err == nil {
		t.Error("/readyz still served after the wait")
	}
	if err := client.Get(context.Background(), "/v1/status", &admin.Status{}); !errors.Is(err, admin.ErrNotRunning) {
		t.Errorf("admin socket after the wait: %v, want it closed", err)
	}
}

// A NodeConfig that does not exist yet is waited for as before: no error
// (nothing logged at Error, no configError), /readyz says what it waits
// for, and the timeout's message is unchanged.
func TestWaitNodeConfigMissing(t *testing.T) {
	gvr := nodeconfigs.GVR
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{gvr: "NodeConfigList"})
	var logs testutil.SyncBuffer
	o := Options{NodeName: "vm", Log: slog.New(slog.NewTextHandler(&logs, nil)), AdminSocket: filepath.Join(t.TempDir(), "admin.sock")}
	type seen struct {
		status    admin.Status
		readiness string
	}
	got := make(chan seen, 1)
	nc := nodeconfigs.New(kubeclient.NewFactory(), dyn, "vm")
	w, _, _, err := waitNodeConfigWith(context.Background(), o, nc, 50*time.Millisecond, 5*time.Millisecond, func(w *nodeConfigWait) {
		go func() { // once a read returned: what an operator sees
			for {
				w.mu.Lock()
				tried := w.tried
				w.mu.Unlock()
				if tried {
					got <- seen{waitingSource{w}.Status(), w.readiness().Error()}
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
	})
	if err == nil || err.Error() != `NodeConfig "vm" does not exist (waited 50ms): create one for this node (see deploy/examples/nodeconfig.yaml)` {
		t.Fatalf("wait: %v", err)
	}
	s := <-got
	during, readiness := s.status, s.readiness
	if w.apiError() != nil || during.ConfigError != "" || during.Ready {
		t.Errorf("a missing NodeConfig shows as an error: %v, %+v", w.apiError(), during)
	}
	if readiness != `waiting for NodeConfig "vm": it does not exist yet: create one for this node (see deploy/examples/nodeconfig.yaml)` {
		t.Errorf("readiness %q", readiness)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("a missing NodeConfig logged at Error:\n%s", logs.String())
	}
}

// The wait's progress logs each distinct error once, and its clearing.
func TestNodeConfigWaitProgressLogsOnce(t *testing.T) {
	var logs testutil.SyncBuffer
	w := &nodeConfigWait{node: "vm", log: slog.New(slog.NewTextHandler(&logs, nil))}
	a, b := errors.New("error a"), errors.New("error b")
	for _, err := range []error{a, a, a, b, b, nil, nil, a} {
		w.progress(err)
	}
	out := logs.String()
	if n := strings.Count(out, "level=ERROR"); n != 3 {
		t.Errorf("%d Error lines, want 3 (a, b, a again):\n%s", n, out)
	}
	if n := strings.Count(out, "can be read again"); n != 1 {
		t.Errorf("%d clearings logged, want 1:\n%s", n, out)
	}
}
