package bgp

import (
	"context"
	"fmt"
	"time"

	api "github.com/osrg/gobgp/v4/api"
)

// Max-prefix (a peer's maxPrefixes, per family).
//
// GoBGP v4.8.0 enforces the limit itself: when an UPDATE takes a family's
// Adj-RIB-In past it, it sends the peer a Cease NOTIFICATION (subcode 1,
// "Maximum Number of Prefixes Reached"), closes the connection and moves
// the peer to admin state PFX_CT, in which it stays Idle for good: it
// neither reconnects nor accepts the peer's connections until EnablePeer.
// Its own log line names only the family, every time an UPDATE arrives over
// the limit. And with graceful restart negotiated it takes its own teardown
// for the peer restarting (the connection "failed"): it keeps all of the
// peer's routes, the excess included, as stale for the peer's restart
// time, and a new session counts them against the limit again until the
// peer's End-of-RIB, so even a peer that now sends fewer can trip it at
// once.
//
// flock builds on that: when a session goes down in PFX_CT it logs one
// line (peer, family, limit, received), deletes the peer from GoBGP (which
// drops everything it sent) and adds it again admin-down, shows the reason
// in the Neighbor's LastError, and enables the peer after a back-off:
// 30 s after the first trip, doubling with each trip in a row, at most
// 10 min (30 s, 1 m, 2 m, 4 m, 8 m, 10 m, 10 m, ...). A session that then
// stays established for 10 min starts the count again. While held, the ToR
// gets no session at all (GoBGP refuses its connections), so a ToR stuck
// on too many routes is tried at most every 10 min.
var (
	maxPrefixBackoffMin = 30 * time.Second
	maxPrefixBackoffMax = 10 * time.Minute
	// maxPrefixStable: a session up this long before it trips again starts
	// the back-off from the beginning.
	maxPrefixStable = 10 * time.Minute
)

// maxPrefixBackoff is the hold after the n-th trip in a row (n >= 1).
func maxPrefixBackoff(n int) time.Duration {
	d := maxPrefixBackoffMin
	for i := 1; i < n && d < maxPrefixBackoffMax; i++ {
		d *= 2
	}
	return min(d, maxPrefixBackoffMax)
}

// maxPrefixTripLocked handles a session GoBGP tore down for max-prefix:
// wasUp and upSince describe the session before it went down.
func (s *Speaker) maxPrefixTripLocked(ctx context.Context, key string, p *peer, wasUp bool, upSince time.Time) {
	now := time.Now()
	if wasUp && now.Sub(upSince) >= maxPrefixStable {
		p.pfxTrips = 0
	}
	p.pfxTrips++
	delay := maxPrefixBackoff(p.pfxTrips)
	p.holdUntil = now.Add(delay)

	// What the peer sent: GoBGP keeps the Adj-RIB-In as stale when graceful
	// restart was negotiated (until we delete the peer below); without it,
	// it has already dropped it, and only the limit is known.
	limit := p.spec.MaxPrefixes
	fams := Families(p.spec)
	family, received := "", uint64(0)
	if p.apiAddr.IsValid() {
		for _, f := range fams {
			t, err := s.srv.GetTable(ctx, &api.GetTableRequest{TableType: api.TableType_TABLE_TYPE_ADJ_IN, Name: p.apiAddr.String(), Family: apiFamily(f)})
			if err == nil && t.NumPath > uint64(limit) && t.NumPath > received {
				family, received = f, t.NumPath
			}
		}
	}
	if family == "" && len(fams) == 1 {
		family = fams[0]
	}
	what := fmt.Sprintf("max-prefix %d exceeded", limit)
	if family != "" {
		what += " for " + family
	}
	if received > 0 {
		what += fmt.Sprintf(" (received %d)", received)
	}
	p.maxPfx = what
	attrs := []any{"peer", key}
	if family != "" {
		attrs = append(attrs, "family", family)
	}
	attrs = append(attrs, "limit", limit)
	if received > 0 {
		attrs = append(attrs, "received", received)
	}
	attrs = append(attrs, "retry_in", delay, "trips_in_a_row", p.pfxTrips)
	s.log.Warn("bgp: max-prefix exceeded: session torn down (Cease sent to the peer), retrying after a back-off", attrs...)

	// Drop what the peer sent (GoBGP would keep it as stale) and reset the
	// PFX_CT state: delete the peer; Run adds it again admin-down and
	// enables it when the hold ends.
	if err := s.readdLocked(ctx, key, p); err != nil {
		// Still PFX_CT in GoBGP: EnablePeer at the end of the hold brings
		// it back all the same.
		s.log.Warn("bgp: after max-prefix", "peer", key, "err", err)
	}
}

// held tells whether the peer waits out a max-prefix back-off.
func (p *peer) held(now time.Time) bool {
	return now.Before(p.holdUntil)
}

// nextRelease is how long until the first held peer may be enabled.
func (s *Speaker) nextRelease() (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var next time.Time
	for _, p := range s.peers {
		if !p.enabled && p.held(now) && (next.IsZero() || p.holdUntil.Before(next)) {
			next = p.holdUntil
		}
	}
	if next.IsZero() {
		return 0, false
	}
	return next.Sub(now), true
}

// maxPrefixStatus is the max-prefix part of a Neighbor's LastError.
func (p *peer) maxPrefixStatus(now time.Time) string {
	if p.maxPfx == "" {
		return ""
	}
	if p.held(now) {
		return fmt.Sprintf("%s: session down, retrying in %s", p.maxPfx, max(p.holdUntil.Sub(now).Round(time.Second), time.Second))
	}
	return p.maxPfx + ": session down, reconnecting"
}
