package kubeproxy

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Reader answers whether kube-proxy delivers an address port by asking
// the kernel for that key's elements of kube-proxy's maps, one element
// each (NFT_MSG_GETSETELEM, not a dump): what an answer costs is two or
// three requests, whatever the number of Services. The maps hold an
// element for every Service port address of the cluster, and the
// Services controller asks while an address waits for kube-proxy (every
// 100 ms). Dumping them, even only after each kube-proxy sync (and once
// more to confirm it), cost flock-agent CPU in proportion to the
// cluster's Services. Safe for concurrent use.
type Reader struct {
	// NetNS is the network namespace's file descriptor (0: the one the
	// process started in, whatever thread calls).
	NetNS int

	mu sync.Mutex
	ns int           // the namespace read (NetNS, or startNS's)
	nl *netlink.Conn // nil until dialed, or after an error
	// requests counts what was asked of the kernel (tests).
	requests int
}

// startNS is the network namespace the process started in, opened while
// the package initializes (on the main thread, before anything moves a
// thread to another namespace); nil if it could not be.
var startNS, startErr = os.Open("/proc/thread-self/ns/net")

// Delivers reports whether kube-proxy sends k to an endpoint, as a
// Snapshot read now would: k is in the map service-ips of its family's
// table and not in no-endpoint-services. known is false when that table
// or map is not there (no kube-proxy in nftables mode for k's family).
func (r *Reader) Delivers(k Key) (delivers, known bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.dialLocked(); err != nil {
		return false, false, err
	}
	defer func() {
		if err != nil {
			_ = r.nl.Close()
			r.nl = nil
		}
	}()
	fam, key := byte(unix.NFPROTO_IPV6), k.Addr.As16()
	raw := key[:]
	if k.Addr.Is4() {
		a := k.Addr.As4()
		fam, raw = unix.NFPROTO_IPV4, a[:]
	}
	// Each field of a concatenation is in a 4-byte register: the
	// protocol's byte, then the port in network order, padded.
	raw = append(raw, k.Proto, 0, 0, 0, byte(k.Port>>8), byte(k.Port), 0, 0)
	in, err := r.hasElement(fam, ServiceIPs, raw)
	if err != nil {
		return false, false, err
	}
	if !in {
		// Not there, or no map to be in.
		known, err := r.hasSet(fam, ServiceIPs)
		return false, known, err
	}
	dropped, err := r.hasElement(fam, NoEndpointServices, raw)
	if err != nil {
		return false, false, err
	}
	return !dropped, true, nil
}

// Close releases the netlink socket; a call after it dials again.
func (r *Reader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	if r.nl != nil {
		err = r.nl.Close()
		r.nl = nil
	}
	r.ns = 0
	return err
}

// dialLocked opens the socket into the namespace, under mu.
func (r *Reader) dialLocked() error {
	if r.ns == 0 {
		if r.NetNS > 0 {
			r.ns = r.NetNS
		} else {
			if startErr != nil {
				return fmt.Errorf("the process's network namespace: %w", startErr)
			}
			r.ns = int(startNS.Fd())
		}
	}
	if r.nl != nil {
		return nil
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: r.ns})
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	r.nl = c
	return nil
}

// hasElement asks whether map set of kube-proxy's table of family fam
// holds key (NFT_MSG_GETSETELEM for that element): ENOENT when it does
// not, or when there is no such table or map.
func (r *Reader) hasElement(fam byte, set string, key []byte) (bool, error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, Table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(ae *netlink.AttributeEncoder) error {
		ae.Nested(unix.NFTA_LIST_ELEM, func(ae *netlink.AttributeEncoder) error {
			ae.Nested(unix.NFTA_SET_ELEM_KEY, func(ae *netlink.AttributeEncoder) error {
				ae.Bytes(unix.NFTA_DATA_VALUE, key)
				return nil
			})
			return nil
		})
		return nil
	})
	return r.ask(unix.NFT_MSG_GETSETELEM, unix.NFT_MSG_NEWSETELEM, fam, set, ae)
}

// hasSet asks whether kube-proxy's table of family fam has map set.
func (r *Reader) hasSet(fam byte, set string) (bool, error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_TABLE, Table)
	ae.String(unix.NFTA_SET_NAME, set)
	return r.ask(unix.NFT_MSG_GETSET, unix.NFT_MSG_NEWSET, fam, set, ae)
}

// ask sends one nftables get (not a dump): true when the kernel answers
// with a message of type answer, false when it answers ENOENT.
func (r *Reader) ask(get, answer uint16, fam byte, set string, ae *netlink.AttributeEncoder) (bool, error) {
	attrs, err := ae.Encode()
	if err != nil {
		return false, err
	}
	r.requests++
	msgs, err := r.nl.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | get), Flags: netlink.Request},
		// struct nfgenmsg: family, version, resource id.
		Data: append([]byte{fam, unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	switch {
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("kube-proxy's map %s %s: %w", familyName(fam == unix.NFPROTO_IPV4), set, err)
	}
	want := netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | answer)
	for _, m := range msgs {
		if m.Header.Type == want {
			return true, nil
		}
	}
	return false, fmt.Errorf("kube-proxy's map %s %s: the kernel answered %d messages, none of type %d", familyName(fam == unix.NFPROTO_IPV4), set, len(msgs), answer)
}
