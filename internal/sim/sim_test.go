package sim

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefs/leasefs/lease/paxos"
)

var (
	seedFlag   = flag.Int64("seed", -1, "replay one seed with a full trace (TestSeed)")
	unsafeFlag = flag.String("unsafe", "", "comma-separated broken variants for TestSeed (names as in brokenVariants)")
	inv1Flag   = flag.Bool("inv1", false, "TestSeed: check invariant 1 only, not acceptor backing")
)

// parseUnsafe turns "A,B" into the union of the named broken variants.
func parseUnsafe(t *testing.T, s string) paxos.Unsafe {
	var u paxos.Unsafe
	for _, name := range strings.Split(s, ",") {
		if name == "" {
			continue
		}
		found := false
		for _, v := range brokenVariants {
			if v.name == name {
				u = union(u, v.u)
				found = true
			}
		}
		if !found {
			t.Fatalf("unknown variant %q", name)
		}
	}
	return u
}

// seedCount is 10,000 (the normal run covers at least that many),
// 500 with -short, or LEASEFS_SEEDS=n.
func seedCount() int {
	if v, err := strconv.Atoi(os.Getenv("LEASEFS_SEEDS")); err == nil && v > 0 {
		return v
	}
	if testing.Short() {
		return 500
	}
	return 10000
}

// TestSeed replays one seed and prints its trace:
// go test ./internal/sim -run TestSeed -seed=N -v
func TestSeed(t *testing.T) {
	if *seedFlag < 0 {
		t.Skip("no -seed given")
	}
	r := Run(Options{Seed: uint64(*seedFlag), Trace: true, Unsafe: parseUnsafe(t, *unsafeFlag), OnlyInvariant1: *inv1Flag})
	for _, l := range r.Trace {
		t.Log(l)
	}
	if r.Violation != "" {
		t.Fatalf("seed %d: %s", r.Seed, r.Violation)
	}
}

// runSeeds runs seeds [0, n) on every core and returns the first failing
// result (lowest seed), if any.
func runSeeds(n int, u paxos.Unsafe, stopEarly bool) (fail *Result, ran int, events int64) {
	fail, ran, events, _ = runSeedsStats(n, u, stopEarly)
	return
}

func runSeedsStats(n int, u paxos.Unsafe, stopEarly bool) (fail *Result, ran int, events, acquired int64) {
	var acq atomic.Int64
	var (
		mu   sync.Mutex
		next atomic.Int64
		wg   sync.WaitGroup
		evs  atomic.Int64
		done atomic.Int64
	)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				seed := next.Add(1) - 1
				if seed >= int64(n) {
					return
				}
				mu.Lock()
				stop := stopEarly && fail != nil && uint64(seed) > fail.Seed
				mu.Unlock()
				if stop {
					return
				}
				r := Run(Options{Seed: uint64(seed), Unsafe: u})
				evs.Add(int64(r.Events))
				acq.Add(int64(r.Acquired))
				done.Add(1)
				if r.Violation != "" {
					mu.Lock()
					if fail == nil || r.Seed < fail.Seed {
						fail = &r
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return fail, int(done.Load()), evs.Load(), acq.Load()
}

func TestSeeds(t *testing.T) {
	n := seedCount()
	start := time.Now()
	fail, ran, evs, acq := runSeedsStats(n, paxos.Unsafe{}, false)
	t.Logf("%d seeds, %d events, %d acquisitions, %v", ran, evs, acq, time.Since(start))
	if acq < int64(ran) {
		t.Fatalf("only %d acquisitions in %d seeds: the workload does not exercise ownership", acq, ran)
	}
	if fail != nil {
		r := Run(Options{Seed: fail.Seed, Trace: true})
		tail := r.Trace
		if len(tail) > 200 {
			tail = tail[len(tail)-200:]
		}
		for _, l := range tail {
			t.Log(l)
		}
		t.Fatalf("seed %d (%s): %s\nreplay: go test ./internal/sim -run TestSeed -seed=%d -v", fail.Seed, fail.Profile, fail.Violation, fail.Seed)
	}
}

func TestDeterministic(t *testing.T) {
	for seed := range uint64(5) {
		a, b := Run(Options{Seed: seed, Trace: true}), Run(Options{Seed: seed, Trace: true})
		if a.Events != b.Events || a.Messages != b.Messages || len(a.Trace) != len(b.Trace) {
			t.Fatalf("seed %d: two runs differ: %d/%d events", seed, a.Events, b.Events)
		}
		for i := range a.Trace {
			if a.Trace[i] != b.Trace[i] {
				t.Fatalf("seed %d: traces differ at line %d:\n%s\n%s", seed, i, a.Trace[i], b.Trace[i])
			}
		}
	}
}
