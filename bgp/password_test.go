package bgp

import (
	"errors"
	"strings"
	"testing"
)

// Defect 9: a password file or Secret value written with a trailing newline
// (echo, kubectl create secret --from-file) was used as is, so the TCP-MD5
// key never matched the ToR's.
func TestNormalizePassword(t *testing.T) {
	for _, tc := range []struct {
		name, raw, want string
		err             error
		errText         string
	}{
		{name: "plain", raw: "s3cret", want: "s3cret"},
		{name: "trailing LF", raw: "s3cret\n", want: "s3cret"},
		{name: "trailing CRLF", raw: "s3cret\r\n", want: "s3cret"},
		{name: "several trailing newlines", raw: "s3cret\n\n", want: "s3cret"},
		{name: "spaces kept", raw: " s3 cret \n", want: " s3 cret "},
		{name: "exactly 80 bytes", raw: strings.Repeat("a", 80) + "\n", want: strings.Repeat("a", 80)},
		{name: "empty", raw: "", err: ErrPasswordEmpty, errText: "password is empty"},
		{name: "only a newline", raw: "\r\n", err: ErrPasswordEmpty, errText: "password is empty"},
		{name: "81 bytes", raw: strings.Repeat("a", 81), err: ErrPasswordTooLong, errText: "password is too long: 81 bytes, TCP-MD5 keys are at most 80"},
		{name: "two lines", raw: "s3cret\nother\n", err: ErrPasswordMultiline, errText: "password spans several lines"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NormalizePassword([]byte(tc.raw))
			if tc.err != nil {
				if !errors.Is(err, tc.err) || err.Error() != tc.errText {
					t.Fatalf("error %q, want %q (errors.Is %v)", err, tc.errText, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
