// Package v1alpha1 holds the flock.fritzlab.net/v1alpha1 API types. The
// NodeConfig spec is shared by the CRD and by the standalone node-config
// file, so both modes are configured with exactly the same fields.
//
// +groupName=flock.fritzlab.net
package v1alpha1

// NodeConfigSpec is the per-node configuration: BGP identity, the node's pod
// pools and the defaults applied to pods that do not say otherwise.
type NodeConfigSpec struct {
	// ASN is the node's local BGP autonomous system number.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967294
	ASN uint32 `json:"asn"`

	// RouterID is the BGP router ID, a dotted quad. Required: an IPv6-only
	// node has no IPv4 address to borrow one from.
	// +kubebuilder:validation:Format=ipv4
	RouterID string `json:"routerID"`

	// Pools are the CIDRs this node allocates pod addresses from.
	// +kubebuilder:validation:MinItems=1
	Pools []Pool `json:"pools"`

	// Defaults apply to pods without the matching annotation.
	// +optional
	Defaults Defaults `json:"defaults,omitempty"`
}

// Pool is one CIDR pod addresses come from.
type Pool struct {
	// CIDR of the pool, canonical form (no host bits set).
	CIDR string `json:"cidr"`

	// Shared marks a pool that is not this node's own block (for example
	// one CIDR spread over several nodes). Pods get an address from it only
	// by the cidr6/cidr4 annotation, and each address is advertised as a
	// /128 or /32. A pool that is not shared is a node summary: the default
	// pool of its family, advertised as one aggregate and blackholed in the
	// kernel.
	// +optional
	Shared bool `json:"shared,omitempty"`

	// Namespaces that may request this pool (or a range inside it) by
	// annotation. Empty means every namespace.
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
}

// Defaults for pods that carry no annotation of their own.
type Defaults struct {
	// IPv6 gives pods an IPv6 address unless they opt out. Default true.
	// +optional
	IPv6 *bool `json:"ipv6,omitempty"`

	// IPv4 gives pods an IPv4 address unless they opt out. Default false:
	// flock is IPv6-first.
	// +optional
	IPv4 bool `json:"ipv4,omitempty"`

	// IPAlgo is the default ip-algo (random, sequential, embed[:...]).
	// Default random.
	// +optional
	IPAlgo string `json:"ipAlgo,omitempty"`
}

// WantIPv6 resolves the IPv6 default.
func (d Defaults) WantIPv6() bool { return d.IPv6 == nil || *d.IPv6 }
