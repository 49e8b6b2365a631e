package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/cni/install/report"
)

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args           []string
		code           int
		exit           bool
		stdout, stderr []string
		check          func(config) bool
	}{
		{args: []string{"--help"}, exit: true, stdout: []string{"usage: flock-installer", "-cni-bin-dir", "-status-file", "-portmap", "-version"}},
		{args: []string{"-h"}, exit: true, stdout: []string{"usage: flock-installer"}},
		{args: []string{"--version"}, exit: true, stdout: []string{"flock-installer ", "(commit ", runtime.Version() + ")\n"}},
		{args: []string{"--bogus"}, code: 2, exit: true, stderr: []string{"flock-installer: flag provided but not defined: -bogus", "flock-installer --help"}},
		{args: []string{"--portmap", "yes"}, code: 2, exit: true, stderr: []string{`unexpected argument "yes"`}},
		{args: []string{"--portmap", "--cni-bin-dir", "/b", "--status-file", "", "--node-name=n1"},
			check: func(c config) bool {
				return c.o.Portmap && c.o.CNIBinDir == "/b" && c.statusFile == "" && c.nodeName == "n1" && c.o.PluginSrc == "/opt/flock/bin/flock"
			}},
		{args: nil, check: func(c config) bool { return c.statusFile == report.DefaultPath && !c.o.Bandwidth }},
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
