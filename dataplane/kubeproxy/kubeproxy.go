// Package kubeproxy reads what kube-proxy has programmed on this node, so
// that a Service address is advertised only once kube-proxy delivers it:
// kube-proxy syncs its rules some time after the EndpointSlice change
// flock decides from (up to its min-sync-period, a second by default),
// and a flow the fabric sends meanwhile misses its DNAT and leaves by the
// node's default route.
//
// It reads kube-proxy's nftables mode (pkg/proxy/nftables, proxier.go):
// table ip/ip6 "kube-proxy", map "service-ips" (ClusterIP, external and
// LoadBalancer IPs, keyed address . protocol . port, an element only
// while the Service has endpoints) and map "no-endpoint-services" (the
// same keys while external traffic has no endpoint to go to: dropped or
// rejected). An address port is delivered when it is in the first and
// not in the second. Without the table (another proxy, kube-proxy's
// iptables or IPVS mode, or a family it does not run) nothing is known,
// and the caller advertises as kube-proxy's rules would decide.
package kubeproxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// The names kube-proxy's nftables proxier gives its objects.
const (
	Table              = "kube-proxy"
	ServiceIPs         = "service-ips"
	NoEndpointServices = "no-endpoint-services"
)

// Key is one address, protocol (IPPROTO_*) and port of a Service.
type Key struct {
	Addr  netip.Addr
	Proto uint8
	Port  uint16
}

// Snapshot is what kube-proxy had programmed when it was read.
type Snapshot struct {
	fams map[bool]*family // by IPv4; absent: no table of that family
}

type family struct {
	serviceIPs, noEndpoints map[Key]bool
}

// Delivers reports whether kube-proxy sends k to an endpoint; known is
// false when kube-proxy's nftables rules for k's family were not there
// to read.
func (s *Snapshot) Delivers(k Key) (delivers, known bool) {
	if s == nil {
		return false, false
	}
	f := s.fams[k.Addr.Is4()]
	if f == nil {
		return false, false
	}
	return f.serviceIPs[k] && !f.noEndpoints[k], true
}

// Read takes a snapshot through conn (this network namespace's
// nftables, or the one conn was opened in).
func Read(conn *nftables.Conn) (*Snapshot, error) {
	s := &Snapshot{fams: map[bool]*family{}}
	for _, v4 := range []bool{true, false} {
		t := &nftables.Table{Name: Table, Family: nftables.TableFamilyIPv6}
		if v4 {
			t.Family = nftables.TableFamilyIPv4
		}
		f := &family{}
		var err error
		if f.serviceIPs, err = elements(conn, t, ServiceIPs, v4); err != nil {
			if notFound(err) {
				continue // no kube-proxy of this family in nftables mode
			}
			return nil, err
		}
		if f.noEndpoints, err = elements(conn, t, NoEndpointServices, v4); err != nil && !notFound(err) {
			return nil, err
		}
		s.fams[v4] = f
	}
	return s, nil
}

func notFound(err error) bool {
	return errors.Is(err, unix.ENOENT)
}

// elements reads map name's keys: address . inet_proto . inet_service,
// each field in a 4-byte-aligned register.
func elements(conn *nftables.Conn, t *nftables.Table, name string, v4 bool) (map[Key]bool, error) {
	set, err := conn.GetSetByName(t, name)
	if err != nil {
		return nil, fmt.Errorf("kube-proxy's map %s %s: %w", familyName(v4), name, err)
	}
	elems, err := conn.GetSetElements(set)
	if err != nil {
		return nil, fmt.Errorf("kube-proxy's map %s %s: elements: %w", familyName(v4), name, err)
	}
	alen := 16
	if v4 {
		alen = 4
	}
	out := make(map[Key]bool, len(elems))
	for _, e := range elems {
		if len(e.Key) != alen+8 {
			return nil, fmt.Errorf("kube-proxy's map %s %s: a key of %d bytes, want %d (address . protocol . port): not the layout this flock reads", familyName(v4), name, len(e.Key), alen+8)
		}
		a, _ := netip.AddrFromSlice(e.Key[:alen])
		out[Key{Addr: a, Proto: e.Key[alen], Port: binary.BigEndian.Uint16(e.Key[alen+4:])}] = true
	}
	return out, nil
}

func familyName(v4 bool) string {
	if v4 {
		return "ip " + Table
	}
	return "ip6 " + Table
}
