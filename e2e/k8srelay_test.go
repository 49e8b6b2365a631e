package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

const relaySelector = "app.kubernetes.io/name=flock-relay"

// testRelayInTheCluster installs deploy/ with the relay component, as
// deploy/README.md tells an operator to, on the two nodes of the Services
// lab (whose pods reach the API server through the kubernetes Service):
// flock-relay runs in the pod network, one under its Deployment on each
// node, each publishes itself in the ConfigMap flock-relay, and each
// node's policy container, given the token the kubelet projects for the
// relays' audience, reads its pods from one of them. NetworkPolicy then
// follows pods made after the switch and a label changed (what the
// engines know of them came through the relays).
func testRelayInTheCluster(t *testing.T, e *k8sEnv, root string) {
	dir := t.TempDir()
	// kustomize takes only relative paths to other kustomizations.
	kust := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
components:
- %s
`, rel(t, dir, filepath.Join(root, "deploy")), rel(t, dir, filepath.Join(root, "deploy", "relay")))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kust), 0o644); err != nil {
		t.Fatal(err)
	}
	e.kubectl("apply", "-k", dir)
	t.Cleanup(func() {
		// The relays' pods go while the agents still answer their DELs.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, _ = e.c.Kubectl(ctx, "-n", "flock-system", "delete", "deployment", "flock-relay", "--wait=true", "--timeout=90s")
	})
	if out, err := e.c.Kubectl(context.Background(), "-n", "flock-system", "rollout", "status", "deployment/flock-relay", "--timeout=180s"); err != nil {
		e.waitPods("the relays", "-n", "flock-system", "-l", relaySelector) // its diagnostics
		t.Fatalf("the relays did not roll out: %v\n%s", err, out)
	}
	if out, err := e.c.Kubectl(context.Background(), "-n", "flock-system", "rollout", "status", "daemonset/flock", "--timeout=180s"); err != nil {
		t.Fatalf("the DaemonSet with the relays' token did not roll out: %v\n%s", err, out)
	}
	relays := map[string]netip.Addr{}
	for _, name := range systemPods(e, relaySelector) {
		ips := e.podIPs("flock-system", name)
		if len(ips) == 0 {
			t.Fatalf("relay pod %s has no IP", name)
		}
		relays[name] = ips[0]
	}
	if len(relays) != 2 {
		t.Fatalf("relays %v, want one on each node", relays)
	}
	// The directory names each relay at its pod IP.
	testutil.EventuallyWithin(t, 60*time.Second, "both relays in the ConfigMap flock-relay", func() (bool, string) {
		out, _ := e.c.Kubectl(context.Background(), "-n", "flock-system", "get", "configmap", "flock-relay", "-o", "jsonpath={.data}")
		ok := true
		for name, ip := range relays {
			ok = ok && strings.Contains(out, name) && strings.Contains(out, net.JoinHostPort(ip.String(), "9479"))
		}
		return ok, out
	})
	// Each node's policy container reads its pods from a relay: the last
	// source it logged is one.
	agents := systemPods(e, agentSelector)
	if len(agents) != 2 {
		t.Fatalf("flock's pods %v, want one on each node", agents)
	}
	readsFromRelay := func(agent string) (bool, string) {
		out, _ := e.c.Kubectl(context.Background(), "-n", "flock-system", "logs", agent, "-c", "policy")
		sources := regexp.MustCompile(`msg="pods from ([^":]+)`).FindAllStringSubmatch(out, -1)
		if len(sources) == 0 {
			return false, tail(out, 15)
		}
		last := sources[len(sources)-1][1]
		_, ok := relays[strings.TrimPrefix(last, "relay ")]
		return ok && strings.HasPrefix(last, "relay "), "pods from " + last
	}
	for _, agent := range agents {
		testutil.EventuallyWithin(t, 90*time.Second, agent+"'s policy container reading pods from a relay", func() (bool, string) { return readsFromRelay(agent) })
	}

	// Pods made now reach the engines through the relays: a policy admits
	// only role=relay-client to the server; a client so labelled gets in,
	// another does not until it is labelled so.
	e.apply(npPod("relay-server", "relay-server", "", "", true))
	e.apply(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: relay-clients, namespace: default}
spec:
  podSelector: {matchLabels: {role: relay-server}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: relay-client}}
    ports:
    - {protocol: TCP, port: 8080}
`)
	e.apply(npPod("relay-client", "relay-client", "", "", false))
	e.apply(npPod("relay-other", "relay-other", "", "", false))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, _ = e.c.Kubectl(ctx, "delete", "networkpolicy", "relay-clients", "--wait=true")
		_, _ = e.c.Kubectl(ctx, "delete", "pod", "relay-server", "relay-client", "relay-other", "--wait=true", "--timeout=90s")
	})
	for _, p := range []string{"relay-server", "relay-client", "relay-other"} {
		e.waitPods(p, p)
	}
	srv := e.podIPs("default", "relay-server")
	e.expect(t, "relay-client", allowed, srv...)
	e.expect(t, "relay-other", blocked, srv...)
	// What the relays sent, from their own counters (read from a pod:
	// the relays listen in the pod network).
	metrics := func(name string) (sum float64, out string) {
		for relay, ip := range relays {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			got, err := e.c.Kubectl(ctx, "exec", "relay-client", "--", "sh", "-c",
				fmt.Sprintf(`printf "GET /metrics HTTP/1.0\r\n\r\n" | nc -w 2 %s 9480`, ip))
			cancel()
			line := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(got)
			if err != nil || line == nil {
				return -1, fmt.Sprintf("%s: %v %s", relay, err, tail(got, 5))
			}
			v, _ := strconv.ParseFloat(line[1], 64)
			sum += v
			out += fmt.Sprintf("%s: %s=%s ", relay, name, line[1])
		}
		return sum, out
	}
	// One watch a node, wherever it went.
	testutil.EventuallyWithin(t, 30*time.Second, "the relays serving one watch a node", func() (bool, string) {
		n, out := metrics("flock_relay_watchers")
		return n == 2, out
	})
	// A label change, sent through the relays, turns the verdict.
	e.kubectl("label", "pod", "relay-other", "role=relay-client", "--overwrite")
	e.expect(t, "relay-other", allowed, srv...)
	for _, agent := range agents {
		if ok, last := readsFromRelay(agent); !ok {
			t.Errorf("%s's policy container no longer reads from a relay: %s", agent, last)
		}
	}
}

func rel(t *testing.T, from, to string) string {
	t.Helper()
	r, err := filepath.Rel(from, to)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// systemPods are the names of flock's pods that selector selects.
func systemPods(e *k8sEnv, selector string) []string {
	return strings.Fields(e.kubectl("-n", "flock-system", "get", "pods", "-l", selector, "-o", "jsonpath={.items[*].metadata.name}"))
}
