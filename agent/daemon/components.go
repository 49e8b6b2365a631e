package daemon

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
)

// The component contract. Every long-running part of the agent is a
// Runner: Run(ctx) works until ctx ends and then returns nil, or returns
// the error that stopped it (which stops the agent). A part whose changes
// others follow offers Changed() <-chan struct{}: a coalesced signal (one
// value stands for every change since the last receive; read the part's
// state then). Informers come from the one kubeclient.Factory, which is a
// Runner itself. Adding a source of routes or rules (Services,
// NetworkPolicy) is writing one Runner and registering it here.

// Runner is one long-running part of the agent.
type Runner interface {
	Run(ctx context.Context) error
}

// RunFunc makes a function a Runner.
type RunFunc func(ctx context.Context) error

// Run calls f.
func (f RunFunc) Run(ctx context.Context) error { return f(ctx) }

// phase says when a component starts.
type phase int

const (
	// duringRecovery: what recovery needs running (the speaker, the
	// informers whose facts restore uses, metrics answering "not ready").
	duringRecovery phase = iota
	// whenServing: once allocations are restored and the speaker holds
	// the full set; everything that changes state or serves requests.
	whenServing
)

func (p phase) String() string {
	if p == duringRecovery {
		return "recovery"
	}
	return "serving"
}

type component struct {
	name  string
	phase phase
	r     Runner
}

// components are the registered parts, started by phase.
type components struct {
	list    []component
	started map[phase]bool
}

// register adds a component. All are registered before Run starts any.
func (c *components) register(name string, p phase, r Runner) {
	c.list = append(c.list, component{name: name, phase: p, r: r})
}

// start runs the components of phase p in g.
func (c *components) start(ctx context.Context, g *errgroup.Group, p phase) {
	if c.started == nil {
		c.started = map[phase]bool{}
	}
	if c.started[p] {
		return
	}
	c.started[p] = true
	for _, comp := range c.list {
		if comp.phase != p {
			continue
		}
		g.Go(func() error {
			if err := comp.r.Run(ctx); err != nil {
				return fmt.Errorf("%s: %w", comp.name, err)
			}
			return nil
		})
	}
}

// follow is the shape of the daemon's small controllers: apply once per
// value on any of the signals (nil ones never fire), until ctx ends.
func follow(apply func(), signals ...<-chan struct{}) RunFunc {
	return func(ctx context.Context) error {
		var a, b, c <-chan struct{}
		switch len(signals) {
		case 3:
			c = signals[2]
			fallthrough
		case 2:
			b = signals[1]
			fallthrough
		case 1:
			a = signals[0]
		case 0:
		default:
			return fmt.Errorf("follow: at most 3 signals, got %d", len(signals))
		}
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-a:
			case <-b:
			case <-c:
			}
			apply()
		}
	}
}
