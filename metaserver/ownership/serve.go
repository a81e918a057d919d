package ownership

// What this server answers its peers' calls about its replica.

import (
	"context"

	"github.com/leasefs/leasefs/internal/ids"
)

func (c *Owner) handleApply(_ context.Context, _ ids.ServerID, body []byte) []byte {
	changes, err := decodeChanges(body)
	if err == nil {
		err = c.repl.Apply(changes)
	}
	return statusReply(err)
}

func (c *Owner) handleReplState(_ context.Context, _ ids.ServerID, body []byte) []byte {
	d := &dec{b: body}
	ino := ids.Ino(d.u64())
	if d.err != nil {
		return statusReply(d.err)
	}
	ep, v, err := c.repl.State(ino)
	if err != nil {
		return statusReply(err)
	}
	e := &enc{}
	e.u8(stOK)
	e.u64(uint64(ep))
	e.u64(v)
	return e.b
}

// handleState serves one page of an inode's state (ReadStatePage).
func (c *Owner) handleState(ctx context.Context, _ ids.ServerID, body []byte) []byte {
	ino, after, maxBytes, err := decodeStateReq(body)
	if err != nil {
		return statusReply(err)
	}
	page, err := c.repl.ReadStatePage(ctx, ino, after, maxBytes)
	if err != nil {
		return statusReply(err)
	}
	return encodeStatePage(page)
}

// handleReplace stages one page of a transfer into this replica; the last
// one switches it in (StagePage).
func (c *Owner) handleReplace(ctx context.Context, _ ids.ServerID, body []byte) []byte {
	tr, seq, records, last, err := decodeStage(body)
	if err != nil {
		return statusReply(err)
	}
	done, err := c.repl.StagePage(ctx, tr, seq, records, last)
	if err != nil {
		return statusReply(err)
	}
	if done {
		return []byte{stOK, 1}
	}
	return []byte{stOK, 0}
}

func (c *Owner) handleRestamp(_ context.Context, _ ids.ServerID, body []byte) []byte {
	d := &dec{b: body}
	ino, ep, v, nep := ids.Ino(d.u64()), ids.Epoch(d.u64()), d.u64(), ids.Epoch(d.u64())
	if d.err != nil {
		return statusReply(d.err)
	}
	done, err := c.repl.Restamp(ino, ep, v, nep)
	if err != nil {
		return statusReply(err)
	}
	if done {
		return []byte{stOK, 1}
	}
	return []byte{stOK, 0}
}

func (c *Owner) handleDigest(_ context.Context, _ ids.ServerID, body []byte) []byte {
	d := &dec{b: body}
	after, max := ids.Ino(d.u64()), int(d.u32())
	if d.err != nil {
		return statusReply(d.err)
	}
	page, err := c.repl.Digest(after, min(max, 4096), false)
	if err != nil {
		return statusReply(err)
	}
	return encodePage(page)
}
