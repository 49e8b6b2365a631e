package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// claimCost is what a cluster-wide claim costs an ADD: a Kubernetes-mode
// agent against the e2e lab's real kube-apiserver (etcd and the apiserver
// only: apiLab), ADDing pods from the node's summary (no claim: the
// baseline), pods with an `addresses` IP (one AddressClaim) and pods from
// a cluster-wide pool (one AddressClaim per address). Sequential ADDs; p50
// and p99 each.
type claimCost struct {
	name     string
	p50, p99 float64
}

func measureClaims(ctx context.Context, a *apiLab, dir, binDir, prefix string, n int) ([]claimCost, error) {
	l, closeLab, err := a.nodeLab(ctx, prefix, filepath.Join(dir, "claims"), binDir, func(n *lab.LabNode) string {
		return fmt.Sprintf(`apiVersion: flock.fritzlab.net/v1alpha1
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
`, n.Name, n.Summary6)
	})
	if err != nil {
		return nil, err
	}
	defer closeLab()
	node := l.Nodes[0]
	cs := a.cs
	ns, err := lab.NewNS(prefix + "claimpod")
	if err != nil {
		return nil, err
	}
	defer ns.Delete()
	var out []claimCost
	for _, tc := range []struct {
		name string
		ann  func(i int) map[string]string
	}{
		{"node summary, no claim", func(int) map[string]string { return nil }},
		{"`addresses` IP, 1 claim", func(i int) map[string]string {
			return map[string]string{"flock.fritzlab.net/addresses": fmt.Sprintf("2001:db8:ab::%x", i+1)}
		}},
		{"cluster-wide pool, 1 claim", func(int) map[string]string {
			return map[string]string{"flock.fritzlab.net/cidr6": "2001:db8:100::/112"}
		}},
	} {
		var lat []time.Duration
		for i := range n {
			name := fmt.Sprintf("c%d-%d", len(out), i)
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: tc.ann(i)},
				Spec: corev1.PodSpec{NodeName: node.Name, Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
			created, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
			if err != nil {
				return nil, err
			}
			p := lab.Pod{ContainerID: fmt.Sprintf("claim%d-%06d", len(out), i), NS: ns, Args: lab.PodArgs("default", name, "K8S_POD_UID", string(created.UID))}
			start := time.Now()
			if _, err := node.CNI.Add(ctx, p); err != nil {
				return nil, fmt.Errorf("%s: ADD %d: %w", tc.name, i, err)
			}
			lat = append(lat, time.Since(start))
			if err := node.CNI.Del(ctx, p); err != nil {
				return nil, fmt.Errorf("%s: DEL %d: %w", tc.name, i, err)
			}
			zero := int64(0) // no kubelet confirms a graceful delete
			_ = cs.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
		out = append(out, claimCost{name: tc.name, p50: pct(lat, .5), p99: pct(lat, .99)})
		logf("claims: %s: ADD p50 %.1f ms p99 %.1f ms", tc.name, pct(lat, .5), pct(lat, .99))
	}
	return out, nil
}

// claimFigures are the claim section's rows: each case beside the
// baseline (the first), or the error.
func claimFigures(cc []claimCost, err error) []figure {
	const csec = "What an AddressPool claim costs an ADD (Kubernetes mode, real kube-apiserver)"
	if err == nil && len(cc) < 2 {
		err = fmt.Errorf("%d cases measured", len(cc))
	}
	if err != nil {
		return []figure{{Section: csec, Name: "ADD p50", Value: nan(), Base: nan(), Limit: nan(), Err: firstLine(err.Error())}}
	}
	var figs []figure
	for _, c := range cc[1:] {
		figs = append(figs, figure{Section: csec, Name: "ADD p50, " + c.name, Value: c.p50, Base: cc[0].p50, BaseName: cc[0].name, Unit: "ms", Limit: nan()})
		figs = append(figs, figure{Section: csec, Name: "ADD p99, " + c.name, Value: c.p99, Base: cc[0].p99, BaseName: cc[0].name, Unit: "ms", Limit: nan()})
	}
	return figs
}
