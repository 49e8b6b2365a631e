// Package unixsock binds the agent's unix sockets (CNI and admin): mode
// 0600, a stale socket left by a crash is replaced, a live one (another
// agent) or a file that is not a socket is never touched.
package unixsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// staleProbeTimeout bounds the dial that tells a live socket from a stale one.
const staleProbeTimeout = time.Second

// Listen binds path, creating its directory.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket (mode %v); refusing to remove it", path, fi.Mode())
		}
		if c, derr := net.DialTimeout("unix", path, staleProbeTimeout); derr == nil {
			c.Close()
			return nil, fmt.Errorf("another agent is listening on %s", path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("checking %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	// Between bind and chmod the socket has umask-derived permissions;
	// connecting still needs search permission on the parent directory.
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return l, nil
}
