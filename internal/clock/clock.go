// Package clock gives the protocol cores a monotonic time value that carries
// no wall-clock meaning, so nothing can accidentally compare clocks of two
// machines (DESIGN.md: leases use durations on each node's monotonic clock),
// and gives the shells that drive them a Clock with timers, so that a shell
// sets its one timer to its core's next deadline on a clock a test can
// replace.
//
// # Tests
//
// Real works inside a testing/synctest bubble: its Now and its timers follow
// the bubble's fake clock, so a shell's test that only waits for time to pass
// runs in a bubble with the production clock and takes no wall-clock time.
package clock

import (
	"context"
	"time"
)

// Time is a point on one node's monotonic clock, in nanoseconds since an
// arbitrary origin. Times from different nodes must never be compared.
type Time int64

// Add returns t+d.
func (t Time) Add(d time.Duration) Time { return t + Time(d) }

// Sub returns t-u as a duration.
func (t Time) Sub(u Time) time.Duration { return time.Duration(t - u) }

// Before reports whether t is before u.
func (t Time) Before(u Time) bool { return t < u }

// After reports whether t is after u.
func (t Time) After(u Time) bool { return t > u }

// IsZero reports whether t is the zero time (used as "unset").
func (t Time) IsZero() bool { return t == 0 }

// Clock reads the current monotonic time and makes timers on it. Shells
// take one in their config (nil meaning Real); the simulator drives the
// cores with times of its own and needs none. Safe for concurrent use.
type Clock interface {
	// Now returns the current time; never zero.
	Now() Time
	// NewTimer returns a timer that sends on the returned channel once d
	// has passed, as time.NewTimer does. The value sent carries no meaning
	// beyond "fired": read Now for the time.
	NewTimer(d time.Duration) (Timer, <-chan time.Time)
	// AfterFunc calls f in its own goroutine once d has passed, as
	// time.AfterFunc does.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a timer of a Clock. Its methods behave as time.Timer's (Go 1.23
// and later: after Stop or Reset returns, no value from before it is
// received on the timer's channel).
type Timer interface {
	// Stop prevents the timer from firing; it reports whether it stopped
	// the timer, false if it had already fired or been stopped.
	Stop() bool
	// Reset makes the timer fire once d has passed from now; it reports
	// whether the timer was active.
	Reset(d time.Duration) bool
}

// Real is the process's monotonic clock.
type Real struct{}

var _ Clock = Real{}

var origin = time.Now()

// bubbleStart is when every testing/synctest bubble's fake clock starts.
var bubbleStart = time.Date(2000, time.January, 1, 0, 0, 0, 0, time.UTC)

// Now returns the time since process start on the monotonic clock; it is never
// zero so that zero can mean "unset".
func (Real) Now() Time {
	d := time.Since(origin)
	if d < 0 {
		// Only inside a synctest bubble, whose clock starts in 2000, long
		// before origin: count from the bubble's start instead, so that
		// times stay positive and zero keeps meaning "unset".
		d = time.Since(bubbleStart)
	}
	return Time(d) + 1
}

// NewTimer returns a time.Timer and its channel.
func (Real) NewTimer(d time.Duration) (Timer, <-chan time.Time) {
	t := time.NewTimer(d)
	return t, t.C
}

// AfterFunc returns time.AfterFunc(d, f).
func (Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Sleep waits until d has passed on c or ctx is done, whichever comes first,
// and returns ctx.Err() in the second case.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t, ch := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Until returns how long from now on c until t; negative once t has passed.
func Until(c Clock, t Time) time.Duration { return t.Sub(c.Now()) }
