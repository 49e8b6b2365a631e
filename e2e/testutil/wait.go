// Package testutil is what the tests of several packages share: waiting
// for a condition instead of sleeping, running a component until the test
// ends, and fixtures for client-go's fake API clients. It imports nothing
// of flock, so the tests of any package can use it without an import
// cycle. (It lives under e2e/ because the top level is fixed.)
package testutil

import (
	"testing"
	"time"
)

// Timeout is how long Eventually waits: long enough for a loaded 2-core
// machine running the race detector. A condition that holds returns at
// once, so only a failing test pays for it.
const Timeout = 10 * time.Second

// maxPoll caps the pause between two looks: the first looks come quickly
// (most conditions hold within milliseconds), later ones back off so that
// an expensive condition (a CLI run, a RIB dump) does not load the machine.
const maxPoll = 50 * time.Millisecond

// Eventually polls cond until it holds. If it does not within Timeout the
// test fails, naming what and cond's last message.
func Eventually(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	EventuallyWithin(t, Timeout, what, cond)
}

// EventuallyWithin is Eventually with its own deadline.
func EventuallyWithin(t testing.TB, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for pause := time.Millisecond; ; pause = min(2*pause, maxPoll) {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if msg != "" {
				msg = "; last: " + msg
			}
			t.Fatalf("timed out after %v waiting for %s%s", within, what, msg)
		}
		time.Sleep(pause)
	}
}

// WaitFor is Eventually for a condition with nothing to say.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Eventually(t, what, func() (bool, string) { return cond(), "" })
}

// Consistently checks that cond holds throughout the window, failing the
// test (naming what and cond's message) the first time it does not. It is
// for "nothing happens" windows only: a slow machine makes it look less
// often, never fail, so it cannot fail on correct code under load. When
// the thing that must not happen has a witness (a counter, an ordered
// stream, a later event it would precede), check that instead.
func Consistently(t testing.TB, what string, within time.Duration, cond func() (bool, string)) {
	t.Helper()
	end := time.Now().Add(within)
	for pause := time.Millisecond; ; pause = min(2*pause, maxPoll) {
		if ok, msg := cond(); !ok {
			t.Fatalf("%s: %s", what, msg)
		}
		if time.Now().After(end) {
			return
		}
		time.Sleep(pause)
	}
}
