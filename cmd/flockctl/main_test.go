package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestNotRunning(t *testing.T) {
	var out bytes.Buffer
	err := run([]string{"--socket", t.TempDir() + "/none.sock", "bgp", "neighbors"}, &out)
	if err == nil || !strings.Contains(err.Error(), "flock agent is not running") || !strings.Contains(err.Error(), "none.sock") {
		t.Fatalf("want a clear 'not running' error naming the socket, got %v", err)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "xml", "pods"}, `-o "xml"`},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{nil, "no command given"},
	} {
		var out bytes.Buffer
		err := run(tc.args, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: want error containing %q, got %v", tc.args, tc.want, err)
		}
	}
}
