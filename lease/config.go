package lease

import (
	"errors"
	"fmt"
	"time"
)

// ErrConfig is returned by Config.Validate.
var ErrConfig = errors.New("lease: bad config")

// Config holds the client lease parameters, shared by client and server (the
// server tells the client τ and δ when a session opens).
type Config struct {
	// Tau is the client lease period τ.
	Tau time.Duration
	// Delta is the bound δ on the clock-rate error between any two nodes:
	// a duration of d on one clock is at least d/(1+δ) on another.
	Delta float64
	// RenewMargin is how long before expiry a client holding state sends an
	// explicit renewal; it must cover a round trip and a retry or two.
	RenewMargin time.Duration
}

// DefaultConfig returns DESIGN.md's defaults: τ = 2 s, δ = 0.05, renewal
// margin τ/8.
func DefaultConfig() Config {
	return Config{Tau: 2 * time.Second, Delta: 0.05, RenewMargin: 250 * time.Millisecond}
}

// Validate checks the fields and how they relate.
func (c Config) Validate() error {
	switch {
	case c.Tau <= 0:
		return fmt.Errorf("%w: lease period %v must be positive", ErrConfig, c.Tau)
	case c.Delta < 0 || c.Delta >= 1 || c.Delta != c.Delta:
		return fmt.Errorf("%w: clock drift %v must be in [0, 1)", ErrConfig, c.Delta)
	case c.RenewMargin <= 0:
		return fmt.Errorf("%w: renew margin %v must be positive", ErrConfig, c.RenewMargin)
	case c.RenewMargin > c.Tau/2:
		// A larger margin would renew more often than every τ/2 and make
		// opportunistic renewal pointless.
		return fmt.Errorf("%w: renew margin %v must be at most half the lease period %v", ErrConfig, c.RenewMargin, c.Tau)
	}
	return nil
}

// FailTimeout is τ(1+δ): how long, on its own clock, a server waits after it
// stopped acknowledging a client before it may steal that client's locks, and
// how long a restarted server grants no lock.
func (c Config) FailTimeout() time.Duration {
	return c.Tau + time.Duration(float64(c.Tau)*c.Delta)
}
