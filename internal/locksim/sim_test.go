package locksim

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func seeds() int {
	if os.Getenv("LEASEFS_LONG") != "" {
		return 10000
	}
	if testing.Short() {
		return 100
	}
	return 500
}

func report(t *testing.T, res Result) {
	t.Helper()
	cfg := res.Config
	cfg.Trace = true
	again := Run(cfg)
	tr := again.Trace
	if len(tr) > 300 {
		tr = tr[len(tr)-300:]
	}
	t.Fatalf("seed %d (%s): %s\nreplay: %s\nlast events:\n%s", cfg.Seed, cfg.Broken, res.Violation, res.Replay(), strings.Join(tr, "\n"))
}

func TestSeeds(t *testing.T) {
	start := time.Now()
	var total Stats
	n := seeds()
	for seed := 0; seed < n; seed++ {
		res := Run(RandomConfig(uint64(seed)))
		if res.Violation != "" {
			report(t, res)
		}
		s := res.Stats
		total.Events += s.Events
		total.Grants += s.Grants
		total.Revokes += s.Revokes
		total.Fails += s.Fails
		total.Steals += s.Steals
		total.Nacks += s.Nacks
		total.Restarts += s.Restarts
		total.Reclaims += s.Reclaims
		total.Freezes += s.Freezes
		total.Partitions += s.Partitions
		total.LivenessGrants += s.LivenessGrants
		total.MaxBelieversPerInode = max(total.MaxBelieversPerInode, s.MaxBelieversPerInode)
		total.Messages += s.Messages
		total.Dropped += s.Dropped
		total.ExplicitRenewals += s.ExplicitRenewals
		total.ClientRequest += s.ClientRequest
	}
	t.Logf("%d seeds in %v: %+v", n, time.Since(start).Round(time.Millisecond), total)
	// The faults must actually have exercised the dangerous paths.
	if total.Fails == 0 || total.Steals == 0 || total.Restarts == 0 || total.Reclaims == 0 || total.Nacks == 0 || total.MaxBelieversPerInode < 2 {
		t.Fatalf("fault profile too tame: %+v", total)
	}
}

// TestReplay reruns one seed with a trace: LOCKSIM_SEED=n, optionally
// LOCKSIM_BROKEN=lease-from-receive,steal-without-wait,no-grace,ignore-seq,ignore-delta.
func TestReplay(t *testing.T) {
	v := os.Getenv("LOCKSIM_SEED")
	if v == "" {
		t.Skip("set LOCKSIM_SEED")
	}
	seed, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	cfg := RandomConfig(seed)
	for _, b := range strings.Split(os.Getenv("LOCKSIM_BROKEN"), ",") {
		switch b {
		case "":
		case "lease-from-receive":
			cfg.Broken.LeaseFromReceive = true
		case "steal-without-wait":
			cfg.Broken.StealWithoutWait = true
		case "no-grace":
			cfg.Broken.NoGrace = true
		case "ignore-seq":
			cfg.Broken.IgnoreSeq = true
		case "ignore-delta":
			cfg.Broken.IgnoreDelta = true
			cfg.Lease.Delta, cfg.DeliveryTimeout, cfg.Faults.ExtremeRates = 0.5, cfg.Lease.Tau/20, true
		default:
			t.Fatalf("unknown broken variant %q", b)
		}
	}
	cfg.Trace = true
	res := Run(cfg)
	for _, l := range res.Trace {
		t.Log(l)
	}
	if res.Violation != "" {
		t.Fatal(res.Violation)
	}
}

func TestDeterministic(t *testing.T) {
	a, b := Run(RandomConfig(42)), Run(RandomConfig(42))
	if a.Stats != b.Stats || a.Violation != b.Violation {
		t.Fatalf("same seed, different runs:\n%+v\n%+v", a.Stats, b.Stats)
	}
}
