package metaserver

import (
	"cmp"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/wire"
)

// namespaceOps are the requests on names, attributes and directories.
var namespaceOps = map[wire.Op]opHandler{
	wire.OpLookup:    (*Server).opLookup,
	wire.OpGetAttr:   (*Server).opGetAttr,
	wire.OpSetAttr:   (*Server).opSetAttr,
	wire.OpCreate:    (*Server).opMake,
	wire.OpMkdir:     (*Server).opMake,
	wire.OpSymlink:   (*Server).opMake,
	wire.OpAllocInos: (*Server).opAllocInos,
	wire.OpReadlink:  (*Server).opReadlink,
	wire.OpLink:      (*Server).opLink,
	wire.OpUnlink:    (*Server).opUnlink,
	wire.OpRmdir:     (*Server).opRmdir,
	wire.OpRename:    (*Server).opRename,
	wire.OpReadDir:   (*Server).opReadDir,
}

func (s *Server) opLookup(q *request) *wire.Reply {
	r := q.r
	return s.withChild(q.ctx, q.sess, r.Parent, r.Name, locks.Shared, locks.Shared, func() *wire.Reply {
		return attrReply(q.st.Lookup(r.Parent, r.Name))
	})
}

func (s *Server) opGetAttr(q *request) *wire.Reply {
	return s.underLocks(q.ctx, q.sess, shared(q.r.Ino), func() *wire.Reply { return attrReply(q.st.GetAttr(q.r.Ino)) })
}

func (s *Server) opSetAttr(q *request) *wire.Reply {
	r := q.r
	in := setAttrIn(r)
	return s.underLocks(q.ctx, q.sess, exclusive(r.Ino), s.unlessReplayed(q.sess, r, func() *wire.Reply {
		return attrReply(q.st.SetAttr(r.Ino, in, q.now))
	}))
}

// opMake makes a file, directory or symbolic link.
func (s *Server) opMake(q *request) *wire.Reply {
	ctx, sess, r := q.ctx, q.sess, q.r
	// The child too, if the name exists (a create that opens it,
	// EEXIST, or a resend answered from it): in a cluster it must be
	// recovered here before it is read.
	replayed := false
	var newLock *wire.Grant
	made := func() *wire.Reply {
		if rep, ok := s.replayed(sess, r); ok {
			replayed = true
			return rep
		}
		rep, g := s.makeNode(q)
		newLock = g
		return rep
	}
	var rep *wire.Reply
	if sentBehind(r) {
		// made behind the client's caller under its X lock on the
		// directory: the name was free, and the client has its
		// attributes and the directory's (no store reads for them)
		rep = s.underLocks(ctx, sess, exclusive(r.Parent), made)
	} else {
		rep = s.withChild(ctx, sess, r.Parent, r.Name, locks.Shared, locks.Exclusive, made)
	}
	createOpen := r.Op == wire.OpCreate && r.Flags&wire.CreateOpen != 0
	switch {
	case newLock != nil:
		rep.Grants = append(rep.Grants, *newLock)
	case rep.Attr == nil:
	case !replayed && !createOpen:
		// The creator may cache the new inode at once, as new
		// (no extended attributes): nobody else can know it yet,
		// so this never waits. Not for a resend answered from the
		// current state: others may have known it meanwhile.
		if g, ok := s.lockNew(ctx, sess, rep.Attr.Ino); ok {
			rep.Grants = append(rep.Grants, g)
		}
	case replayed && createOpen:
		// a resend: the reply grants no lock, so the client takes
		// the open as counted here (if the first execution counted
		// it too, the file outlives an unlink until the session ends)
		s.openHandle(sess, rep.Attr.Ino, 1)
	}
	if sentBehind(r) {
		// the client has the attributes, and may have changed them
		// since (buffered writes)
		rep.Attr = nil
	}
	return rep
}

// makeNode makes the new inode of opMake under its locks, and returns the
// X lock on it that a create which opens it takes, if any.
func (s *Server) makeNode(q *request) (*wire.Reply, *wire.Grant) {
	r, now := q.r, q.now
	st := q.st.WithUmask(r.Umask)
	switch r.Op {
	case wire.OpMkdir:
		return s.withDirAttr(attrReply(st.Mkdir(r.Parent, r.Name, r.Mode, r.Uid, r.Gid, now)), r), nil
	case wire.OpSymlink:
		return s.withDirAttr(attrReply(st.Symlink(r.Parent, r.Name, r.Target, r.Uid, r.Gid, now)), r), nil
	}
	var a store.Attr
	var err error
	if r.Flags&wire.CreateIno != 0 {
		// the times the client answered its caller with
		a, err = st.CreateAs(r.Ino, r.Parent, r.Name, r.Mode, r.Uid, r.Gid, cmp.Or(max(r.Mtime, 0), now))
	} else {
		a, err = st.Create(r.Parent, r.Name, r.Mode, r.Uid, r.Gid, r.Rdev, now)
	}
	var newLock *wire.Grant
	if err == nil && r.Flags&wire.CreateOpen != 0 {
		// The creator counts the open itself if it gets the
		// new file's lock with the reply (cache.OpenLocally);
		// else it is counted here, while the parent's X lock
		// keeps anyone from unlinking the new file.
		if g, ok := s.lockNew(q.ctx, q.sess, a.Ino); ok {
			newLock = &g
		} else {
			s.openHandle(q.sess, a.Ino, 1)
		}
	}
	return s.withDirAttr(attrReply(a, err), r), newLock
}

func (s *Server) opAllocInos(q *request) *wire.Reply {
	if s.owner != nil {
		// a new inode's owner acquires it as it makes it (onAlloc)
		return wire.ErrorReply(wire.Errf(wire.CodeInvalid, "a cluster server hands out no inode numbers"))
	}
	n := min(max(q.r.Size, 1), wire.MaxInoRange)
	first, err := s.store.AllocInos(n)
	if err != nil {
		return wire.ErrorReply(err)
	}
	return &wire.Reply{Data: wire.AppendInoRange(nil, first, uint32(n))}
}

func (s *Server) opReadlink(q *request) *wire.Reply {
	if s.owner != nil {
		if err := s.owner.OwnAll(q.ctx, []ids.Ino{q.r.Ino}); err != nil {
			return wire.ErrorReply(err)
		}
	}
	t, err := q.st.Readlink(q.r.Ino)
	if err != nil {
		return wire.ErrorReply(err)
	}
	return &wire.Reply{Data: []byte(t)}
}

func (s *Server) opLink(q *request) *wire.Reply {
	r := q.r
	return s.underLocks(q.ctx, q.sess, exclusive(r.Ino, r.NewPar), s.unlessReplayed(q.sess, r, func() *wire.Reply {
		return s.withDirAttr(attrReply(q.st.Link(r.Ino, r.NewPar, r.Name, q.now)), r)
	}))
}

func (s *Server) opUnlink(q *request) *wire.Reply {
	r := q.r
	return s.removal(q.ctx, q.sess, r, s.unlessReplayed(q.sess, r, func() *wire.Reply {
		if rep := s.namesOther(r); rep != nil {
			return rep
		}
		a, purged, err := q.st.Unlink(r.Parent, r.Name, q.now, s.unopened)
		if err == nil && !purged {
			s.removed(&a)
		}
		return s.withDirAttr(errReply(err), r)
	}))
}

func (s *Server) opRmdir(q *request) *wire.Reply {
	r := q.r
	return s.removal(q.ctx, q.sess, r, s.unlessReplayed(q.sess, r, func() *wire.Reply {
		if rep := s.namesOther(r); rep != nil {
			return rep
		}
		return s.withDirAttr(errReply(q.st.Rmdir(r.Parent, r.Name, q.now)), r)
	}))
}

// opRename locks both directories and both names' inodes, retrying if a
// name was re-pointed while locking.
func (s *Server) opRename(q *request) *wire.Reply {
	r := q.r
	for attempt := 0; ; attempt++ {
		moved, target := s.child(r.Parent, r.Name), s.child(r.NewPar, r.NewName)
		var changed bool
		rep := s.underLocks(q.ctx, q.sess, exclusive(r.Parent, r.NewPar, moved, target), func() *wire.Reply {
			if attempt < 5 && (s.child(r.Parent, r.Name) != moved || s.child(r.NewPar, r.NewName) != target) {
				changed = true
				return &wire.Reply{}
			}
			if rep, ok := s.replayed(q.sess, r); ok {
				return rep
			}
			replaced, err := q.st.Rename(r.Parent, r.Name, r.NewPar, r.NewName, r.Flags, q.now)
			if err == nil {
				s.removed(replaced)
			}
			return errReply(err)
		})
		if !changed {
			return rep
		}
	}
}

func (s *Server) opReadDir(q *request) *wire.Reply {
	r := q.r
	max := int(r.Size)
	if max <= 0 || max > wire.MaxEntries {
		max = wire.MaxEntries
	}
	return s.underLocks(q.ctx, q.sess, shared(r.Ino), func() *wire.Reply {
		ents, err := q.st.ReadDir(r.Ino, r.Off, max)
		if err != nil {
			return wire.ErrorReply(err)
		}
		out := make([]wire.DirEntry, len(ents))
		for i, e := range ents {
			out[i] = wire.DirEntry{Name: e.Name, Ino: e.Ino, Mode: e.Mode, Off: e.Off}
		}
		return &wire.Reply{Entries: out}
	})
}
