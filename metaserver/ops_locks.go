package metaserver

import (
	"github.com/leasefs/leasefs/locks"
	"github.com/leasefs/leasefs/wire"
)

// lockOps are the requests on data locks and POSIX locks.
var lockOps = map[wire.Op]opHandler{
	wire.OpLockRelease: (*Server).opLockRelease,
	wire.OpPosixLock:   (*Server).opPosixLock,
}

func (s *Server) opLockRelease(q *request) *wire.Reply {
	r := q.r
	s.lm.release(q.sess.client, r.Ino, locks.Mode(r.LockMode), r.Version)
	return &wire.Reply{}
}

func (s *Server) opPosixLock(q *request) *wire.Reply {
	ctx, sess, r := q.ctx, q.sess, q.r
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
