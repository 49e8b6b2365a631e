package kubeproxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Reader reads kube-proxy's rules as Read does, but dumps its maps again
// only once the nftables ruleset has changed: every transaction any
// process commits in the network namespace moves the ruleset's
// generation, so the same generation is, nearly always, the same
// ruleset. The maps hold an element for every Service port address of
// the cluster, and a caller that polls while an address waits for
// kube-proxy (the Services controller, every 100 ms) dumped them whole
// each time: at 5,000 nodes that was most of flock-agent's CPU under
// churn. Safe for concurrent use.
//
// Nearly: the kernel moves the generation before the new ruleset is
// what a dump sees, so a dump right after it may still read the old one;
// and a table whose owner process exits goes without moving it. So a
// snapshot is kept only once a second dump at the same generation was
// taken (one more dump a change), and for at most maxAge.
type Reader struct {
	// NetNS is the network namespace's file descriptor (0: the one the
	// process started in, whatever thread calls).
	NetNS int

	mu        sync.Mutex
	ns        int           // the namespace read (NetNS, or startNS's)
	nl        *netlink.Conn // for the generation; nil until dialed, or after an error
	gen       uint32
	snap      *Snapshot // read at gen; nil: none
	confirmed bool      // snap was dumped at gen twice
	at        time.Time // when snap was dumped
	// dumps counts the reads that dumped the maps (tests).
	dumps int
}

// startNS is the network namespace the process started in, opened while
// the package initializes (on the main thread, before anything moves a
// thread to another namespace); nil if it could not be.
var startNS, startErr = os.Open("/proc/thread-self/ns/net")

// maxAge bounds how long a snapshot is answered without dumping again.
var maxAge = 5 * time.Second // a variable for tests

// Read returns what kube-proxy has programmed in this network namespace:
// the last snapshot while the ruleset's generation has not moved, else
// a new one.
func (r *Reader) Read() (*Snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ns == 0 {
		if r.NetNS > 0 {
			r.ns = r.NetNS
		} else {
			if startErr != nil {
				return nil, fmt.Errorf("the process's network namespace: %w", startErr)
			}
			r.ns = int(startNS.Fd())
		}
	}
	gen, genErr := r.generation()
	if genErr == nil && r.snap != nil && r.confirmed && gen == r.gen && time.Since(r.at) < maxAge {
		return r.snap, nil
	}
	conn, err := nftables.New(nftables.WithNetNSFd(r.ns))
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	s, err := Read(conn)
	r.dumps++
	if err != nil {
		r.snap = nil
		return nil, err
	}
	// Kept under the generation read before the dump: a transaction
	// committed during it moves the generation past that, and the next
	// Read dumps again.
	if genErr != nil {
		r.snap, r.gen, r.confirmed = nil, 0, false
		return s, nil
	}
	r.confirmed = r.snap != nil && gen == r.gen
	r.snap, r.gen, r.at = s, gen, time.Now()
	return s, nil
}

// Close releases the netlink socket; a Read after it starts over.
func (r *Reader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	if r.nl != nil {
		err = r.nl.Close()
		r.nl = nil
	}
	r.ns, r.snap, r.confirmed = 0, nil, false
	return err
}

// generation asks the kernel for the nftables ruleset's generation
// (NFT_MSG_GETGEN). Under mu. On an error the socket is dropped, and the
// next call dials again.
func (r *Reader) generation() (uint32, error) {
	if r.nl == nil {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: r.ns})
		if err != nil {
			return 0, fmt.Errorf("nftables generation: %w", err)
		}
		r.nl = c
	}
	gen, err := getGen(r.nl)
	if err != nil {
		_ = r.nl.Close()
		r.nl = nil
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	return gen, nil
}

// getGen sends NFT_MSG_GETGEN and reads NFTA_GEN_ID from the kernel's
// NFT_MSG_NEWGEN.
func getGen(c *netlink.Conn) (uint32, error) {
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN),
			Flags: netlink.Request,
		},
		// struct nfgenmsg: family, version, resource id (big endian).
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, err
	}
	want := netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWGEN)
	for _, m := range msgs {
		if m.Header.Type != want || len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), ad.Err()
			}
		}
		if err := ad.Err(); err != nil {
			return 0, err
		}
	}
	return 0, errors.New("no NFTA_GEN_ID in the kernel's answer")
}
