package metaserver

import (
	"cmp"
	"context"
	"slices"
	"syscall"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

var errNotFound = wire.Err(wire.CodeNotFound)

// lockReq is a data lock an operation takes for its client.
type lockReq struct {
	ino  ids.Ino
	mode locks.Mode
}

func shared(inos ...ids.Ino) []lockReq    { return reqs(locks.Shared, inos) }
func exclusive(inos ...ids.Ino) []lockReq { return reqs(locks.Exclusive, inos) }

func reqs(mode locks.Mode, inos []ids.Ino) []lockReq {
	out := make([]lockReq, 0, len(inos))
	for _, ino := range inos {
		if ino != 0 {
			out = append(out, lockReq{ino, mode})
		}
	}
	return out
}

// underLocks runs fn with the client holding every lock in want. Locks are
// taken in ascending inode order so that operations on several inodes
// cannot deadlock; a reader gets S (so it may cache what it read), a writer
// X (so no other client caches what it changes). The grants travel back
// with the reply.
func (s *Server) underLocks(ctx context.Context, sess *session, want []lockReq, fn func() *wire.Reply) *wire.Reply {
	slices.SortFunc(want, func(a, b lockReq) int { return cmpIno(a.ino, b.ino) })
	if s.owner == nil {
		hs, errRep := s.takeLocks(ctx, sess, want)
		if errRep != nil {
			return errRep
		}
		return s.runLocked(hs, fn)
	}
	// Cluster mode (package ownership): own every inode first, holding no
	// client lock, then lock, then check that no inode was handed over
	// while we waited for its lock.
	inos := make([]ids.Ino, 0, len(want))
	for _, w := range want {
		inos = append(inos, w.ino)
	}
	for attempt := 0; ; attempt++ {
		if err := s.owner.OwnAll(ctx, inos); err != nil {
			return wire.ErrorReply(err)
		}
		hs, errRep := s.takeLocks(ctx, sess, want)
		if errRep != nil {
			return errRep
		}
		if s.owner.StillOwned(inos) {
			return s.runLocked(hs, fn)
		}
		// The grants came after a hand-over (which revoked every lock on
		// the inode): they were never the client's, drop them.
		for _, h := range hs {
			s.lm.done(h)
			s.lm.release(h.key.client, h.key.ino, locks.None, h.grant.Seq)
		}
		if attempt == 8 {
			return wire.ErrorReply(errUnavailable("ownership of the inodes keeps moving"))
		}
	}
}

// takeLocks takes every lock in want (sorted) for the client, or returns
// the error reply with none held.
func (s *Server) takeLocks(ctx context.Context, sess *session, want []lockReq) ([]held, *wire.Reply) {
	var hs []held
	for i, w := range want {
		if i > 0 && want[i-1].ino == w.ino {
			continue
		}
		mode := w.mode
		for _, o := range want[i:] {
			if o.ino == w.ino && o.mode > mode {
				mode = o.mode
			}
		}
		h, err := s.lm.acquire(ctx, sess.client, w.ino, mode)
		if err != nil {
			for _, h := range hs {
				s.lm.done(h)
			}
			return nil, wire.ErrorReply(err)
		}
		hs = append(hs, h)
	}
	return hs, nil
}

// runLocked runs fn under the held locks, ends them, and adds the grants
// to the reply. A lock the request took on an inode that does not exist
// (it found none) is given back, not granted: a client asking about
// inode numbers it made up would fill the lock table.
func (s *Server) runLocked(hs []held, fn func() *wire.Reply) *wire.Reply {
	rep := func() *wire.Reply {
		defer func() {
			for _, h := range hs {
				s.lm.done(h)
			}
		}()
		return fn()
	}()
	for _, h := range hs {
		if rep.Code == wire.CodeNotFound && h.fresh && !s.exists(h.key.ino) {
			s.lm.release(h.key.client, h.key.ino, locks.None, h.grant.Seq)
			continue
		}
		rep.Grants = append(rep.Grants, wire.Grant{Ino: h.grant.Ino, Mode: wire.LockMode(h.grant.Mode), Seq: h.grant.Seq})
	}
	return rep
}

func cmpIno(a, b ids.Ino) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// child resolves parent/name without a lock, to know which inode to lock;
// the operation re-checks under the locks.
func (s *Server) child(parent ids.Ino, name string) ids.Ino {
	if store.CheckName(name) != nil {
		return 0
	}
	return s.store.Child(parent, name)
}

// withChild runs an operation on parent/name under locks that include the
// child it names, retrying if the name was re-pointed while locking.
func (s *Server) withChild(ctx context.Context, sess *session, parent ids.Ino, name string,
	mode locks.Mode, lockParent locks.Mode, fn func() *wire.Reply) *wire.Reply {
	for attempt := 0; ; attempt++ {
		child := s.child(parent, name)
		want := reqs(mode, []ids.Ino{child})
		want = append(want, lockReq{parent, lockParent})
		var moved bool
		rep := s.underLocks(ctx, sess, want, func() *wire.Reply {
			if s.child(parent, name) != child && attempt < 5 {
				moved = true
				return &wire.Reply{}
			}
			return fn()
		})
		if !moved {
			return rep
		}
	}
}

// removal runs fn, the removal of r.Parent/r.Name, under X locks on the
// directory and the child. A removal that names the inode it removes
// (wire.RemoveIfIno: every removal sent behind the caller) locks that
// inode without looking the name up first; fn checks under the locks that
// the name still names it (namesOther). That spares rm -rf two of the
// store reads per file.
func (s *Server) removal(ctx context.Context, sess *session, r *wire.Request, fn func() *wire.Reply) *wire.Reply {
	if sentBehind(r) && r.Ino != 0 {
		return s.underLocks(ctx, sess, exclusive(r.Ino, r.Parent), fn)
	}
	return s.withChild(ctx, sess, r.Parent, r.Name, locks.Exclusive, locks.Exclusive, fn)
}

// dispatch executes one request against the store under the data locks it
// needs.
func (s *Server) dispatch(ctx context.Context, sess *session, r *wire.Request) *wire.Reply {
	now := time.Now().UnixNano()
	st := s.store
	if o, ok := changeOrigin(sess, r); ok {
		st = st.For(o)
	}
	if s.owner != nil {
		if rep := s.owner.Redirect(r); rep != nil {
			return rep
		}
	}
	if r.Opens > 0 && r.Ino != 0 && s.exists(r.Ino) {
		// handles the client opened under its lock: counted before the
		// request can remove the file
		s.openHandle(sess, r.Ino, int(r.Opens))
	}
	switch r.Op {
	case wire.OpRenew:
		return &wire.Reply{}
	case wire.OpGoodbye:
		s.mu.Lock()
		if s.sessions[sess.client] == sess {
			delete(s.sessions, sess.client)
		}
		s.mu.Unlock()
		s.forgetSession(sess)
		s.lm.forgetClient(sess.client)
		s.log.Info("session closed by client", "client", sess.client, "session", sess.id)
		return &wire.Reply{}
	case wire.OpLookup:
		return s.withChild(ctx, sess, r.Parent, r.Name, locks.Shared, locks.Shared, func() *wire.Reply {
			return attrReply(st.Lookup(r.Parent, r.Name))
		})
	case wire.OpGetAttr:
		return s.underLocks(ctx, sess, shared(r.Ino), func() *wire.Reply { return attrReply(st.GetAttr(r.Ino)) })
	case wire.OpSetAttr:
		in := setAttrIn(r)
		return s.underLocks(ctx, sess, exclusive(r.Ino), s.once(sess, r, func() *wire.Reply { return attrReply(st.SetAttr(r.Ino, in, now)) }))
	case wire.OpCreate, wire.OpMkdir, wire.OpSymlink:
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
			st := st.WithUmask(r.Umask)
			switch r.Op {
			case wire.OpCreate:
				var a store.Attr
				var err error
				if r.Flags&wire.CreateIno != 0 {
					// the times the client answered its caller with
					a, err = st.CreateAs(r.Ino, r.Parent, r.Name, r.Mode, r.Uid, r.Gid, cmp.Or(max(r.Mtime, 0), now))
				} else {
					a, err = st.Create(r.Parent, r.Name, r.Mode, r.Uid, r.Gid, r.Rdev, now)
				}
				if err == nil && r.Flags&wire.CreateOpen != 0 {
					// The creator counts the open itself if it gets the
					// new file's lock with the reply (cache.OpenLocally);
					// else it is counted here, while the parent's X lock
					// keeps anyone from unlinking the new file.
					if g, ok := s.lockNew(ctx, sess, a.Ino); ok {
						newLock = &g
					} else {
						s.openHandle(sess, a.Ino, 1)
					}
				}
				return s.withDirAttr(attrReply(a, err), r)
			case wire.OpMkdir:
				return s.withDirAttr(attrReply(st.Mkdir(r.Parent, r.Name, r.Mode, r.Uid, r.Gid, now)), r)
			}
			return s.withDirAttr(attrReply(st.Symlink(r.Parent, r.Name, r.Target, r.Uid, r.Gid, now)), r)
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
	case wire.OpAllocInos:
		if s.owner != nil {
			// a new inode's owner acquires it as it makes it (onAlloc)
			return wire.ErrorReply(wire.Errf(wire.CodeInvalid, "a cluster server hands out no inode numbers"))
		}
		n := min(max(r.Size, 1), wire.MaxInoRange)
		first, err := s.store.AllocInos(n)
		if err != nil {
			return wire.ErrorReply(err)
		}
		return &wire.Reply{Data: wire.AppendInoRange(nil, first, uint32(n))}
	case wire.OpReadlink:
		if s.owner != nil {
			if err := s.owner.OwnAll(ctx, []ids.Ino{r.Ino}); err != nil {
				return wire.ErrorReply(err)
			}
		}
		t, err := st.Readlink(r.Ino)
		if err != nil {
			return wire.ErrorReply(err)
		}
		return &wire.Reply{Data: []byte(t)}
	case wire.OpLink:
		return s.underLocks(ctx, sess, exclusive(r.Ino, r.NewPar), s.once(sess, r, func() *wire.Reply {
			return s.withDirAttr(attrReply(st.Link(r.Ino, r.NewPar, r.Name, now)), r)
		}))
	case wire.OpUnlink:
		return s.removal(ctx, sess, r, s.once(sess, r, func() *wire.Reply {
			if rep := s.namesOther(r); rep != nil {
				return rep
			}
			a, purged, err := st.Unlink(r.Parent, r.Name, now, s.unopened)
			if err == nil && !purged {
				s.removed(&a)
			}
			return s.withDirAttr(errReply(err), r)
		}))
	case wire.OpRmdir:
		return s.removal(ctx, sess, r, s.once(sess, r, func() *wire.Reply {
			if rep := s.namesOther(r); rep != nil {
				return rep
			}
			return s.withDirAttr(errReply(st.Rmdir(r.Parent, r.Name, now)), r)
		}))
	case wire.OpRename:
		for attempt := 0; ; attempt++ {
			moved, target := s.child(r.Parent, r.Name), s.child(r.NewPar, r.NewName)
			var changed bool
			rep := s.underLocks(ctx, sess, exclusive(r.Parent, r.NewPar, moved, target), func() *wire.Reply {
				if attempt < 5 && (s.child(r.Parent, r.Name) != moved || s.child(r.NewPar, r.NewName) != target) {
					changed = true
					return &wire.Reply{}
				}
				if rep, ok := s.replayed(sess, r); ok {
					return rep
				}
				replaced, err := st.Rename(r.Parent, r.Name, r.NewPar, r.NewName, r.Flags, now)
				if err == nil {
					s.removed(replaced)
				}
				return errReply(err)
			})
			if !changed {
				return rep
			}
		}
	case wire.OpReadDir:
		max := int(r.Size)
		if max <= 0 || max > wire.MaxEntries {
			max = wire.MaxEntries
		}
		return s.underLocks(ctx, sess, shared(r.Ino), func() *wire.Reply {
			ents, err := st.ReadDir(r.Ino, r.Off, max)
			if err != nil {
				return wire.ErrorReply(err)
			}
			out := make([]wire.DirEntry, len(ents))
			for i, e := range ents {
				out[i] = wire.DirEntry{Name: e.Name, Ino: e.Ino, Mode: e.Mode, Off: e.Off}
			}
			return &wire.Reply{Entries: out}
		})
	case wire.OpOpen:
		want := shared(r.Ino)
		if r.Flags&syscall.O_TRUNC != 0 {
			want = exclusive(r.Ino)
		}
		return s.underLocks(ctx, sess, want, func() *wire.Reply {
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
				if a, err = st.SetAttr(r.Ino, store.SetAttrIn{Valid: wire.SetSize}, now); err != nil {
					s.releaseHandle(sess, r.Ino)
					return wire.ErrorReply(err)
				}
			}
			return &wire.Reply{Attr: toWire(a)}
		})
	case wire.OpRelease:
		s.releaseHandle(sess, r.Ino)
		return &wire.Reply{}
	case wire.OpRead:
		return s.underLocks(ctx, sess, shared(r.Ino), func() *wire.Reply {
			// a pooled buffer, which handle gives back once the reply
			// is encoded: a fresh megabyte per read cost a page fault
			// per 4 KiB when the store copied into it
			data, a, err := st.ReadWithAttr(r.Ino, r.Off, int(min(r.Size, wire.MaxData)), transport.Buffer)
			if err != nil {
				return wire.ErrorReply(err)
			}
			if data == nil {
				data = []byte{}
			}
			return &wire.Reply{Data: data, Attr: toWire(a)}
		})
	case wire.OpWrite:
		return s.underLocks(ctx, sess, exclusive(r.Ino), func() *wire.Reply {
			mu := &s.writeMu[r.Ino%ids.Ino(len(s.writeMu))]
			mu.Lock()
			defer mu.Unlock()
			if rep, ok := s.replayed(sess, r); ok {
				return rep
			}
			if r.Flags&wire.WriteIfVersion != 0 {
				a, err := st.GetAttr(r.Ino)
				if err != nil {
					return wire.ErrorReply(err)
				}
				if a.Version != r.Version {
					return wire.ErrorReply(wire.Errf(wire.CodeStale,
						"file changed since the buffered writes were made (version %d, not %d)", a.Version, r.Version))
				}
			}
			if r.Flags&wire.WriteAppend != 0 {
				if r.Spans != nil {
					return wire.ErrorReply(wire.Errf(wire.CodeInvalid, "an append cannot be a vectored write"))
				}
				return attrReply(st.Append(r.Ino, r.Data, setAttrIn(r), now))
			}
			spans := r.Spans
			if spans == nil {
				spans = store.SpanAt(r.Off, r.Data)
			}
			return attrReply(st.WriteSetAttr(r.Ino, spans, r.Data, setAttrIn(r), now))
		})
	case wire.OpFsync:
		return errReply(st.Sync())
	case wire.OpStatFs:
		fs, err := st.StatFs()
		if err != nil {
			return wire.ErrorReply(err)
		}
		return &wire.Reply{StatFs: &wire.StatFs{Blocks: fs.Blocks, Bfree: fs.Bfree, Bavail: fs.Bavail,
			Files: fs.Files, Ffree: fs.Ffree, Bsize: fs.Bsize, NameLen: fs.NameLen}}
	case wire.OpGetXattr:
		return s.underLocks(ctx, sess, shared(r.Ino), func() *wire.Reply {
			v, err := st.GetXattr(r.Ino, r.Name)
			if err != nil {
				return wire.ErrorReply(err)
			}
			if v == nil {
				v = []byte{}
			}
			return &wire.Reply{Data: v}
		})
	case wire.OpSetXattr:
		return s.underLocks(ctx, sess, exclusive(r.Ino), s.once(sess, r, func() *wire.Reply {
			return errReply(st.SetXattr(r.Ino, r.Name, r.Data, r.Flags, now))
		}))
	case wire.OpListXattr:
		return s.underLocks(ctx, sess, shared(r.Ino), func() *wire.Reply {
			names, err := st.ListXattr(r.Ino)
			if err != nil {
				return wire.ErrorReply(err)
			}
			if names == nil {
				names = []string{}
			}
			return &wire.Reply{Names: names}
		})
	case wire.OpRemoveXattr:
		return s.underLocks(ctx, sess, exclusive(r.Ino), s.once(sess, r, func() *wire.Reply {
			return errReply(st.RemoveXattr(r.Ino, r.Name, now))
		}))
	case wire.OpLockRelease:
		s.lm.release(sess.client, r.Ino, locks.Mode(r.LockMode), r.Version)
		return &wire.Reply{}
	case wire.OpPosixLock:
		if r.Flags&wire.PosixReleaseOwner != 0 {
			s.lm.releaseOwner(sess.client, r.Lk.Owner, r.Ino)
			return &wire.Reply{}
		}
		if r.Lk.Type != uint8(locks.Unlock) && !s.exists(r.Ino) {
			// a lock table entry for an inode that is not
			return wire.ErrorReply(errNotFound)
		}
		lk, err := s.lm.posixLock(ctx, sess.client, r.Ino, r.Lk)
		if err != nil {
			return wire.ErrorReply(err)
		}
		return &wire.Reply{Lk: lk}
	}
	return wire.ErrorReply(wire.Errf(wire.CodeNotSupported, "operation %v", r.Op))
}

// namesOther refuses a removal with RemoveIfIno whose name no longer
// names the inode the client meant (run under the locks).
func (s *Server) namesOther(r *wire.Request) *wire.Reply {
	if r.Flags&wire.RemoveIfIno == 0 {
		return nil
	}
	if child := s.child(r.Parent, r.Name); child != r.Ino {
		return wire.ErrorReply(wire.Errf(wire.CodeNotFound, "%q names %v, not %v", r.Name, child, r.Ino))
	}
	return nil
}

// withDirAttr adds to a successful change r of a directory's entries the
// directory's attributes after it (Attr2), read under the X lock the
// change holds on it: the client caches them under that lock instead of
// asking again at the kernel's next lookup of the directory (one request of
// three per create). Not for a change sent behind: the client changed its
// cached directory itself.
func (s *Server) withDirAttr(rep *wire.Reply, r *wire.Request) *wire.Reply {
	if rep.Code != wire.CodeOK || sentBehind(r) {
		return rep
	}
	dir := r.Parent
	if r.Op == wire.OpLink {
		dir = r.NewPar
	}
	if a, err := s.store.GetAttr(dir); err == nil {
		rep.Attr2 = toWire(a)
	}
	if has, err := s.store.HasDefaultACL(dir); err == nil && !has {
		rep.Flags |= wire.DirNoDefaultACL
	}
	return rep
}

// sentBehind reports whether r is a change a client sent behind its caller
// (client/behind.go): it reads nothing of the reply but its outcome.
func sentBehind(r *wire.Request) bool {
	switch r.Op {
	case wire.OpUnlink, wire.OpRmdir:
		return r.Flags&wire.RemoveIfIno != 0
	case wire.OpCreate:
		return r.Flags&wire.CreateIno != 0
	}
	return false
}

// changeOrigin is the Origin a change request records (store.Origin):
// the inode it is recorded with is one the change writes under an X lock.
func changeOrigin(sess *session, r *wire.Request) (store.Origin, bool) {
	if !r.Op.Changes() || r.ReqID == 0 {
		return store.Origin{}, false
	}
	return store.Origin{Ino: r.OriginIno(), Client: sess.client, Req: r.ReqID, Oldest: r.Oldest}, true
}

// lockNew gives the client an X lock on an inode it just created, which
// nobody else can know yet (so this never waits).
func (s *Server) lockNew(ctx context.Context, sess *session, ino ids.Ino) (wire.Grant, bool) {
	h, err := s.lm.acquire(ctx, sess.client, ino, locks.Exclusive)
	if err != nil {
		return wire.Grant{}, false
	}
	s.lm.done(h)
	return wire.Grant{Ino: h.grant.Ino, Mode: wire.LockExclusive, Seq: h.grant.Seq}, true
}

// once runs fn unless the store already applied r (replayed).
func (s *Server) once(sess *session, r *wire.Request, fn func() *wire.Reply) func() *wire.Reply {
	return func() *wire.Reply {
		if rep, ok := s.replayed(sess, r); ok {
			return rep
		}
		return fn()
	}
}

// replayed answers a change request the store already applied (a resend:
// the server that applied it failed before the reply got through) from the
// current state. Call it under the request's locks.
func (s *Server) replayed(sess *session, r *wire.Request) (*wire.Reply, bool) {
	o, ok := changeOrigin(sess, r)
	if !ok {
		return nil, false
	}
	done, stale, err := s.store.Applied(o)
	if err != nil {
		return wire.ErrorReply(err), true
	}
	if stale {
		s.log.Info("stale copy of a change the client has finished with; not applied",
			"client", sess.client, "op", r.Op, "req", r.ReqID, "ino", o.Ino)
		return wire.ErrorReply(wire.Errf(wire.CodeStale, "request %d superseded", r.ReqID)), true
	}
	if !done {
		return nil, false
	}
	s.counters.Replayed.Add(1)
	s.log.Info("resent change already applied; answering from the current state",
		"client", sess.client, "op", r.Op, "req", r.ReqID, "ino", o.Ino)
	switch r.Op {
	case wire.OpCreate, wire.OpMkdir, wire.OpSymlink:
		a, err := s.store.Lookup(r.Parent, r.Name)
		if err == nil && r.Op == wire.OpCreate && r.Flags&wire.CreateOpen != 0 {
			s.openHandle(sess, a.Ino, 1)
		}
		return attrReply(a, err), true
	case wire.OpWrite, wire.OpSetAttr, wire.OpLink:
		return attrReply(s.store.GetAttr(r.Ino)), true
	}
	return &wire.Reply{}, true
}

func setAttrIn(r *wire.Request) store.SetAttrIn {
	return store.SetAttrIn{Valid: r.Valid, Mode: r.Mode, Uid: r.Uid, Gid: r.Gid, Size: r.Size,
		Atime: r.Atime, Mtime: r.Mtime, Ctime: r.Ctime}
}
