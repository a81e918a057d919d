package admin

import (
	"encoding/json"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
)

// TestLatBuckets: every latency falls in the bucket whose bounds hold it,
// and the buckets are in order.
func TestLatBuckets(t *testing.T) {
	for _, d := range []int64{0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 100, 999, 1000, 4095, 4096, 1e6, 1e9, 123456789, 1 << 40, (1 << 41) - 1} {
		i := latBucket(d)
		lo, hi := latBounds(i)
		if d < lo || d >= hi {
			t.Errorf("latency %d in bucket %d [%d, %d)", d, i, lo, hi)
		}
	}
	if i := latBucket(math.MaxInt64); i != latBuckets-1 {
		t.Errorf("the longest latency in bucket %d, want the last", i)
	}
	if i := latBucket(-5); i != 0 {
		t.Errorf("a negative latency in bucket %d", i)
	}
	var prevHi int64
	for i := 8; i < latBuckets; i++ {
		lo, hi := latBounds(i)
		if lo != prevHi && prevHi != 0 || hi <= lo {
			t.Fatalf("bucket %d [%d, %d) after one ending at %d", i, lo, hi, prevHi)
		}
		prevHi = hi
	}
}

// TestLatencyQuantiles: percentiles of a known distribution come out
// within a bucket's width (a quarter).
func TestLatencyQuantiles(t *testing.T) {
	var h latencyHist
	for i := 1; i <= 1000; i++ {
		h.observe(time.Duration(i) * time.Microsecond) // 1µs .. 1ms, uniform
	}
	c := h.snapshot()
	q, mean := c.quantiles(0.5, 0.99)
	near := func(got, want time.Duration) bool { return math.Abs(float64(got-want)) <= 0.25*float64(want) }
	if !near(q[0], 500*time.Microsecond) || !near(q[1], 990*time.Microsecond) {
		t.Errorf("p50 %v p99 %v, want about 500µs and 990µs", q[0], q[1])
	}
	if mean != 500500*time.Nanosecond {
		t.Errorf("mean %v, want 500.5µs", mean)
	}
	var empty latencyCounts
	if q, mean := empty.quantiles(0.5); q[0] != 0 || mean != 0 {
		t.Errorf("quantiles of nothing: %v %v", q, mean)
	}
}

// TestTrendRing: the first totals are a baseline; each later one adds the
// rates of its interval; the ring keeps its capacity, oldest first.
func TestTrendRing(t *testing.T) {
	r := newTrendRing(3)
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tot := func(sec int, req, nacks, revs, in, out int64, lat ...time.Duration) trendTotals {
		var h latencyHist
		for _, d := range lat {
			h.observe(d)
		}
		return trendTotals{at: clock.Time(sec) * clock.Time(time.Second), wall: base.Add(time.Duration(sec) * time.Second),
			requests: req, nacks: nacks, revocations: revs, bytesIn: in, bytesOut: out, latency: h.snapshot()}
	}
	r.add(tot(1, 10, 0, 0, 100, 200))
	if got := r.samples(); len(got) != 0 {
		t.Fatalf("a sample from the baseline alone: %+v", got)
	}
	r.add(tot(3, 30, 4, 2, 2100, 4200, time.Millisecond, time.Millisecond))
	got := r.samples()
	if len(got) != 1 {
		t.Fatalf("%d samples, want 1", len(got))
	}
	s := got[0]
	if s.RequestsPerSec != 10 || s.Requests != 20 || s.NacksPerSec != 2 || s.RevocationsPerSec != 1 ||
		s.BytesInPerSec != 1000 || s.BytesOutPerSec != 2000 || s.Interval != 2*time.Second || !s.Time.Equal(base.Add(3*time.Second)) {
		t.Errorf("sample %+v", s)
	}
	if s.LatencyMean != time.Millisecond || s.LatencyP50 < 750*time.Microsecond || s.LatencyP50 > 1250*time.Microsecond {
		t.Errorf("latency of the interval: p50 %v mean %v, want about 1ms", s.LatencyP50, s.LatencyMean)
	}
	for i := range 5 {
		r.add(tot(5+2*i, int64(40+10*i), 4, 2, 2100, 4200, time.Millisecond, time.Millisecond))
	}
	got = r.samples()
	if len(got) != 3 {
		t.Fatalf("%d samples in a ring of 3", len(got))
	}
	for i, s := range got {
		if want := base.Add(time.Duration(9+2*i) * time.Second); !s.Time.Equal(want) || s.RequestsPerSec != 5 || s.LatencyP50 != 0 {
			t.Errorf("sample %d: %+v, want at %v, 5 requests/s, no latency (cumulative counts unchanged)", i, s, want)
		}
	}
	// the same instant again: no interval, no sample
	r.add(tot(13, 100, 4, 2, 2100, 4200))
	if n := len(r.samples()); n != 3 {
		t.Errorf("%d samples after a zero interval", n)
	}
}

// TestSampler: in a synctest bubble, the sampler takes one sample per
// period, keeps ten minutes of them, and stops.
func TestSampler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var reqs atomic.Int64
		read := func() trendTotals { return trendTotals{wall: time.Now(), requests: reqs.Add(20)} }
		s := newSampler(2*time.Second, clock.Real{}, read)
		s.start()
		defer s.stop()
		time.Sleep(10*time.Second + time.Millisecond)
		synctest.Wait()
		tr := s.trends()
		if len(tr.Samples) != 5 || tr.Period != 2*time.Second || tr.Window != TrendWindow {
			t.Fatalf("after 10 s: %d samples, period %v, window %v", len(tr.Samples), tr.Period, tr.Window)
		}
		for _, x := range tr.Samples {
			if x.RequestsPerSec != 10 {
				t.Errorf("sample %+v: want 10 requests/s", x)
			}
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if n := len(s.trends().Samples); n != 300 {
			t.Fatalf("after an hour: %d samples, want 300 (10 minutes)", n)
		}
		last := s.trends().Samples[299]
		if since := time.Since(last.Time); since < 0 || since >= 2*time.Second {
			t.Errorf("last sample at %v, now is %v", last.Time, time.Now())
		}
		b, err := json.Marshal(s.trends())
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{`"period_ns":2000000000`, `"requests_per_sec":10`, `"latency_p99_ns":0`, `"bytes_in_per_sec":0`, `"time":"20`} {
			if !strings.Contains(string(b), key) {
				t.Errorf("/api/trends JSON lacks %s: %.300s", key, b)
			}
		}
	})
}

// TestSamplerBound: a tiny period still keeps a bounded ring.
func TestSamplerBound(t *testing.T) {
	s := newSampler(time.Millisecond, clock.Real{}, func() trendTotals { return trendTotals{} })
	if n := len(s.ring.buf); n != maxTrendSamples {
		t.Errorf("ring of %d samples for a 1 ms period, want %d", n, maxTrendSamples)
	}
}
