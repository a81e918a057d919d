package client

import (
	"context"
	"errors"

	"github.com/leasefs/leasefs/wire"
)

// StatFs returns file system usage. When no server can be reached (a
// soft mount's timeout passed, or the client is shut down) it returns the
// last usage a server reported, if any: df and umount, which ask for it,
// then answer instead of failing. (A hard mount waits for a server, as
// for everything else.)
func (c *Client) StatFs(ctx context.Context) (*wire.StatFs, error) {
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpStatFs})
	if err == nil && rep.StatFs == nil {
		err = wire.Errf(wire.CodeIO, "statfs reply without data")
	}
	if err != nil {
		if last := c.statfs.Load(); last != nil && (errors.Is(err, ErrTimeout) || errors.Is(err, ErrClosed)) {
			c.log.Debug("statfs: no server reachable; answering with the last usage known", "err", err)
			s := *last
			return &s, nil
		}
		return nil, err
	}
	s := *rep.StatFs
	c.statfs.Store(&s)
	return rep.StatFs, nil
}
