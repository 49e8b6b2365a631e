package bgp

import (
	"errors"
	"fmt"
	"strings"
)

// MaxPasswordLen is the kernel's TCP-MD5 key limit (TCP_MD5SIG_MAXKEYLEN):
// a longer key fails setsockopt, so the session could never come up.
const MaxPasswordLen = 80

// Errors of NormalizePassword; callers wrap them with where the password
// came from (file, Secret key) and which peer it is for.
var (
	ErrPasswordEmpty     = errors.New("password is empty")
	ErrPasswordTooLong   = errors.New("password is too long")
	ErrPasswordMultiline = errors.New("password spans several lines")
)

// NormalizePassword turns the raw bytes of a password file or Secret value
// into the TCP-MD5 key. Trailing line endings are dropped: `echo pw > f` and
// `kubectl create secret --from-file` keep the file's final newline, which
// the ToR's configured password does not have, so MD5 would never match.
// Nothing else is trimmed (spaces may be part of a password). An empty key,
// one longer than MaxPasswordLen, or one with a line break inside (no
// router's password can hold one, so it is a wrong file) is an error.
func NormalizePassword(raw []byte) (string, error) {
	pw := strings.TrimRight(string(raw), "\r\n")
	switch {
	case pw == "":
		return "", ErrPasswordEmpty
	case len(pw) > MaxPasswordLen:
		return "", fmt.Errorf("%w: %d bytes, TCP-MD5 keys are at most %d", ErrPasswordTooLong, len(pw), MaxPasswordLen)
	case strings.ContainsAny(pw, "\r\n"):
		return "", ErrPasswordMultiline
	}
	return pw, nil
}
