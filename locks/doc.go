// Package locks holds the server's lock tables as pure state machines: data
// locks (DataTable: per-inode shared/exclusive locks that make client caching
// safe, DESIGN.md "Data locks") and POSIX advisory locks (PosixTable: fcntl
// byte ranges and flock).
//
// The tables never read a clock, send or wait: calls return what the caller
// must do (grants to send, revocations to deliver). One goroutine of the
// server shell owns a table; returned slices belong to the caller.
//
// # Safety
//
// The table only records what the server believes; clients may still trust a
// lock the table no longer lists until their lease lapses. So the caller
// (package lockserver, which keeps these rules for the server) may
// Steal a client's locks only when lease.FailingSet reports it expired, and
// after a restart must SetGrace for τ(1+δ) so that only reclaims are granted
// while clients of the previous incarnation may still trust their locks.
// Grants and revocations of one inode carry an increasing sequence number
// (one counter per table), so that messages reordered or duplicated by the
// network cannot resurrect or drop the wrong lock. The client (package
// lockclient keeps these rules):
//
//   - applies a revocation with Seq s only if s is above the Seq of the grant
//     it holds (a lower one was overtaken by a newer grant), and ignores a
//     grant whose Seq is below a revocation it has already applied;
//   - answers a revocation with Release(To, s) carrying the revocation's own
//     s, whether or not it applied it (the table refuses it as stale if a newer
//     grant exists), and releases voluntarily with the Seq of its grant.
//
// A restarted server numbers afresh: clients reset their numbers with the
// new session.
package locks

import "errors"

// Errors returned by the tables.
var (
	ErrBadMode        = errors.New("locks: bad lock mode")
	ErrNotHeld        = errors.New("locks: lock not held")
	ErrStale          = errors.New("locks: stale sequence number")
	ErrNotWaiting     = errors.New("locks: no such waiter")
	ErrTooManyWaiters = errors.New("locks: too many waiters")
	ErrConflict       = errors.New("locks: conflicting lock")
	ErrNoGrace        = errors.New("locks: not in grace period")
	ErrBadRange       = errors.New("locks: bad byte range")
	ErrDeadlock       = errors.New("locks: deadlock")
	ErrTooManyLocks   = errors.New("locks: too many locks") // ENOLCK: an inode's lock list is full
)
