package metaserver

import (
	"context"
	"errors"
	"io"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// errNoBlockStore answers a block commit to a server without a block
// store: the client writes with OpWrite.
func errNoBlockStore(ino ids.Ino) *wire.Reply {
	return wire.ErrorReply(wire.Errf(wire.CodeNotSupported, "this server has no block store: write %v with OpWrite", ino))
}

// opCommitBlocks commits blocks the client put in the block store, only
// while it holds the file's X lock, which the commit pins (a revocation
// waits for it) but never acquires: the client put the blocks under that
// lock; a reclaim after a NACK (wire.WriteIfVersion) takes it instead,
// and applies only to the version it names. Once, as a write: a resend is
// answered from the current state. Every block must be in the block
// store, whole, before a map names it.
func (s *Server) opCommitBlocks(q *request) *wire.Reply {
	r := q.r
	if s.blocks == nil {
		return errNoBlockStore(r.Ino)
	}
	if r.ReqID == 0 {
		return wire.ErrorReply(wire.Errf(wire.CodeInvalid, "a block commit needs a request id"))
	}
	blks, exts, err := wire.ParseCommit(r.Data)
	if err != nil {
		return wire.ErrorReply(err)
	}
	commit := func() *wire.Reply { return s.writeOnce(q, func() *wire.Reply { return s.commitBlocks(q, blks, exts) }) }
	if r.Flags&wire.WriteIfVersion != 0 {
		// A reclaim after a NACK: the client's locks are gone, so the
		// commit takes X as a write does, and applies only to the
		// version the blocks' data was based on (nobody wrote since).
		return s.underLocks(q.ctx, q.sess, exclusive(r.Ino), commit)
	}
	h, ok := s.lm.pin(q.sess.client, r.Ino, locks.Exclusive)
	if !ok {
		return wire.ErrorReply(wire.Errf(wire.CodeAccess, "a block commit of %v needs the file's X lock, which the client does not hold", r.Ino))
	}
	if s.owner != nil && !s.owner.StillOwned([]ids.Ino{r.Ino}) {
		s.lm.done(h)
		return wire.ErrorReply(errUnavailable("inode %v changed owner", r.Ino))
	}
	// with the lock's grant, as a write's reply: the attributes it
	// carries are then the client's to cache
	return s.runLocked([]held{h}, commit)
}

// commitBlocks applies a block commit, once (writeOnce): its blocks must
// be in the store, and a reclaim's version must still be the file's.
func (s *Server) commitBlocks(q *request, blks []blockmap.Block, exts []blockmap.Extent) *wire.Reply {
	r := q.r
	if r.Flags&wire.WriteIfVersion != 0 {
		a, err := q.st.GetAttr(r.Ino)
		if err != nil {
			return wire.ErrorReply(err)
		}
		if a.Version != r.Version {
			return wire.ErrorReply(errStale(a.Version, r.Version))
		}
	}
	if err := s.checkUploaded(q.ctx, r.Ino, blks); err != nil {
		return wire.ErrorReply(err)
	}
	a, err := q.st.CommitBlocks(r.Ino, blks, exts, r.Size, q.now)
	if errors.Is(err, store.ErrNotMapped) {
		// its data was small enough for pages until now
		if err := s.convertPaged(q.ctx, r.Ino); err != nil {
			return wire.ErrorReply(err)
		}
		a, err = q.st.CommitBlocks(r.Ino, blks, exts, r.Size, q.now)
	}
	if err == nil {
		for _, b := range blks {
			s.blocks.used.add(int64(b.Size))
		}
		s.compact(q, r.Ino)
	}
	return attrReply(a, err)
}

// checkUploaded fails unless each of blks is in the block store with its
// size (CodeNotFound for a block never put, CodeInvalid for another size):
// it reads the block's last byte and finds nothing after it.
func (s *Server) checkUploaded(ctx context.Context, ino ids.Ino, blks []blockmap.Block) error {
	var b [1]byte
	for _, blk := range blks {
		id := blocks.ID{Ino: ino, Unique: blk.Unique}
		n, err := s.blocks.store.ReadAt(ctx, id, b[:], int64(blk.Size)-1)
		switch {
		case errors.Is(err, blocks.ErrNotFound):
			return wire.Errf(wire.CodeNotFound, "block %s is not in the block store", id)
		case n == 1:
			n, err = s.blocks.store.ReadAt(ctx, id, b[:], int64(blk.Size))
			if n == 0 && err == io.EOF {
				continue
			}
			if n == 1 {
				return wire.Errf(wire.CodeInvalid, "block %s is longer than %d bytes", id, blk.Size)
			}
		case err == io.EOF:
			return wire.Errf(wire.CodeInvalid, "block %s is shorter than %d bytes", id, blk.Size)
		}
		return wire.Errf(wire.CodeIO, "block %s: %v", id, err)
	}
	return nil
}

// opLookupBlocks returns the pieces of a range of a block-mapped file, at
// most wire.MaxPieces (the client asks again from where they end), under
// the S lock it takes and grants as opRead does. For a file whose data is
// in pages (every file of a server without a block store) it answers the
// bytes themselves, as opRead does, flagged wire.InlineData.
func (s *Server) opLookupBlocks(q *request) *wire.Reply {
	r := q.r
	return s.underLocks(q.ctx, q.sess, shared(r.Ino), func() *wire.Reply {
		if s.blocks != nil {
			ps, a, err := q.st.LookupBlocks(r.Ino, r.Off, r.Size)
			if err == nil {
				return &wire.Reply{Data: wire.AppendPieces(nil, ps[:min(len(ps), wire.MaxPieces)]), Attr: toWire(a)}
			}
			if !errors.Is(err, store.ErrNotMapped) {
				return wire.ErrorReply(err)
			}
		}
		// the S lock keeps the file paged: its conversion takes X
		data, a, err := q.st.ReadWithAttr(r.Ino, r.Off, int(min(r.Size, wire.MaxData)), transport.Buffer)
		if err != nil {
			return wire.ErrorReply(err)
		}
		if data == nil {
			data = []byte{}
		}
		return &wire.Reply{Flags: wire.InlineData, Data: data, Attr: toWire(a)}
	})
}

// pin marks an operation in flight under client c's lock on ino if c
// holds at least mode and is not being failed, so that a revocation waits
// for done(h); it never acquires a lock nor waits for one.
func (m *lockMgr) pin(c ids.ClientID, ino ids.Ino, mode locks.Mode) (held, bool) {
	key := holdKey{c, ino}
	m.mu.Lock()
	if m.core.Failing(c) || m.core.Mode(c, ino) < mode {
		m.mu.Unlock()
		return held{}, false
	}
	// granted at once: a mode held is granted again with its grant
	queued, err := m.core.Request(m.clk.Now(), c, ino, mode)
	if err != nil || queued {
		if queued {
			_ = m.core.Cancel(m.clk.Now(), c, ino)
		}
		m.unlock()
		return held{}, false
	}
	g, ok := m.unlockFor(key)
	return held{key, g, false}, ok
}
