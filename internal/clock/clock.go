// Package clock gives the protocol cores a monotonic time value that carries
// no wall-clock meaning, so nothing can accidentally compare clocks of two
// machines (DESIGN.md: leases use durations on each node's monotonic clock).
package clock

import "time"

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

// Clock reads the current monotonic time. Shells pass Real; the simulator
// passes its own.
type Clock interface {
	Now() Time
}

// Real is the process's monotonic clock.
type Real struct{}

var origin = time.Now()

// Now returns the time since process start on the monotonic clock; it is never
// zero so that zero can mean "unset".
func (Real) Now() Time { return Time(time.Since(origin)) + 1 }
