package metaserver

// The server's own reads and writes of block-mapped files: a write through
// the QUIC path of a file that is (or becomes) larger than wire.InlineMax
// is put as a block by the server and committed as the client's
// OpCommitBlocks would be; a read of a block-mapped file is answered from
// its blocks. This keeps every client working whatever its data path, and
// serves a client that cannot reach the block store.

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// writeBlock writes q's data as one new block of its file, holding the
// spans' bytes one after another (appended at the file's end if
// appending), and commits it with the write's attribute changes in the
// request's transaction. A file whose data is in pages is converted
// between the two: a block store without room for the write then leaves
// the file as it was. Under the file's X lock and write mutex
// (writeOnce).
func (s *Server) writeBlock(q *request, spans []wire.Span, appending bool) *wire.Reply {
	r := q.r
	id := blocks.NewID(r.Ino)
	if err := s.put(q.ctx, id, r.Data); err != nil {
		return wire.ErrorReply(err)
	}
	a, used, err := s.commitWrite(q, id, spans, appending)
	if !used {
		s.dropUnused(id)
	} else if err == nil {
		s.blocks.used.add(int64(len(r.Data)))
		s.compact(q, r.Ino)
	}
	return attrReply(a, err)
}

// commitWrite commits block id, put with q's data, as writeBlock says, and
// reports whether it did: a file too big to convert is written in pages
// instead.
func (s *Server) commitWrite(q *request, id blocks.ID, spans []wire.Span, appending bool) (a store.Attr, used bool, err error) {
	r := q.r
	if err := s.convertPaged(q.ctx, r.Ino); errors.Is(err, store.ErrTooBigToConvert) {
		// a big file of a cluster's old data directory: it stays in pages
		a, err := s.writePages(q, spans, appending)
		return a, false, err
	} else if err != nil {
		return a, false, err
	}
	blk := blockmap.Block{Unique: id.Unique, Size: uint64(len(r.Data)), Sums: blocks.Sum(r.Data)}
	if appending {
		a, err = q.st.AppendBlock(r.Ino, blk, setAttrIn(r), q.now)
	} else {
		a, err = q.st.WriteBlock(r.Ino, blk, spans, setAttrIn(r), q.now)
	}
	return a, err == nil, err
}

// dropUnused deletes block id, which the server put and did not commit, at
// once on a single server: no map names it and no client knew of it. In a
// cluster a failed commit may still be on a minority of replicas, so the
// collector removes it as an orphan once it knows.
func (s *Server) dropUnused(id blocks.ID) {
	if s.owner != nil {
		return
	}
	if err := s.blocks.store.Delete(context.Background(), id); err != nil {
		s.log.Warn("deleting a block not committed", "block", id, "err", err)
	}
}

// convertPaged moves the data of ino from pages to blocks if it is in
// pages, under the file's X lock and write mutex. The conversion is no
// part of the request's change: a resend must still make the change.
func (s *Server) convertPaged(ctx context.Context, ino ids.Ino) error {
	converted, err := s.store.ConvertFile(ctx, s.blocks.put, ino)
	if err != nil {
		return putErr(err)
	}
	if converted {
		s.log.Debug("file data moved from pages to blocks", "ino", ino)
	}
	return nil
}

// put puts data as block id: the block store's lack of room is ENOSPC to
// the writer (CodeNoSpace), nothing committed.
func (s *Server) put(ctx context.Context, id blocks.ID, data []byte) error {
	return putErr(s.blocks.put.Put(ctx, id, data))
}

// putErr is the wire error for a failed Put (or a conversion's).
func putErr(err error) error {
	var we *wire.Error
	switch {
	case err == nil || errors.As(err, &we):
		return err
	case errors.Is(err, syscall.ENOSPC):
		return wire.Errf(wire.CodeNoSpace, "block store: %v", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return wire.Errf(wire.CodeInterrupted, "block store: %v", err)
	}
	return wire.Errf(wire.CodeIO, "block store: %v", err)
}

// readBlocks reads up to n bytes at off of block-mapped file ino from its
// blocks, each verified against its sums, holes as zeros, into a pooled
// buffer. A block missing or corrupt is CodeIO and an error in the log
// naming the file and the block: never wrong bytes.
func (s *Server) readBlocks(ctx context.Context, ino ids.Ino, off uint64, n int) ([]byte, store.Attr, error) {
	ps, a, err := s.store.LookupBlocks(ino, off, uint64(n))
	if err != nil || off >= a.Size {
		return []byte{}, a, err
	}
	out := transport.Buffer(int(min(uint64(n), a.Size-off)))
	end, bad, err := blockmap.ReadPieces(off, ps, out, blockmap.ReadVerified(ctx, s.blocks.store))
	if err == nil && end != off+uint64(len(out)) {
		err = fmt.Errorf("%w: pieces end at %d, want %d", blockmap.ErrCorrupt, end, off+uint64(len(out)))
	}
	if err != nil {
		transport.Recycle(out)
		var block blocks.ID
		if bad != nil {
			block = bad.Block
		}
		s.log.Error("block of a file unreadable", "ino", ino, "block", block, "err", err)
		return nil, store.Attr{}, wire.Errf(wire.CodeIO, "block %s of %v: %v", block, ino, err)
	}
	return out, a, nil
}
