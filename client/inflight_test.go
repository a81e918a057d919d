package client

import (
	"sync"
	"testing"
)

// TestChangesInFlightOrder: a change numbered before another is recorded
// before it too, so no change names an oldest in-flight change past one
// still unanswered (the server would refuse that one as a stale copy:
// ESTALE from a plain write, seen with 16 concurrent flush writes).
func TestChangesInFlightOrder(t *testing.T) {
	var f changesInFlight
	const workers, each = 8, 2000
	var wg sync.WaitGroup
	bad := make(chan [2]uint64, workers)
	for range workers {
		wg.Go(func() {
			for range each {
				var id uint64
				if oldest := f.add(&id); oldest != 1 {
					bad <- [2]uint64{id, oldest}
					return
				}
			}
		})
	}
	wg.Wait()
	close(bad)
	for b := range bad {
		t.Errorf("change %d named %d as the oldest in flight; change 1 was never answered", b[0], b[1])
	}
	var resent uint64 = 5
	if oldest := f.add(&resent); resent != 5 || oldest != 1 {
		t.Errorf("a resend was renumbered %d or saw oldest %d", resent, oldest)
	}
}
