package main

import (
	"context"
	"log/slog"
	"runtime"
	"syscall"
	"time"
)

// A server's GOMAXPROCS, unless --cpus or the environment fixes it,
// follows its load between one CPU and all of them. Go wakes an idle CPU
// at a hand-off between goroutines when it has one, and a request is
// handed on several times (QUIC connection, stream, store, badger's
// writer, sender): with small requests that costs more than it gains,
// while bulk data is received, copied and committed faster on several
// CPUs, where these overlap. So the server takes all CPUs while data moves
// in bulk or one CPU is not enough, and goes back to one after a second
// without either.
const (
	cpuTick       = 200 * time.Millisecond
	cpuBulkBytes  = 8 << 20 // request and reply bodies per tick: 40 MB/s (an untar's bursts stay below)
	cpuBusy       = 0.7     // CPU time per tick, as a fraction of the tick: one CPU nearly busy
	cpuQuietTicks = 5       // ticks without bulk data or load before one CPU
)

// cpuPolicy is the decision, apart from the clock and the process.
type cpuPolicy struct {
	max   int
	cur   int
	quiet int
}

// next returns the CPUs to use after a tick in which bytes moved and the
// process used cpu of the tick's time (1.0: one CPU busy throughout).
func (p *cpuPolicy) next(bytes int64, cpu float64) int {
	if bytes > cpuBulkBytes || cpu > cpuBusy {
		p.quiet = 0
		p.cur = p.max
	} else if p.quiet++; p.quiet >= cpuQuietTicks {
		p.cur = 1
	}
	return p.cur
}

// adaptCPUs runs the policy until ctx ends; moved returns the bytes the
// server moved so far.
func adaptCPUs(ctx context.Context, moved func() int64, log *slog.Logger) {
	p := &cpuPolicy{max: runtime.GOMAXPROCS(0), cur: runtime.GOMAXPROCS(0)}
	if p.max <= 1 {
		return
	}
	lastBytes, lastCPU := moved(), processCPU()
	t := time.NewTicker(cpuTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b, c := moved(), processCPU()
		was := p.cur
		n := p.next(b-lastBytes, float64(c-lastCPU)/float64(cpuTick))
		lastBytes, lastCPU = b, c
		if n != was {
			runtime.GOMAXPROCS(n)
			log.Debug("server CPUs", "cpus", n)
		}
	}
}

// processCPU returns the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
