package netpol

import (
	"errors"

	"golang.org/x/sys/unix"
)

// sctpSupported tells whether the kernel has SCTP: without it, no pod can
// open an SCTP socket, so policies naming SCTP ports allow and deny
// nothing (the engine takes them as written; the log says why they never
// match).
func sctpSupported() (bool, error) {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
	if err == nil {
		unix.Close(fd)
		return true, nil
	}
	if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ESOCKTNOSUPPORT) {
		return false, nil
	}
	if errors.Is(err, unix.EAFNOSUPPORT) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
		if err == nil {
			unix.Close(fd)
			return true, nil
		}
		if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ESOCKTNOSUPPORT) {
			return false, nil
		}
	}
	return false, err
}
