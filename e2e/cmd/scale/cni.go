package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"code.fritzlab.net/fritzlab/flock/e2e/k8slab"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	flockv1 "code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

var nodeConfigGVR = flockv1.GroupVersion.WithResource("nodeconfigs")

// cniNamespace holds the pods the node ADDs for real.
const cniNamespace = "scale-cni"

// register makes the measured node's Node (as its kubelet would) and
// NodeConfig, and the namespace of the pods it runs.
func (m *measuredNode) register(ctx context.Context, cs kubernetes.Interface, c *k8slab.Cluster) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: m.node.Name, Labels: map[string]string{"kubernetes.io/hostname": m.node.Name, "kubernetes.io/os": "linux"}}}
	created, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Node %s: %w", m.node.Name, err)
	}
	nodeStatus(created, 0)
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: m.node.V6.String()}, {Type: corev1.NodeHostName, Address: m.node.Name}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("status of Node %s: %w", m.node.Name, err)
	}
	if out, err := c.KubectlStdin(ctx, m.nodeConfig(), "apply", "-f", "-"); err != nil {
		return fmt.Errorf("apply the node's NodeConfig: %w\n%s", err, out)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cniNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err = cs.CoreV1().ServiceAccounts(cniNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: cniNamespace}}, metav1.CreateOptions{})
	m.cs = cs
	if err != nil {
		return err
	}
	return m.relayAccess(ctx, cs)
}

// cniCost is what the agent asked the API server per CNI ADD and DEL.
type cniCost struct {
	pods     int
	add, del counts // the agent's requests over all ADDs, all DELs (watches left out)
	perAdd   float64
	perDel   float64
}

// cniCost ADDs n pods on the node through libcni (their Pod objects made
// first, as kubelet's are), then DELs them, and counts the agent's
// requests (its apiProxy's, watches aside) over each phase.
func (m *measuredNode) cniCost(ctx context.Context, n int) (r cniCost, err error) {
	r.pods = n
	var pods []lab.Pod
	defer func() {
		var errs []error
		for _, p := range pods {
			errs = append(errs, p.NS.Delete())
		}
		for i := range n {
			if err := m.cs.CoreV1().Pods(cniNamespace).Delete(context.Background(), fmt.Sprintf("cni-%d", i), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); ignoreNotFound(err) != nil {
				errs = append(errs, err)
			}
		}
		if e := errors.Join(errs...); e != nil && err == nil {
			err = fmt.Errorf("clean up the CNI pods: %w", e)
		}
	}()
	for i := range n {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cni-%d", i), Namespace: cniNamespace, Labels: map[string]string{"app": "cni"}},
			Spec: podSpec(m.node.Name, "cni")}
		if _, err := m.cs.CoreV1().Pods(cniNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return r, fmt.Errorf("create Pod %s: %w", p.Name, err)
		}
		ns, err := lab.NewNS(fmt.Sprintf("fs-cni-%d", i))
		if err != nil {
			return r, err
		}
		pods = append(pods, lab.Pod{ContainerID: fmt.Sprintf("scale%08d", i), NS: ns, Args: lab.PodArgs(cniNamespace, p.Name)})
	}
	px := m.proxies[procAgent]
	b := px.snapshot()
	for _, p := range pods {
		if _, err := m.node.CNI.Add(ctx, p); err != nil {
			return r, fmt.Errorf("ADD %s: %w (%s)\n--- flock-agent log (tail) ---\n%s", p.ContainerID, err, m.agentGoroutines(), m.logTail(procAgent, 40))
		}
	}
	mid := px.snapshot()
	for _, p := range pods {
		if err := m.node.CNI.Del(ctx, p); err != nil {
			return r, fmt.Errorf("DEL %s: %w", p.ContainerID, err)
		}
	}
	end := px.snapshot()
	r.add, r.del = withoutWatches(mid.sub(b)), withoutWatches(end.sub(mid))
	r.perAdd, r.perDel = float64(r.add.requestTotal())/float64(n), float64(r.del.requestTotal())/float64(n)
	logf("CNI: %d ADDs: %.2f requests each (%s); DELs: %.2f each (%s)", n, r.perAdd, r.add.requestList(), r.perDel, r.del.requestList())
	return r, nil
}

// unixClient talks HTTP to an admin socket.
func unixClient(sock string, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
}

// policyProfile saves flock-policy's Go profile (its admin socket's
// pprof; CPU over d when d > 0) as dir/flock-policy-name.pprof, and logs
// where or why not. Nothing without dir.
func (m *measuredNode) policyProfile(dir, name, profile string, d time.Duration) {
	saveProfile(m.policyAdmin, procPolicy, dir, name, profile, d)
}

// agentProfile is policyProfile for flock-agent.
func (m *measuredNode) agentProfile(dir, name, profile string, d time.Duration) {
	saveProfile(m.node.Agent.AdminSocket, procAgent, dir, name, profile, d)
}

func saveProfile(sock, proc, dir, name, profile string, d time.Duration) {
	if dir == "" || sock == "" {
		return
	}
	hc := unixClient(sock, d+30*time.Second)
	u := "http://" + proc + "/debug/pprof/" + profile
	if d > 0 {
		u += fmt.Sprintf("?seconds=%d", int(d.Seconds()))
	}
	path := filepath.Join(dir, proc+"-"+name+".pprof")
	err := func() error {
		resp, err := hc.Get(u)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", u, resp.Status)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(f, resp.Body)
		return err
	}()
	if err != nil {
		logf("%s's %s profile: %v", proc, name, err)
		return
	}
	logf("%s's %s profile: %s", proc, name, path)
}

// agentGoroutines saves the agent's goroutines (its admin socket's
// pprof) to a file that outlives the run, and says where.
func (m *measuredNode) agentGoroutines() string {
	hc := unixClient(m.node.Agent.AdminSocket, 10*time.Second)
	resp, err := hc.Get("http://agent/debug/pprof/goroutine?debug=2")
	if err != nil {
		return "the agent's goroutines: " + err.Error()
	}
	defer resp.Body.Close()
	f, err := os.CreateTemp("", "flock-scale-agent-goroutines-*.txt")
	if err != nil {
		return "the agent's goroutines: " + err.Error()
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err != nil {
		return "the agent's goroutines: " + err.Error()
	}
	return "the agent's goroutines are in " + f.Name()
}

func withoutWatches(c counts) counts {
	for k := range c.requests {
		if strings.HasPrefix(k, "watch ") {
			delete(c.requests, k)
		}
	}
	return c
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// selfProfile saves this process's CPU profile over d in dir (none if dir
// is empty) as scale-NAME.pprof.
func selfProfile(dir, name string, d time.Duration) {
	if dir == "" {
		return
	}
	path := filepath.Join(dir, "scale-"+name+".pprof")
	err := func() error {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		time.Sleep(d)
		pprof.StopCPUProfile()
		return nil
	}()
	if err != nil {
		logf("scale's %s profile: %v", name, err)
		return
	}
	logf("scale's %s profile: %s", name, path)
}
