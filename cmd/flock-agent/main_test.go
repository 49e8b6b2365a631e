package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args           []string
		code           int
		exit           bool
		stdout, stderr []string
		check          func(config) bool
	}{
		{args: []string{"--help"}, exit: true, stdout: []string{"usage: flock-agent", "-node-config", "-kubernetes", "-restart-grace duration", `(default "info")`, "-version"}},
		{args: []string{"-h"}, exit: true, stdout: []string{"usage: flock-agent"}},
		{args: []string{"--state-dir", "/elsewhere", "--help"}, exit: true, stdout: []string{`(default "/var/lib/flock")`}},
		{args: []string{"--version"}, exit: true, stdout: []string{"flock-agent ", "(commit ", runtime.Version() + ")\n"}},
		{args: []string{"--bogus"}, code: 2, exit: true, stderr: []string{"flock-agent: flag provided but not defined: -bogus", "flock-agent --help"}},
		{args: []string{"--repair-interval", "soon"}, code: 2, exit: true, stderr: []string{`invalid value "soon" for flag -repair-interval`}},
		{args: []string{"--kubernetes", "false"}, code: 2, exit: true, stderr: []string{`unexpected argument "false"`}},
		{args: []string{"--uninstall-remove", "var/lib/flock"}, code: 2, exit: true, stderr: []string{`--uninstall-remove "var/lib/flock": want an absolute path other than /`}},
		{args: []string{"--uninstall-remove", "/host/opt/cni/bin/flock,/"}, code: 2, exit: true, stderr: []string{`--uninstall-remove "/": want an absolute path other than /`}},
		{args: []string{"--kubernetes", "--uninstall-remove", "/host/a/, /host/b", "--uninstall-remove=/host/c"},
			check: func(c config) bool { return strings.Join(c.o.UninstallRemove, " ") == "/host/a /host/b /host/c" }},
		// Hidden from --help, the test flags still parse.
		{args: []string{"--node-config", "n.yaml", "--test-hook", "pause-before-commit"},
			check: func(c config) bool { return c.testHook == "pause-before-commit" && c.o.NodeConfig == "n.yaml" }},
		{args: []string{"--kubernetes", "--test-hook=pause-before-commit", "--restart-grace", "5s", "--log-level", "debug"},
			check: func(c config) bool {
				return c.testHook == "pause-before-commit" && c.o.Kubernetes && c.o.RestartGrace == 5*time.Second && c.logLevel == "debug"
			}},
		{args: []string{"--node-config", "n.yaml"},
			check: func(c config) bool {
				return c.testHook == "" && c.logLevel == "info" && c.o.StateDir == "/var/lib/flock"
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

// The flags for tests are left out of --help.
func TestHelpHidesTestFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if _, code, exit := parseFlags([]string{"--help"}, &stdout, &stderr); code != 0 || !exit {
		t.Fatalf("--help: code %d exit %v", code, exit)
	}
	for _, hidden := range []string{"test-hook", testingOnly, "pause-before-commit"} {
		if strings.Contains(stdout.String(), hidden) {
			t.Errorf("--help shows %q:\n%s", hidden, stdout.String())
		}
	}
}
