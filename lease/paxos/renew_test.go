package paxos

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

// TestRenewalsUnderSteadyAcquires: a node that acquires new instances all
// the time (a server creating files: every new inode is an instance) still
// renews the leases it holds, even when its timer runs late behind the
// messages it handles (a busy loop picks among ready events at random).
func TestRenewalsUnderSteadyAcquires(t *testing.T) {
	tn := newNet(t, 3, nil)
	tn.events = nil
	rng := rand.New(rand.NewPCG(1, 2))
	step := 700 * time.Microsecond
	for i := range 20_000 { // 14 s: 14 leases' time
		tn.now = tn.now.Add(step)
		tn.deliver(tn.take(all)...)
		tn.nodes[1].Acquire(tn.now, ids.Ino(i+1))
		for _, n := range tn.nodes {
			if dl := n.NextDeadline(); !dl.IsZero() && !tn.now.Before(dl) && rng.IntN(4) == 0 {
				n.Tick(tn.now) // late by a few steps, at random
			}
		}
		tn.collect()
	}
	lost := 0
	for _, e := range tn.events {
		if e.Kind == Lost {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d leases lapsed", lost)
	}
}
