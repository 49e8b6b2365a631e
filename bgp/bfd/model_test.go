package bfd

import (
	"math/rand/v2"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// simSide is one end of a simulated link: its machine and when it sends.
type simSide struct {
	m      *machine
	nextTx time.Time
	// upWith: the remote discriminator this side went Up with.
	upWith uint32
}

// schedule sets the next periodic packet as runSession's timer does: none
// (zero) while the remote wants none.
func (s *simSide) schedule(now time.Time) {
	s.nextTx = time.Time{}
	if iv := s.m.txInterval(); iv > 0 {
		s.nextTx = now.Add(iv)
	}
}

type simPacket struct {
	p  Packet
	at time.Time // delivery time
}

// TestMachineModel drives two machines over a simulated link that drops,
// delays and reorders packets, while timing changes and remote restarts
// (new discriminators) happen at random, in simulated time. Invariants:
// a side only goes Up on a packet that names its discriminator; a timing
// change never takes a session down on a loss-free link; and at every
// quiescent point (a loss-free link for a few seconds) both sides are Up
// with each other's current discriminators and no Poll Sequence pending.
// FLOCK_SEED replays a run.
func TestMachineModel(t *testing.T) {
	seed := uint64(testutil.Seed(t))
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	configs := []Config{{}, {DesiredMinTx: 100 * time.Millisecond, RequiredMinRx: 100 * time.Millisecond},
		{DesiredMinTx: time.Second, RequiredMinRx: time.Second, DetectMult: 5}, {DesiredMinTx: 200 * time.Millisecond, RequiredMinRx: 500 * time.Millisecond, DetectMult: 2}}
	discr := uint32(1)
	newSide := func(now time.Time) *simSide {
		discr++
		return &simSide{m: newMachine(configs[rng.IntN(len(configs))], discr), nextTx: now}
	}
	now := time.Unix(1000, 0)
	sides := [2]*simSide{newSide(now), newSide(now)}
	var queues [2][]simPacket // queues[i]: packets on their way to side i
	const step = 5 * time.Millisecond
	var lossy bool

	send := func(from int) {
		s := sides[from]
		p := s.m.packet()
		if lossy && rng.IntN(4) == 0 {
			return // dropped
		}
		delay := time.Millisecond
		if lossy {
			delay += time.Duration(rng.IntN(80)) * time.Millisecond // reorders too
		}
		queues[1-from] = append(queues[1-from], simPacket{p, now.Add(delay)})
	}
	// run advances simulated time by d; reconfOK: no Down may happen.
	run := func(d time.Duration, noDown bool) {
		end := now.Add(d)
		for now.Before(end) {
			now = now.Add(step)
			for i, s := range sides {
				// Deliver what has arrived (in arrival order).
				var keep []simPacket
				for _, q := range queues[i] {
					if q.at.After(now) {
						keep = append(keep, q)
						continue
					}
					before, base := s.m.state, s.m.txBase()
					poll := q.p.Poll
					changed := s.m.receive(q.p, now)
					if s.m.txBase() != base { // as runSession: the new rate from now
						s.schedule(now)
					}
					if changed && s.m.state == Up && before != Up {
						if q.p.YourDiscr != s.m.localDiscr {
							t.Fatalf("seed %d: side %d went Up on a packet for discriminator %d (ours %d)", seed, i, q.p.YourDiscr, s.m.localDiscr)
						}
						s.upWith = q.p.MyDiscr
					}
					if noDown && before == Up && s.m.state != Up {
						t.Fatalf("seed %d: side %d went down on a loss-free link (%v)", seed, i, s.m.diag)
					}
					if changed || poll {
						send(i)
					}
				}
				queues[i] = keep
				before, base := s.m.state, s.m.txBase()
				if s.m.expire(now) {
					if noDown && before == Up {
						t.Fatalf("seed %d: side %d's detection time expired on a loss-free link (detect %v)", seed, i, s.m.detectTime())
					}
					send(i)
				}
				if s.m.txBase() != base {
					s.schedule(now)
				}
				if !s.nextTx.IsZero() && !now.Before(s.nextTx) {
					send(i)
					s.schedule(now)
				}
			}
		}
	}
	// reconf is a timing change as runSession applies it.
	reconf := func(i int) {
		s := sides[i]
		base := s.m.txBase()
		if s.m.reconfigure(configs[rng.IntN(len(configs))]) {
			send(i)
		}
		if s.m.txBase() != base {
			s.schedule(now)
		}
	}
	quiescent := func(round int) {
		t.Helper()
		lossy = false
		run(8*time.Second, false)
		a, b := sides[0].m, sides[1].m
		if a.state != Up || b.state != Up || a.remoteDiscr != b.localDiscr || b.remoteDiscr != a.localDiscr || a.poll || b.poll {
			t.Fatalf("seed %d round %d: not settled: a %v (remote %d, poll %v) b %v (remote %d, poll %v), discr %d/%d",
				seed, round, a.state, a.remoteDiscr, a.poll, b.state, b.remoteDiscr, b.poll, a.localDiscr, b.localDiscr)
		}
	}

	quiescent(0)
	for round := 1; round <= 40; round++ {
		switch op := rng.IntN(4); op {
		case 0: // a timing change on a loss-free link: never a Down
			i := rng.IntN(2)
			reconf(i)
			run(50*time.Millisecond, true)
			if rng.IntN(2) == 0 { // a second change during the Poll Sequence
				reconf(i)
			}
			run(6*time.Second, true)
		case 1: // the remote restarts: a new session, a new discriminator
			i := rng.IntN(2)
			sides[i] = newSide(now)
			queues[i] = nil
		case 2: // a bad link for a while
			lossy = true
			run(time.Duration(500+rng.IntN(3000))*time.Millisecond, false)
		case 3: // the link dies for longer than any detection time
			queues = [2][]simPacket{}
			end := now.Add(6 * time.Second)
			for now.Before(end) {
				now = now.Add(step)
				for _, s := range sides {
					s.m.expire(now)
				}
			}
			if sides[0].m.state == Up || sides[1].m.state == Up {
				t.Fatalf("seed %d round %d: Up after a dead link", seed, round)
			}
		}
		quiescent(round)
	}
}
