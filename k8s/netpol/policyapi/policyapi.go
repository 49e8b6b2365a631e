// Package policyapi is the wire format of flock-policy's admin API (HTTP+
// JSON on a unix socket, read by `flockctl policy`). It imports nothing, so
// flockctl links none of the engine, client-go or nftables.
package policyapi

// DefaultSocket is flock-policy's admin socket path.
const DefaultSocket = "/run/flock/policy.sock"

// PoliciesPath answers []PodView: the pods on the node, or with
// ?pod=NAMESPACE/NAME that pod wherever it runs.
const PoliciesPath = "/v1/policies"

// PodView is a pod and the NetworkPolicies that isolate it.
type PodView struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Node      string `json:"node"`
	// IPs are the pod's status.podIPs, then the IPs the CNI binds to it
	// that the API does not list (anycast, `addresses`).
	IPs []string `json:"ips"`
	// Ingress and Egress name (namespace/name) the policies that select
	// the pod and isolate it in that direction; empty: not isolated.
	Ingress []string `json:"ingress"`
	Egress  []string `json:"egress"`
}
