package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Names of the NodeConfigTemplate resource.
const (
	NodeConfigTemplateKind     = "NodeConfigTemplate"
	NodeConfigTemplateResource = "nodeconfigtemplates"
)

// TemplateLabel marks a NodeConfig an agent rendered from a
// NodeConfigTemplate; its value is the template's name. A NodeConfig
// without it is hand-made: no agent ever touches it, and it overrides
// every template for its node.
const TemplateLabel = GroupName + "/template"

// Sources of a value that differs from node to node.
const (
	// NodeAddressInternalIPv4 is the Node's first status.addresses entry
	// of type InternalIP that is an IPv4 address.
	NodeAddressInternalIPv4 = "InternalIPv4"
	// NodeAddressInternalIPv6 is the Node's first InternalIP that is an
	// IPv6 address.
	NodeAddressInternalIPv6 = "InternalIPv6"
	// HashNodeName derives a router ID from the node's name (for nodes
	// without an IPv4 address to take one from).
	HashNodeName = "NodeName"
)

func init() {
	// Registered here, not in groupversion_info.go's addKnownTypes, so the
	// kind lives in one file.
	SchemeBuilder.Register(func(s *runtime.Scheme) error {
		s.AddKnownTypes(GroupVersion, &NodeConfigTemplate{}, &NodeConfigTemplateList{})
		return nil
	})
}

// NodeConfigTemplate peers a whole set of nodes (a rack, a cluster)
// without a hand-written NodeConfig per node. Every agent renders the one
// template that selects its own node into the NodeConfig named after the
// node, labelled flock.fritzlab.net/template=<template>; what differs per
// node (AS number, router ID, pod pools, ToR addresses) comes from the
// Node object: its labels, annotations, addresses and spec.podCIDRs. A
// NodeConfig made by hand (without that label) overrides the template for
// its node. A node selected by two templates gets neither (the agent
// reports the conflict).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=nct
// +kubebuilder:subresource:status
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63",message="the name is the value of the rendered NodeConfigs' flock.fritzlab.net/template label: at most 63 characters"
// +kubebuilder:printcolumn:name="Selector",type=string,JSONPath=`.spec.nodeSelector`
// +kubebuilder:printcolumn:name="ASN",type=integer,JSONPath=`.spec.asn`,description="The literal AS number (empty: per node, see ASN-From)"
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes`,description="NodeConfigs rendered from the template"
// +kubebuilder:printcolumn:name="ASN-From",type=string,JSONPath=`.spec.asnFrom`,priority=1
// +kubebuilder:printcolumn:name="Router-ID-From",type=string,JSONPath=`.spec.routerIDFrom`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeConfigTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the template.
	Spec NodeConfigTemplateSpec `json:"spec"`

	// Status is written by the agents.
	// +optional
	Status NodeConfigTemplateStatus `json:"status,omitempty"`
}

// NodeConfigTemplateSpec is a NodeConfig spec for every node it selects,
// with the per-node values taken from each Node. There is no literal
// routerID (it must be unique) and no literal pools (they would overlap
// between nodes).
//
// +kubebuilder:validation:XValidation:rule="has(self.asn) != has(self.asnFrom)",message="set exactly one of asn and asnFrom"
type NodeConfigTemplateSpec struct {
	// NodeSelector selects the nodes by label; {} selects every node.
	NodeSelector metav1.LabelSelector `json:"nodeSelector"`

	// ASN is every selected node's AS number.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967294
	// +kubebuilder:validation:Format=int64
	// +optional
	ASN uint32 `json:"asn,omitempty"`

	// ASNFrom takes each node's AS number (decimal) from one of its
	// labels or annotations, e.g. the label flock.fritzlab.net/asn: one
	// AS per rack.
	// +optional
	ASNFrom *ValueFrom `json:"asnFrom,omitempty"`

	// RouterIDFrom says where each node's router ID comes from.
	RouterIDFrom RouterIDFrom `json:"routerIDFrom"`

	// PoolsFrom says where each node's pod pools (its summaries) come
	// from.
	PoolsFrom PoolsFrom `json:"poolsFrom"`

	// Template is the rest of the NodeConfig spec, copied into every
	// rendered NodeConfig.
	// +optional
	Template TemplateSpec `json:"template,omitempty"`
}

// ValueFrom names a node label or annotation; exactly one.
//
// +kubebuilder:validation:XValidation:rule="has(self.label) != has(self.annotation)",message="set exactly one of label and annotation"
type ValueFrom struct {
	// Label of the Node holding the value.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +optional
	Label string `json:"label,omitempty"`

	// Annotation of the Node holding the value.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +optional
	Annotation string `json:"annotation,omitempty"`
}

// RouterIDFrom is where a node's router ID (a dotted quad, unique among
// the nodes) comes from; exactly one source.
//
// +kubebuilder:validation:XValidation:rule="(has(self.nodeAddress) ? 1 : 0) + (has(self.label) ? 1 : 0) + (has(self.annotation) ? 1 : 0) + (has(self.hash) ? 1 : 0) == 1",message="set exactly one of nodeAddress, label, annotation and hash"
type RouterIDFrom struct {
	// NodeAddress InternalIPv4: the Node's first IPv4 InternalIP
	// (status.addresses).
	// +kubebuilder:validation:Enum=InternalIPv4
	// +optional
	NodeAddress string `json:"nodeAddress,omitempty"`

	// Label of the Node holding a dotted quad.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +optional
	Label string `json:"label,omitempty"`

	// Annotation of the Node holding a dotted quad.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +optional
	Annotation string `json:"annotation,omitempty"`

	// Hash NodeName: 32 bits of FNV-1a of the node's name, for IPv6-only
	// nodes (no IPv4 address to borrow). Stable across restarts; unique
	// with high probability, and a duplicate is reported (log, Event)
	// when the agent writes the NodeConfig.
	// +kubebuilder:validation:Enum=NodeName
	// +optional
	Hash string `json:"hash,omitempty"`
}

// PoolsFrom is where a node's summary pools come from: its spec.podCIDRs
// and/or an annotation. There are no literal pools: they would overlap
// between nodes.
//
// +kubebuilder:validation:XValidation:rule="(has(self.podCIDRs) && self.podCIDRs) || has(self.annotation)",message="set podCIDRs: true and/or annotation"
type PoolsFrom struct {
	// PodCIDRs: the Node's spec.podCIDRs, which kube-controller-manager's
	// node IPAM carves from --cluster-cidr (--allocate-node-cidrs):
	// collision-free cluster-wide without another allocator.
	// +optional
	PodCIDRs bool `json:"podCIDRs,omitempty"`

	// Annotation of the Node holding comma-separated CIDRs.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +optional
	Annotation string `json:"annotation,omitempty"`
}

// AddressFrom is where a per-node address comes from: one of the Node's
// addresses, a label or an annotation; exactly one. Label values cannot
// hold an IPv6 address (':' is not allowed in them): use an annotation.
//
// +kubebuilder:validation:XValidation:rule="(has(self.nodeAddress) ? 1 : 0) + (has(self.label) ? 1 : 0) + (has(self.annotation) ? 1 : 0) == 1",message="set exactly one of nodeAddress, label and annotation"
type AddressFrom struct {
	// NodeAddress InternalIPv6 or InternalIPv4: the Node's first
	// InternalIP of that family (status.addresses).
	// +kubebuilder:validation:Enum=InternalIPv6;InternalIPv4
	// +optional
	NodeAddress string `json:"nodeAddress,omitempty"`

	// Label of the Node holding the address.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +optional
	Label string `json:"label,omitempty"`

	// Annotation of the Node holding the address.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +optional
	Annotation string `json:"annotation,omitempty"`
}

// TemplateSpec is the part of a NodeConfig spec that is the same on every
// node of a template.
type TemplateSpec struct {
	// Defaults apply to pods without the matching annotation.
	// +optional
	Defaults Defaults `json:"defaults,omitempty"`

	// BGP configures the embedded speaker and its peers.
	// +optional
	BGP TemplateBGP `json:"bgp,omitempty"`
}

// TemplateBGP is a NodeConfig's bgp section whose peers may take their
// addresses from the Node.
type TemplateBGP struct {
	// ListenPort for incoming sessions. 0 means 179; -1 disables listening
	// (the node only connects out).
	// +kubebuilder:validation:Minimum=-1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	ListenPort int32 `json:"listenPort,omitempty"`

	// ImportPolicy for routes received from peers: reject (default: the
	// node needs none) or accept.
	// +kubebuilder:validation:Enum=reject;accept
	// +optional
	ImportPolicy string `json:"importPolicy,omitempty"`

	// Peers are the BGP neighbours, usually the top-of-rack switches: over
	// `interface` (unnumbered), a literal address (a route server) or an
	// address per node (addressFrom).
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Peers []TemplatePeer `json:"peers,omitempty"`
}

// TemplatePeer embeds Peer, whose type-level CEL rules it inherits: the
// rule "exactly one of address and interface" therefore sits on the items
// of BGP.Peers (types.go), not on Peer, and TemplatePeer has its own.

// TemplatePeer is a NodeConfig peer whose address and local address may
// come from the Node. Exactly one of address, interface and addressFrom
// is set.
//
// +kubebuilder:validation:XValidation:rule="(has(self.address) ? 1 : 0) + (has(self.interface) ? 1 : 0) + (has(self.addressFrom) ? 1 : 0) == 1",message="set exactly one of address, interface (unnumbered) and addressFrom"
// +kubebuilder:validation:XValidation:rule="!has(self.localAddress) || !has(self.localAddressFrom)",message="set only one of localAddress and localAddressFrom"
type TemplatePeer struct {
	Peer `json:",inline"`

	// AddressFrom takes the neighbour's address from a Node label or
	// annotation (a ToR address per rack or per server port).
	// +optional
	AddressFrom *ValueFrom `json:"addressFrom,omitempty"`

	// LocalAddressFrom takes the session's source address from the Node:
	// its InternalIP of a family, a label or an annotation.
	// +optional
	LocalAddressFrom *AddressFrom `json:"localAddressFrom,omitempty"`
}

// NodeConfigTemplateStatus is written by the agents.
type NodeConfigTemplateStatus struct {
	// Nodes counts the NodeConfigs rendered from the template (labelled
	// flock.fritzlab.net/template=<name>).
	// +optional
	Nodes int32 `json:"nodes,omitempty"`
}

// NodeConfigTemplateList is a list of NodeConfigTemplates.
//
// +kubebuilder:object:root=true
type NodeConfigTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeConfigTemplate `json:"items"`
}
