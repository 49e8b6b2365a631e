package networkpolicy

import (
	"encoding/binary"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// queueVerdict hands a packet to the controller's NFQUEUE: nftables' queue
// expression, or with Config.QueueCompat the xtables NFQUEUE target
// (revision 3), which kernels without nft_queue still run through
// nft_compat. Either way FailOpen sets the bypass flag.
func (c *Controller) queueVerdict() expr.Any {
	return queueExpr(uint16(c.config.QueueID), c.config.QueueCompat, c.config.FailOpen)
}

// queueExpr is the verdict handing a packet to queue num, through the
// xtables target when compat is set; bypass lets it pass while nobody
// reads the queue.
func queueExpr(num uint16, compat, bypass bool) expr.Any {
	if !compat {
		q := &expr.Queue{Num: num}
		if bypass {
			q.Flag = expr.QueueFlagBypass
		}
		return q
	}
	// struct xt_NFQ_info_v3 { __u16 queuenum, queues_total, flags; },
	// padded to XT_ALIGN (8 bytes) as the kernel checks.
	info := make([]byte, 8)
	binary.NativeEndian.PutUint16(info[0:], num)
	binary.NativeEndian.PutUint16(info[2:], 1)
	if bypass {
		binary.NativeEndian.PutUint16(info[4:], 1) // NFQ_FLAG_BYPASS
	}
	u := xt.Unknown(info)
	return &expr.Target{Name: "NFQUEUE", Rev: 3, Info: &u}
}
