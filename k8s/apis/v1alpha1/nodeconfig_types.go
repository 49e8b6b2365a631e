package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Names of the NodeConfig resource.
const (
	// Kind of the NodeConfig object.
	NodeConfigKind = "NodeConfig"
	// NodeConfigResource is the plural resource name.
	NodeConfigResource = "nodeconfigs"
)

// ConditionReady is the condition the agents set. On a NodeConfig: True
// once the spec is applied (IPAM, BGP speaker and peers configured), False
// with the reason otherwise. On an AddressPool: True when the pool is
// valid, False (ReasonInvalidSpec) with the validation error.
const ConditionReady = "Ready"

// NodeConfig is the configuration of one node's flock agent. It is
// cluster-scoped and named after the node it configures; the agent fills in
// the status.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=nc
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="ASN",type=integer,JSONPath=`.spec.asn`
// +kubebuilder:printcolumn:name="Router ID",type=string,JSONPath=`.spec.routerID`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,description="True once the node's agent applied the spec and serves; False with the reason otherwise"
// +kubebuilder:printcolumn:name="Peers",type=string,JSONPath=`.status.peers`,description="BGP sessions established/configured"
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Last Error",type=string,JSONPath=`.status.lastError`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the node's configuration.
	Spec NodeConfigSpec `json:"spec"`

	// Status is what the node's agent reports.
	// +optional
	Status NodeConfigStatus `json:"status,omitempty"`
}

// NodeConfigStatus is written by the node's agent.
type NodeConfigStatus struct {
	// PeersEstablished counts BGP sessions in state Established.
	// +optional
	PeersEstablished int32 `json:"peersEstablished,omitempty"`

	// PeersConfigured counts the configured BGP peers.
	// +optional
	PeersConfigured int32 `json:"peersConfigured,omitempty"`

	// Peers is "established/configured", e.g. "2/2", for kubectl get.
	// +optional
	Peers string `json:"peers,omitempty"`

	// PeerStates is the state of each BGP session.
	// +listType=map
	// +listMapKey=peer
	// +optional
	PeerStates []PeerStatus `json:"peerStates,omitempty"`

	// Allocations was the number of committed pod allocations on the
	// node.
	//
	// Deprecated: no longer written. A count that changes with every pod
	// made a status write reach every node that watches NodeConfigs; it
	// is in `flockctl status` and the flock_allocations metric.
	// +optional
	Allocations int32 `json:"allocations,omitempty"`

	// LastError is the most recent error applying the spec or running the
	// node's networking (a reconciler whose last pass failed), empty when
	// there is none.
	// +optional
	LastError string `json:"lastError,omitempty"`

	// Reconcilers is the health of the route reconcilers (bgp: the paths
	// the node originates; kernel: its anycast/addresses host routes).
	// +listType=map
	// +listMapKey=target
	// +optional
	Reconcilers []ReconcilerStatus `json:"reconcilers,omitempty"`

	// ObservedGeneration is the spec generation the agent last applied.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions of the node's flock agent; type Ready.
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// PeerStatus is the state of one BGP session.
type PeerStatus struct {
	// Peer is the neighbour's address, or "interface <name>" for an
	// unnumbered session.
	Peer string `json:"peer"`

	// State is the BGP FSM state (idle, connect, active, opensent,
	// openconfirm, established).
	// +optional
	State string `json:"state,omitempty"`

	// Since is when the session entered State.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`

	// Warning is a problem worth a look (for example an MD5 password that
	// could not be read), empty when there is none.
	// +optional
	Warning string `json:"warning,omitempty"`
}

// ReconcilerStatus is the health of one route reconciler.
type ReconcilerStatus struct {
	// Target is bgp or kernel.
	Target string `json:"target"`

	// Errors counts failed passes since the agent started.
	// +optional
	Errors int64 `json:"errors,omitempty"`

	// Failing is true while the last pass failed (it is retried with
	// back-off).
	// +optional
	Failing bool `json:"failing,omitempty"`

	// LastError is the error of the last failed pass.
	// +optional
	LastError string `json:"lastError,omitempty"`

	// LastErrorTime is when the last pass failed.
	// +optional
	LastErrorTime *metav1.Time `json:"lastErrorTime,omitempty"`
}

// NodeConfigList is a list of NodeConfigs.
//
// +kubebuilder:object:root=true
type NodeConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeConfig `json:"items"`
}
