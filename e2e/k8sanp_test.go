package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// AdminNetworkPolicy and BaselineAdminNetworkPolicy through the optional
// component deploy/admin-network-policy, on the running cluster flock was
// installed on from deploy/.

const (
	anpServerNS = "flock-anp-server"
	anpClientNS = "flock-anp-client"
	anpName     = "flock-e2e"
	anpBanner   = "flock-anp"
)

var anpCRDNames = []string{"adminnetworkpolicies.policy.networking.k8s.io", "baselineadminnetworkpolicies.policy.networking.k8s.io"}

// anpWorkloads: a TCP server (the hostPort test's busybox nc loop, a
// banner on 8080) and a client in another namespace.
var anpWorkloads = fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: v1
kind: Namespace
metadata: {name: %[2]s}
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: %[1]s, labels: {app: anp-server}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: bb
    image: docker.io/local/busybox:1.35
    imagePullPolicy: Never
    command: ["sh", "-c", "while true; do echo %[3]s | nc -l -p 8080; done"]
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: %[2]s}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: bb
    image: docker.io/local/busybox:1.35
    imagePullPolicy: Never
    command: ["sleep", "3600"]
`, anpServerNS, anpClientNS, anpBanner)

// anpBANP denies the client's namespace into the server's: the baseline,
// below every NetworkPolicy.
var anpBANP = fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata: {name: default}
spec:
  subject:
    namespaces: {matchLabels: {kubernetes.io/metadata.name: %[1]s}}
  ingress:
  - name: deny-client
    action: Deny
    from:
    - namespaces: {matchLabels: {kubernetes.io/metadata.name: %[2]s}}
`, anpServerNS, anpClientNS)

// anpNetworkPolicy allows the client's namespace to the server on 8080.
var anpNetworkPolicy = fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-client, namespace: %[1]s}
spec:
  podSelector: {matchLabels: {app: anp-server}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: %[2]s}}
    ports:
    - {protocol: TCP, port: 8080}
`, anpServerNS, anpClientNS)

// anpANP is an AdminNetworkPolicy whose one rule, for the client's
// namespace into the server's, has action (Deny, Pass).
func anpANP(action string) string {
	return fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: %[1]s}
spec:
  priority: 10
  subject:
    namespaces: {matchLabels: {kubernetes.io/metadata.name: %[2]s}}
  ingress:
  - name: client
    action: %[4]s
    from:
    - namespaces: {matchLabels: {kubernetes.io/metadata.name: %[3]s}}
`, anpName, anpServerNS, anpClientNS, action)
}

// testAdminNetworkPolicy applies deploy/ with the component
// deploy/admin-network-policy (as an operator would: a kustomization of
// their own), waits for the DaemonSet to roll out with both flags, and
// proves the precedence the API defines, from a client pod to a server pod
// in another namespace, in both families:
//
//   - no policy: connected;
//   - a BaselineAdminNetworkPolicy denying the client's namespace: blocked;
//   - a NetworkPolicy allowing it as well: connected (NetworkPolicy beats
//     the baseline);
//   - an AdminNetworkPolicy Deny as well: blocked (it beats NetworkPolicy);
//   - that rule turned to Pass: connected (the NetworkPolicy decides);
//   - the NetworkPolicy deleted: blocked (Pass, then the baseline).
//
// It leaves the cluster as it found it: the policies and namespaces
// deleted, deploy/ alone applied again (the flags go, the DaemonSet rolls
// out) and then the CRDs deleted.
func testAdminNetworkPolicy(t *testing.T, e *k8sEnv) {
	e.t = t
	ctx := context.Background()
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	deploy := filepath.Join(root, "deploy")
	component := filepath.Join(deploy, "admin-network-policy")

	// The operator's kustomization; kustomize wants relative paths.
	kdir := t.TempDir()
	relDeploy, err := filepath.Rel(kdir, deploy)
	if err != nil {
		t.Fatal(err)
	}
	relComponent, err := filepath.Rel(kdir, component)
	if err != nil {
		t.Fatal(err)
	}
	kust := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\ncomponents:\n- %s\n",
		filepath.ToSlash(relDeploy), filepath.ToSlash(relComponent))
	if err := os.WriteFile(filepath.Join(kdir, "kustomization.yaml"), []byte(kust), 0o644); err != nil {
		t.Fatal(err)
	}

	policyCommand := func(ctx context.Context) (string, error) {
		return e.c.Kubectl(ctx, "-n", "flock-system", "get", "daemonset", "flock", "-o",
			`jsonpath={.spec.template.spec.containers[?(@.name=="policy")].command}`)
	}
	agentCommand := func(ctx context.Context) (string, error) {
		return e.c.Kubectl(ctx, "-n", "flock-system", "get", "daemonset", "flock", "-o",
			`jsonpath={.spec.template.spec.containers[?(@.name=="agent")].command}`)
	}
	// What the DaemonSet runs now (TestKubernetes patches the agent's
	// flags): the cleanup puts exactly this back.
	basePolicy, err := policyCommand(ctx)
	if err != nil {
		t.Fatal(err)
	}
	baseAgent, err := agentCommand(ctx)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		// No Fatal here: every step is tried.
		dctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		run := func(args ...string) {
			if out, err := e.c.Kubectl(dctx, args...); err != nil {
				t.Errorf("cleanup: %v\n%s", err, tail(out, 20))
			}
		}
		if t.Failed() {
			out, _ := e.c.Kubectl(dctx, "-n", "flock-system", "logs", "ds/flock", "-c", "policy", "--tail=60")
			t.Logf("policy container log:\n%s", out)
			out, _ = e.c.Kubectl(dctx, "get", "adminnetworkpolicies,baselineadminnetworkpolicies,networkpolicies", "-A", "-o", "yaml")
			t.Logf("policies:\n%s", out)
		}
		// The policies first (the CRDs may never have been served: then
		// there is nothing to delete), the namespaces while the agent
		// runs (their pods' DELs reach it).
		for _, kind := range []string{"adminnetworkpolicies/" + anpName, "baselineadminnetworkpolicies/default"} {
			_, _ = e.c.Kubectl(dctx, "delete", kind, "--ignore-not-found", "--wait=true", "--timeout=60s")
		}
		run("delete", "namespace", anpServerNS, anpClientNS, "--ignore-not-found", "--wait=true", "--timeout=120s")
		// The policy container's command back to what it was (a patch,
		// not another apply, so that nothing else of the DaemonSet moves).
		run("-n", "flock-system", "patch", "daemonset", "flock", "--type=json", "-p",
			fmt.Sprintf(`[{"op":"replace","path":"/spec/template/spec/containers/1/command","value":%s}]`, basePolicy))
		run("-n", "flock-system", "rollout", "status", "daemonset/flock", "--timeout=180s")
		run("wait", "--for=condition=Ready", "--timeout=180s", "pod", "-n", "flock-system", "-l", agentSelector)
		if cmd, err := policyCommand(dctx); err != nil || cmd != basePolicy {
			t.Errorf("cleanup: the policy container runs %s (%v), want %s", cmd, err, basePolicy)
		}
		if cmd, err := agentCommand(dctx); err != nil || cmd != baseAgent {
			t.Errorf("cleanup: the agent runs %s (%v), want %s as before", cmd, err, baseAgent)
		}
		// The engine without the admin APIs removed their DNS agent's
		// table (nothing reads its queue any more).
		testutil.EventuallyWithin(t, 30*time.Second, "the DNS agent's nftables table to go", func() (bool, string) {
			out, err := osexec.Command("nft", "list", "table", "inet", "kube-network-policies-dnscache").CombinedOutput()
			return err != nil, string(out)
		})
		// Then the CRDs (nothing watches them any more).
		run(append([]string{"delete", "crd", "--ignore-not-found", "--wait=true", "--timeout=120s"}, anpCRDNames...)...)
	})

	t.Log("applying deploy/ with the component admin-network-policy")
	e.kubectl("apply", "-k", kdir)
	e.kubectl(append([]string{"wait", "--for=condition=Established", "--timeout=60s"}, prefixAll("crd/", anpCRDNames)...)...)
	e.kubectl("-n", "flock-system", "rollout", "status", "daemonset/flock", "--timeout=180s")
	e.waitPods("flock with the admin policy APIs", "-n", "flock-system", "-l", agentSelector)
	// kubectl apply puts the agent's command back to deploy/'s, dropping
	// the flags TestKubernetes patched in (its short leak-GC grace): put
	// them back as they were.
	if cmd, err := agentCommand(ctx); err != nil || cmd != baseAgent {
		e.kubectl("-n", "flock-system", "patch", "daemonset", "flock", "--type=json", "-p",
			fmt.Sprintf(`[{"op":"replace","path":"/spec/template/spec/containers/0/command","value":%s}]`, baseAgent))
		e.kubectl("-n", "flock-system", "rollout", "status", "daemonset/flock", "--timeout=180s")
		e.waitPods("flock with the test's agent flags again", "-n", "flock-system", "-l", agentSelector)
	}
	cmd, err := policyCommand(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`"--admin-network-policy"`, `"--baseline-admin-network-policy"`} {
		if strings.Count(cmd, f) != 1 {
			t.Fatalf("the policy container runs %s: want %s once", cmd, f)
		}
	}
	testutil.EventuallyWithin(t, 90*time.Second, "the policy engine to start with both APIs", func() (bool, string) {
		out, _ := e.c.Kubectl(ctx, "-n", "flock-system", "logs", "ds/flock", "-c", "policy")
		return strings.Contains(out, "adminNetworkPolicy=true") && strings.Contains(out, "baselineAdminNetworkPolicy=true"), tail(out, 10)
	})

	e.apply(anpWorkloads)
	e.waitPods("the server", "-n", anpServerNS, "server")
	e.waitPods("the client", "-n", anpClientNS, "client")
	ips := e.podIPs(anpServerNS, "server")
	if len(ips) == 0 {
		t.Fatal("the server has no pod IPs")
	}

	// probe connects from the client to ip:8080 once: "connected" (the
	// banner), "blocked" (no answer: the engine dropped the SYN), or ""
	// when it says nothing (refused between two of the server's nc runs,
	// kubectl exec failing): ask again.
	probe := func(ip netip.Addr) string {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		out, err := e.c.Kubectl(pctx, "-n", anpClientNS, "exec", "client", "--", "sh", "-c",
			fmt.Sprintf("nc -w 3 %s 8080 </dev/null; echo rc=$?", ip))
		switch {
		case err != nil:
			return ""
		case strings.Contains(out, anpBanner):
			return "connected"
		case strings.Contains(strings.ToLower(out), "refused"):
			return ""
		case strings.Contains(out, "rc=") && !strings.Contains(out, "rc=0"):
			return "blocked"
		}
		return ""
	}
	// expect waits until every server IP is want; blocked must then hold
	// for two more attempts (a drop is a timeout, never a refusal, but
	// one is not enough to tell).
	expect := func(step, want string) {
		t.Helper()
		for _, ip := range ips {
			testutil.EventuallyWithin(t, 60*time.Second, fmt.Sprintf("%s: client to %s:8080 %s", step, ip, want), func() (bool, string) {
				got := probe(ip)
				if got == want && want == "blocked" {
					for i := 0; i < 2 && got == want; i++ {
						got = probe(ip)
					}
				}
				return got == want, got
			})
		}
		t.Logf("%s: %s", step, want)
	}

	expect("no policy", "connected")
	e.apply(anpBANP)
	expect("BaselineAdminNetworkPolicy Deny", "blocked")
	e.apply(anpNetworkPolicy)
	expect("NetworkPolicy allow over the baseline Deny", "connected")
	e.apply(anpANP("Deny"))
	expect("AdminNetworkPolicy Deny over the NetworkPolicy allow", "blocked")
	e.apply(anpANP("Pass"))
	expect("AdminNetworkPolicy Pass to the NetworkPolicy allow", "connected")
	e.kubectl("-n", anpServerNS, "delete", "networkpolicy", "allow-client", "--wait=true")
	expect("AdminNetworkPolicy Pass, no NetworkPolicy: the baseline Deny", "blocked")
}

func prefixAll(prefix string, s []string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = prefix + x
	}
	return out
}
