package networkpolicy

import (
	"context"
	"net"

	"github.com/google/nftables/expr"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// EvaluatePacket is the engine's verdict on the first packet of a
// connection with these fields (proto empty and ports 0 for a protocol
// other than TCP, UDP and SCTP): what a program compiled from the same
// policies must decide alike.
func (c *Controller) EvaluatePacket(ctx context.Context, srcIP, dstIP net.IP, proto v1.Protocol, srcPort, dstPort int) bool {
	family := v1.IPv4Protocol
	if srcIP.To4() == nil {
		family = v1.IPv6Protocol
	}
	return c.evaluatePacket(ctx, packet{family: family, srcIP: srcIP, dstIP: dstIP, proto: proto, srcPort: srcPort, dstPort: dstPort})
}

// JudgedIPs are the addresses whose packets the engine queues for a
// verdict (its podips sets without AdminNetworkPolicy): the IPs of this
// node's pods that some NetworkPolicy selects.
func (c *Controller) JudgedIPs() ([]string, error) {
	networkPolicies, err := c.networkpolicyLister.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var out []string
	for _, networkPolicy := range networkPolicies {
		for _, pod := range c.getLocalPodsForNetworkPolicy(networkPolicy) {
			out = append(out, c.podIPs(pod)...)
		}
	}
	return out, nil
}

// QueueVerdict is the verdict the engine's rules hand a packet to its
// queue with (cfg's QueueID, QueueCompat and FailOpen): an embedder that
// writes the rules itself (NoRules) queues what the engine must judge
// with it.
func QueueVerdict(cfg Config) expr.Any {
	return queueExpr(uint16(cfg.QueueID), cfg.QueueCompat, cfg.FailOpen)
}
