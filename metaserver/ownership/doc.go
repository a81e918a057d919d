// Package ownership is a cluster server's owner logic (DESIGN.md, "Servers,
// ownership and replication"): per-inode ownership by PaxosLease (package
// paxosnode), recovery of an inode's state from a majority on a fresh
// acquire, replication of every change to a majority before the reply,
// hand-over of inodes between servers, and anti-entropy for servers that
// were down or cut off. A single server has no Owner.
//
// # Caller's duties
//
//   - New the Owner before opening the store, and open it with the Owner's
//     hooks: store.Options.Stamp = replica.Stamp(OwnerEpoch) (a change
//     commits only while this server owns every inode it writes, recovered
//     under the current epoch), Replicate (the change reaches a majority,
//     this server's synced store included, before the operation returns),
//     Uncommitted and OnAllocIno = OnAlloc; NoOrphanPurge.
//   - Start it once the transport listens, with the store's replica and the
//     lock manager; route peer bodies (paxosnode.IsPeerBody) to HandlePeer.
//   - Before an operation takes its client locks, Redirect it if another
//     server owns its inode, then OwnAll the inodes it touches, in ascending
//     order, holding no client lock meanwhile: a server asked to hand an
//     inode over must be able to revoke its clients' locks. Once the locks
//     are held, check StillOwned: an inode handed over while the operation
//     waited for its lock is owned again from the start.
//   - Close (a crash, as far as ownership goes) or Close gracefully (inodes
//     handed over first) before closing the store.
//
// # Safety
//
//   - Fencing: every replica rejects records of an older epoch than one it
//     has seen for the inode (package replica); a recovered owner has
//     written its epoch to a majority before it serves, so a deposed owner
//     can never again reach a majority.
//   - A fresh owner that did not get the inode by a confirmed hand-over
//     (the previous owner crashed, was cut off, or we cannot tell) grants no
//     client lock on it for τ(1+δ) after its acquire: the old owner's
//     clients may trust their locks until then (grace.go asks the previous
//     owner first; Locks.Grace, which the lock server core enforces). The
//     server has no lock reclaim, so during the grace every lock request
//     on the inode waits (stricter than DESIGN.md's "no
//     conflicting lock except reclaims"); clients reclaim buffered writes
//     after it by their version check (WriteIfVersion).
//   - An inode with client locks is pinned (never released for idleness);
//     if its lease lapses anyway the clients that hold locks on it are
//     failed (NACK), never ACKed again (onLost).
//
// # State transfer
//
// Whole-inode states (a new owner's recovery and write-back, a push to a
// replica that answers with a version gap, anti-entropy) move with
// replica.CopyInode: a page of at most transferPage bytes per peer call,
// staged at the receiver and switched in at the end, so inodes of any size
// move, and a crash or a dead sender midway leaves the receiver at its
// previous state.
//
// # Limits
//
//   - Open-but-unlinked files are counted per server.
package ownership
