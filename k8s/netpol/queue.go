package netpol

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// probeTable is where nftQueueWorks tries a queue rule; it never holds
// one for longer than the probe.
const probeTable = "flock-netpol-probe"

// nftQueueWorks tells whether the kernel runs nftables' queue expression.
// Kernels built without nft_queue (CONFIG_NFT_QUEUE unset: some VM
// kernels, this project's CI) refuse it with ENOENT; the engine then
// queues through the xtables NFQUEUE target instead. The probe is a rule
// in a chain no hook calls, removed at once.
func nftQueueWorks() (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, fmt.Errorf("netpol: open nftables: %w", err)
	}
	t := &nftables.Table{Name: probeTable, Family: nftables.TableFamilyINet}
	// add + delete + add: no table of an interrupted probe survives.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	if err := c.Flush(); err != nil {
		return false, fmt.Errorf("netpol: create nftables table %s: %w", probeTable, err)
	}
	defer func() {
		c.DelTable(t)
		_ = c.Flush()
	}()
	ch := c.AddChain(&nftables.Chain{Name: "probe", Table: t})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{&expr.Queue{Num: 65535, Flag: expr.QueueFlagBypass}}})
	return c.Flush() == nil, nil
}
