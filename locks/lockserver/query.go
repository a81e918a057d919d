package lockserver

import (
	"time"

	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/lease"
	"github.com/leasefs/leasefs/locks"
)

// Read-only views, for the shell's admin pages and the ownership logic.

// Mode returns the data lock c holds on ino.
func (s *Server) Mode(c ids.ClientID, ino ids.Ino) locks.Mode { return s.data.Mode(c, ino) }

// Holders returns ino's data lock holders in client order.
func (s *Server) Holders(ino ids.Ino) []locks.Holder { return s.data.Holders(ino) }

// All returns every inode with data locks held or waited for.
func (s *Server) All() []locks.InodeLocks { return s.data.All() }

// LockedInodes returns len(All()) without building it.
func (s *Server) LockedInodes() int { return s.data.Inodes() }

// HeldBy returns the data locks c holds, in inode order.
func (s *Server) HeldBy(c ids.ClientID) []locks.Held { return s.data.HeldBy(c) }

// InGrace reports whether the restart's grace period runs, and until when.
func (s *Server) InGrace() (clock.Time, bool) { return s.data.InGrace() }

// PosixLocks returns ino's POSIX locks.
func (s *Server) PosixLocks(ino ids.Ino) []locks.PosixLock { return s.posix.Locks(ino) }

// PosixWaiting returns ino's blocked POSIX requests.
func (s *Server) PosixWaiting(ino ids.Ino) []locks.PosixGrant { return s.posix.Waiting(ino) }

// PosixLen returns the number of inodes with POSIX locks.
func (s *Server) PosixLen() int { return s.posix.Len() }

// FailingClients returns the failing clients in id order.
func (s *Server) FailingClients() []ids.ClientID { return s.failing.Clients() }

// FailingLeft returns how long c has left before its locks are stolen.
func (s *Server) FailingLeft(c ids.ClientID, now clock.Time) (time.Duration, bool) {
	return s.failing.Remaining(c, now)
}

// FailingStats returns the failing set's counters.
func (s *Server) FailingStats() lease.FailingStats { return s.failing.Stats() }

// Stats returns the counters.
func (s *Server) Stats() Stats { return s.stats }

// Revoking returns the number of revocations awaiting acknowledgement.
func (s *Server) Revoking() int { return len(s.callbacks) }
