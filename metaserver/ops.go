package metaserver

import (
	"context"
	"slices"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/metaserver/store"
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

// request is one client request on its way through a handler: the session
// it came in, the store it changes (recording the change's origin) and the
// time its changes are stamped with.
type request struct {
	ctx  context.Context
	sess *session
	r    *wire.Request
	st   *store.Store
	now  int64
}

// opHandler executes one kind of request under the data locks it needs.
type opHandler func(s *Server, q *request) *wire.Reply

// opHandlers maps each operation to its handler, from the tables of each
// kind (ops_ns.go, ops_data.go, ops_xattr.go, ops_locks.go).
var opHandlers = func() (t [256]opHandler) {
	for _, kind := range []map[wire.Op]opHandler{sessionOps, namespaceOps, dataOps, xattrOps, lockOps, blockOps} {
		for op, h := range kind {
			if t[op] != nil {
				panic("metaserver: two handlers for " + op.String())
			}
			t[op] = h
		}
	}
	return t
}()

var sessionOps = map[wire.Op]opHandler{
	wire.OpRenew:   func(*Server, *request) *wire.Reply { return &wire.Reply{} },
	wire.OpGoodbye: (*Server).opGoodbye,
}

// execute executes one request against the store under the data locks it
// needs.
func (s *Server) execute(ctx context.Context, sess *session, r *wire.Request) *wire.Reply {
	q := &request{ctx: ctx, sess: sess, r: r, st: s.store, now: time.Now().UnixNano()}
	if o, ok := changeOrigin(sess, r); ok {
		q.st = q.st.For(o)
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
	if h := opHandlers[r.Op]; h != nil {
		return h(s, q)
	}
	return wire.ErrorReply(wire.Errf(wire.CodeNotSupported, "operation %v", r.Op))
}

func (s *Server) opGoodbye(q *request) *wire.Reply {
	sess := q.sess
	s.mu.Lock()
	if s.sessions[sess.client] == sess {
		delete(s.sessions, sess.client)
	}
	s.mu.Unlock()
	s.forgetSession(sess)
	s.lm.forgetClient(sess.client)
	s.log.Info("session closed by client", "client", sess.client, "session", sess.id)
	return &wire.Reply{}
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

// unlessReplayed runs fn unless the store already applied r (replayed).
func (s *Server) unlessReplayed(sess *session, r *wire.Request, fn func() *wire.Reply) func() *wire.Reply {
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
	case wire.OpWrite, wire.OpSetAttr, wire.OpLink, wire.OpCommitBlocks, wire.OpPunch:
		return attrReply(s.store.GetAttr(r.Ino)), true
	}
	return &wire.Reply{}, true
}

func setAttrIn(r *wire.Request) store.SetAttrIn {
	return store.SetAttrIn{Valid: r.Valid, Mode: r.Mode, Uid: r.Uid, Gid: r.Gid, Size: r.Size,
		Atime: r.Atime, Mtime: r.Mtime, Ctime: r.Ctime}
}
