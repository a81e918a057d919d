// Package metaserver is the leasefs server: it authenticates clients over
// the transport, keeps their sessions and data locks, and serves file
// operations from its store. Its parts are packages of their own:
//
//   - store: the badger store (namespace, attributes, file data, space).
//   - replica: replication of the store's records per inode, fenced by
//     ownership epochs; whole-inode state transfers; digests.
//   - ownership: a cluster server's owner logic (ownership, recovery,
//     replication to a majority, hand-over, anti-entropy).
//   - paxosnode: the PaxosLease runtime and the links to the other servers.
//   - admin: the admin endpoint.
//
// This package is the server itself: sessions (sessions.go), the lock
// manager, a shell around the pure lock server locks/lockserver (locking.go),
// the request handlers
// (ops.go) and what the admin endpoint reads (adminview.go).
//
// # Caller's duties
//
// Start a server with a validated Config (DefaultConfig, then set Dir);
// Shutdown stops it gracefully (a cluster server hands its inodes over
// first), Close like a crash. ServeAdmin starts an admin endpoint; close it
// before the server.
package metaserver
