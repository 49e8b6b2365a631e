package bgp

import (
	"crypto/sha256"
	"fmt"
	"net/netip"
	"os"
	"slices"

	api "github.com/osrg/gobgp/v4/api"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// Defaults applied to a peer's unset knobs. Graceful restart is on with
// explicit times: never GoBGP's silent 360 s default.
const (
	DefaultHoldTime     = 90
	DefaultConnectRetry = 5
	DefaultRestartTime  = 120
	DefaultDeferralTime = 60
	DefaultBFDInterval  = 300 // ms
	DefaultBFDMult      = 3
)

// Key identifies a peer across config changes: its address, or
// "interface <name>" for an unnumbered session.
func Key(p v1alpha1.Peer) string {
	if p.Interface != "" {
		return "interface " + p.Interface
	}
	if a, err := netip.ParseAddr(p.Address); err == nil {
		return a.String()
	}
	return p.Address
}

// TransportV6 tells whether the session runs over IPv6 (so IPv4 routes
// would carry an IPv6 next hop, RFC 5549).
func TransportV6(p v1alpha1.Peer) bool {
	if p.Interface != "" {
		return true
	}
	a, err := netip.ParseAddr(p.Address)
	return err == nil && a.Is6()
}

// Families resolves the families to negotiate.
func Families(p v1alpha1.Peer) []string {
	if len(p.Families) > 0 {
		f := slices.Clone(p.Families)
		slices.Sort(f)
		return slices.Compact(f)
	}
	if TransportV6(p) {
		return []string{"ipv4", "ipv6"}
	}
	return []string{"ipv4"}
}

func apiFamily(f string) *api.Family {
	if f == "ipv4" {
		return &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	}
	return &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
}

// PasswordSource returns a peer's TCP-MD5 password as it is stored (a
// file's or a Secret value's bytes; nil: none configured) and where it is
// stored, which errors name; the speaker normalizes it (NormalizePassword).
type PasswordSource func(p v1alpha1.Peer) (raw []byte, where string, err error)

// FilePasswords reads passwords from PasswordFile (standalone mode).
func FilePasswords(p v1alpha1.Peer) ([]byte, string, error) {
	if p.PasswordFile == "" {
		return nil, "", nil
	}
	where := fmt.Sprintf("peer %s: passwordFile %s", Key(p), p.PasswordFile)
	b, err := os.ReadFile(p.PasswordFile)
	if err != nil {
		return nil, where, fmt.Errorf("peer %s: passwordFile: %w", Key(p), err)
	}
	return b, where, nil
}

// password reads and normalizes a peer's password ("" for none).
func (s *Speaker) password(p v1alpha1.Peer) (string, error) {
	raw, where, err := s.passwords(p)
	if err != nil || raw == nil {
		return "", err
	}
	pw, err := NormalizePassword(raw)
	if err != nil {
		return "", fmt.Errorf("%s: %w", where, err)
	}
	return pw, nil
}

// apiPeer builds the GoBGP peer config. adminDown holds the session until
// the export policy knows the peer's address; restarting marks a peer added
// when the agent restarts (see LocalRestarting).
func apiPeer(p v1alpha1.Peer, password string, adminDown, restarting bool) *api.Peer {
	hold := uint64(p.Timers.HoldTime)
	if hold == 0 {
		hold = DefaultHoldTime
	}
	keep := uint64(p.Timers.KeepaliveTime)
	if keep == 0 {
		keep = hold / 3
	}
	retry := uint64(p.Timers.ConnectRetry)
	if retry == 0 {
		retry = DefaultConnectRetry
	}
	out := &api.Peer{
		Conf: &api.PeerConf{
			PeerAsn: p.ASN, AuthPassword: password, AdminDown: adminDown,
			Description: "flock " + Key(p),
		},
		// After a reset of ours (a BFD failure) reconnect at the connect
		// retry pace: GoBGP's default idle hold after a reset is 30 s.
		Timers:    &api.Timers{Config: &api.TimersConfig{HoldTime: hold, KeepaliveInterval: keep, ConnectRetry: retry, IdleHoldTimeAfterReset: retry}},
		Transport: &api.Transport{LocalAddress: p.LocalAddress, RemotePort: uint32(p.Port)},
	}
	if p.Interface != "" {
		out.Conf.NeighborInterface = p.Interface
	} else {
		out.Conf.NeighborAddress = Key(p)
	}
	gr := !p.GracefulRestart.Disabled
	if gr {
		rt, dt := p.GracefulRestart.RestartTime, p.GracefulRestart.DeferralTime
		if rt == 0 {
			rt = DefaultRestartTime
		}
		if dt == 0 {
			dt = DefaultDeferralTime
		}
		// LocalRestarting sets the Restart State and Forwarding State bits
		// in our OPEN, so the peer keeps our routes until our End-of-RIB
		// instead of flushing them the moment the new session comes up.
		out.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: rt, DeferralTime: dt, LocalRestarting: restarting}
	}
	for _, f := range Families(p) {
		af := &api.AfiSafi{Config: &api.AfiSafiConfig{Family: apiFamily(f), Enabled: true}}
		if gr {
			af.MpGracefulRestart = &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}
		}
		if p.MaxPrefixes > 0 {
			af.PrefixLimits = &api.PrefixLimit{Family: apiFamily(f), MaxPrefixes: p.MaxPrefixes}
		}
		out.AfiSafis = append(out.AfiSafis, af)
	}
	if p.EBGPMultihop > 0 {
		out.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: uint32(p.EBGPMultihop)}
	}
	if p.TTLSecurityMin > 0 {
		out.TtlSecurity = &api.TtlSecurity{Enabled: true, TtlMin: uint32(p.TTLSecurityMin)}
	}
	return out
}

// sessionFingerprint covers everything that needs the session re-created
// when it changes; communities are applied by policy, without a reset. It
// holds a hash of the password, not the password: a fingerprint is the
// kind of string that ends up in a debug log.
func sessionFingerprint(p v1alpha1.Peer, password string) string {
	q := p
	q.Communities, q.LargeCommunities = v1alpha1.KindCommunities{}, v1alpha1.KindCommunities{}
	q.BFD = v1alpha1.BFD{} // flock's BFD follows changes live (bfd.go)
	// Canonical forms, so "fd00::01" or a reordered family list is not a
	// change that resets the session.
	if a, err := netip.ParseAddr(q.Address); err == nil {
		q.Address = a.String()
	}
	if a, err := netip.ParseAddr(q.LocalAddress); err == nil {
		q.LocalAddress = a.String()
	}
	q.Families = Families(p)
	return fmt.Sprintf("%+v|%x", q, sha256.Sum256([]byte(password)))
}
