package client

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
)

// TestTick: the renewal loops' tick calls its function every period on
// the client's clock, at once again after a call that took longer than a
// period, and no more once the client closes.
func TestTick(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &Client{clk: clock.Real{}, stop: make(chan struct{})}
		start := time.Now()
		var at []time.Duration
		c.wg.Add(1)
		go c.tick(10*time.Millisecond, func() {
			at = append(at, time.Since(start))
			if len(at) == 2 {
				time.Sleep(35 * time.Millisecond) // a renewal that waits
			}
		})
		time.Sleep(100 * time.Millisecond)
		close(c.stop)
		c.wg.Wait()
		n := len(at)
		time.Sleep(50 * time.Millisecond)
		ms := time.Millisecond
		want := []time.Duration{10 * ms, 20 * ms, 55 * ms, 65 * ms, 75 * ms, 85 * ms, 95 * ms}
		if !slices.Equal(at, want) || len(at) != n {
			t.Fatalf("called at %v, want %v", at, want)
		}
	})
}
