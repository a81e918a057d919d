// Package paxos is PaxosLease (Trencseni 2009) for many resources at once: a
// pure, deterministic proposer, acceptor and learner per server. Each inode is
// a resource; its lease holder is the inode's owner (DESIGN.md, "Servers,
// ownership and replication").
//
// # The caller's duties
//
// One goroutine owns a Node. After every call to Step, Tick, Acquire or
// Release it must, in order:
//
//  1. take Ready(): send every Message (one per peer, all instances batched;
//     encode with Message.Append, decode with Parse; a lost message is
//     harmless, so unreliable datagrams do), then act on the Events
//     (Acquired with its epoch, Lost, Released);
//  2. arm one timer for NextDeadline() and call Tick when it fires.
//
// Before New the caller increments and persists the boot counter
// (Config.Boot) and passes the highest epoch it has persisted (MinEpoch).
// Nothing else is persisted: acceptors are diskless.
//
// Before serving a change, check Owns(now, ino) with a fresh clock reading;
// never cache it. Epochs fence everything outside the lease layer: records
// carry the epoch, replicas reject older ones. A new owner recovers the
// inode (majority read); if it finds a newer epoch than its own it must
// Release, call Acquire again (ballots then exceed every ballot it has
// seen), and only then serve.
//
// # Safety
//
// At any real time at most one node believes it owns a resource. The
// argument rests on acceptors, not on clocks agreeing:
//
//   - the owner believes from the moment it sent its Prepare for T/(1+δ) of
//     its own clock; every acceptor of its accept quorum accepted after that
//     send and holds the lease for T of its clock, which is at least
//     T/(1+δ) of any other clock, so a quorum holds the lease for as long as
//     the owner believes;
//   - an acceptor never replaces a live lease of a different owner, and a
//     proposer adopts no lease: it proposes only itself, and only after a
//     quorum of prepare responses reported no live lease other than the one
//     it is renewing; quorums intersect;
//   - an acceptor that restarted forgot its promises and leases, so it takes
//     part in nothing for T(1+δ) (the owner's belief, in real time, with the
//     rate bound applied);
//   - a lease is (owner, ballot); only its owner releases it.
//
// DESIGN.md's rules from the 2026 audit are each cited where implemented
// ("audit rule"). The deliberately broken variants in Config.Unsafe exist
// for the simulator (internal/sim) to show that it catches each violation.
//
// # Timing
//
// Clocks need only bounded rates: for any interval, two nodes' clocks
// measure durations within a factor 1+δ (Config.Drift). No clock is ever
// compared with another node's. MaxDelay matters only to learners (for
// redirects), never to safety. Acquire costs two round trips when
// uncontended; renewals of every held lease run in shared rounds every
// quarter lease, each renewing leases with at most half their belief left,
// so holding N leases costs a number of messages per second independent of
// N.
//
// # Ballots
//
// A ballot (exposed as ids.Epoch) is counter<<24 | boot<<8 | server id:
// 40 bits of Lamport counter (above every ballot the node has seen and above
// MinEpoch), 16 bits of boot counter, 8 bits of server id. Unique per
// proposer and boot; increasing across restarts given MinEpoch.
package paxos
