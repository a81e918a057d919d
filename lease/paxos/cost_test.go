package paxos

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// learnN has node 1 learn n leases owned by node 2 and returns the heap
// bytes per learnt instance.
func learnN(t testing.TB, n int) float64 {
	c := testConfig(1, []ids.ServerID{1, 2, 3}, 1)
	node, err := New(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	now := node.quarantineUntil
	m := Message{From: 2, To: 1, Entries: make([]Entry, n)}
	for i := range m.Entries {
		m.Entries[i] = Entry{Kind: KindLearn, Ino: ids.Ino(i + 1), Ballot: 1<<24 | 1<<8 | 2, Owner: 2, Aux: uint64(c.LeaseTime / 2)}
	}
	before := heapInUse()
	if err := node.Step(now, m); err != nil {
		t.Fatal(err)
	}
	after := heapInUse()
	runtime.KeepAlive(m) // the message is the caller's, not the node's state
	if o, ok := node.Owner(now, ids.Ino(n)); !ok || o != 2 {
		t.Fatal("not learnt")
	}
	runtime.KeepAlive(node)
	return float64(after-before) / float64(n)
}

// TestLearntInstanceBytes: an idle instance a node has learnt about costs at
// most 100 bytes (the paper's 50-100 bytes). LEASEFS_LONG=1 measures 1e6.
func TestLearntInstanceBytes(t *testing.T) {
	n := 100_000
	if os.Getenv("LEASEFS_LONG") == "1" {
		n = 1_000_000
	}
	b := learnN(t, n)
	t.Logf("%d learnt instances: %.1f bytes each", n, b)
	if b > 100 {
		t.Fatalf("%.1f bytes per learnt instance, want ≤ 100", b)
	}
}

// holdCluster makes node 1 of three own n leases and returns the net.
func holdCluster(t testing.TB, n int) *tnet {
	tn := newNet(t, 3, nil)
	for i := range n {
		tn.nodes[1].Acquire(tn.now, ids.Ino(i+1))
	}
	tn.settle()
	if !tn.nodes[1].Owns(tn.now, ids.Ino(n)) {
		t.Fatal("not acquired")
	}
	return tn
}

// run lets d pass, delivering every message at once (a fast network), and
// returns how many messages and entries were sent.
func (tn *tnet) run(d time.Duration) (msgs, entries int) {
	end := tn.now.Add(d)
	for tn.now.Before(end) {
		next := end
		for _, n := range tn.nodes {
			if dl := n.NextDeadline(); !dl.IsZero() && dl.Before(next) {
				next = max(dl, tn.now)
			}
		}
		tn.advance(next.Sub(tn.now))
		for {
			ms := tn.take(all)
			if len(ms) == 0 {
				break
			}
			for _, m := range ms {
				msgs++
				entries += len(m.Entries)
			}
			tn.deliver(ms...)
		}
	}
	return msgs, entries
}

// TestHoldingCostIndependentOfN: holding N leases costs the same number of
// messages per second for N = 10 and N = 100,000 (batching).
func TestHoldingCostIndependentOfN(t *testing.T) {
	var counts []int
	for _, n := range []int{10, 10_000} {
		tn := holdCluster(t, n)
		tn.run(time.Second) // settle into rounds
		start := time.Now()
		msgs, entries := tn.run(5 * time.Second)
		t.Logf("N=%d: %.1f msgs/s, %.0f entries/s among 3 nodes (T=%v; %v CPU per simulated second)",
			n, float64(msgs)/5, float64(entries)/5, tn.nodes[1].cfg.LeaseTime, time.Since(start)/5)
		if !tn.nodes[1].Owns(tn.now, ids.Ino(n)) || !tn.nodes[1].Owns(tn.now, 1) {
			t.Fatal("lost leases")
		}
		counts = append(counts, msgs)
	}
	if counts[0] != counts[1] {
		t.Fatalf("messages grow with N: %v", counts)
	}
}

// BenchmarkHold: one op is one simulated second of node 1 holding N leases
// among 3 nodes (T = 1 s, instant network); msgs/s must not depend on N.
func BenchmarkHold(b *testing.B) {
	for _, n := range []int{1000, 100_000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			tn := holdCluster(b, n)
			tn.run(time.Second)
			b.ResetTimer()
			msgs, entries := tn.run(time.Duration(b.N) * time.Second)
			b.ReportMetric(float64(msgs)/float64(b.N), "msgs/s")
			b.ReportMetric(float64(entries)/float64(b.N), "entries/s")
		})
	}
}

// BenchmarkLearn measures learner memory per instance with -benchmem style
// reporting (bytes/instance as a custom metric).
func BenchmarkLearn1e5(b *testing.B) {
	var per float64
	for range b.N {
		per = learnN(b, 100_000)
	}
	b.ReportMetric(per, "bytes/instance")
}

// BenchmarkAcquire measures one uncontended acquire among 3 nodes.
func BenchmarkAcquire(b *testing.B) {
	tn := newNet(b, 3, nil)
	b.ReportAllocs()
	msgs := 0
	for i := range b.N {
		tn.nodes[1].Acquire(tn.now, ids.Ino(i+1))
		for {
			ms := tn.take(all)
			if len(ms) == 0 {
				break
			}
			msgs += len(ms)
			tn.deliver(ms...)
		}
		tn.nodes[1].Release(tn.now, ids.Ino(i+1))
		tn.take(all)
	}
	b.ReportMetric(float64(msgs)/float64(b.N), "msgs/acquire")
}
