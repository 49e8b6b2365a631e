package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"code.fritzlab.net/fritzlab/flock/e2e/k8slab"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// BenchmarkCNIAddClaim measures what a cluster-wide claim costs an ADD: a
// Kubernetes-mode agent against a real kube-apiserver (etcd and the
// apiserver only), ADDing a pod from the node's summary (no claim: the
// baseline), a pod with an `addresses` IP (one AddressClaim created) and a
// pod from a cluster-wide pool (one AddressClaim per address), in the same
// run. Read the p50s as ratios to the baseline.
func BenchmarkCNIAddClaim(b *testing.B) {
	ctx := context.Background()
	root, err := lab.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	c, err := k8slab.Up(ctx, k8slab.Options{Dir: filepath.Join(b.TempDir(), "k8s"), APIOnly: true, Log: b.Logf})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Down() })
	kubectl := func(stdin string, args ...string) {
		b.Helper()
		var out string
		var err error
		for range 30 { // a just-created CRD takes a moment to be served
			if stdin == "" {
				out, err = c.Kubectl(ctx, args...)
			} else {
				out, err = c.KubectlStdin(ctx, stdin, args...)
			}
			if err == nil {
				return
			}
			time.Sleep(time.Second)
		}
		b.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
	kubectl("", "apply", "-f", filepath.Join(root, "deploy", "crd"))
	kubectl("", "-n", "default", "create", "serviceaccount", "default")
	benchBinOnce.Do(func() {
		benchBinDir = filepath.Join(binDir, "norace")
		benchBinErr = lab.Build(benchBinDir, false)
	})
	if benchBinErr != nil {
		b.Fatal(benchBinErr)
	}
	l, err := lab.NewBGPLab(lab.LabOptions{Prefix: randName("fb") + "-", Dir: b.TempDir(), BinDir: benchBinDir, Nodes: 1,
		Kubeconfig: c.Kubeconfig, AgentArgs: []string{"--metrics-address=", "--log-level=warn"},
		Setup: func(n *lab.LabNode) error {
			kubectl(fmt.Sprintf(`apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata: {name: %s}
spec:
  asn: 64512
  routerID: 192.0.2.1
  pools: [{cidr: "%s"}]
---
apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: bench-pods}
spec: {cidrs: ["2001:db8:100::/112"], use: [pod], namespaces: [default]}
---
apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: bench-addresses}
spec: {cidrs: ["2001:db8:ab::/112"], use: [addresses], namespaces: [default]}
`, n.Name, n.Summary6), "apply", "-f", "-")
			stop, err := n.NS.Proxy(net127(k8slab.APIServerPort), net127(k8slab.APIServerPort))
			if err == nil {
				b.Cleanup(stop)
			}
			return err
		}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	n := l.Nodes[0]
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		ann  func(i int) map[string]string
	}{
		{"summary-baseline", func(int) map[string]string { return nil }},
		{"addresses-claimed", func(i int) map[string]string {
			return map[string]string{"flock.fritzlab.net/addresses": fmt.Sprintf("2001:db8:ab::%x", i+1)}
		}},
		{"cluster-pool-claimed", func(int) map[string]string {
			return map[string]string{"flock.fritzlab.net/cidr6": "2001:db8:100::/112"}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ns, err := lab.NewNS(randName("flkb-"))
			if err != nil {
				b.Fatal(err)
			}
			defer ns.Delete()
			var lat []time.Duration
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				name := fmt.Sprintf("%s-%d-%d", tc.name, b.N, i)
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: tc.ann(i)},
					Spec: corev1.PodSpec{NodeName: n.Name, Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
				created, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
				if err != nil {
					b.Fatal(err)
				}
				p := lab.Pod{ContainerID: fmt.Sprintf("b%d-%06d", b.N, i), NS: ns, Args: lab.PodArgs("default", name, "K8S_POD_UID", string(created.UID))}
				b.StartTimer()
				start := time.Now()
				if _, err := n.CNI.Add(ctx, p); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				b.StopTimer()
				if err := n.CNI.Del(ctx, p); err != nil {
					b.Fatal(err)
				}
				zero := int64(0) // no kubelet confirms a graceful delete
				_ = cs.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
				b.StartTimer()
			}
			b.StopTimer()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
