package relay

import (
	"context"
	"net"
	"time"
)

// dialer gives up on a relay after timeout, so that a node whose relay
// is gone goes on to the next (or the API server) within seconds.
type dialer struct{ timeout time.Duration }

func (d *dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	nd := net.Dialer{Timeout: d.timeout, KeepAlive: 30 * time.Second}
	return nd.DialContext(ctx, network, addr)
}
