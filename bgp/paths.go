package bgp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"code.fritzlab.net/fritzlab/flock/advert"
)

// Set makes the paths the speaker originates equal desired (the full set:
// prefix → path). Only the difference is sent, in one AddPath and one
// DeletePath batch; a path held with the same attributes is never re-sent.
// With full, or when an earlier Set failed, it first re-reads what GoBGP
// really holds (its global RIB, locally originated paths, kinds from the
// marker community, drain and weight from theirs) and diffs against that.
// Set only talks to GoBGP, so it works before Run.
func (s *Speaker) Set(ctx context.Context, desired map[netip.Prefix]advert.Path, full bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.pathMu.Lock()
	defer s.pathMu.Unlock()
	// A full pass re-reads GoBGP's RIB when its path count differs from
	// what we hold, and every rereadEvery-th time anyway (and after an
	// error): listing 10,000 paths on every repair would cost the idle node
	// more than everything else it does, and only our own AddPath and
	// DeletePath change those paths.
	if full {
		s.fullPasses++
	}
	if s.reread || (full && (s.fullPasses%rereadEvery == 0 || !s.countMatches())) {
		held, err := s.readRIB()
		if err != nil {
			s.reread = true
			return err
		}
		s.held = held
	}
	announce, withdraw := advert.Diff(desired, s.held)
	err := s.applyPaths(announce, withdraw)
	s.reread = err != nil
	return err
}

// rereadEvery: one full pass in this many re-reads GoBGP's RIB even when
// the path count matches (with the default 30 s repair, every 5 minutes).
const rereadEvery = 10

// countMatches tells whether GoBGP's global RIB holds as many paths as the
// speaker believes it originates (false if it cannot tell).
func (s *Speaker) countMatches() bool {
	n := uint64(0)
	for _, fam := range []*api.Family{{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}, {Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}} {
		t, err := s.srv.GetTable(context.Background(), &api.GetTableRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: fam})
		if err != nil {
			return false
		}
		n += t.NumPath
	}
	return n == uint64(len(s.held))
}

// Held returns what the speaker believes it originates (prefix → path).
func (s *Speaker) Held() map[netip.Prefix]advert.Path {
	s.pathMu.Lock()
	defer s.pathMu.Unlock()
	return maps.Clone(s.held)
}

// applyPaths withdraws and announces, updating s.held with what is known
// to have worked. Withdrawal is by path (NLRI), which also drops GoBGP's
// UUID entry, so no UUIDs are kept.
func (s *Speaker) applyPaths(announce map[netip.Prefix]advert.Path, withdraw []netip.Prefix) error {
	var errs []error
	if len(withdraw) > 0 {
		paths := make([]*apiutil.Path, 0, len(withdraw))
		var gone []netip.Prefix
		for _, p := range withdraw {
			path, err := s.path(p, s.held[p])
			if err != nil {
				errs = append(errs, err)
				continue
			}
			paths = append(paths, path)
			gone = append(gone, p)
		}
		if len(paths) > 0 {
			if err := s.srv.DeletePath(apiutil.DeletePathRequest{Paths: paths}); err != nil {
				errs = append(errs, fmt.Errorf("bgp: withdraw %d paths: %w", len(paths), err))
			} else {
				for _, p := range gone {
					delete(s.held, p)
				}
			}
		}
	}
	if len(announce) > 0 {
		prefixes := slices.SortedFunc(maps.Keys(announce), advert.ComparePrefixes)
		paths := make([]*apiutil.Path, 0, len(prefixes))
		sent := make([]netip.Prefix, 0, len(prefixes))
		for _, p := range prefixes {
			path, err := s.path(p, announce[p])
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if s.announceHook != nil {
				path = s.announceHook(p, path)
			}
			paths = append(paths, path)
			sent = append(sent, p)
		}
		if len(paths) > 0 {
			resp, err := s.srv.AddPath(apiutil.AddPathRequest{Paths: paths})
			if err != nil {
				// GoBGP v4.8.0 returns no per-path results when one path of
				// the batch fails, although it added the others: what it
				// holds is unknown until the next Set re-reads it.
				errs = append(errs, fmt.Errorf("bgp: announce %d paths: %w", len(paths), err))
			} else {
				for i, r := range resp {
					if i >= len(sent) {
						break
					}
					if r.Error != nil {
						errs = append(errs, fmt.Errorf("bgp: announce %s: %w", sent[i], r.Error))
						continue
					}
					s.held[sent[i]] = announce[sent[i]]
				}
			}
		}
	}
	return errors.Join(errs...)
}

// readRIB lists the locally originated paths GoBGP holds, with the kind
// their marker names (none for a path without one: not what any desired
// path asks for, so Set replaces or withdraws it) and the drain and weight
// they carry.
func (s *Speaker) readRIB() (map[netip.Prefix]advert.Path, error) {
	out := map[netip.Prefix]advert.Path{}
	for _, fam := range []bgp.Family{bgp.RF_IPv4_UC, bgp.RF_IPv6_UC} {
		var perr error
		err := s.srv.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: fam}, func(nlri bgp.NLRI, paths []*apiutil.Path) {
			for _, p := range paths {
				if p.PeerAddress.IsValid() || p.Withdrawal {
					continue // learned from a peer (import policy accept)
				}
				pfx, err := netip.ParsePrefix(nlri.String())
				if err != nil {
					perr = fmt.Errorf("bgp: read RIB: %s: %w", nlri, err)
					continue
				}
				out[pfx] = s.pathOf(p.Attrs)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("bgp: read RIB %s: %w", fam, err)
		}
		if perr != nil {
			return nil, perr
		}
	}
	return out, nil
}

// pathOf recovers what path built from the attributes of a path it
// built.
func (s *Speaker) pathOf(attrs []bgp.PathAttributeInterface) advert.Path {
	var out advert.Path
	for _, a := range attrs {
		switch a := a.(type) {
		case *bgp.PathAttributeLargeCommunities:
			for _, v := range a.Values {
				if k := markerKind(s.asn, v.ASN, v.LocalData1, v.LocalData2); k != "" && out.Kind == "" {
					out.Kind = k
				}
			}
		case *bgp.PathAttributeCommunities:
			out.Drain = out.Drain || slices.Contains(a.Value, gracefulShutdown)
		case *bgp.PathAttributeExtendedCommunities:
			for _, ec := range a.Value {
				if lb, ok := ec.(*bgp.LinkBandwidthExtended); ok {
					out.Weight = weightOf(lb.Bandwidth)
				}
			}
		}
	}
	if out.Kind == "" {
		return advert.Path{} // not ours, whatever else it carries
	}
	return out
}

// gracefulShutdown is the GRACEFUL_SHUTDOWN well-known community (RFC 8326).
const gracefulShutdown = uint32(bgp.COMMUNITY_PLANNED_SHUT)

// drainPrepend is how many more times a draining path carries the node's
// AS: an eBGP neighbour cannot be handed a lower LOCAL_PREF, but a longer
// AS path takes the node out of the ToR's multipath set (equal AS path
// lengths) wherever another node still delivers, whether or not the ToR
// acts on GRACEFUL_SHUTDOWN.
const drainPrepend = 3

// bandwidthPerWeight is the link bandwidth one unit of weight stands for,
// in bytes per second (1 Mbit/s: what FRR's `set extcommunity bandwidth`
// counts in), so that the ToR's per-path weights are the endpoint counts.
const bandwidthPerWeight = 125_000

func weightOf(bw float32) uint32 {
	if bw <= 0 {
		return 0
	}
	return uint32(float64(bw)/bandwidthPerWeight + 0.5)
}

// linkBandwidthAS is the AS field of the link-bandwidth community: the
// node's, or AS_TRANS when it does not fit in two octets (RFC 6793).
func linkBandwidthAS(asn uint32) uint16 {
	if asn > 0xffff {
		return 23456
	}
	return uint16(asn)
}

// path builds a locally originated path with next-hop-self: the marker of
// its kind and, for a Service route, the drain and weight attributes.
func (s *Speaker) path(p netip.Prefix, a advert.Path) (*apiutil.Path, error) {
	nlri, err := bgp.NewIPAddrPrefix(p)
	if err != nil {
		return nil, fmt.Errorf("bgp: %s: %w", p, err)
	}
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(0)}
	if k := a.Kind; k != "" {
		if kindIndex(k) == 0 {
			return nil, fmt.Errorf("bgp: %s: unknown kind %q", p, k)
		}
		lc, err := bgp.ParseLargeCommunity(marker(s.asn, k))
		if err != nil {
			return nil, fmt.Errorf("bgp: %s: marker: %w", p, err)
		}
		attrs = append(attrs, bgp.NewPathAttributeLargeCommunities([]*bgp.LargeCommunity{lc}))
	}
	if a.Drain {
		asns := make([]uint32, drainPrepend)
		for i := range asns {
			asns[i] = s.asn
		}
		attrs = append(attrs, bgp.NewPathAttributeCommunities([]uint32{gracefulShutdown}),
			bgp.NewPathAttributeAsPath([]bgp.AsPathParamInterface{bgp.NewAs4PathParam(bgp.BGP_ASPATH_ATTR_TYPE_SEQ, asns)}))
	}
	if a.Weight > 0 {
		lb := bgp.NewLinkBandwidthExtended(linkBandwidthAS(s.asn), float32(a.Weight)*bandwidthPerWeight)
		attrs = append(attrs, bgp.NewPathAttributeExtendedCommunities([]bgp.ExtendedCommunityInterface{lb}))
	}
	fam := bgp.RF_IPv4_UC
	if p.Addr().Is4() {
		nh, err := bgp.NewPathAttributeNextHop(netip.IPv4Unspecified())
		if err != nil {
			return nil, fmt.Errorf("bgp: %s: %w", p, err)
		}
		attrs = append(attrs, nh)
	} else {
		fam = bgp.RF_IPv6_UC
		mp, err := bgp.NewPathAttributeMpReachNLRI(bgp.RF_IPv6_UC, []bgp.PathNLRI{{NLRI: nlri}}, netip.IPv6Unspecified())
		if err != nil {
			return nil, fmt.Errorf("bgp: %s: %w", p, err)
		}
		attrs = append(attrs, mp)
	}
	return &apiutil.Path{Family: fam, Nlri: nlri, Attrs: attrs}, nil
}
