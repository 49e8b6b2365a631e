package daemon

import (
	"context"
	"fmt"

	"k8s.io/client-go/dynamic"

	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/nodetemplate"
)

// templates runs this node's NodeConfigTemplate controller
// (k8s/nodetemplate): it renders the one template selecting the node into
// the node's NodeConfig, unless that one is hand-made. It starts before
// the wait for the NodeConfig — it may be what creates it — and runs
// until the agent stops; as a component (register) it is only waited for.
type templates struct {
	c    *nodetemplate.Controller
	stop context.CancelFunc
	done chan error
}

// startTemplates starts the controller; ctx is the agent's.
func (k *kubeMode) startTemplates(ctx context.Context, dyn dynamic.Interface, core *kubeclient.Client) {
	c := nodetemplate.New(nodetemplate.Config{Node: k.o.NodeName, Dyn: dyn, Nodes: core.Nodes(),
		Validate: nodeconfig.Validate, Log: k.o.Log})
	ctx, cancel := context.WithCancel(ctx)
	t := &templates{c: c, stop: cancel, done: make(chan error, 1)}
	go func() { t.done <- c.Run(ctx) }()
	k.templates = t
}

// Run waits for the controller, and ends it with ctx.
func (t *templates) Run(ctx context.Context) error {
	select {
	case err := <-t.done:
		t.done <- err
		return err
	case <-ctx.Done():
		t.stop()
		err := <-t.done
		t.done <- err
		return nil
	}
}

// explain is why the NodeConfig the agent waits for is not rendered (a
// template conflict, a render error), nil if nothing is known.
func (t *templates) explain() error {
	if t == nil {
		return nil
	}
	return t.c.Err()
}

// waitError adds the controller's problem to the wait's error, and stops
// the controller: the agent does not start.
func (t *templates) waitError(err error) error {
	if t == nil {
		return err
	}
	terr := t.c.Err()
	t.stop()
	if terr != nil {
		return fmt.Errorf("%w; %v", err, terr)
	}
	return err
}

// templateError is the controller's problem for the status snapshot ("":
// none).
func (k *kubeMode) templateError() string {
	if k == nil {
		return ""
	}
	if err := k.templates.explain(); err != nil {
		return err.Error()
	}
	return ""
}

// templateChanged is the controller's signal that its problem changed.
func (k *kubeMode) templateChanged() <-chan struct{} {
	if k.templates == nil {
		return nil
	}
	return k.templates.c.Changed()
}

// joinProblems joins two problems ("" is none) into one.
func joinProblems(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}
