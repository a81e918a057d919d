package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// ErrClosed is what a request fails with once Shutdown gave up on the
// servers (a mount's FUSE request sees EIO).
var ErrClosed = errors.New("client: shut down")

// ErrDataLost: Shutdown could not send everything the client buffered.
var ErrDataLost = errors.New("client: buffered changes lost")

// shutdownGrace is how long after its context ended Shutdown waits for
// the requests it ended to return before it reports and returns anyway.
const shutdownGrace = 500 * time.Millisecond

// Shutdown sends what the client buffered (writes, attribute changes,
// creates and removals sent behind the caller), ends its sessions (their
// locks go at once) and closes its connections, all within ctx. When ctx
// ends first, every request still waiting for a server fails (ErrClosed),
// and each file whose buffered changes were not sent is logged as DATA
// LOST with its path; the error then wraps ErrDataLost. It returns at
// most shutdownGrace after ctx ended, whatever still waits. Call it once.
func (c *Client) Shutdown(ctx context.Context) error {
	defer context.AfterFunc(ctx, c.abort)()
	done := make(chan error, 1)
	go func() { done <- c.shutdown(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	t := time.NewTimer(shutdownGrace)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		// a wait the abort did not end (not a request to a server): what
		// is still buffered is reported from here
		c.log.Error("shutdown did not finish in time", "err", ctx.Err())
		return c.ReportUnsent("the mount stopped before it could send them")
	}
}

func (c *Client) shutdown(ctx context.Context) error {
	_ = c.wb.flushAll(ctx) // each failure is logged
	for _, cn := range c.live() {
		c.mu.Lock()
		open := cn.hasSession()
		c.mu.Unlock()
		if open {
			_, _ = c.send(ctx, &wire.Request{Op: wire.OpGoodbye}, sendOpts{to: cn})
		}
	}
	// Whatever still waits for a server (a renewal, a FUSE request on a
	// server that went away) ends now.
	c.abort()
	close(c.stop)
	c.wg.Wait()
	for _, cn := range c.live() {
		cn.tr.Close()
		c.mu.Lock()
		nb := cn.blocks
		c.mu.Unlock()
		nb.close()
	}
	return c.ReportUnsent("no server took them before the mount stopped")
}

// Unsent is a file whose buffered changes have not reached a server.
type Unsent struct {
	Ino   ids.Ino
	Path  string // "" if the mount does not know it
	Bytes int    // buffered data; -1 if a flush of it is under way
}

// Unsent lists the files whose buffered changes have not reached a
// server, without waiting for anything.
func (c *Client) Unsent() []Unsent {
	out := c.wb.unsent()
	slices.SortFunc(out, func(a, b Unsent) int { return cmp.Compare(a.Ino, b.Ino) })
	return out
}

// ReportUnsent logs each file Unsent lists as DATA LOST, saying why, and
// returns an error wrapping ErrDataLost if there is any.
func (c *Client) ReportUnsent(why string) error {
	lost := c.Unsent()
	for _, u := range lost {
		c.Counters.DataLost.Add(1)
		c.log.Error("DATA LOST: buffered writes not sent: "+why, "path", u.Path, "ino", u.Ino, "bytes", u.Bytes)
	}
	if len(lost) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d files' buffered writes", ErrDataLost, len(lost))
}
