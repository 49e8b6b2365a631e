package bgp

import (
	"errors"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
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

// The speaker normalizes what a source returns and names where it came
// from when the value is unusable (defect 9: a Secret value from
// `kubectl create secret --from-file` kept its trailing newline).
func TestPasswordSourceNormalized(t *testing.T) {
	where := `peer fd00::3: passwordSecretKey "k" in Secret flock-system/flock-bgp-passwords`
	for _, tc := range []struct {
		raw     []byte
		want    string
		errText string
	}{
		{raw: []byte("s3cret\n"), want: "s3cret"},
		{raw: []byte("s3cret\r\n"), want: "s3cret"},
		{raw: nil, want: ""}, // none configured
		{raw: []byte(strings.Repeat("x", 81) + "\n"), errText: where + ": password is too long: 81 bytes, TCP-MD5 keys are at most 80"},
		{raw: []byte{}, errText: where + ": password is empty"},
		{raw: []byte("\n"), errText: where + ": password is empty"},
	} {
		s := &Speaker{passwords: func(v1alpha1.Peer) ([]byte, string, error) { return tc.raw, where, nil }}
		pw, err := s.password(v1alpha1.Peer{Address: "fd00::3", PasswordSecretKey: "k"})
		if tc.errText != "" {
			if err == nil || err.Error() != tc.errText {
				t.Errorf("%q: error %v, want %q", tc.raw, err, tc.errText)
			}
			continue
		}
		if err != nil || pw != tc.want {
			t.Errorf("%q: %q %v, want %q", tc.raw, pw, err, tc.want)
		}
	}
}
