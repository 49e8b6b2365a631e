package main

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// vethWatch notes when the kernel announces the deletion of each link of
// one namespace (RTM_DELLINK): the DEL figures run to the moment the
// pod's host veth is deleted, for every plugin alike. ptp's DEL returns
// after its veth is gone (the kernel sends RTM_DELLINK while ptp still
// waits in its netlink call, and ptp then releases the address through
// host-local); flock's DEL returns before (the agent takes the veth down,
// and deletes it after answering, while it holds the container's lock).
type vethWatch struct {
	mu     sync.Mutex
	gone   map[string]time.Time // link name → when its RTM_DELLINK was read
	notify chan struct{}        // closed and replaced on every deletion
	err    error                // the subscription failed: events may be lost
	closed bool
	done   chan struct{}
	ended  chan struct{} // the reader has returned
}

// watchVeths subscribes to ns's link events; close it when the DELs are
// timed.
func watchVeths(ns *lab.NS) (*vethWatch, error) {
	nsh, err := netns.GetFromPath(ns.Path)
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", ns.Name, err)
	}
	defer nsh.Close()
	w := &vethWatch{gone: map[string]time.Time{}, notify: make(chan struct{}), done: make(chan struct{}), ended: make(chan struct{})}
	ch := make(chan netlink.LinkUpdate, 4096)
	err = netlink.LinkSubscribeWithOptions(ch, w.done, netlink.LinkSubscribeOptions{
		Namespace:     &nsh,
		ErrorCallback: w.fail,
		// 200 pods deleted at once are a few hundred messages; a lost
		// one would be an error, not a late figure.
		ReceiveBufferSize:      8 << 20,
		ReceiveBufferForceSize: true,
	})
	if err != nil {
		return nil, fmt.Errorf("link events in %s: %w", ns.Name, err)
	}
	go func() {
		defer close(w.ended)
		for u := range ch {
			if u.Header.Type == syscall.RTM_DELLINK {
				w.deleted(u.Attrs().Name, time.Now())
			}
		}
	}()
	return w, nil
}

func (w *vethWatch) deleted(name string, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.gone[name]; !ok {
		w.gone[name] = at
	}
	close(w.notify)
	w.notify = make(chan struct{})
}

func (w *vethWatch) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return // the socket closed under the reader: the end, not a loss
	}
	if w.err == nil {
		w.err = fmt.Errorf("link event subscription: %w", err)
	}
	close(w.notify)
	w.notify = make(chan struct{})
}

func (w *vethWatch) Close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	w.mu.Unlock()
	close(w.done)
	<-w.ended
}

// goneAfter is when every one of names had been deleted, counted from
// returned (the DEL calls' return): returned if each deletion was
// announced before it, else the last announcement. An error if one is
// not announced within timeout, or if events may have been lost.
func (w *vethWatch) goneAfter(names []string, returned time.Time, timeout time.Duration) (time.Time, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	last := returned
	for _, name := range names {
		if name == "" {
			return last, errors.New("a pod without a host veth name")
		}
		for {
			w.mu.Lock()
			at, ok := w.gone[name]
			err, notify := w.err, w.notify
			w.mu.Unlock()
			if err != nil {
				return last, err
			}
			if ok {
				if at.After(last) {
					last = at
				}
				break
			}
			select {
			case <-notify:
			case <-deadline.C:
				return last, fmt.Errorf("host veth %s: its deletion not announced (RTM_DELLINK) within %s of the DEL's return", name, timeout)
			}
		}
	}
	return last, nil
}
