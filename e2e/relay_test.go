package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/relay"
)

// flock-relay (bin) against a real kube-apiserver: a node's pod informer
// (flock-policy's source, relay.PodSource) reads it with a token the API
// server made for the relays' audience, and holds what the API server
// holds, trimmed (of other nodes' pods, those with addresses), through
// creates, status writes and deletes; a token for
// another audience, or of a user who may not list pods, is refused as the
// API server would; the relay leaves the directory when it stops.
func TestRelayAgainstTheAPIServer(t *testing.T) {
	c := apiOnlyLab(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const ns = "flock-system"
	mustCreate(t, func() error {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		return err
	})
	// (No controller-manager makes the default service account.)
	for _, sa := range []struct{ ns, name string }{{ns, "node"}, {ns, "nobody"}, {"default", "default"}} {
		mustCreate(t, func() error {
			_, err := cs.CoreV1().ServiceAccounts(sa.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa.name}}, metav1.CreateOptions{})
			return err
		})
	}
	mustCreate(t, func() error {
		_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-pod-reader"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-pod-reader"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "e2e-pod-reader"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "node"}}}, metav1.CreateOptions{})
		return err
	})
	token := func(sa string, audience string) string {
		t.Helper()
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: []string{audience}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token for %s: %v", sa, err)
		}
		return tr.Status.Token
	}
	// Pods before the relay starts, and after.
	mkPod := func(name string, i int) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": fmt.Sprintf("a%d", i%3)}},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("n%d", 1+i%2), Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}}
		if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s: %v", name, err)
		}
	}
	for i := range 5 {
		mkPod(fmt.Sprintf("before-%d", i), i)
	}

	dir := t.TempDir()
	listen, metrics := freeLoopback(t), freeLoopback(t)
	logf, err := os.Create(filepath.Join(dir, "relay.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(binDir, "flock-relay"), "--kubeconfig="+c.Kubeconfig, "--listen="+listen, "--metrics-address="+metrics,
		"--namespace="+ns, "--name=relay-e2e", "--advertise=https://"+listen)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("flock-relay's log:\n%s", b)
		}
	})
	testutil.WaitFor(t, "flock-relay ready and in the directory", func() bool {
		resp, err := http.Get("http://" + metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		entries, _, err := relay.Lookup(ctx, cs.CoreV1().ConfigMaps(ns))
		return resp.StatusCode == http.StatusOK && err == nil && entries["relay-e2e"].URL == "https://"+listen
	})

	// A node's informer, as flock-policy's; its fallback is a client that
	// may not list pods, so that only the relay can fill it.
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token("node", relay.Audience)), 0o600); err != nil {
		t.Fatal(err)
	}
	src := &relay.PodSource{API: nobodyPods(t, cfg), Directory: cs.CoreV1().ConfigMaps(ns), Node: "n1", TokenFile: tokenFile, Log: slog.Default()}
	inf := kubeclient.NewInformer(src, &trim.Pod{}, nil)
	if err := inf.SetTransform(trim.Transform); err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, func(ctx context.Context) error { inf.RunWithContext(ctx); return nil })
	same := func() (bool, string) {
		list, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		// The transform caches a pod as a *trim.Pod.
		got := map[string]*trim.Pod{}
		for _, o := range inf.GetStore().List() {
			p, ok := o.(*trim.Pod)
			if !ok {
				return false, fmt.Sprintf("a %T held, want a *trim.Pod", o)
			}
			got[p.Namespace+"/"+p.Name] = p
		}
		// The node (n1) is sent another node's pod only while it has
		// addresses.
		var want []*trim.Pod
		for i := range list.Items {
			if p := &list.Items[i]; p.Spec.NodeName == "n1" || len(p.Status.PodIPs) > 0 {
				want = append(want, trim.NewPod(p))
			}
		}
		if len(got) != len(want) {
			return false, fmt.Sprintf("%d pods held, the API server has %d for n1 (of %d)", len(got), len(want), len(list.Items))
		}
		for _, w := range want {
			g := got[w.Namespace+"/"+w.Name]
			if g == nil {
				return false, fmt.Sprintf("%s/%s missing", w.Namespace, w.Name)
			}
			// The node (n1) is sent the whole UID of its own pods alone:
			// of others, its start.
			want := w.UID
			if w.Spec.NodeName != "n1" {
				want = trim.ShortUID(w.UID)
			}
			if g.UID != want || len(w.UID) < 36 {
				return false, fmt.Sprintf("%s/%s on %s: held with UID %q, want %q (of %q)", w.Namespace, w.Name, w.Spec.NodeName, g.UID, want, w.UID)
			}
			if c := *g; !trim.Unchanged(w, func() *trim.Pod { c.UID = w.UID; return &c }()) {
				return false, fmt.Sprintf("%s/%s: held %+v, want %+v", w.Namespace, w.Name, g, w)
			}
		}
		return true, ""
	}
	testutil.Eventually(t, "the node holds the API server's pods", same)
	// Changes: new pods, addresses written through the status
	// subresource, relabels, deletes.
	for i := range 5 {
		mkPod(fmt.Sprintf("after-%d", i), i)
	}
	for i := range 5 {
		name := fmt.Sprintf("before-%d", i)
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = fmt.Sprintf("2001:db8::%d", i+1)
		p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
		if _, err := cs.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cs.CoreV1().Pods("default").Delete(ctx, "after-0", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the node follows the API server's changes", same)
	if src.Using() != "relay relay-e2e" {
		t.Fatalf("pods from %q, want the relay", src.Using())
	}

	// Refusals, asked of the relay directly.
	entries, _, err := relay.Lookup(ctx, cs.CoreV1().ConfigMaps(ns))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(entries["relay-e2e"].Certificate)) {
		t.Fatal("the directory's certificate does not parse")
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: entries["relay-e2e"].ServerName}}}
	for _, tc := range []struct {
		what, token string
		code        int
	}{
		{"a token for the API server", token("node", "https://kubernetes.default.svc.cluster.local"), http.StatusUnauthorized},
		{"a user who may not list pods", token("nobody", relay.Audience), http.StatusForbidden},
		{"the node's token", token("node", relay.Audience), http.StatusOK},
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+listen+relay.PodsPath, nil)
		req.Header.Set("Authorization", "Bearer "+tc.token)
		req.Header.Set("Accept", "application/vnd.kubernetes.protobuf")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.what, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s: %d, want %d", tc.what, resp.StatusCode, tc.code)
		}
	}

	// Stopped, it leaves the directory: nodes no longer try it.
	stopped = true
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("flock-relay exited: %v", err)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Fatal("flock-relay did not stop within 30s of SIGTERM")
	}
	entries, _, err = relay.Lookup(ctx, cs.CoreV1().ConfigMaps(ns))
	if err != nil || len(entries) != 0 {
		t.Fatalf("directory after the stop: %v (%v), want empty", entries, err)
	}
}

func mustCreate(t *testing.T, create func() error) {
	t.Helper()
	if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// nobodyPods is the pods of a client that may not read them: a node
// that fell back to it would hold nothing.
func nobodyPods(t *testing.T, admin *rest.Config) corev1client.PodInterface {
	t.Helper()
	cfg := *admin
	cfg.TLSClientConfig.CertData, cfg.TLSClientConfig.KeyData, cfg.TLSClientConfig.CertFile, cfg.TLSClientConfig.KeyFile = nil, nil, "", ""
	cfg.BearerToken = "not-a-token"
	cs, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs.CoreV1().Pods("")
}

func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
