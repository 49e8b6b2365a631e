// Package annotations parses flock's per-pod annotations
// (flock.fritzlab.net/...) into an allocation request. In Kubernetes mode they
// come from the Pod object; in standalone mode from CNI_ARGS keys of the same
// name. Every error names the key and the value.
package annotations

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"code.fritzlab.net/fritzlab/flock/ipam"
)

// Prefix is the annotation prefix.
const Prefix = "flock.fritzlab.net/"

// The annotation keys.
const (
	IPv6      = Prefix + "ipv6"
	IPv4      = Prefix + "ipv4"
	CIDR6     = Prefix + "cidr6"
	CIDR4     = Prefix + "cidr4"
	IPAlgo    = Prefix + "ip-algo"
	Anycast   = Prefix + "anycast"
	Addresses = Prefix + "addresses"
)

var known = map[string]bool{IPv6: true, IPv4: true, CIDR6: true, CIDR4: true, IPAlgo: true, Anycast: true, Addresses: true}

// Keys lists every annotation key flock reads, sorted.
func Keys() []string {
	out := make([]string, 0, len(known))
	for k := range known {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Defaults are the node's defaults (from NodeConfig) for absent annotations.
type Defaults struct {
	IPv6, IPv4 bool
	Algo       ipam.Algo
}

// Request is what a pod asks for.
type Request struct {
	IPv6, IPv4   bool
	CIDR6, CIDR4 netip.Prefix // zero: the node's summary pool
	Algo         ipam.Algo
	Anycast      []netip.Addr
	Addresses    []netip.Addr
}

// Error is a malformed annotation.
type Error struct {
	Key, Value, Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("annotation %s=%q: %s", e.Key, e.Value, e.Reason)
}

// Parse reads the flock annotations out of ann (other keys are ignored).
func Parse(ann map[string]string, d Defaults) (Request, error) {
	r := Request{IPv6: d.IPv6, IPv4: d.IPv4, Algo: d.Algo}
	// Sorted so that, with several bad keys, the error is deterministic.
	keys := make([]string, 0, len(ann))
	for k := range ann {
		if strings.HasPrefix(k, Prefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := ann[k]
		var err error
		switch k {
		case IPv6:
			r.IPv6, err = parseBool(k, v)
		case IPv4:
			r.IPv4, err = parseBool(k, v)
		case CIDR6:
			r.CIDR6, err = parseCIDR(k, v, 6)
		case CIDR4:
			r.CIDR4, err = parseCIDR(k, v, 4)
		case IPAlgo:
			r.Algo, err = ipam.ParseAlgo(v)
			if err != nil {
				err = &Error{Key: k, Value: v, Reason: err.Error()}
			}
		case Anycast:
			r.Anycast, err = parseIPs(k, v)
		case Addresses:
			r.Addresses, err = parseIPs(k, v)
		default:
			// A typo such as "ipv44" must not silently fall back to defaults.
			err = &Error{Key: k, Value: v, Reason: fmt.Sprintf("unknown flock annotation (known: %s)", strings.Join(Keys(), ", "))}
		}
		if err != nil {
			return Request{}, err
		}
	}
	if r.CIDR6.IsValid() && !r.IPv6 {
		return Request{}, &Error{Key: CIDR6, Value: ann[CIDR6], Reason: "set, but the pod gets no IPv6 address (ipv6=false)"}
	}
	if r.CIDR4.IsValid() && !r.IPv4 {
		return Request{}, &Error{Key: CIDR4, Value: ann[CIDR4], Reason: "set, but the pod gets no IPv4 address (ipv4 is false)"}
	}
	if !r.IPv6 && !r.IPv4 {
		return Request{}, &Error{Key: IPv6, Value: ann[IPv6], Reason: "the pod would get no address at all (ipv6 and ipv4 both false)"}
	}
	seen := map[netip.Addr]string{}
	for _, set := range []struct {
		key string
		ips []netip.Addr
	}{{Anycast, r.Anycast}, {Addresses, r.Addresses}} {
		for _, ip := range set.ips {
			if prev, dup := seen[ip]; dup {
				return Request{}, &Error{Key: set.key, Value: ann[set.key], Reason: fmt.Sprintf("%s is listed twice (also in %s)", ip, prev)}
			}
			seen[ip] = set.key
			if (ip.Is4() && !r.IPv4) || (ip.Is6() && !r.IPv6) {
				return Request{}, &Error{Key: set.key, Value: ann[set.key], Reason: fmt.Sprintf("%s needs the pod to have an address of the same family as its next hop, but that family is off", ip)}
			}
		}
	}
	return r, nil
}

func parseBool(k, v string) (bool, error) {
	switch v {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, &Error{Key: k, Value: v, Reason: `want "true" or "false"`}
}

func parseCIDR(k, v string, family int) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(v)
	if err != nil {
		return netip.Prefix{}, &Error{Key: k, Value: v, Reason: "not a CIDR"}
	}
	if p.Addr().Is4() != (family == 4) || p.Addr().Is4In6() {
		return netip.Prefix{}, &Error{Key: k, Value: v, Reason: fmt.Sprintf("not an IPv%d CIDR", family)}
	}
	if p.Masked() != p {
		return netip.Prefix{}, &Error{Key: k, Value: v, Reason: fmt.Sprintf("host bits set (did you mean %s?)", p.Masked())}
	}
	return p, nil
}

func parseIPs(k, v string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		ip, err := netip.ParseAddr(f)
		if err != nil {
			return nil, &Error{Key: k, Value: v, Reason: fmt.Sprintf("%q is not an IP address", f)}
		}
		if ip.Zone() != "" || ip.Is4In6() {
			return nil, &Error{Key: k, Value: v, Reason: fmt.Sprintf("%q: zones and IPv4-mapped forms are not allowed", f)}
		}
		if !ip.IsGlobalUnicast() {
			return nil, &Error{Key: k, Value: v, Reason: fmt.Sprintf("%s is not a global unicast address", ip)}
		}
		for _, prev := range out {
			if prev == ip {
				return nil, &Error{Key: k, Value: v, Reason: fmt.Sprintf("%s is listed twice", ip)}
			}
		}
		out = append(out, ip)
	}
	return out, nil
}
