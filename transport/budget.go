package transport

import (
	"context"
	"sync"
)

// budget bounds bytes held on behalf of peers: a reservation waits while
// it does not fit. Each request body is reserved whole, on the server's
// budget and on its connection's, before it is read and until its handler
// returns: every body admitted can then be read to its end, so bodies
// being received never wait for each other's bytes (a budget shared by
// half-read bodies that all wait for more would deadlock).
type budget struct {
	max int64

	mu      sync.Mutex
	used    int64
	waiters int
	wake    chan struct{} // closed and replaced when bytes are given back to waiters
}

func newBudget(max int64) *budget { return &budget{max: max, wake: make(chan struct{})} }

// acquire reserves n bytes (n <= max), waiting until they fit or ctx ends.
func (b *budget) acquire(ctx context.Context, n int64) error {
	for {
		b.mu.Lock()
		if b.used+n <= b.max {
			b.used += n
			b.mu.Unlock()
			return nil
		}
		wake := b.wake
		b.waiters++
		b.mu.Unlock()
		var err error
		select {
		case <-wake:
		case <-ctx.Done():
			err = ctx.Err()
		}
		b.mu.Lock()
		b.waiters--
		b.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// take reserves n bytes without waiting, over max if need be.
func (b *budget) take(n int64) {
	b.mu.Lock()
	b.used += n
	b.mu.Unlock()
}

// release gives back n bytes.
func (b *budget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	if b.used < 0 {
		panic("transport: budget released more than was acquired")
	}
	if b.waiters > 0 {
		close(b.wake)
		b.wake = make(chan struct{})
	}
	b.mu.Unlock()
}

// inUse returns the bytes reserved.
func (b *budget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
