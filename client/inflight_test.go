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
				if oldest := f.add(&id, 7); oldest != 1 {
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
	if oldest := f.add(&resent, 7); resent != 5 || oldest != 1 {
		t.Errorf("a resend was renumbered %d or saw oldest %d", resent, oldest)
	}
}

// TestChangesInFlightPerInode: the oldest change a request names is the
// oldest of its own inode. A change stuck in flight on another inode (a
// directory's, during a failover) must not keep a file's finished changes
// applicable: a copy of one, left at a server the client gave up on, ran
// there once that server owned the file again, after more changes than the
// server remembers ids for, and an O_APPEND record was written twice.
func TestChangesInFlightPerInode(t *testing.T) {
	var f changesInFlight
	var stuck uint64
	f.add(&stuck, 1)
	for i := range 100 {
		var id uint64
		oldest := f.add(&id, 2)
		if oldest != id {
			t.Fatalf("change %d of inode 2 (the only one of it in flight) named %d as the oldest", i, oldest)
		}
		f.done(id)
	}
	var first, second uint64
	f.add(&first, 2)
	if oldest := f.add(&second, 2); oldest != first {
		t.Errorf("with %d of inode 2 in flight, %d named %d", first, second, oldest)
	}
	var dir uint64
	if oldest := f.add(&dir, 1); oldest != stuck {
		t.Errorf("a change of inode 1 named %d, not the stuck %d", oldest, stuck)
	}
}
