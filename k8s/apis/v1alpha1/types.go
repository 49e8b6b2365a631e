// Package v1alpha1 holds the flock.fritzlab.net/v1alpha1 API types. The
// NodeConfig spec is shared by the CRD and by the standalone node-config
// file, so both modes are configured with exactly the same fields.
//
// The OpenAPI validation below (kubebuilder markers, rendered into
// deploy/crd by `make generate`) is a first line of defence at the API
// server; nodeconfig.Validate is the authority and runs in both modes. The
// CRD sets no defaults that change behaviour: the Go code applies them.
//
// +kubebuilder:object:generate=true
// +groupName=flock.fritzlab.net
package v1alpha1

// NodeConfigSpec is the per-node configuration: BGP identity, the node's pod
// pools and the defaults applied to pods that do not say otherwise.
type NodeConfigSpec struct {
	// ASN is the node's local BGP autonomous system number.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967294
	// +kubebuilder:validation:Format=int64
	ASN uint32 `json:"asn"`

	// RouterID is the BGP router ID, a dotted quad. Required: an IPv6-only
	// node has no IPv4 address to borrow one from.
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:Format=ipv4
	// +kubebuilder:validation:XValidation:rule="isIP(self) && ip(self).family() == 4",message="must be an IPv4 dotted quad, e.g. 192.0.2.10"
	RouterID string `json:"routerID"`

	// Pools are the CIDRs this node allocates pod addresses from.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Pools []Pool `json:"pools"`

	// Defaults apply to pods without the matching annotation.
	// +optional
	Defaults Defaults `json:"defaults,omitempty"`

	// BGP configures the embedded speaker and its peers.
	// +optional
	BGP BGP `json:"bgp,omitempty"`

	// Services configures how this node advertises Service addresses
	// (LoadBalancer ingress IPs and external IPs; Kubernetes mode).
	// +optional
	Services Services `json:"services,omitempty"`
}

// Services configures the advertisement of Service addresses.
type Services struct {
	// DefaultLoadBalancerClass makes LoadBalancer Services without a
	// spec.loadBalancerClass flock's too. Only one implementation in a
	// cluster may take them; by default flock takes only its class,
	// flock.fritzlab.net/bgp.
	// +optional
	DefaultLoadBalancerClass bool `json:"defaultLoadBalancerClass,omitempty"`

	// LinkBandwidth sends, with the address of an externalTrafficPolicy:
	// Local Service, the number of its endpoints on this node as the
	// link-bandwidth extended community, so a ToR with weighted ECMP
	// spreads per endpoint rather than per node.
	// +optional
	LinkBandwidth bool `json:"linkBandwidth,omitempty"`

	// DrainOnStopSeconds: on a planned stop of the agent (SIGTERM: a
	// rollout, a node shutting down), re-advertise this node's Service
	// addresses with GRACEFUL_SHUTDOWN and wait this long before stopping,
	// so the fabric moves new flows to other nodes first. 0 (the default)
	// does not: kube-proxy keeps delivering while the agent restarts, and
	// graceful restart keeps the routes.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=300
	// +optional
	DrainOnStopSeconds int32 `json:"drainOnStopSeconds,omitempty"`
}

// BGP is the speaker's node-wide configuration.
type BGP struct {
	// ListenPort for incoming sessions. 0 means 179; -1 disables listening
	// (the node only connects out).
	// +kubebuilder:validation:Minimum=-1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	ListenPort int32 `json:"listenPort,omitempty"`

	// ImportPolicy for routes received from peers: reject (default: the
	// node needs none) or accept.
	// +kubebuilder:validation:Enum=reject;accept
	// +kubebuilder:default=reject
	// +optional
	ImportPolicy string `json:"importPolicy,omitempty"`

	// Peers are the BGP neighbours, usually the top-of-rack switches.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:XValidation:rule="has(self.address) != has(self.interface)",message="set exactly one of address and interface (unnumbered)"
	// +optional
	Peers []Peer `json:"peers,omitempty"`
}

// Peer is one BGP neighbour. Exactly one of Address and Interface is set.
//
// +kubebuilder:validation:XValidation:rule="!has(self.address) || !has(self.localAddress) || !isIP(self.address) || !isIP(self.localAddress) || ip(self.address).family() == ip(self.localAddress).family()",message="localAddress must be of the same family as address",fieldPath=".localAddress"
// +kubebuilder:validation:XValidation:rule="!has(self.passwordFile) || !has(self.passwordSecretKey)",message="set only one of passwordFile and passwordSecretKey",fieldPath=".passwordFile"
// +kubebuilder:validation:XValidation:rule="!has(self.ebgpMultihop) || self.ebgpMultihop == 0 || !has(self.ttlSecurityMin) || self.ttlSecurityMin == 0",message="ebgpMultihop and ttlSecurityMin (GTSM) are exclusive",fieldPath=".ttlSecurityMin"
// +kubebuilder:validation:XValidation:rule="!has(self.families) || !has(self.address) || !isIP(self.address) || ip(self.address).family() == 6 || !self.families.exists(f, f == 'ipv6')",message="ipv6 over an IPv4 session needs an IPv6 next hop the session cannot carry; peer over IPv6 instead",fieldPath=".families"
type Peer struct {
	// Address of the neighbour (IPv6 or IPv4, no zone: for a link-local
	// neighbour use interface).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IPv6 or IPv4 address"
	// +optional
	Address string `json:"address,omitempty"`

	// Interface for an unnumbered session: the neighbour is found by its
	// IPv6 link-local address on this interface.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:Pattern=`^[^/%\s]+$`
	// +optional
	Interface string `json:"interface,omitempty"`

	// ASN of the neighbour.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967294
	// +kubebuilder:validation:Format=int64
	ASN uint32 `json:"asn"`

	// Port of the neighbour, default 179.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port uint16 `json:"port,omitempty"`

	// LocalAddress pins the session's source address. Recommended: without
	// it the kernel may pick, say, a SLAAC address the ToR does not expect.
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IPv6 or IPv4 address"
	// +optional
	LocalAddress string `json:"localAddress,omitempty"`

	// PasswordFile holds the TCP-MD5 password (standalone mode).
	// +optional
	PasswordFile string `json:"passwordFile,omitempty"`

	// PasswordSecretKey names the key of the BGP password Secret in
	// flock's namespace (Kubernetes mode).
	// +optional
	PasswordSecretKey string `json:"passwordSecretKey,omitempty"`

	// Timers in seconds.
	// +optional
	Timers Timers `json:"timers,omitempty"`

	// GracefulRestart is on by default with explicit times, so a restarting
	// agent keeps its routes at the ToR.
	// +optional
	GracefulRestart GracefulRestart `json:"gracefulRestart,omitempty"`

	// BFD for fast failure detection.
	// +optional
	BFD BFD `json:"bfd,omitempty"`

	// EBGPMultihop TTL for a neighbour that is not directly connected; 0
	// means a directly connected neighbour.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=255
	// +optional
	EBGPMultihop uint8 `json:"ebgpMultihop,omitempty"`

	// TTLSecurityMin enables GTSM (RFC 5082): packets with a lower TTL are
	// dropped; 255 for a directly connected neighbour. 0 disables it.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=255
	// +optional
	TTLSecurityMin uint8 `json:"ttlSecurityMin,omitempty"`

	// MaxPrefixes received per family before the session is shut down; 0
	// means no limit.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	// +kubebuilder:validation:Format=int64
	// +optional
	MaxPrefixes uint32 `json:"maxPrefixes,omitempty"`

	// Families to negotiate: ipv6 and/or ipv4. Default: both over an IPv6
	// or unnumbered session (IPv4 with an IPv6 next hop, RFC 5549), ipv4
	// over an IPv4 session.
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:Enum=ipv4;ipv6
	// +kubebuilder:validation:items:MaxLength=4
	// +optional
	Families []string `json:"families,omitempty"`

	// Communities ("asn:value") added per advertisement kind.
	// +optional
	Communities KindCommunities `json:"communities,omitempty"`

	// LargeCommunities ("global:local1:local2") added per kind.
	// +optional
	LargeCommunities KindCommunities `json:"largeCommunities,omitempty"`
}

// Timers of a session, in seconds; 0 means the default.
//
// +kubebuilder:validation:XValidation:rule="!has(self.keepaliveTime) || self.keepaliveTime == 0 || self.keepaliveTime < (has(self.holdTime) && self.holdTime != 0 ? self.holdTime : 90)",message="keepaliveTime must be below the hold time (default 90)",fieldPath=".keepaliveTime"
type Timers struct {
	// HoldTime, default 90 (0 or 3..65535).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	// +kubebuilder:validation:XValidation:rule="self == 0 || self >= 3",message="must be 0 (default 90) or 3..65535"
	// +optional
	HoldTime uint32 `json:"holdTime,omitempty"`
	// KeepaliveTime, default a third of the hold time; below the hold
	// time.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	// +optional
	KeepaliveTime uint32 `json:"keepaliveTime,omitempty"`
	// ConnectRetry, default 5.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	// +kubebuilder:validation:Format=int64
	// +optional
	ConnectRetry uint32 `json:"connectRetry,omitempty"`
}

// GracefulRestart (RFC 4724) settings.
type GracefulRestart struct {
	// Disabled turns graceful restart off (it is on by default).
	// +optional
	Disabled bool `json:"disabled,omitempty"`
	// RestartTime the peer keeps our routes after the session drops,
	// default 120 seconds.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4095
	// +optional
	RestartTime uint32 `json:"restartTime,omitempty"`
	// DeferralTime we wait for peers' End-of-RIB after our own restart,
	// default 60 seconds.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	// +kubebuilder:validation:Format=int64
	// +optional
	DeferralTime uint32 `json:"deferralTime,omitempty"`
}

// BFD (RFC 5880) settings. The ranges apply while BFD is enabled (as
// nodeconfig.Validate checks them).
//
// +kubebuilder:validation:XValidation:rule="!has(self.enabled) || !self.enabled || !has(self.intervalMs) || self.intervalMs == 0 || (self.intervalMs >= 10 && self.intervalMs <= 60000)",message="must be 0 (default 300) or 10..60000 milliseconds",fieldPath=".intervalMs"
// +kubebuilder:validation:XValidation:rule="!has(self.enabled) || !self.enabled || !has(self.multiplier) || self.multiplier <= 255",message="must be 0 (default 3) or 1..255",fieldPath=".multiplier"
type BFD struct {
	// Enabled turns BFD on.
	// +optional
	Enabled bool `json:"enabled,omitempty"`
	// IntervalMs is the transmit and receive interval, default 300
	// (10..60000).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	// +kubebuilder:validation:Format=int64
	// +optional
	IntervalMs uint32 `json:"intervalMs,omitempty"`
	// Multiplier of missed packets before the session is down, default 3
	// (1..255).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	// +kubebuilder:validation:Format=int64
	// +optional
	Multiplier uint32 `json:"multiplier,omitempty"`
}

// KindCommunities lists communities per advertisement kind.
type KindCommunities struct {
	// Summary: the node's pod CIDRs.
	// +optional
	Summary []string `json:"summary,omitempty"`
	// Pod: /128 and /32 of pods allocated outside the summaries.
	// +optional
	Pod []string `json:"pod,omitempty"`
	// Anycast IPs of Ready pods.
	// +optional
	Anycast []string `json:"anycast,omitempty"`
	// Address: `addresses` IPs of Ready pods.
	// +optional
	Address []string `json:"address,omitempty"`
	// Service: LoadBalancer and external IPs of Services this node
	// delivers (a draining one carries GRACEFUL_SHUTDOWN besides).
	// +optional
	Service []string `json:"service,omitempty"`
}

// Pool is one CIDR pod addresses come from.
type Pool struct {
	// CIDR of the pool, canonical form (no host bits set).
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be a CIDR, e.g. fd00:10:1::/64 or 10.1.1.0/24"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="must have no host bits set"
	CIDR string `json:"cidr"`

	// Shared marks a pool that is not this node's own block.
	//
	// Deprecated: write an AddressPool of use pod instead; a shared pool is
	// still read, for one release, as the AddressPool
	// "nodeconfig-pool-<index>" (use pod, these namespaces) and the agent
	// logs the AddressPool to write. A pool that is not shared is a node
	// summary: the default pool of its family, advertised as one aggregate
	// and blackholed in the kernel.
	// +optional
	Shared bool `json:"shared,omitempty"`

	// Namespaces that may request a shared pool (deprecated with it).
	// Empty means every namespace.
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:Pattern=`^\S+$`
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
}

// Defaults for pods that carry no annotation of their own.
type Defaults struct {
	// IPv6 gives pods an IPv6 address unless they opt out. Default true.
	// +kubebuilder:default=true
	// +optional
	IPv6 *bool `json:"ipv6,omitempty"`

	// IPv4 gives pods an IPv4 address unless they opt out. Default false:
	// flock is IPv6-first.
	// +optional
	IPv4 bool `json:"ipv4,omitempty"`

	// IPAlgo is the default ip-algo (random, sequential, embed[:...]).
	// Default random.
	// +kubebuilder:validation:Pattern=`^(random|sequential|embed(:[a-z]+/[0-9]+(,[a-z]+/[0-9]+)*)?)$`
	// +optional
	IPAlgo string `json:"ipAlgo,omitempty"`
}

// WantIPv6 resolves the IPv6 default.
func (d Defaults) WantIPv6() bool { return d.IPv6 == nil || *d.IPv6 }
