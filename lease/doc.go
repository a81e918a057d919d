// Package lease holds the client-lease protocol of DESIGN.md ("Client leases")
// as pure state machines: the client's lease with one server (Client), the
// server's failing-client set (FailingSet) and the restart grace period
// (Grace). The Storage Tank protocol is Burns, Rees and Long, "Safe caching in
// a distributed file system for network attached storage", ICDCS 2001.
//
// Nothing here reads a clock, sleeps or starts a goroutine: the caller passes
// its node's monotonic time (clock.Time) into every call and arms one timer at
// the deadline the core reports (Client.RenewAt, FailingSet.NextDeadline,
// Grace.Until). PaxosLease among servers lives in lease/paxos.
//
// # Safety
//
// The client trusts its cached state and locks only while Client.Valid. The
// server steals a client's locks only after FailingSet reports the client
// Expired, which is τ(1+δ) of the server's clock after it stopped
// acknowledging that client: the client's lease, started when the client sent
// its last acknowledged request, has then lapsed on any clock whose rate is
// within δ of the server's. Caller duties:
//
//   - client: call Acked only for application replies (never transport
//     acknowledgements) with the local time the request was sent; call Nacked
//     on a NACK before dropping state; never trust state when Valid is false.
//   - server: once Fail was called for a client, answer every request of that
//     client with a NACK (Failing) and grant it nothing; steal and forget the
//     clients Expired returns; after a restart grant no lock until Grace ends.
//
// # Timing
//
// τ is Config.Tau, δ Config.Delta. Clocks need only rate synchronisation:
// every duration is measured on one node's monotonic clock.
package lease
