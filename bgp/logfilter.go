package bgp

import (
	"context"
	"errors"
	"log/slog"
	"net"
)

// levelFilter drops records below min. GoBGP does not filter by the
// LevelVar it is given (it only changes it on a SetLogLevel call), so
// without this GoBGP logged at the agent's level, debug included.
type levelFilter struct {
	slog.Handler
	min slog.Leveler
}

func (h levelFilter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min.Level() && h.Handler.Enabled(ctx, l)
}

// demoted are GoBGP warnings logged at info instead. A max-prefix trip
// makes GoBGP log "prefix limit reached" for every UPDATE over the limit
// (naming neither limit nor count), and each of those asks for the PFX_CT
// admin state again, which it reports as a request "still remaining" or a
// change "to the same state"; flock logs the trip once, with the limit and
// the count (maxPrefixTripLocked). flock itself never has two admin state
// requests for a peer outstanding (one EnablePeer after an admin-down add),
// so those two warnings only ever come from the repeats.
var demoted = map[string]bool{
	"prefix limit reached": true,
	"previous setting admin state request is still remaining": true,
	"cannot change to the same state":                         true,
}

// closedConn tells whether a record is GoBGP's "failed to send" on a
// connection it closed itself: its sender racing its own teardown (a
// NOTIFICATION it sent, max-prefix), not a network failure.
func closedConn(r slog.Record) bool {
	if r.Message != "failed to send" {
		return false
	}
	closed := false
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && errors.Is(err, net.ErrClosed) {
			closed = true
		}
		return !closed
	})
	return closed
}

// Handle logs the demoted GoBGP warnings at info.
func (h levelFilter) Handle(ctx context.Context, r slog.Record) error {
	if (demoted[r.Message] || closedConn(r)) && r.Level > slog.LevelInfo {
		r.Level = slog.LevelInfo
		if !h.Enabled(ctx, r.Level) {
			return nil
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h levelFilter) WithAttrs(a []slog.Attr) slog.Handler {
	return levelFilter{h.Handler.WithAttrs(a), h.min}
}

func (h levelFilter) WithGroup(name string) slog.Handler {
	return levelFilter{h.Handler.WithGroup(name), h.min}
}
