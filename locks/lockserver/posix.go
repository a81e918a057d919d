package lockserver

import (
	"slices"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/locks"
)

// PosixGet reports a lock that conflicts with lk (F_GETLK).
func (s *Server) PosixGet(c ids.ClientID, ino ids.Ino, lk locks.PosixLock) (locks.PosixLock, bool, error) {
	if s.Failing(c) {
		return locks.PosixLock{}, false, ErrNack
	}
	return s.posix.Get(ino, lk)
}

// PosixSet sets or removes lk without waiting (locks.ErrConflict if it
// conflicts); waiters it unblocks come in Ready().PosixGrants.
func (s *Server) PosixSet(c ids.ClientID, ino ids.Ino, lk locks.PosixLock) error {
	if s.Failing(c) {
		return ErrNack
	}
	gs, err := s.posix.Set(ino, lk)
	s.ready.PosixGrants = append(s.ready.PosixGrants, gs...)
	return err
}

// PosixSetWait sets lk, waiting for conflicting locks: granted reports that
// it was set at once, else its grant comes in Ready().PosixGrants with id.
func (s *Server) PosixSetWait(c ids.ClientID, ino ids.Ino, lk locks.PosixLock) (id locks.WaiterID, granted bool, err error) {
	if s.Failing(c) {
		return 0, false, ErrNack
	}
	id, gs, err := s.posix.SetWait(ino, lk)
	if err != nil {
		return 0, false, err
	}
	granted = slices.ContainsFunc(gs, func(g locks.PosixGrant) bool { return g.Waiter == id })
	gs = slices.DeleteFunc(gs, func(g locks.PosixGrant) bool { return g.Waiter == id })
	s.ready.PosixGrants = append(s.ready.PosixGrants, gs...)
	return id, granted, nil
}

// PosixCancel withdraws a waiting PosixSetWait.
func (s *Server) PosixCancel(id locks.WaiterID) error { return s.posix.Cancel(id) }

// PosixReleaseOwner drops the POSIX locks of one lock owner (file closed).
func (s *Server) PosixReleaseOwner(c ids.ClientID, owner uint64, ino ids.Ino) {
	s.ready.PosixGrants = append(s.ready.PosixGrants, s.posix.ReleaseOwner(c, owner, ino)...)
}
