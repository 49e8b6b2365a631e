package daemon

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/status"
	"code.fritzlab.net/fritzlab/flock/k8s/nodetemplate"
)

// While the agent waits for a NodeConfig a template would render, its
// readiness says why it is not rendered; the wait's final error too.
func TestWaitNamesTheTemplateError(t *testing.T) {
	problem := errors.New("NodeConfigTemplate rack: spec.asnFrom.label: node vm has no label flock.fritzlab.net/asn")
	w := &nodeConfigWait{node: "vm", log: slog.New(slog.DiscardHandler), tried: true,
		explain: func() error { return problem }}
	want := `waiting for NodeConfig "vm": ` + problem.Error()
	if got := w.readiness(); got == nil || got.Error() != want {
		t.Errorf("readiness %v, want %s", got, want)
	}
	if st := (waitingSource{w}).Status(); len(st.Problems) != 1 || st.Problems[0] != want {
		t.Errorf("admin status problems %q, want [%s]", st.Problems, want)
	}
	// Nothing to explain: the wait's own answer.
	w.explain = func() error { return nil }
	if got := w.readiness(); got == nil || !strings.Contains(got.Error(), "does not exist yet") {
		t.Errorf("readiness %v", got)
	}

	// The wait gives up: its error carries the controller's problem, and
	// the controller stops.
	c := nodetemplate.New(nodetemplate.Config{Node: "vm"})
	ctx, cancel := context.WithCancel(context.Background())
	tp := &templates{c: c, stop: cancel, done: make(chan error, 1)}
	go func() { <-ctx.Done(); tp.done <- nil }()
	werr := errors.New(`NodeConfig "vm" does not exist (waited 1s)`)
	if got := tp.waitError(werr); !errors.Is(got, werr) || got.Error() != werr.Error() {
		t.Errorf("waitError %v, want %v (the controller knows nothing)", got, werr)
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
		t.Error("the controller was not stopped")
	}
	var nilT *templates
	if got := nilT.waitError(werr); got != werr || nilT.explain() != nil {
		t.Errorf("no controller: %v", got)
	}
}

// The status snapshot's ConfigError joins the NodeConfig's and the
// template controller's problems.
func TestConfigErrorJoinsTemplateError(t *testing.T) {
	for _, c := range []struct{ a, b, want string }{
		{"", "", ""}, {"x", "", "x"}, {"", "y", "y"}, {"x", "y", "x; y"},
	} {
		if got := joinProblems(c.a, c.b); got != c.want {
			t.Errorf("joinProblems(%q, %q) = %q, want %q", c.a, c.b, got, c.want)
		}
	}
	var k *kubeMode
	if k.templateError() != "" {
		t.Error("standalone mode has a template error")
	}
	n := status.Node{ConfigError: joinProblems("", "node vm: NodeConfigTemplates a and b select it")}
	if p := n.Problems(); len(p) != 1 || p[0] != "config: node vm: NodeConfigTemplates a and b select it" {
		t.Errorf("problems %q", p)
	}
}
