// Package lab builds flock test labs out of real network namespaces, real
// flock-agent processes and real CNI invocations through libcni. The
// integration tests and the demo command share it.
package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// NetnsDir is where named network namespaces are mounted (as iproute2 does).
const NetnsDir = "/run/netns"

// NS is a named network namespace created by the lab.
type NS struct {
	Name string
	Path string
}

// NewNS creates a named network namespace with lo up. It fails if the name
// is taken: the lab never adopts a namespace it did not create.
func NewNS(name string) (*NS, error) {
	errc := make(chan error, 1)
	// A fresh OS thread that is never returned to the pool: it is the one
	// whose namespace changes.
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name)
		if err != nil {
			errc <- fmt.Errorf("create netns %s: %w", name, err)
			return
		}
		h.Close()
		if err := netns.Set(orig); err != nil {
			errc <- err // thread stays locked and dies with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	n := &NS{Name: name, Path: filepath.Join(NetnsDir, name)}
	if err := n.Do(func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		return h.LinkSetUp(lo)
	}); err != nil {
		n.Delete()
		return nil, err
	}
	return n, nil
}

// Delete unmounts and removes the namespace; missing is fine.
func (n *NS) Delete() error {
	err := netns.DeleteNamed(n.Name)
	if err != nil && errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Do runs f with a netlink handle inside the namespace.
func (n *NS) Do(f func(h *netlink.Handle) error) error {
	nsh, err := netns.GetFromPath(n.Path)
	if err != nil {
		return fmt.Errorf("netns %s: %w", n.Name, err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return fmt.Errorf("netns %s: %w", n.Name, err)
	}
	defer h.Delete()
	return f(h)
}

// Dump runs f like Do, and again while a netlink dump in it was cut short
// by a concurrent change (NLM_F_DUMP_INTR, which netlink returns as
// ErrDumpInterrupted with partial results): f must start its results afresh
// on each call. A lab's reader races the agent it watches, so every dump of a
// namespace the agent writes goes through here.
func (n *NS) Dump(f func(h *netlink.Handle) error) error {
	for i := 0; ; i++ {
		err := n.Do(f)
		if !errors.Is(err, netlink.ErrDumpInterrupted) || i == 200 {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// InNS runs f on an OS thread switched into the namespace (for sockets and
// child processes, which inherit the thread's namespace).
func (n *NS) InNS(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(n.Path)
		if err != nil {
			errc <- fmt.Errorf("netns %s: %w", n.Name, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- err
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, err) // thread dies locked
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// AddAddr puts ip (as a host prefix) on lo: a node's own address, used as
// the source of pings towards pods.
func (n *NS) AddAddr(ip netip.Addr) error {
	return n.Do(func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		a := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}}
		return h.AddrReplace(lo, a)
	})
}
