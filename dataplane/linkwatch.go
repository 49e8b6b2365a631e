package dataplane

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// WatchLinks calls gone with the name of every flock veth that disappears
// from the node until ctx ends (a pod's netns destroyed without a DEL takes
// its veth, and the kernel the routes through it, without telling anyone).
// When events may have been lost (the subscription broke and is renewed,
// or the kernel dropped notifications) it calls gone(""). Watching is best
// effort: the periodic repair is the safety net, so a failing
// subscription is retried, never fatal.
func (d *Netlink) WatchLinks(ctx context.Context, gone func(name string)) error {
	backoff := time.Second
	for first := true; ; first = false {
		err := watchDeletedLinks(ctx, !first, gone)
		if ctx.Err() != nil {
			return nil
		}
		d.log().Warn("link watch interrupted; renewing", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Minute)
	}
}

// watchDeletedLinks reads link notifications on a socket of its own and
// looks only at RTM_DELLINK: every ADD causes several RTM_NEWLINKs, and
// decoding each whole (as a generic link subscription does) was most of
// what the agent allocated in a burst of ADDs.
func watchDeletedLinks(ctx context.Context, renewed bool, gone func(string)) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("link watch: socket: %w", err)
	}
	// Through the runtime's poller: an idle node's watch costs nothing (a
	// receive timeout to notice ctx was ~0.1 % of a core).
	f := os.NewFile(uintptr(fd), "link-watch")
	defer f.Close()
	// A burst of ADDs must not overflow it (a drop costs a full re-read).
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	// Only RTM_DELLINK is read: the kernel drops every other notification
	// before it is queued. Each ADD causes three RTM_NEWLINKs (created,
	// up, carrier) and each DEL one (down), and every one woke the agent
	// to read and discard it, beside the ADDs and DELs it was serving.
	// Without the filter (an old kernel refusing it) they are read and
	// skipped as before.
	_ = unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, delLinkFilter())
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.RTNLGRP_LINK - 1)}); err != nil {
		return fmt.Errorf("link watch: subscribe: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	if renewed {
		gone("")
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, unix.ENOBUFS):
			gone("") // the kernel dropped notifications
			continue
		case err != nil:
			return fmt.Errorf("link watch: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("link watch: %w", err)
		}
		for i := range msgs {
			if msgs[i].Header.Type != unix.RTM_DELLINK {
				continue
			}
			if name := deletedLinkName(&msgs[i]); strings.HasPrefix(name, VethPrefix) {
				gone(name)
			}
		}
	}
}

// delLinkFilter is a socket filter that passes a netlink notification
// only if its (first) message is an RTM_DELLINK: the kernel sends one
// message per link notification. Classic BPF loads a half-word in network
// byte order; nlmsg_type is in the host's.
func delLinkFilter() *unix.SockFprog {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], unix.RTM_DELLINK)
	want := uint32(binary.BigEndian.Uint16(b[:]))
	const typeOffset = 4 // nlmsghdr: len (4 bytes), then type
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: typeOffset},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: want},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff}, // the whole message
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},          // dropped
	}
	return &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
}

// deletedLinkName is the IFLA_IFNAME of an RTM_DELLINK message.
func deletedLinkName(m *syscall.NetlinkMessage) string {
	attrs, err := syscall.ParseNetlinkRouteAttr(m)
	if err != nil {
		return ""
	}
	for _, a := range attrs {
		if a.Attr.Type == unix.IFLA_IFNAME {
			return strings.TrimRight(string(a.Value), "\x00")
		}
	}
	return ""
}
