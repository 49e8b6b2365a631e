package netpol

import (
	"context"
	"testing"
	"time"
)

func TestPace(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name             string
		urgent           bool
		took, idle, want time.Duration
	}{
		{"any change: idle as long as the load took", true, 100 * ms, 30 * ms, 70 * ms},
		{"any change after a quiet spell: at once", true, 100 * ms, time.Second, 0},
		{"other nodes' pods: 49 loads' time", false, 10 * ms, 0, 490 * ms},
		{"other nodes' pods: at most the lag", false, 50 * ms, 100 * ms, 900 * ms},
		{"other nodes' pods: a load longer than the lag", false, 2 * time.Second, 500 * ms, 1500 * ms},
		{"other nodes' pods after a quiet spell: at once", false, 10 * ms, 5 * time.Second, 0},
	} {
		if got := pace(tc.urgent, tc.took, tc.idle, time.Second); got != tc.want {
			t.Errorf("%s: pace(urgent %v, took %s, idle %s) = %s, want %s", tc.name, tc.urgent, tc.took, tc.idle, got, tc.want)
		}
	}
}

// A change of other nodes' pods alone waits; any other change that comes
// meanwhile is loaded without waiting for it (a pod of this node must
// not stay unjudged for the other nodes' lag).
func TestKernelUrgentChangeCutsTheWait(t *testing.T) {
	ns := testNS(t)
	kv, _, _, _ := testKernel(ns)
	kv.remoteLag = time.Hour
	// Every load takes a second at least: other nodes' pods then wait
	// 49 seconds, any other change one.
	kv.fail = func() error { time.Sleep(time.Second); return nil }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- kv.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-kv.loaded:
	case <-time.After(10 * time.Second):
		t.Fatal("no first load")
	}
	kv.recompile() // another node's pod
	time.Sleep(500 * time.Millisecond)
	if kv.done.Load() == kv.seq.Load() {
		t.Fatal("a change of another node's pod loaded at once after a load: not paced")
	}
	kv.changed() // a pod of this node, a policy, a namespace
	deadline := time.Now().Add(6 * time.Second)
	for kv.done.Load() != kv.seq.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("a change of the context waited for other nodes' pods' pace (done %d of %d)", kv.done.Load(), kv.seq.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Patches wait PatchEvery while they are cheap, 19 times what the last
// took once that is longer (a twentieth of a core), never past the lag.
func TestPatchPace(t *testing.T) {
	const every = RemoteLag / 4 // under the lag: the pace shows
	for _, c := range []struct{ took, want time.Duration }{
		{time.Millisecond, every},
		{10 * time.Millisecond, every},
		{20 * time.Millisecond, 380 * time.Millisecond},
		{40 * time.Millisecond, 760 * time.Millisecond},
		{time.Second, RemoteLag},
	} {
		if got := patchPace(c.took, every, RemoteLag); got != c.want {
			t.Errorf("a patch that took %s: next after %s, want %s", c.took, got, c.want)
		}
	}
	if got := patchPace(time.Second, 10*time.Millisecond, time.Millisecond); got != 10*time.Millisecond {
		t.Errorf("a lag under every: %s, want every", got)
	}
}
