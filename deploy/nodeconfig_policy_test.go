package deploy_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// The optional component deploy/nodeconfig-policy: a
// ValidatingAdmissionPolicy confining the agents' NodeConfig writes to
// their own node's rendered one (RBAC grants create, update and delete on
// every NodeConfig). Its CEL is the API server's to run (e2e
// TestNodeConfigTemplate); here: its shape, and that it names what the
// rest of deploy/ and the agent use.

const policyComponent = "nodeconfig-policy"

func checkAdmissionDoc(t *testing.T, d doc) {
	t.Helper()
	switch d.kind {
	case "ValidatingAdmissionPolicy":
		strict[admissionv1.ValidatingAdmissionPolicy](t, d)
	case "ValidatingAdmissionPolicyBinding":
		strict[admissionv1.ValidatingAdmissionPolicyBinding](t, d)
	}
}

func TestNodeConfigPolicy(t *testing.T) {
	var k kustFile
	kd := readDocs(t, filepath.Join(policyComponent, "kustomization.yaml"))
	if len(kd) != 1 {
		t.Fatalf("%s: want one kustomization", policyComponent)
	}
	k = *strict[kustFile](t, kd[0])
	if k.Kind != "Component" || !slices.Equal(k.Resources, []string{"policy.yaml"}) {
		t.Errorf("%s/kustomization.yaml: kind %s resources %v, want a Component of policy.yaml", policyComponent, k.Kind, k.Resources)
	}
	var pol *admissionv1.ValidatingAdmissionPolicy
	var bind *admissionv1.ValidatingAdmissionPolicyBinding
	for _, d := range readDocs(t, filepath.Join(policyComponent, "policy.yaml")) {
		switch d.kind {
		case "ValidatingAdmissionPolicy":
			pol = strict[admissionv1.ValidatingAdmissionPolicy](t, d)
		case "ValidatingAdmissionPolicyBinding":
			bind = strict[admissionv1.ValidatingAdmissionPolicyBinding](t, d)
		default:
			t.Errorf("policy.yaml: unexpected %s", d.kind)
		}
	}
	if pol == nil || bind == nil {
		t.Fatal("policy.yaml: want a ValidatingAdmissionPolicy and its binding")
	}
	if bind.Spec.PolicyName != pol.Name || !slices.Equal(bind.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) ||
		bind.Spec.MatchResources != nil || bind.Spec.ParamRef != nil {
		t.Errorf("binding %+v: want policy %s, Deny, everywhere", bind.Spec, pol.Name)
	}
	s := pol.Spec
	if s.FailurePolicy == nil || *s.FailurePolicy != admissionv1.Fail {
		t.Error("failurePolicy is not Fail: an expression error would admit the write")
	}
	if s.MatchConstraints == nil || len(s.MatchConstraints.ResourceRules) != 1 {
		t.Fatalf("matchConstraints %+v, want one rule", s.MatchConstraints)
	}
	r := s.MatchConstraints.ResourceRules[0]
	if !slices.Equal(r.APIGroups, []string{v1alpha1.GroupName}) || !slices.Equal(r.Resources, []string{v1alpha1.NodeConfigResource}) ||
		!slices.Equal(r.Operations, []admissionv1.OperationType{admissionv1.Create, admissionv1.Update, admissionv1.Delete}) {
		t.Errorf("rule %+v, want create, update and delete of %s.%s (not their status)", r, v1alpha1.NodeConfigResource, v1alpha1.GroupName)
	}
	// Only the ServiceAccount rbac.yaml makes.
	var sa *corev1.ServiceAccount
	for _, d := range find(t, "ServiceAccount") {
		sa = strict[corev1.ServiceAccount](t, d)
	}
	user := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	if len(s.MatchConditions) != 1 || s.MatchConditions[0].Expression != "request.userInfo.username == '"+user+"'" {
		t.Errorf("matchConditions %+v, want only %s", s.MatchConditions, user)
	}
	var all []string
	for _, v := range s.Variables {
		all = append(all, v.Expression)
	}
	for _, v := range s.Validations {
		all = append(all, v.Expression)
		if v.Message == "" && v.MessageExpression == "" {
			t.Errorf("validation %q says nothing when it denies", v.Expression)
		}
	}
	text := strings.Join(all, "\n")
	for _, want := range []string{
		"'authentication.kubernetes.io/node-name'", // the pod's node, in a bound token
		"'" + v1alpha1.TemplateLabel + "'",         // the agent's rendered NodeConfigs
		"oldObject == null", "object == null",      // create, delete
		"variables.name == variables.node",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the policy's expressions lack %s", want)
		}
	}
	if len(s.Validations) != 3 {
		t.Errorf("%d validations, want 3 (a node, its own, rendered)", len(s.Validations))
	}
}
