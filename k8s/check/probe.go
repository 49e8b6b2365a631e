package check

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"
)

// The probe is what the check's pods run: `flockctl check-probe serve`
// answers every connection, `flockctl check-probe connect` dials targets
// and writes what happened as its termination message (JSON), where the
// check reads it from the pod's status. flock's own image has flockctl,
// so the check needs no other image on the nodes.

// Greeting starts a server's answer.
const Greeting = "flock-check"

// Serve answers every TCP connection on port (both families) with the
// greeting and the pod's name, until ctx ends.
func Serve(ctx context.Context, port int) error {
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", net.JoinHostPort("::", strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("check-probe serve: %w", err)
	}
	return serve(ctx, l)
}

// serve answers on l until ctx ends.
func serve(ctx context.Context, l net.Listener) error {
	context.AfterFunc(ctx, func() { l.Close() })
	host, _ := os.Hostname()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("check-probe serve: %w", err)
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "%s %s\n", Greeting, host)
		}()
	}
}

// Verdict is what a connection attempt met.
type Verdict string

const (
	Answered Verdict = "answered" // the server greeted
	Blocked  Verdict = "blocked"  // no answer within the timeout: dropped
	Refused  Verdict = "refused"  // refused, reset, or another error
)

// Outcome is one target's last verdict, and whether it is the one wanted.
type Outcome struct {
	To     string  `json:"to"`
	Want   Verdict `json:"want"`
	Got    Verdict `json:"got"`
	OK     bool    `json:"ok"`
	Detail string  `json:"detail,omitempty"`
}

// Connect dials each target (host:port) until it meets want three times
// in a row, or until within ends (then the last verdict stands): a
// NetworkPolicy takes effect a moment after it is made, and one lost
// packet is not a verdict.
func Connect(ctx context.Context, targets []string, want Verdict, timeout, within time.Duration) []Outcome {
	out := make([]Outcome, len(targets))
	var wg sync.WaitGroup
	for i, to := range targets {
		// All at once, each its own time: one target down neither fails
		// the others nor makes the probe outlast the check's wait.
		wg.Go(func() {
			deadline := time.Now().Add(within)
			o := Outcome{To: to, Want: want}
			streak := 0
			for {
				o.Got, o.Detail = dial(ctx, to, timeout)
				if o.Got == want {
					streak++
				} else {
					streak = 0
				}
				if streak == 3 || time.Now().After(deadline) || ctx.Err() != nil {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			o.OK = streak == 3
			out[i] = o
		})
	}
	wg.Wait()
	return out
}

func dial(ctx context.Context, to string, timeout time.Duration) (Verdict, string) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", to)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return Blocked, err.Error()
		}
		return Refused, err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	b := make([]byte, 128)
	n, err := c.Read(b)
	if n > len(Greeting) && string(b[:len(Greeting)]) == Greeting {
		return Answered, string(b[len(Greeting)+1 : n-1])
	}
	return Refused, fmt.Sprintf("answer %q: %v", b[:n], err)
}

// WriteOutcomes writes outcomes as the pod's termination message.
func WriteOutcomes(path string, outcomes []Outcome) error {
	b, err := json.Marshal(outcomes)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// ReadOutcomes parses a termination message.
func ReadOutcomes(msg string) ([]Outcome, error) {
	var out []Outcome
	if err := json.Unmarshal([]byte(msg), &out); err != nil {
		return nil, fmt.Errorf("the probe's report %q: %w", msg, err)
	}
	return out, nil
}
