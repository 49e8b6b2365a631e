package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/policyips"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/policyapi"
)

func TestFlags(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	for _, tc := range []struct {
		args           []string
		code           int
		exit           bool
		stdout, stderr []string
		check          func(config) bool
	}{
		{args: []string{"--help"}, exit: true, stdout: []string{"usage: flock-policy", "-nfqueue-id int", "-admin-socket", "-fail-open", "-loadbalancers", "-namespace", "-agent-bindings-file", "-relay-token-file", "-version"}},
		{args: []string{"-h"}, exit: true, stdout: []string{"usage: flock-policy"}},
		{args: []string{"--version"}, exit: true, stdout: []string{"flock-policy ", "(commit ", runtime.Version() + ")\n"}},
		{args: []string{"--bogus"}, code: 2, exit: true, stderr: []string{"flock-policy: flag provided but not defined: -bogus", "flock-policy --help"}},
		{args: []string{"--nfqueue-id", "x"}, code: 2, exit: true, stderr: []string{`invalid value "x" for flag -nfqueue-id`}},
		{args: []string{"--fail-open", "true"}, code: 2, exit: true, stderr: []string{`unexpected argument "true"`}},
		{args: []string{"--node-name", "n1", "--nfqueue-id", "7", "--fail-open", "--kubeconfig", "k", "--admin-socket", "", "--metrics-address=:1"},
			check: func(c config) bool {
				return c.cfg.NodeName == "n1" && c.cfg.QueueID == 7 && c.cfg.FailOpen && c.kubeconfig == "k" && c.ep == endpoints{metrics: ":1", agent: admin.DefaultSocket, bindings: policyips.DefaultBindingsFile, relayToken: defaultRelayToken}
			}},
		{args: nil, check: func(c config) bool {
			return c.cfg.QueueID == 100 && c.ep == endpoints{metrics: defaultMetricsAddress, admin: policyapi.DefaultSocket, agent: admin.DefaultSocket, bindings: policyips.DefaultBindingsFile, relayToken: defaultRelayToken} &&
				c.lb == lbConfig{on: true, namespace: "flock-system"}
		}},
		{args: []string{"--relay-token-file", ""}, check: func(c config) bool { return c.ep.relayToken == "" }},
		{args: []string{"--agent-bindings-file", ""}, check: func(c config) bool { return c.ep.bindings == "" && c.ep.agent == admin.DefaultSocket }},
		{args: []string{"--loadbalancers=false", "--namespace", "kube-flock"}, check: func(c config) bool {
			return c.lb == lbConfig{on: false, namespace: "kube-flock"}
		}},
	} {
		var stdout, stderr bytes.Buffer
		c, code, exit := parseFlags(tc.args, &stdout, &stderr)
		if code != tc.code || exit != tc.exit {
			t.Errorf("%q: code %d exit %v, want %d %v (stderr %q)", tc.args, code, exit, tc.code, tc.exit, stderr.String())
		}
		for _, w := range tc.stdout {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("%q: stdout lacks %q:\n%s", tc.args, w, stdout.String())
			}
		}
		for _, w := range tc.stderr {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("%q: stderr lacks %q:\n%s", tc.args, w, stderr.String())
			}
		}
		if len(tc.stderr) == 0 && stderr.Len() > 0 {
			t.Errorf("%q: stderr %q, want nothing", tc.args, stderr.String())
		}
		if tc.check != nil && !tc.check(c) {
			t.Errorf("%q: parsed %+v", tc.args, c)
		}
	}
}
