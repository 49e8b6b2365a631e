package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/k8s/relay"
)

func TestFlags(t *testing.T) {
	t.Setenv("POD_NAME", "relay-0")
	for _, tc := range []struct {
		args   []string
		podIP  string
		code   int
		exit   bool
		stderr string
		url    string
	}{
		{args: nil, podIP: "2001:db8::7", url: "https://[2001:db8::7]:9479"},
		{args: []string{"--listen", "127.0.0.1:5000"}, podIP: "192.0.2.7", url: "https://192.0.2.7:5000"},
		{args: []string{"--advertise", "https://relay.example:1"}, url: "https://relay.example:1"},
		{args: nil, podIP: "", code: 2, exit: true, stderr: `$POD_IP "" is not an IP`},
		{args: []string{"--name", ""}, podIP: "192.0.2.7", code: 2, exit: true, stderr: "--name is empty"},
		{args: []string{"--history", "0"}, podIP: "192.0.2.7", code: 2, exit: true, stderr: "--history 0"},
		{args: []string{"--listen", "9479"}, podIP: "192.0.2.7", code: 2, exit: true, stderr: `--listen "9479"`},
		{args: []string{"extra"}, code: 2, exit: true, stderr: `unexpected argument "extra"`},
	} {
		t.Setenv("POD_IP", tc.podIP)
		var stdout, stderr bytes.Buffer
		c, code, exit := parseFlags(tc.args, &stdout, &stderr)
		if code != tc.code || exit != tc.exit || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("%q (POD_IP %q): code %d exit %v stderr %q, want %d %v %q", tc.args, tc.podIP, code, exit, stderr.String(), tc.code, tc.exit, tc.stderr)
		}
		if tc.url != "" && c.advertise != tc.url {
			t.Errorf("%q: advertises %q, want %q", tc.args, c.advertise, tc.url)
		}
	}
}

// The certificate is its own root, for the name nodes ask for: a node
// trusting it alone can verify it.
func TestSelfSignedVerifies(t *testing.T) {
	_, certPEM, err := selfSigned()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode([]byte(certPEM))
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: serverName}); err != nil {
		t.Fatalf("verify: %v", err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "kubernetes.default"}); err == nil {
		t.Fatal("verified for another name")
	}
}

// A relay is ready once it is live and in the directory: a node started
// before it is published cannot find it, and reads every pod from the
// API server.
func TestReadyOnlyOncePublished(t *testing.T) {
	pods := relay.NewCache(0)
	if err := ready(pods, true); err == nil {
		t.Error("ready before the first list")
	}
	if err := pods.Live("5"); err != nil {
		t.Fatal(err)
	}
	if err := ready(pods, false); !errors.Is(err, errNotPublished) {
		t.Errorf("live, not published: %v, want %v", err, errNotPublished)
	}
	if err := ready(pods, true); err != nil {
		t.Errorf("live and published: %v", err)
	}
}
