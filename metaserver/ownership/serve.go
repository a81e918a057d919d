package ownership

// What this server answers its peers' calls about its replica.

import (
	"context"

	"github.com/leasefs/leasefs/internal/ids"
)

func (c *Owner) handleApply(_ context.Context, _ ids.ServerID, body []byte) []byte {
	var req applyReq
	err := req.Parse(body)
	if err == nil {
		err = c.repl.Apply(req.Changes)
	}
	return statusReply(err)
}

func (c *Owner) handleReplState(_ context.Context, _ ids.ServerID, body []byte) []byte {
	var req inoReq
	if err := req.Parse(body); err != nil {
		return statusReply(err)
	}
	ep, v, err := c.repl.State(req.Ino)
	if err != nil {
		return statusReply(err)
	}
	return okReply(&replStateRep{Epoch: ep, Version: v})
}

// handleState serves one page of an inode's state (ReadStatePage).
func (c *Owner) handleState(ctx context.Context, _ ids.ServerID, body []byte) []byte {
	var req stateReq
	if err := req.Parse(body); err != nil {
		return statusReply(err)
	}
	page, err := c.repl.ReadStatePage(ctx, req.Ino, req.After, int(min(req.MaxBytes, transferPage)))
	if err != nil {
		return statusReply(err)
	}
	return okReply(&statePageRep{Page: page})
}

// handleReplace stages one page of a transfer into this replica; the last
// one switches it in (StagePage).
func (c *Owner) handleReplace(ctx context.Context, _ ids.ServerID, body []byte) []byte {
	var req stageReq
	if err := req.Parse(body); err != nil {
		return statusReply(err)
	}
	done, err := c.repl.StagePage(ctx, req.Tr, req.Seq, req.Records, req.Last)
	if err != nil {
		return statusReply(err)
	}
	return okReply(&doneRep{Done: done})
}

func (c *Owner) handleRestamp(_ context.Context, _ ids.ServerID, body []byte) []byte {
	var req restampReq
	if err := req.Parse(body); err != nil {
		return statusReply(err)
	}
	done, err := c.repl.Restamp(req.Ino, req.Epoch, req.Version, req.NewEpoch)
	if err != nil {
		return statusReply(err)
	}
	return okReply(&doneRep{Done: done})
}

func (c *Owner) handleDigest(_ context.Context, _ ids.ServerID, body []byte) []byte {
	var req digestReq
	if err := req.Parse(body); err != nil {
		return statusReply(err)
	}
	page, err := c.repl.Digest(req.After, int(min(req.Max, 4096)), false)
	if err != nil {
		return statusReply(err)
	}
	return okReply(&digestRep{Page: page})
}
