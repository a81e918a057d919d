// Package lockserver is the server side of the lock protocol as one pure,
// deterministic state machine: the data and POSIX lock tables of every
// client session, the set of failing clients, revocations in flight with
// their deadlines, the steal that ends a failing client, the grace period
// of a restarted server, reclaims, and operations in flight under a lock.
// metaserver's lock manager and internal/locksim's server both drive it.
//
// # The caller's duties
//
// One goroutine (or one mutex) owns a Server. Every call takes the current
// time of the caller's monotonic clock, read once per call. After every call
// the caller must, in order:
//
//  1. take Ready() (valid until the next call): answer each Nacks entry's waiting request with a NACK,
//     wake the requests each Grants entry grants, deliver every Revokes
//     entry as a callback (a resend replaces an earlier delivery), wake the
//     POSIX waiters of PosixGrants, stop delivering to each Failed client
//     and NACK its requests from now on (Failing), and forget the sessions
//     of the Stolen clients (their locks are gone);
//  2. arm one timer for NextDeadline() and call Tick when it fires.
//
// The caller tells the server of every request of a client about an inode
// (Progress: a client flushing for a revocation is alive), of each
// acknowledged revocation (Acked) and of each that could not be delivered
// (Undelivered). Operations that execute under a client's lock are
// bracketed by Begin and End: a release waits for them.
//
// # Safety
//
// The server only records what it believes; a client may trust a lock
// until its lease lapses. So the server NACKs a failing client from the
// moment it stops acknowledging it, grants it nothing more, and steals its
// locks only τ(1+δ) later on its own clock (Burns et al.; lease.FailingSet).
// A server that restarts grants nothing but reclaims for τ(1+δ), since
// clients of the previous incarnation may still trust their locks
// (New with restarted); a server that took an inode over without a clean
// hand-over grants no client lock on it for τ(1+δ) (InodeGrace, the
// ownership grace). A revocation's deadline is extended while the
// client sends requests about the inode (it flushes what the lock
// covered), up to Config.MaxRevokeWait; a client that stops answering is
// still failed within the delivery timeout.
//
// Config.Unsafe switches rules off. TEST ONLY: the simulator uses it to
// show that it catches each violation; production leaves it zero.
package lockserver
