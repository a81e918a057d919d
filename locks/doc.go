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
// lock the table no longer lists until their lease lapses. So the caller may
// Steal a client's locks only when lease.FailingSet reports it expired, and
// after a restart must SetGrace for τ(1+δ) so that only reclaims are granted
// while clients of the previous incarnation may still trust their locks.
// Grants and revocations of one inode carry an increasing sequence number: a
// client applies a revocation with Seq s to every grant with Seq < s it has
// received or will receive, and passes the highest Seq it saw to Release, so
// that messages reordered or duplicated by the network cannot resurrect a lock.
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
)
