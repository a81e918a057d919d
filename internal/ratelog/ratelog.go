// Package ratelog bounds the log lines one peer can cause: a server logs a
// WARN for each malformed request or refused connection, and a peer that
// sends them in a loop would otherwise fill the disk with them and drown
// the lines that matter.
//
// Each peer (an IP address) has a bucket of Burst lines, refilled by one
// every Every. A line that finds the bucket empty is dropped and counted;
// the next line let through for that peer carries the count. At most
// MaxPeers buckets are kept: when full, buckets back at Burst with nothing
// counted are dropped (they are as good as new; one sweep per Every at
// most), and if none is, lines of peers without a bucket are dropped and
// counted under no peer.
package ratelog

import (
	"log/slog"
	"net"
	"sync"
	"time"
)

// Defaults: ten lines at once, then ten a minute, per peer.
const (
	DefaultBurst    = 10
	DefaultEvery    = 6 * time.Second
	DefaultMaxPeers = 4096
)

// Limiter decides which lines to log. It is safe for concurrent use.
type Limiter struct {
	burst    float64
	every    time.Duration
	maxPeers int

	mu       sync.Mutex
	peers    map[string]*bucket
	swept    time.Time // the last sweep: at most one per every
	overflow int       // lines dropped for peers that found no room for a bucket
}

type bucket struct {
	tokens  float64
	last    time.Time
	dropped int
}

// New returns a Limiter with the defaults.
func New() *Limiter { return NewLimiter(DefaultBurst, DefaultEvery, DefaultMaxPeers) }

// NewLimiter returns a Limiter that lets burst lines through per peer at
// once, then one every every, for at most maxPeers peers.
func NewLimiter(burst int, every time.Duration, maxPeers int) *Limiter {
	return &Limiter{burst: float64(max(burst, 1)), every: max(every, time.Nanosecond),
		maxPeers: max(maxPeers, 1), peers: map[string]*bucket{}}
}

// Allow reports whether a line about peer may be logged at now and, if so,
// how many lines about it were dropped since the last one let through.
func (l *Limiter) Allow(peer string, now time.Time) (ok bool, dropped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.peers[peer]
	if b == nil {
		if len(l.peers) >= l.maxPeers && now.Sub(l.swept) >= l.every {
			l.sweep(now)
		}
		if len(l.peers) >= l.maxPeers {
			l.overflow++
			return false, 0
		}
		b = &bucket{tokens: l.burst, last: now}
		l.peers[peer] = b
	}
	l.refill(b, now)
	if b.tokens < 1 {
		b.dropped++
		return false, 0
	}
	b.tokens--
	dropped, b.dropped = b.dropped, 0
	return true, dropped
}

// Overflow is the number of lines dropped because every bucket was in use.
func (l *Limiter) Overflow() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.overflow
}

func (l *Limiter) refill(b *bucket, now time.Time) {
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(l.burst, b.tokens+float64(d)/float64(l.every))
		b.last = now
	}
}

// sweep drops the buckets that are full again and owe no count.
func (l *Limiter) sweep(now time.Time) {
	l.swept = now
	for p, b := range l.peers {
		l.refill(b, now)
		if b.tokens >= l.burst && b.dropped == 0 {
			delete(l.peers, p)
		}
	}
}

// Warn logs msg at WARN level unless peer has used up its lines; a line
// after dropped ones says how many ("suppressed").
func (l *Limiter) Warn(log *slog.Logger, peer, msg string, args ...any) {
	ok, dropped := l.Allow(peer, time.Now())
	if !ok {
		return
	}
	if dropped > 0 {
		args = append(args, "suppressed", dropped)
	}
	log.Warn(msg, args...)
}

// Peer is the key of a remote address: its IP, as a peer can open
// connections from any number of ports.
// It takes net.Addr.String()'s form.
func Peer(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return host
}
