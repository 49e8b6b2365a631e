package lab

import (
	"context"
	"io"
	"net"
	"sync"
)

// Proxy forwards TCP connections made to listen inside the namespace to
// target as seen from the test's own namespace: an agent in a node
// namespace reaches the lab's loopback-only kube-apiserver this way, under
// the same address (so the server certificate still matches). Stop it
// with the returned function.
func (n *NS) Proxy(listen, target string) (stop func(), err error) {
	var l net.Listener
	if err := n.InNS(func() error {
		var err error
		l, err = net.Listen("tcp", listen)
		return err
	}); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				var d net.Dialer
				up, err := d.DialContext(ctx, "tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				stop := context.AfterFunc(ctx, func() { c.Close(); up.Close() })
				defer stop()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return func() {
		cancel()
		l.Close()
		wg.Wait()
	}, nil
}
