// Package paxosnode is the server-to-server layer of a leasefs server: links to
// the other servers (Peers) and the PaxosLease ownership runtime (Node) that
// drives the pure core of package lease/paxos with a real clock and real
// QUIC links (DESIGN.md, "Servers, ownership and replication").
//
// # The caller's duties
//
//   - Start the transport server first, then New the Node, and route every
//     request body for which IsPeerBody is true to Node.HandlePeer; other
//     bodies are client requests. Peer traffic uses the reserved client ids
//     PeerClientID(1..255) (see PeerOf).
//   - Before changing an inode: Acquire it (or redirect the client on
//     *NotOwnerError, retry later on ErrQuarantined), recover it with the
//     returned epoch, and check Owns with each change; never cache ownership.
//   - Touch every inode a request uses, and Pin inodes on which clients
//     hold locks (Unpin when the last lock goes); other leases are released
//     after Config.IdleRelease.
//   - On a Loss (OnLost), stop serving that inode and fail the clients that
//     hold locks on it (NACK): another server may own it soon.
//   - Release an inode to hand it over; Shutdown to stop gracefully
//     (releases everything), Close to stop like a crash (held leases run
//     out at the peers).
//   - Use Peers().Handle and Peers().Call for server-to-server requests
//     (replication); kinds are the application's.
//
// # Safety
//
// Ownership safety is the core's (package paxos, "# Safety"); this package
// adds what the core asks of its caller: the boot counter is incremented and
// synced to Dir/BootFile before the core starts, so ballots never repeat
// across restarts; MinEpoch comes from the caller; the quarantine defaults to
// the smallest safe value, T(1+δ); every query reads the clock afresh on the
// node's goroutine; and messages are stepped with one clock reading each.
// Lost, duplicated, delayed or reordered PaxosLease messages cost liveness
// only, so the send path drops rather than blocks.
//
// Peer frames are authenticated only by the cluster token, which clients
// hold too: a client that knows the token can speak for a server. Ownership
// fencing by epoch (replicas reject older epochs) does not depend on it.
//
// # Timing
//
// PaxosLease messages to one peer go one frame at a time, each bounded by
// Config.SendTimeout; what is produced meanwhile is coalesced into the next
// frame, so holding N leases costs frames independent of N. A learner's view
// of another owner (Owner, NotOwnerError) assumes delivery within MaxDelay;
// Learn entries that waited longer than half of it are dropped.
package paxosnode
