package admin

// Trends: every refresh period the endpoint reads the server's cumulative
// counts and keeps the differences of the last ten minutes in a fixed
// ring, for the status page's sparklines and /api/trends.

import (
	"context"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefs/leasefs/internal/clock"
)

// TrendWindow is how far back the trends reach.
const TrendWindow = 10 * time.Minute

// maxTrendSamples bounds the ring whatever the refresh period.
const maxTrendSamples = 1200

// TrendSample is what happened in one sampling interval, ending at Time.
// Rates are per second; latencies come from the requests answered in the
// interval (zero if none was).
type TrendSample struct {
	Time              time.Time     `json:"time"` // RFC 3339
	Interval          time.Duration `json:"interval_ns"`
	Requests          int64         `json:"requests"`
	RequestsPerSec    float64       `json:"requests_per_sec"`
	LatencyP50        time.Duration `json:"latency_p50_ns"`
	LatencyP99        time.Duration `json:"latency_p99_ns"`
	LatencyMean       time.Duration `json:"latency_mean_ns"`
	NacksPerSec       float64       `json:"nacks_per_sec"`
	RevocationsPerSec float64       `json:"revocations_per_sec"`
	BytesInPerSec     float64       `json:"bytes_in_per_sec"`
	BytesOutPerSec    float64       `json:"bytes_out_per_sec"`
}

// Trends is /api/trends: the samples, oldest first.
type Trends struct {
	Period  time.Duration `json:"period_ns"`
	Window  time.Duration `json:"window_ns"`
	Samples []TrendSample `json:"samples"`
}

// Latency histogram: four buckets per power of two of nanoseconds, so a
// percentile read from it is off by at most a quarter, at a fixed size
// that an atomic add per request fills.
const (
	latSub     = 4
	latOctaves = 41 // up to 2^41 ns, about 37 minutes; longer counts there
	latBuckets = latSub * latOctaves
)

// latBucket is the bucket of a latency of d ns.
func latBucket(d int64) int {
	if d < latSub {
		return int(max(d, 0))
	}
	e := bits.Len64(uint64(d)) - 1 // 2^e <= d < 2^(e+1)
	if e >= latOctaves {
		return latBuckets - 1
	}
	sub := int(d>>(e-2)) & (latSub - 1)
	return e*latSub + sub
}

// latBounds are the latencies bucket i holds: [lo, hi) ns.
func latBounds(i int) (lo, hi int64) {
	e, sub := i/latSub, int64(i%latSub)
	if e < 2 {
		return int64(i), int64(i) + 1
	}
	return (latSub + sub) << (e - 2), (latSub + sub + 1) << (e - 2)
}

// latencyHist counts request latencies; safe for concurrent use.
type latencyHist struct {
	n   [latBuckets]atomic.Int64
	sum atomic.Int64 // ns
}

func (h *latencyHist) observe(d time.Duration) {
	h.n[latBucket(int64(d))].Add(1)
	h.sum.Add(int64(d))
}

// latencyCounts is a copy of a latencyHist's counts.
type latencyCounts struct {
	n   [latBuckets]int64
	sum int64
}

func (h *latencyHist) snapshot() (c latencyCounts) {
	for i := range h.n {
		c.n[i] = h.n[i].Load()
	}
	c.sum = h.sum.Load()
	return c
}

// quantiles returns the latencies below which the fractions qs of the
// counts d fall, interpolated within a bucket, and their mean.
func (d *latencyCounts) quantiles(qs ...float64) (out []time.Duration, mean time.Duration) {
	var total int64
	for _, n := range d.n {
		total += n
	}
	out = make([]time.Duration, len(qs))
	if total <= 0 {
		return out, 0
	}
	for j, q := range qs {
		rank := q * float64(total)
		var seen int64
		for i, n := range d.n {
			if n <= 0 || float64(seen+n) < rank {
				seen += n
				continue
			}
			lo, hi := latBounds(i)
			out[j] = time.Duration(float64(lo) + float64(hi-lo)*(rank-float64(seen))/float64(n))
			break
		}
	}
	return out, time.Duration(d.sum / total)
}

// trendTotals are the server's cumulative counts at one instant.
type trendTotals struct {
	at                           clock.Time
	wall                         time.Time
	requests, nacks, revocations int64
	bytesIn, bytesOut            int64
	latency                      latencyCounts
}

// trendRing keeps the last samples, each the difference of two
// consecutive totals. It is a pure value: the sampler feeds it.
type trendRing struct {
	buf   []TrendSample // fixed length: the capacity
	next  int           // where the next sample goes
	n     int           // samples held
	prev  trendTotals
	fresh bool // prev holds a first totals
}

func newTrendRing(capacity int) *trendRing {
	return &trendRing{buf: make([]TrendSample, min(max(capacity, 1), maxTrendSamples))}
}

// add takes the next totals and, from the second on, records a sample.
// Totals that go backwards (a counter reset) record nothing.
func (r *trendRing) add(t trendTotals) {
	p := r.prev
	r.prev = t
	if !r.fresh {
		r.fresh = true
		return
	}
	iv := t.at.Sub(p.at)
	if iv <= 0 || t.requests < p.requests {
		return
	}
	sec := iv.Seconds()
	rate := func(now, before int64) float64 { return float64(max(now-before, 0)) / sec }
	var d latencyCounts
	for i := range d.n {
		d.n[i] = max(t.latency.n[i]-p.latency.n[i], 0)
	}
	d.sum = t.latency.sum - p.latency.sum
	q, mean := d.quantiles(0.5, 0.99)
	r.buf[r.next] = TrendSample{Time: t.wall, Interval: iv, Requests: t.requests - p.requests,
		RequestsPerSec: rate(t.requests, p.requests), LatencyP50: q[0], LatencyP99: q[1], LatencyMean: mean,
		NacksPerSec: rate(t.nacks, p.nacks), RevocationsPerSec: rate(t.revocations, p.revocations),
		BytesInPerSec: rate(t.bytesIn, p.bytesIn), BytesOutPerSec: rate(t.bytesOut, p.bytesOut)}
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
}

// samples returns a copy of the samples, oldest first.
func (r *trendRing) samples() []TrendSample {
	out := make([]TrendSample, 0, r.n)
	for i := range r.n {
		out = append(out, r.buf[(r.next-r.n+i+len(r.buf))%len(r.buf)])
	}
	return out
}

// sampler feeds a trendRing every period from read (which need not set
// at), in its own goroutine, on an injected clock.
type sampler struct {
	period time.Duration
	clk    clock.Clock
	read   func() trendTotals

	mu   sync.Mutex
	ring *trendRing

	cancel context.CancelFunc
	done   chan struct{}
}

func newSampler(period time.Duration, clk clock.Clock, read func() trendTotals) *sampler {
	if clk == nil {
		clk = clock.Real{}
	}
	capacity := int((TrendWindow + period - 1) / period)
	return &sampler{period: period, clk: clk, read: read, ring: newTrendRing(capacity), done: make(chan struct{})}
}

// start takes the first totals now and samples every period until stop.
func (s *sampler) start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.sample()
	go func() {
		defer close(s.done)
		for clock.Sleep(ctx, s.clk, s.period) == nil {
			s.sample()
		}
	}()
}

func (s *sampler) sample() {
	t := s.read()
	t.at = s.clk.Now()
	s.mu.Lock()
	s.ring.add(t)
	s.mu.Unlock()
}

// stop ends the sampling goroutine and waits for it.
func (s *sampler) stop() {
	s.cancel()
	<-s.done
}

// trends returns the samples, oldest first.
func (s *sampler) trends() Trends {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Trends{Period: s.period, Window: time.Duration(len(s.ring.buf)) * s.period, Samples: s.ring.samples()}
}
