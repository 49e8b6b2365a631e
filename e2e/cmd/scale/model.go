package main

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
)

// envelope is a cluster's size. full is Kubernetes' scalability envelope
// (sig-scalability thresholds.md: 5,000 nodes, 150,000 pods, 10,000
// Services, up to 250 endpoints behind one) plus the 1,000
// NetworkPolicies; the other sizes are fractions of it.
type envelope struct {
	Nodes int
	// PodsPerNode: HostPods of them are host-network DaemonSet pods
	// (kube-proxy, flock-agent, flock-policy, a log shipper), the rest are
	// pod-network pods with an address of each family.
	PodsPerNode, HostPods int
	Policies              int
}

var full = envelope{Nodes: 5000, PodsPerNode: 30, HostPods: 4, Policies: 1000}

// scaled is the envelope at fraction f of e's nodes and policies.
func (e envelope) scaled(f float64) envelope {
	e.Nodes = max(1, int(float64(e.Nodes)*f/nodeGroup+0.5)) * nodeGroup
	e.Policies = max(1, int(float64(e.Policies)*f+0.5))
	return e
}

func (e envelope) netPods() int   { return e.Nodes * (e.PodsPerNode - e.HostPods) }
func (e envelope) totalPods() int { return e.Nodes * e.PodsPerNode }

// Fixed shape of the model cluster. Everything is a function of an
// object's index (and the seed), never of the cluster's size, so a larger
// size only adds objects: the sizes are filled one after another into the
// same API server.
const (
	maxEndpoints      = 250 // the most pods behind one Service
	nodeGroup         = 100 // nodes a workload's replicas are dealt round (sizes are whole groups)
	servicesPerNS     = 10  // workloads (each a Deployment and its Service) per namespace
	lbEvery           = 100 // one workload in lbEvery is a LoadBalancer Service with a flock address
	dualStackEvery    = 20  // one Service in dualStackEvery is PreferDualStack (the rest: IPv6 only, the primary family)
	addressesEvery    = 200 // one pod-network pod in addressesEvery holds an `addresses` IP (an AddressClaim)
	anycastEvery      = 200 // one workload in anycastEvery carries an anycast IP on every replica
	nodeImages        = 25  // images a node's status lists (kubelet reports up to 50)
	containerEnvVars  = 6   // environment variables per container
	modelNodePrefix   = "scale-"
	modelNSPrefix     = "team-"
	modelPolicyPrefix = "allow-"
)

// workload is a Deployment's worth of pods with its Service: pods
// [first, first+size) of the pod-network pods, laid out one workload
// after another.
type workload struct {
	index, first, size int
}

func (w workload) namespace() string { return nsName(w.index / servicesPerNS) }
func (w workload) name() string      { return fmt.Sprintf("app-%05d", w.index) }
func (w workload) hash() string      { return fmt.Sprintf("%08x", fnvHash(w.name()))[:8] }
func (w workload) lb() bool          { return w.index%lbEvery == lbEvery-1 }
func (w workload) dualStack() bool   { return w.index%dualStackEvery == dualStackEvery-1 }
func (w workload) anycast() bool     { return w.index%anycastEvery == anycastEvery/2 }

func nsName(i int) string   { return fmt.Sprintf("%s%04d", modelNSPrefix, i) }
func nodeName(i int) string { return fmt.Sprintf("%s%04d", modelNodePrefix, i) }

// workloadSize draws workload i's size from a heavy tail capped at
// maxEndpoints (mean about 13, so 10,000 Services cover the envelope's
// 130,000 pod-network pods): most workloads are a few replicas, a few are
// hundreds.
func workloadSize(seed uint64, i int) int {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	switch p := r.Float64(); {
	case p < 0.73:
		return 1 + r.IntN(8) // 1–8
	case p < 0.96:
		return 9 + r.IntN(32) // 9–40
	case p < 0.995:
		return 41 + r.IntN(80) // 41–120
	default:
		return 121 + r.IntN(maxEndpoints-120) // 121–250
	}
}

// model is the cluster at one size.
type model struct {
	seed      uint64
	env       envelope
	workloads []workload // those with at least one pod in the cluster
}

func newModel(seed uint64, e envelope) *model {
	m := &model{seed: seed, env: e}
	n := e.netPods()
	for i, first := 0, 0; first < n; i++ {
		w := workload{index: i, first: first, size: workloadSize(seed, i)}
		if first+w.size > n {
			w.size = n - first // the last one is cut at the size's edge
		}
		m.workloads = append(m.workloads, w)
		first += w.size
	}
	return m
}

// namespaces is how many namespaces the model's workloads use.
func (m *model) namespaces() int {
	return (len(m.workloads) + servicesPerNS - 1) / servicesPerNS
}

// podNode is the node of pod-network pod k. Pods are dealt round groups
// of nodeGroup nodes, so a workload's replicas spread over many nodes as a
// scheduler's would, and a pod's node depends on k alone: sizes are whole
// groups (scaled rounds to them).
func podNode(k int) int {
	per := full.PodsPerNode - full.HostPods
	group, o := k/(per*nodeGroup), k%(per*nodeGroup)
	return group*nodeGroup + o%nodeGroup
}

// podName of pod-network pod k within workload w.
func (w workload) podName(k int) string {
	return fmt.Sprintf("%s-%s-%s", w.name(), w.hash()[:5], suffix(k))
}

// suffix is a pod-name suffix like the ReplicaSet controller's.
func suffix(k int) string {
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"
	b := make([]byte, 5)
	v := fnvHash(fmt.Sprint(k))
	for i := range b {
		b[i] = alphabet[v%uint32(len(alphabet))]
		v /= uint32(len(alphabet))
	}
	return string(b)
}

func fnvHash(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}

// Addresses. Nothing routes to them: they are API data, and the kernel
// rules kube-proxy and flock-policy write from them stay in the node's
// own namespace, which sends them nothing.
var (
	podV6Base  = netip.MustParseAddr("2001:db8:4000::")    // pod k: podV6Base + node<<16 + k
	podV4Base  = netip.MustParseAddr("198.18.0.0")         // pod k: the k-th address of 198.18.0.0/15 (131,072: the envelope's 130,000 fit)
	nodeV6Base = netip.MustParseAddr("2001:db8:3000::")    // node i's InternalIP
	lbV6Base   = netip.MustParseAddr("2001:db8:5000::")    // LoadBalancer addresses
	anyV6Base  = netip.MustParseAddr("2001:db8:5100::")    // anycast addresses
	addrV6Base = netip.MustParseAddr("2001:db8:5200::")    // `addresses` IPs
	svcV4CIDR  = netip.MustParsePrefix("203.0.113.0/24")   // the secondary Service range (PreferDualStack Services)
	svcV6CIDR  = netip.MustParsePrefix("fd00:10:96::/108") // the primary Service range
	// ServiceCIDRs beside the secondary range: the envelope's 500
	// PreferDualStack Services need about 500 IPv4 addresses.
	extraSvcV4CIDRs = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("198.51.100.128/25")}
)

// addOffset is a + n (n < 2^32).
func addOffset(a netip.Addr, n uint64) netip.Addr {
	b := a.As16()
	if a.Is4() {
		v := uint64(b[12])<<24 | uint64(b[13])<<16 | uint64(b[14])<<8 | uint64(b[15])
		v += n
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	var carry uint64 = n
	for i := 15; i >= 0 && carry > 0; i-- {
		s := uint64(b[i]) + carry&0xff
		b[i] = byte(s)
		carry = carry>>8 + s>>8
	}
	return netip.AddrFrom16(b)
}

// podIPs of pod-network pod k: IPv6 from its node's summary (a /64 a
// node), IPv4 the k-th of 198.18.0.0/15 (the model's nodes have IPv6
// summaries only: 5,000 IPv4 blocks of 26 pods would not fit the range).
func podIPs(k int) (v6, v4 netip.Addr) {
	per := full.PodsPerNode - full.HostPods
	slot := k % (per * nodeGroup) / nodeGroup
	return addOffset(nodeSummary(podNode(k)).Addr(), uint64(slot+1)), addOffset(podV4Base, uint64(k))
}

// nodeSummary is model node i's IPv6 pod summary.
func nodeSummary(i int) netip.Prefix {
	b := podV6Base.As16()
	b[6], b[7] = byte(i>>8), byte(i)
	return netip.PrefixFrom(netip.AddrFrom16(b), 64)
}

func nodeIP(i int) netip.Addr { return addOffset(nodeV6Base, uint64(i)) }
