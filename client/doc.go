// Package client is a mount's sessions with the leasefs servers: blocking,
// context-taking calls that fs/ turns FUSE operations into. It numbers
// requests, sends each to the owner of its inode (servers.go), keeps a
// session and a client lease (lease.Client) with each server it talks to,
// caches attributes and entries under the data locks the servers grant
// (cache.Cache), answers revocations, and recovers after a NACK.
//
// # Parts
//
// A Client is its sessions and sends (client.go, servers.go, send.go,
// session.go), the operations fs/ calls (ops.go, mapped.go, statfs.go),
// and three parts with state of their own, each a type of its own that
// the Client and the other parts call only through an interface
// (parts.go): the write-back (writeBack: writeback.go, flush.go,
// reclaim.go, extents.go), the changes sent behind the caller (behind:
// behind.go, createbehind.go) and the read-ahead (readAhead:
// readahead.go). Each part holds its Client to send and to reach the
// cache under Client.mu, in the lock order below.
//
// # Lock and wait order
//
// The client's goroutines: FUSE requests (fs/); the senders of changes sent
// behind the caller (behind.sendQueued, one per directory with changes
// queued, and a flush that takes a held batch along, flushWithCreate); the
// write-back's flushes (a file's mu held while its writes are sent,
// sendWrites' workers); revocation handlers (onCallback); renewLoop
// (renewals, flushOld); kernelLoop; the background goroutine (evict.go:
// gives back locks the cache evicted, drops kernel caches for others);
// prefetches (readAhead.fetch); refillInos; reclaims of files created
// behind, after a NACK.
//
// Locks held across a wait for the server (ctxMutex, whose lock gives up
// with its context): a dirty file's mu (dirtyFile.mu, held while it is
// flushed or reclaimed), a mapped file's sendMu (mapFile.sendMu, the same
// for pages written back from a mapping), Client.recoverMu (one recovery
// at a time) and a conn's open (one session opening at a time).
//
// What each goroutine may wait for (besides the server, and the mutexes
// held only around memory below, which no one holds across a wait):
//
//	FUSE request      changes behind of its inodes (waitFor), a slot behind,
//	                  a file's mu, recoverMu, a conn's open, a prefetch
//	flush             changes behind of its file, then the file's mu
//	revocation        changes behind of its inode, the file's mu, the kernel
//	background        changes behind, a file's mu, the kernel
//	sender (behind)   an rmdir's directory emptied (its children's senders),
//	                  recoverMu, a conn's open
//	recovery          recoverMu, a conn's open; files' mu only by tryLock
//
// Nothing waits for the background goroutine or a revocation handler, and
// the server does not make a holder's requests wait for its own revocation
// (it lets them run). What keeps the graph without a cycle:
//
//   - send, and all it runs (recovery, reclaim), never waits for changes
//     sent behind nor takes a file's mu but by tryLock: it runs on the
//     senders and on flushes holding a file's mu. waitFor runs before send
//     (call), never inside. The locks a reply's grants push out of the
//     cache are given back by the background goroutine (takeEvictedLocked),
//     which waits for the inode's changes behind and flushes it first: given
//     back by the sender that got the reply, a lock would wait for that
//     sender's own batch.
//   - The kernel's invalidation (Hooks.Invalidate) may wait for page locks
//     held by a FUSE request, which may wait for anything above: only a
//     revocation handler and the background goroutine call it; others hand
//     it over (invalidateLater).
//   - A wait that can hold up a FUSE request takes the request's context
//     (opContext): deaf to FUSE interrupts but for lock waits, bounded by
//     its caller's deadline and a soft mount's timeout.
//
// Mutexes held only around memory, each taken before those it lists:
//
//	dirtyFile.mu (a file's)   Client.mu, writeBack.mu (bufferChange,
//	                          retire, loseFile)
//	readAhead.mu              Client.mu (readDone, take)
//	Client.mu                 servers.mu, seqsInFlight.mu, behind.mu,
//	                          inoPool.mu, releases.mu, mappedFiles.mu
//	changesInFlight.mu        none: innermost
package client
