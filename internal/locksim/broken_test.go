package locksim

import (
	"testing"
	"time"
)

// TestBrokenVariantsCaught tests the tester: each variant that drops one
// safety rule must produce a violation within a bounded number of seeds, and
// the correct protocol must pass the very run that caught it.
func TestBrokenVariantsCaught(t *testing.T) {
	variants := []struct {
		name   string
		broken Broken
		// hostile adapts the fault profile so the rule matters: the
		// τ(1+δ) rule only protects when τδ/(1+δ) exceeds the delivery
		// timeout, so ignore-delta runs with δ=0.5, a short delivery
		// timeout and the server's clock fastest.
		hostile func(*Config)
	}{
		{"lease-from-receive", Broken{LeaseFromReceive: true}, nil},
		{"steal-without-wait", Broken{StealWithoutWait: true}, nil},
		{"no-grace", Broken{NoGrace: true}, nil},
		{"ignore-seq", Broken{IgnoreSeq: true}, nil},
		{"ignore-delta", Broken{IgnoreDelta: true}, func(c *Config) {
			c.Lease.Delta = 0.5
			c.DeliveryTimeout = c.Lease.Tau / 20
			c.Faults.ExtremeRates = true
		}},
	}
	const maxSeeds = 400
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			start := time.Now()
			for seed := uint64(0); seed < maxSeeds; seed++ {
				cfg := RandomConfig(seed)
				if v.hostile != nil {
					v.hostile(&cfg)
				}
				cfg.Broken = v.broken
				res := Run(cfg)
				if res.Violation == "" {
					continue
				}
				cfg.Broken = Broken{}
				if ok := Run(cfg); ok.Violation != "" {
					t.Fatalf("seed %d: the correct protocol fails the same run: %s", seed, ok.Violation)
				}
				t.Logf("caught at seed %d after %v: %s", seed, time.Since(start).Round(time.Millisecond), res.Violation)
				return
			}
			t.Fatalf("%s not caught in %d seeds", v.name, maxSeeds)
		})
	}
}
