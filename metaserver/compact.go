package metaserver

// Compaction of block-mapped files: a file written in many small pieces
// (appends, random writes with fsync) gets a block and an extent for each;
// after each write of it commits, the server merges them as
// blockmap.Map.CompactPlan says, so that the number of blocks and extents
// stays small and each byte is rewritten a bounded number of times.
//
// It runs under the writer's X lock and the file's write mutex, before the
// write's reply: no other mount holds an S lock or a cached map of the
// file, the writer dropped its cached map when it buffered the write, and
// the blocks a compaction frees are garbage, deleted only after the
// garbage delay, as an overwrite's are, for reads already under way.

import (
	"context"
	"errors"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/wire"
)

// compactBudget bounds the bytes one write's compactions rewrite, so that
// no reply waits long: a file with more to do is compacted further at its
// next writes.
const compactBudget = 8 << 20

// compact runs the compactions due on block-mapped file ino after a write
// of it committed (writeOnce, under its X lock). A failure is logged and
// leaves the map as it was: the write is committed already.
func (s *Server) compact(q *request, ino ids.Ino) {
	// recorded with the inode, as its other changes, but no client
	// request's: a resend of the write must still find the write's record
	st := q.st.For(store.Origin{Ino: ino})
	for done := uint64(0); done < compactBudget; {
		m, err := st.BlockMap(ino)
		if err != nil {
			s.compactFailed(ino, err)
			return
		}
		p, ok := m.CompactPlan()
		if !ok {
			return
		}
		if err := s.compactOnce(q.ctx, st, m, p, q.now); err != nil {
			s.compactFailed(ino, err)
			return
		}
		done += p.Size
	}
}

// compactOnce copies plan p's extents of m, verified, into a new block and
// commits it.
func (s *Server) compactOnce(ctx context.Context, st *store.Store, m *blockmap.Map, p blockmap.Plan, now int64) error {
	data := make([]byte, p.Size)
	read := blockmap.ReadVerified(ctx, s.blocks.store)
	at := uint64(0)
	for _, e := range p.Extents {
		ps, err := m.Lookup(e.Off, e.Len)
		if err != nil {
			return err
		}
		end, _, err := blockmap.ReadPieces(e.Off, ps, data[at:at+e.Len], read)
		if err == nil && end != e.End() {
			err = blockmap.ErrCorrupt
		}
		if err != nil {
			return err
		}
		at += e.Len
	}
	id := blocks.NewID(m.Ino())
	if err := s.put(ctx, id, data); err != nil {
		return err
	}
	freed, err := st.CompactBlocks(m.Ino(), p, blockmap.Block{Unique: id.Unique, Size: p.Size, Sums: blocks.Sum(data)}, now)
	if err != nil {
		s.dropUnused(id)
		return err
	}
	s.blocks.used.add(int64(p.Size))
	s.counters.Compactions.Add(1)
	s.counters.CompactedBytes.Add(int64(p.Size))
	s.log.Debug("blocks compacted", "ino", m.Ino(), "extents", len(p.Extents), "bytes", p.Size,
		"sparse", p.Sparse, "freed", freed)
	return nil
}

// compactFailed logs why a compaction did not happen: a full block store
// quietly (the next write tries again), anything else as a warning, a few
// a minute.
func (s *Server) compactFailed(ino ids.Ino, err error) {
	var we *wire.Error
	if errors.As(err, &we) && (we.Code == wire.CodeNoSpace || we.Code == wire.CodeInterrupted) {
		s.log.Debug("compaction skipped", "ino", ino, "err", err)
		return
	}
	s.warns.Warn(s.log, "compaction", "compaction of a file's blocks failed; the file is as written", "ino", ino, "err", err)
}
