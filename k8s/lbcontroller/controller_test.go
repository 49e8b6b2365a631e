package lbcontroller

import (
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// A controller without a node name or a namespace for its Lease is refused
// before any client exists, naming what is missing.
func TestNewRefuses(t *testing.T) {
	rc := &rest.Config{Host: "https://127.0.0.1:1"}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Namespace: "flock-system"}, "the node's name is empty"},
		{Config{Node: "n1"}, "the Lease's namespace is empty"},
	} {
		if c, err := New(rc, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) || c != nil {
			t.Errorf("New(%+v) = %v, %v; want an error containing %q", tc.cfg, c, err, tc.want)
		}
	}
	if c, err := New(rc, Config{Node: "n1", Namespace: "flock-system"}); err != nil || c.Leading() {
		t.Errorf("New with both: %v (leading %v), want a controller not yet leading", err, c != nil && c.Leading())
	}
}
