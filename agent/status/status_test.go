package status

import (
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent/reconcile"
)

// The installer's refusal is a problem of its own, listed first: without
// a conflist nothing else the node does reaches a pod.
func TestProblemsNameTheInstaller(t *testing.T) {
	n := Node{Ready: true, ConfigError: "peer x: bad", Installer: "installer: refused to write the CNI config: chained plugin portmap (/opt/cni/bin/portmap): not found",
		Reconcilers: []reconcile.Status{{Target: "kernel", Failing: true, LastError: "no such device"}}}
	p := n.Problems()
	if len(p) != 3 || p[0] != "cni installer: "+n.Installer || !strings.HasPrefix(p[1], "config: ") || !strings.HasPrefix(p[2], "reconcile kernel") {
		t.Errorf("problems %q", p)
	}
	if p := (Node{Ready: true}).Problems(); len(p) != 0 {
		t.Errorf("a healthy node has problems %q", p)
	}
}
