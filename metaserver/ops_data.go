package metaserver

import (
	"errors"
	"syscall"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// dataOps are the requests on open files and their data, and on the file
// system as a whole.
var dataOps = map[wire.Op]opHandler{
	wire.OpOpen:    (*Server).opOpen,
	wire.OpRelease: (*Server).opRelease,
	wire.OpRead:    (*Server).opRead,
	wire.OpWrite:   (*Server).opWrite,
	wire.OpFsync:   func(_ *Server, q *request) *wire.Reply { return errReply(q.st.Sync()) },
	wire.OpStatFs:  (*Server).opStatFs,
	wire.OpSeek:    (*Server).opSeek,
	wire.OpPunch:   (*Server).opPunch,
}

func (s *Server) opOpen(q *request) *wire.Reply {
	r, sess, st := q.r, q.sess, q.st
	want := shared(r.Ino)
	if r.Flags&syscall.O_TRUNC != 0 {
		want = exclusive(r.Ino)
	}
	return s.underLocks(q.ctx, sess, want, func() *wire.Reply {
		// Count the handle before reading the inode: once counted,
		// an unlink elsewhere can no longer purge it.
		if !s.openHandle(sess, r.Ino, 1) {
			return wire.ErrorReply(errNotFound)
		}
		a, err := st.GetAttr(r.Ino)
		if err != nil {
			s.releaseHandle(sess, r.Ino)
			return wire.ErrorReply(err)
		}
		if r.Flags&syscall.O_TRUNC != 0 && a.Mode&syscall.S_IFMT == syscall.S_IFREG && a.Size > 0 {
			if a, err = st.SetAttr(r.Ino, store.SetAttrIn{Valid: wire.SetSize}, q.now); err != nil {
				s.releaseHandle(sess, r.Ino)
				return wire.ErrorReply(err)
			}
		}
		return &wire.Reply{Attr: toWire(a)}
	})
}

func (s *Server) opRelease(q *request) *wire.Reply {
	s.releaseHandle(q.sess, q.r.Ino)
	return &wire.Reply{}
}

func (s *Server) opRead(q *request) *wire.Reply {
	r := q.r
	return s.underLocks(q.ctx, q.sess, shared(r.Ino), func() *wire.Reply {
		data, a, err := s.readData(q)
		if err != nil {
			return wire.ErrorReply(err)
		}
		return &wire.Reply{Data: data, Attr: toWire(a)}
	})
}

// readData reads up to wire.MaxData bytes of q's file at q.r.Off, from its
// pages or its blocks, into a pooled buffer, which handle gives back once
// the reply is encoded: a fresh megabyte per read cost a page fault per
// 4 KiB when the store copied into it.
func (s *Server) readData(q *request) ([]byte, store.Attr, error) {
	r := q.r
	n := int(min(r.Size, wire.MaxData))
	data, a, err := q.st.ReadWithAttr(r.Ino, r.Off, n, transport.Buffer)
	if errors.Is(err, store.ErrMapped) && s.blocks != nil {
		data, a, err = s.readBlocks(q.ctx, r.Ino, r.Off, n)
	}
	if err == nil && data == nil {
		data = []byte{}
	}
	return data, a, err
}

// opSeek answers SEEK_DATA and SEEK_HOLE under an S lock, as a read is:
// no other mount may hold writes of the file back meanwhile.
func (s *Server) opSeek(q *request) *wire.Reply {
	r := q.r
	return s.underLocks(q.ctx, q.sess, shared(r.Ino), func() *wire.Reply {
		off, err := q.st.Seek(r.Ino, r.Off, r.Flags)
		if err != nil {
			return wire.ErrorReply(err)
		}
		return &wire.Reply{Data: wire.AppendOffset(nil, off)}
	})
}

func (s *Server) opWrite(q *request) *wire.Reply {
	r := q.r
	return s.underLocks(q.ctx, q.sess, exclusive(r.Ino), func() *wire.Reply {
		return s.writeOnce(q, func() *wire.Reply { return s.write(q) })
	})
}

// writeOnce runs a change of the data of q's inode after the inode's other
// writes, unless it is a resend of one applied already.
func (s *Server) writeOnce(q *request, change func() *wire.Reply) *wire.Reply {
	mu := &s.writeMu[q.r.Ino%ids.Ino(len(s.writeMu))]
	mu.Lock()
	defer mu.Unlock()
	if rep, ok := s.replayed(q.sess, q.r); ok {
		return rep
	}
	return change()
}

// opPunch zeros a range of a file under an X lock and once, as a write.
func (s *Server) opPunch(q *request) *wire.Reply {
	r := q.r
	return s.underLocks(q.ctx, q.sess, exclusive(r.Ino), func() *wire.Reply {
		return s.writeOnce(q, func() *wire.Reply {
			return attrReply(q.st.Punch(r.Ino, r.Off, r.Size, r.Flags, q.now))
		})
	})
}

// write applies a write under its lock, once: to pages, or as a block
// for a file that is block-mapped or that the write makes larger than
// wire.InlineMax (when the server has a block store).
func (s *Server) write(q *request) *wire.Reply {
	r, st := q.r, q.st
	appending := r.Flags&wire.WriteAppend != 0
	if appending && r.Spans != nil {
		return wire.ErrorReply(wire.Errf(wire.CodeInvalid, "an append cannot be a vectored write"))
	}
	spans := r.Spans
	if spans == nil && !appending {
		spans = store.SpanAt(r.Off, r.Data)
	}
	if r.Flags&wire.WriteIfVersion != 0 || s.blocks != nil && len(r.Data) > 0 {
		a, err := st.GetAttr(r.Ino)
		if err != nil {
			return wire.ErrorReply(err)
		}
		if r.Flags&wire.WriteIfVersion != 0 && a.Version != r.Version {
			return wire.ErrorReply(errStale(a.Version, r.Version))
		}
		if s.blocks != nil && len(r.Data) > 0 && a.Mode&syscall.S_IFMT == syscall.S_IFREG &&
			writeEnd(a.Size, spans, len(r.Data), appending) > wire.InlineMax {
			return s.writeBlock(q, spans, appending)
		}
	}
	a, err := s.writePages(q, spans, appending)
	if errors.Is(err, store.ErrMapped) && s.blocks != nil {
		return s.writeBlock(q, spans, appending)
	}
	return attrReply(a, err)
}

// writeEnd is the size of a file of size bytes after a write of n bytes
// into spans, or appended.
func writeEnd(size uint64, spans []wire.Span, n int, appending bool) uint64 {
	if appending {
		return size + uint64(n)
	}
	if len(spans) > 0 {
		last := spans[len(spans)-1]
		size = max(size, last.Off+uint64(last.Len))
	}
	return size
}

// writePages writes q's data into its file's pages: ErrMapped for a
// block-mapped file.
func (s *Server) writePages(q *request, spans []wire.Span, appending bool) (store.Attr, error) {
	r := q.r
	if appending {
		return q.st.Append(r.Ino, r.Data, setAttrIn(r), q.now)
	}
	return q.st.WriteSetAttr(r.Ino, spans, r.Data, setAttrIn(r), q.now)
}

func (s *Server) opStatFs(q *request) *wire.Reply {
	fs, err := q.st.StatFs()
	if err != nil {
		return wire.ErrorReply(err)
	}
	if s.blocks != nil {
		fs = s.withBlocks(fs)
	}
	return &wire.Reply{StatFs: &wire.StatFs{Blocks: fs.Blocks, Bfree: fs.Bfree, Bavail: fs.Bavail,
		Files: fs.Files, Ffree: fs.Ffree, Bsize: fs.Bsize, NameLen: fs.NameLen}}
}

// withBlocks makes statfs count the block store: used is the blocks'
// bytes and the metadata store's, free the less of what the two file
// systems have left (a write needs room in both).
func (s *Server) withBlocks(fs store.StatFs) store.StatFs {
	u := s.blocks.usage(s.log)
	free := fs.Bavail
	if u.Free >= 0 {
		free = min(free, uint64(u.Free)/uint64(fs.Bsize))
	}
	lsm, vlog := s.store.Size()
	used := (uint64(u.Bytes) + uint64(lsm+vlog)) / uint64(fs.Bsize)
	fs.Bfree, fs.Bavail, fs.Blocks = free, free, used+free
	return fs
}

// errStale refuses a reclaimed change (wire.WriteIfVersion) of a file
// whose version moved on from the one its data was based on.
func errStale(have, want uint64) error {
	return wire.Errf(wire.CodeStale, "file changed since the buffered writes were made (version %d, not %d)", have, want)
}
