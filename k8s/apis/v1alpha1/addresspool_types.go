package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Names of the AddressPool and AddressClaim resources.
const (
	AddressPoolKind      = "AddressPool"
	AddressPoolResource  = "addresspools"
	AddressClaimKind     = "AddressClaim"
	AddressClaimResource = "addressclaims"
)

// Uses of an AddressPool: what its addresses may be used for.
const (
	// UsePod: pod addresses, by the cidr6/cidr4 annotation (each one a /128
	// or /32 route, unique cluster-wide).
	UsePod = "pod"
	// UseAnycast: anycast IPs (shared by design: authorized, not claimed).
	UseAnycast = "anycast"
	// UseAddresses: `addresses` IPs (one pod each, unique cluster-wide).
	UseAddresses = "addresses"
	// UseLoadBalancer: addresses assigned to Services of type LoadBalancer
	// (status.loadBalancer.ingress), claimed cluster-wide like `addresses`
	// IPs.
	UseLoadBalancer = "loadBalancer"
	// UseExternalIP: addresses a Service may list in spec.externalIPs and
	// have advertised (authorized, not claimed: kube-proxy lets several
	// Services share one on different ports).
	UseExternalIP = "externalIP"
)

// Uses lists every use, in documentation order.
var Uses = []string{UsePod, UseAnycast, UseAddresses, UseLoadBalancer, UseExternalIP}

// AddressPool says which addresses pods may claim beyond their node's own
// summary pools, and Services may be given or advertise, for what, and
// from which namespaces. It is cluster-scoped;
// an address no pool allows is refused at ADD.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=ap
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="CIDRs",type=string,JSONPath=`.spec.cidrs`
// +kubebuilder:printcolumn:name="Use",type=string,JSONPath=`.spec.use`
// +kubebuilder:printcolumn:name="Namespaces",type=string,JSONPath=`.spec.namespaces`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,description="True when the agents use the pool, False when it is invalid (see Message)"
// +kubebuilder:printcolumn:name="Claims",type=integer,JSONPath=`.status.claims`,description="Addresses claimed from the pool cluster-wide"
// +kubebuilder:printcolumn:name="In-Use-On",type=string,JSONPath=`.status.inUse[*].node`,description="Nodes where addresses of the pool are in use as anycast or addresses IPs (never handed out there)"
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AddressPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the pool.
	Spec AddressPoolSpec `json:"spec"`

	// Status is written by the agents.
	// +optional
	Status AddressPoolStatus `json:"status,omitempty"`
}

// AddressPoolSpec is one pool of addresses and who may use it.
//
// +kubebuilder:validation:XValidation:rule="has(self.namespaces) || has(self.namespaceSelector)",message="say who may use the pool: namespaces and/or namespaceSelector ({} selects every namespace)"
// +kubebuilder:validation:XValidation:rule="!has(self.aggregate) || !self.aggregate || self.use.all(u, u == 'loadBalancer' || u == 'externalIP')",message="aggregate is for pools of use loadBalancer and externalIP only"
type AddressPoolSpec struct {
	// CIDRs of the pool, IPv6 and/or IPv4, canonical (no host bits set).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="must be a CIDR, e.g. 2001:db8:100::/112 or 198.51.100.0/24"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="must have no host bits set"
	CIDRs []string `json:"cidrs"`

	// Use is what the addresses may be used for: pod (pod addresses by the
	// cidr6/cidr4 annotation), anycast, addresses, loadBalancer (Service
	// addresses flock assigns), externalIP (Service spec.externalIPs flock
	// advertises).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=5
	// +kubebuilder:validation:items:Enum=pod;anycast;addresses;loadBalancer;externalIP
	// +listType=set
	Use []string `json:"use"`

	// Namespaces that may use the pool (namespace names: DNS-1123
	// labels).
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`

	// NamespaceSelector selects more namespaces by label; {} selects
	// every namespace. With neither namespaces nor a selector nobody may
	// use the pool.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// Aggregate (uses loadBalancer and externalIP only): a node advertises
	// the pool's CIDR (the one holding the address) instead of each
	// address of an externalTrafficPolicy: Cluster Service it delivers,
	// one route for many Services, as Calico does with its Service ranges.
	// Addresses of Local Services still go out one by one from the nodes
	// with a ready endpoint (the longer prefix wins at the ToR), and so do
	// draining ones. The ToR then sends a node traffic for every address of
	// the CIDR, assigned or not; kube-proxy rejects what no Service has.
	// +optional
	Aggregate bool `json:"aggregate,omitempty"`
}

// AddressPoolStatus is written by the agents.
type AddressPoolStatus struct {
	// Claims counts the addresses claimed from the pool cluster-wide
	// (AddressClaims: pods' and Services' LoadBalancer addresses; anycast
	// and external IPs are shared and never claimed).
	// +optional
	Claims int32 `json:"claims,omitempty"`

	// InUse lists, per node, the addresses of a pod pool that are in use
	// there as anycast or `addresses` IPs (the pool came to cover them
	// while they were): the node never hands them out as pod addresses,
	// and the pods holding them keep them. Every agent writes only its own
	// node's entry — what it sees differs from node to node, so one shared
	// field would have the agents overwrite each other — and only when it
	// changes; an entry goes when its overlap does (or its node's
	// NodeConfig does).
	// +listType=map
	// +listMapKey=node
	// +optional
	InUse []NodeInUse `json:"inUse,omitempty"`

	// Conditions of the pool; type Ready: True when it is valid (the
	// agents use it), False with reason InvalidSpec and the validation
	// error when it is not (the agents ignore it). Written by the agents,
	// who agree on it: it depends on the AddressPools alone.
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// Reasons of an AddressPool's Ready condition.
const (
	// ReasonValid: the pool is valid; the agents use it.
	ReasonValid = "Valid"
	// ReasonInvalidSpec: the pool is invalid (the message says why); the
	// agents ignore it.
	ReasonInvalidSpec = "InvalidSpec"
)

// NodeInUse is one node's addresses of a pool in use for another purpose.
type NodeInUse struct {
	// Node is the node's name.
	Node string `json:"node"`

	// Addresses in use, in address order; at most the first 16.
	// +kubebuilder:validation:MaxItems=16
	Addresses []InUseAddress `json:"addresses"`

	// Count of the addresses in use (Addresses may list fewer).
	Count int32 `json:"count"`
}

// MaxInUseListed bounds NodeInUse.Addresses.
const MaxInUseListed = 16

// InUseAddress is one address in use on a node.
type InUseAddress struct {
	// IP is the address.
	IP string `json:"ip"`

	// Use is how it is in use: anycast or addresses.
	// +kubebuilder:validation:Enum=anycast;addresses
	Use string `json:"use"`

	// Pods holding it on the node, as namespace/name.
	// +optional
	Pods []string `json:"pods,omitempty"`
}

// AddressPoolList is a list of AddressPools.
//
// +kubebuilder:object:root=true
type AddressPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AddressPool `json:"items"`
}

// AddressClaim records that one pod, or one Service, holds one IP
// cluster-wide: an `addresses` IP or a pod address from an AddressPool
// (held by a pod), or a LoadBalancer address (held by a Service, or by
// the Services sharing it under one allow-shared-ip key). Its name
// is derived from the IP (ClaimName), so creating it is the atomic
// test-and-set that keeps two nodes — or a node and the LoadBalancer
// assigner — from handing the IP out twice. Agents create a pod's claim
// before the dataplane is touched and delete it on DEL; the leak GC
// removes the claims of pods that are gone. A Service's claim is created
// and deleted by the (leader-elected) LoadBalancer assigner alone: the
// agents' GC never touches it.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=aclaim
// +kubebuilder:printcolumn:name="IP",type=string,JSONPath=`.spec.ip`
// +kubebuilder:printcolumn:name="Use",type=string,JSONPath=`.spec.use`
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.pool`
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.spec['pod','service'].namespace`,description="The namespace of the pod or the Service holding the IP"
// +kubebuilder:printcolumn:name="Pod",type=string,JSONPath=`.spec.pod.name`
// +kubebuilder:printcolumn:name="Service",type=string,JSONPath=`.spec.service.name`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AddressClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the claim.
	Spec AddressClaimSpec `json:"spec"`
}

// AddressClaimSpec says who holds the IP: a pod (use pod or addresses:
// pod, node and containerID are set) or a Service (use loadBalancer:
// service is set, and none of the pod's fields; a shared address also
// lists its other holders in sharers, all under sharingKey).
//
// +kubebuilder:validation:XValidation:rule="(self.use == 'loadBalancer') == has(self.service)",fieldPath=".service",message="spec.service is set exactly when spec.use is loadBalancer (a LoadBalancer address is held by a Service, any other by a pod)"
// +kubebuilder:validation:XValidation:rule="self.use != 'loadBalancer' || (!has(self.pod) && !has(self.node) && !has(self.containerID))",message="a loadBalancer claim is held by a Service: spec.pod, spec.node and spec.containerID must be unset"
// +kubebuilder:validation:XValidation:rule="self.use == 'loadBalancer' || (has(self.pod) && has(self.node) && has(self.containerID))",message="a pod or addresses claim needs spec.pod, spec.node and spec.containerID"
// +kubebuilder:validation:XValidation:rule="self.use == 'loadBalancer' || (!has(self.sharingKey) && !has(self.sharers))",message="only a loadBalancer claim is shared: spec.sharingKey and spec.sharers must be unset"
// +kubebuilder:validation:XValidation:rule="!has(self.sharers) || (has(self.sharingKey) && size(self.sharingKey) > 0)",fieldPath=".sharers",message="a claim with sharers names their spec.sharingKey"
// +kubebuilder:validation:XValidation:rule="self.ip == oldSelf.ip && self.use == oldSelf.use",message="spec.ip and spec.use never change: release the claim and make another"
// +kubebuilder:validation:XValidation:rule="oldSelf.use == 'loadBalancer' || self == oldSelf",message="a pod's claim never changes (only a LoadBalancer address's holders are updated): release it and make another"
type AddressClaimSpec struct {
	// IP is the claimed address.
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IP address"
	IP string `json:"ip"`

	// Use is pod (a pod address), addresses, or loadBalancer (a Service's
	// LoadBalancer address).
	// +kubebuilder:validation:Enum=pod;addresses;loadBalancer
	Use string `json:"use"`

	// Pool is the AddressPool the IP was authorized by.
	// +optional
	Pool string `json:"pool,omitempty"`

	// Pod holds the IP (use pod or addresses).
	// +optional
	Pod *ClaimPod `json:"pod,omitempty"`

	// Service holds the IP (use loadBalancer).
	// +optional
	Service *ClaimService `json:"service,omitempty"`

	// SharingKey is the flock.fritzlab.net/allow-shared-ip key the
	// Services hold the address under (use loadBalancer): another Service
	// may join them only with the same key. Empty: not shareable.
	// +optional
	SharingKey string `json:"sharingKey,omitempty"`

	// Sharers are the Services holding the address besides service, under
	// sharingKey (MetalLB-style sharing, use loadBalancer). The claim is
	// deleted when its last holder releases it.
	// +optional
	Sharers []ClaimService `json:"sharers,omitempty"`

	// Node is where the pod runs (use pod or addresses).
	// +optional
	Node string `json:"node,omitempty"`

	// ContainerID of the pod's sandbox (use pod or addresses).
	// +optional
	ContainerID string `json:"containerID,omitempty"`
}

// ClaimPod names the pod holding a claim.
type ClaimPod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// +optional
	UID string `json:"uid,omitempty"`
	// StaticUID of a static pod (its mirror's kubernetes.io/config.mirror
	// annotation): the same across re-created mirrors.
	// +optional
	StaticUID string `json:"staticUID,omitempty"`
}

// ClaimService names the Service holding a claim (its LoadBalancer
// address).
type ClaimService struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// UID of the Service: a Service re-created under the same name is
	// another holder.
	// +optional
	UID string `json:"uid,omitempty"`
	// Terms are what the Service holds a shareable address under (its
	// sharing key, its ports and, with externalTrafficPolicy Local, its
	// selector), as its status last took them: a new leader restores it
	// under these, so an edit not carried out does not move its sharers.
	// Written by the assigner; empty: held unshared.
	// +optional
	Terms string `json:"terms,omitempty"`
}

// AddressClaimList is a list of AddressClaims.
//
// +kubebuilder:object:root=true
type AddressClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AddressClaim `json:"items"`
}
