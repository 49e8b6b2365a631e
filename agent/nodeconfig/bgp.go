package nodeconfig

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// validateBGP checks spec.bgp and names the field and value of each error.
func validateBGP(b *v1alpha1.BGP) []error {
	var errs []error
	if b.ListenPort < -1 || b.ListenPort > 65535 {
		errs = append(errs, fmt.Errorf("spec.bgp.listenPort: %d is not -1 (off), 0 (179) or a port", b.ListenPort))
	}
	if b.ImportPolicy != "" && b.ImportPolicy != "reject" && b.ImportPolicy != "accept" {
		errs = append(errs, fmt.Errorf("spec.bgp.importPolicy: %q, want reject or accept", b.ImportPolicy))
	}
	seen := map[string]int{}
	for i, p := range b.Peers {
		f := fmt.Sprintf("spec.bgp.peers[%d]", i)
		errs = append(errs, validatePeer(f, p)...)
		key := p.Address
		if a, err := netip.ParseAddr(p.Address); err == nil {
			key = a.String()
		}
		if p.Interface != "" {
			key = "interface " + p.Interface
		}
		if j, dup := seen[key]; dup {
			errs = append(errs, fmt.Errorf("%s: %s is the same neighbour as spec.bgp.peers[%d]", f, key, j))
		}
		seen[key] = i
	}
	return errs
}

func validatePeer(f string, p v1alpha1.Peer) []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(f+"."+format, a...)) }
	var addr netip.Addr
	switch {
	case p.Address == "" && p.Interface == "":
		errs = append(errs, fmt.Errorf("%s: set address or interface (unnumbered)", f))
	case p.Address != "" && p.Interface != "":
		errs = append(errs, fmt.Errorf("%s: address %q and interface %q are exclusive", f, p.Address, p.Interface))
	case p.Address != "":
		a, err := netip.ParseAddr(p.Address)
		if err != nil || a.Zone() != "" {
			add("address: %q is not an IP address (for a link-local peer use interface)", p.Address)
		} else {
			addr = a
		}
	default:
		// As the CRD's pattern ^[^/%\s]+$: no '/', '%' or white space.
		if len(p.Interface) > 15 || strings.ContainsFunc(p.Interface, func(r rune) bool {
			return r == '/' || r == '%' || unicode.IsSpace(r)
		}) {
			add("interface: %q is not an interface name", p.Interface)
		}
	}
	if p.ASN == 0 || p.ASN == 4294967295 {
		add("asn: %d is not a usable AS number (1..4294967294)", p.ASN)
	}
	if p.LocalAddress != "" {
		la, err := netip.ParseAddr(p.LocalAddress)
		switch {
		case err != nil:
			add("localAddress: %q is not an IP address", p.LocalAddress)
		case addr.IsValid() && la.Is4() != addr.Is4():
			add("localAddress: %s is not of the same family as address %s", la, addr)
		}
	}
	for j, fam := range p.Families {
		switch fam {
		case "ipv4":
		case "ipv6":
			if addr.IsValid() && addr.Is4() {
				add("families[%d]: ipv6 over an IPv4 session needs an IPv6 next hop the session cannot carry; peer over IPv6 instead", j)
			}
		default:
			add("families[%d]: %q, want ipv4 or ipv6", j, fam)
		}
	}
	if p.PasswordFile != "" && p.PasswordSecretKey != "" {
		add("passwordFile: set only one of passwordFile and passwordSecretKey")
	}
	t := p.Timers
	if t.HoldTime != 0 && t.HoldTime < 3 {
		add("timers.holdTime: %d, want 0 (default 90) or at least 3", t.HoldTime)
	}
	if t.HoldTime > 65535 {
		add("timers.holdTime: %d exceeds 65535", t.HoldTime)
	}
	hold := t.HoldTime
	if hold == 0 {
		hold = 90
	}
	if t.KeepaliveTime != 0 && t.KeepaliveTime >= hold {
		add("timers.keepaliveTime: %d must be below the hold time %d", t.KeepaliveTime, hold)
	}
	if gr := p.GracefulRestart; gr.RestartTime > 4095 {
		add("gracefulRestart.restartTime: %d exceeds 4095 (12-bit field)", gr.RestartTime)
	}
	if b := p.BFD; b.Enabled {
		if b.IntervalMs != 0 && (b.IntervalMs < 10 || b.IntervalMs > 60000) {
			add("bfd.intervalMs: %d, want 10..60000", b.IntervalMs)
		}
		if b.Multiplier > 255 {
			add("bfd.multiplier: %d, want 1..255", b.Multiplier)
		}
	}
	if p.EBGPMultihop > 0 && p.TTLSecurityMin > 0 {
		add("ttlSecurityMin: GTSM and ebgpMultihop are exclusive")
	}
	errs = append(errs, validateCommunities(f+".communities", p.Communities, 2, 16)...)
	errs = append(errs, validateCommunities(f+".largeCommunities", p.LargeCommunities, 3, 32)...)
	return errs
}

func validateCommunities(f string, c v1alpha1.KindCommunities, parts, bits int) []error {
	var errs []error
	for kind, list := range map[string][]string{"summary": c.Summary, "pod": c.Pod, "anycast": c.Anycast, "address": c.Address} {
		for j, v := range list {
			if err := parseCommunity(v, parts, bits); err != nil {
				errs = append(errs, fmt.Errorf("%s.%s[%d]: %q: %w", f, kind, j, v, err))
			}
		}
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errs
}

func parseCommunity(v string, parts, bits int) error {
	fs := strings.Split(v, ":")
	if len(fs) != parts {
		return fmt.Errorf("want %d numbers separated by ':'", parts)
	}
	for _, x := range fs {
		if _, err := strconv.ParseUint(x, 10, bits); err != nil {
			return errors.New("each part must be a " + strconv.Itoa(bits) + "-bit number")
		}
	}
	return nil
}
