package deploy_test

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

func checkRules(t *testing.T, who string, rules []rbacv1.PolicyRule) {
	t.Helper()
	for _, r := range rules {
		for _, l := range [][]string{r.Verbs, r.Resources, r.APIGroups, r.ResourceNames} {
			if slices.Contains(l, "*") {
				t.Errorf("%s: wildcard in rule %+v", who, r)
			}
		}
		if len(r.NonResourceURLs) > 0 {
			t.Errorf("%s: nonResourceURLs %v", who, r.NonResourceURLs)
		}
		for _, verb := range r.Verbs {
			if verb == "escalate" || verb == "bind" || verb == "impersonate" || verb == "deletecollection" {
				t.Errorf("%s: verb %s", who, verb)
			}
		}
	}
}

// grants lists what rules grant, one "verb group/resource" (with
// "[names]" when limited to resourceNames) each, sorted.
func grants(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					e := v + " " + g + "/" + res
					if len(r.ResourceNames) > 0 {
						e += " " + fmt.Sprint(r.ResourceNames)
					}
					out = append(out, e)
				}
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// expand turns "group/resource: verbs" lines into grants.
func expand(want ...string) []string {
	var out []string
	for _, w := range want {
		res, verbs, _ := strings.Cut(w, ":")
		for _, v := range strings.Fields(verbs) {
			out = append(out, v+" "+res)
		}
	}
	sort.Strings(out)
	return out
}

// allows reports whether rules grant verb on group/resource.
func allows(rules []rbacv1.PolicyRule, group, resource, verb string) *rbacv1.PolicyRule {
	for i, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return &rules[i]
		}
	}
	return nil
}

func TestRBAC(t *testing.T) {
	sas := find(t, "ServiceAccount")
	if len(sas) != 1 || sas[0].name != "flock" || strict[corev1.ServiceAccount](t, sas[0]).Namespace != namespace {
		t.Errorf("want one ServiceAccount %s/flock", namespace)
	}
	crs := find(t, "ClusterRole")
	if len(crs) != 1 {
		t.Fatalf("%d ClusterRoles, want 1", len(crs))
	}
	cr := strict[rbacv1.ClusterRole](t, crs[0])
	checkRules(t, "ClusterRole "+cr.Name, cr.Rules)
	// Exactly these grants: a verb more is a failure like a verb less.
	want := expand(
		"flock.fritzlab.net/nodeconfigs: get list watch",
		"flock.fritzlab.net/nodeconfigs/status: get update patch",
		// The agent renders its own node's NodeConfig from the
		// NodeConfigTemplate selecting it: it creates, updates and deletes
		// that one (labelled; never a hand-made one, never patched), reads
		// the templates and counts the rendered ones in their status.
		"flock.fritzlab.net/nodeconfigs: create update delete",
		"flock.fritzlab.net/nodeconfigtemplates: get list watch",
		"flock.fritzlab.net/nodeconfigtemplates/status: update",
		// AddressPools are read-only; the agents count the claims in their
		// status.
		"flock.fritzlab.net/addresspools: get list watch",
		"flock.fritzlab.net/addresspools/status: get update patch",
		// A claim is created whole (the atomic test-and-set on its name)
		// and deleted; a shared LoadBalancer address's claim is updated
		// (with its resourceVersion) as its Services join and leave.
		"flock.fritzlab.net/addressclaims: create get list watch update delete",
		"/pods: get list watch",
		"/namespaces: get list watch", // namespaceSelector
		"/nodes: get",                 // the claim GC: does the claim's node still exist?
		"/nodes: list watch",          // the agent's own Node (a field selector), templates render from it
		"/events: create patch",
		"events.k8s.io/events: create patch",
		// Service routes: read-only.
		"/services: get list watch",
		"discovery.k8s.io/endpointslices: get list watch",
		// The LoadBalancer assigner (the Lease's holder) writes status only.
		"/services/status: patch",
		// The policy container: what it enforces, and the nodes an
		// AdminNetworkPolicy's node peers select.
		"networking.k8s.io/networkpolicies: get list watch",
		"policy.networking.k8s.io/adminnetworkpolicies: get list watch",
		"policy.networking.k8s.io/baselineadminnetworkpolicies: get list watch",
		"/nodes: list watch",
		"apps/daemonsets: get", // flock-policy on stop: uninstall or restart?
	)
	got := grants(cr.Rules)
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("ClusterRole grants %s: more than the agent and the policy engine need", g)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("ClusterRole does not grant %s", w)
		}
	}
	for _, verb := range []string{"patch", "deletecollection"} {
		if allows(cr.Rules, "flock.fritzlab.net", "nodeconfigs", verb) != nil {
			t.Errorf("ClusterRole allows %s on nodeconfigs: the agent only creates, updates (with a resourceVersion) and deletes (with preconditions) the one it renders", verb)
		}
	}
	for _, verb := range []string{"create", "update", "patch", "delete"} {
		if allows(cr.Rules, "flock.fritzlab.net", "nodeconfigtemplates", verb) != nil {
			t.Errorf("ClusterRole allows %s on nodeconfigtemplates: they are read-only to the agent", verb)
		}
		if allows(cr.Rules, "flock.fritzlab.net", "addresspools", verb) != nil {
			t.Errorf("ClusterRole allows %s on addresspools: they are read-only to the agent", verb)
		}
	}
	for _, verb := range []string{"patch", "deletecollection"} {
		if allows(cr.Rules, "flock.fritzlab.net", "addressclaims", verb) != nil {
			t.Errorf("ClusterRole allows %s on addressclaims: a claim is created, updated whole (its sharers) and deleted, never patched", verb)
		}
	}
	for _, r := range cr.Rules {
		if len(r.ResourceNames) > 0 {
			t.Errorf("ClusterRole rule with resourceNames %+v: not expected", r)
		}
	}
	for _, r := range cr.Rules {
		if slices.Contains(r.Resources, "secrets") {
			t.Errorf("ClusterRole grants secrets cluster-wide: %+v", r)
		}
	}

	roles := find(t, "Role")
	var secretRule *rbacv1.PolicyRule
	var roleName string
	for _, d := range roles {
		r := strict[rbacv1.Role](t, d)
		checkRules(t, "Role "+r.Name, r.Rules)
		if r.Namespace != namespace {
			t.Errorf("Role %s in namespace %q, want %s", r.Name, r.Namespace, namespace)
		}
		if rule := allows(r.Rules, "", "secrets", "get"); rule != nil {
			secretRule, roleName = rule, r.Name
		}
	}
	if secretRule == nil {
		t.Fatal("no Role grants get on secrets")
	}
	if !slices.Equal(secretRule.ResourceNames, []string{secretName}) {
		t.Errorf("secrets rule resourceNames %v, want [%s]", secretRule.ResourceNames, secretName)
	}
	var roleGrants []string
	for _, d := range roles {
		roleGrants = append(roleGrants, grants(strict[rbacv1.Role](t, d).Rules)...)
	}
	sort.Strings(roleGrants)
	wantRole := []string{
		"create coordination.k8s.io/leases",
		"get /secrets [" + secretName + "]",
		"get coordination.k8s.io/leases [flock-loadbalancers]",
		"list /secrets [" + secretName + "]",
		"update coordination.k8s.io/leases [flock-loadbalancers]",
		"watch /secrets [" + secretName + "]",
	}
	if !slices.Equal(roleGrants, wantRole) {
		t.Errorf("Roles grant %q, want exactly %q", roleGrants, wantRole)
	}

	bound := func(kind, roleKind, role string) {
		t.Helper()
		for _, d := range find(t, kind) {
			var subjects []rbacv1.Subject
			var ref rbacv1.RoleRef
			switch kind {
			case "ClusterRoleBinding":
				b := strict[rbacv1.ClusterRoleBinding](t, d)
				subjects, ref = b.Subjects, b.RoleRef
			case "RoleBinding":
				b := strict[rbacv1.RoleBinding](t, d)
				if b.Namespace != namespace {
					continue
				}
				subjects, ref = b.Subjects, b.RoleRef
			}
			if ref.Kind == roleKind && ref.Name == role && ref.APIGroup == rbacv1.GroupName &&
				slices.Contains(subjects, rbacv1.Subject{Kind: "ServiceAccount", Name: "flock", Namespace: namespace}) {
				return
			}
		}
		t.Errorf("no %s binds %s %s to ServiceAccount %s/flock", kind, roleKind, role, namespace)
	}
	bound("ClusterRoleBinding", "ClusterRole", cr.Name)
	bound("RoleBinding", "Role", roleName)
}
