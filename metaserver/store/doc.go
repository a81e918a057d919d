// Package store is a leasefs server's badger store: the namespace, the
// inodes' attributes, extended attributes, symlink targets and file data,
// each operation one transaction (DESIGN.md, "Servers, ownership and
// replication": every server keeps a full replica of the metadata in its
// own badger store).
//
// # Key layout
//
// Every key is a one-byte record kind, the big-endian inode number the
// record belongs to, and a suffix:
//
//	'A' ino                 attributes (inode record; dirs also keep parent and next cookie;
//	                        a block-mapped file's, under its own format, its stored bytes)
//	'D' dir name            directory entry: child ino, type bits, cookie
//	'C' dir cookie(8)       cookie index: child ino, type bits, name (ReadDir order)
//	'P' ino page(8)         file data page: up to PageSize bytes, never past Size
//	'B' ino off(8)          extent of a block-mapped file, keyed by its file offset
//	                        (blockmap.AppendExtent); never past Size
//	'U' ino unique(16)      block an extent points into: size, checksums (blockmap.AppendBlock)
//	'G' ino due(8) unique(16)  garbage: a block of ino no extent references any more, to
//	                        delete from the block store at due (unix ns) or later; the
//	                        value is its size (blockmap.go)
//	'X' ino name            extended attribute value
//	'L' ino                 symlink target
//	'R' ino client(8)       request ids of the client's latest changes to ino (done.go)
//	'E' ino                 replication state: ownership epoch, version (package replica)
//	'T' ino ...             transfers' staging (package replica; server-local, never
//	                        replicated, excluded from checksums and digests)
//	'S' MakeIno(server, 0)  the server's inode counter (server-local, never replicated)
//	'F' 0                   the store's format (server-local; format.go)
//
// Records belong to exactly one inode (DESIGN.md), so ownership and
// replication can work per inode: a Write names its inode (Write.Ino).
// Garbage too: keyed by its inode first, it replicates and transfers with
// the inode's other records, so a new owner after a failover collects what
// the old one freed; DueGarbageAfter finds due records by a scan of all 'G'.
// Block records are 'U', not 'K': 'K' held file data in 64 KiB chunks in
// store format 1, and a peer that old may still send them (LegacyHint).
//
// A regular file keeps its data in pages or in a block map, never both:
// the attribute record says which. The page operations answer ErrMapped
// for a block-mapped file, the block map ones ErrNotMapped for a file
// with pages; a file with neither becomes block-mapped at its first
// CommitBlocks or WriteBlock, and stays so until it is purged. The server
// keeps a file's data in pages while it is at most wire.InlineMax bytes
// and was never block-mapped, and converts it (ConvertFile) when a write
// makes it larger. While ConvertPagesToBlocks converts a file at start,
// its 'B' and 'U' records are staged beside its pages, unread until one
// transaction marks it block-mapped; its pages, ignored from then on, go
// after (convertblocks.go).
//
// # Caller's duties
//
//   - Open takes the data directory for itself (ErrDataDirInUse for a second
//     process); Close gives it back.
//   - Operations are safe for concurrent use; one that keeps conflicting
//     with others fails with wire.CodeAgain. A change made for a client
//     request goes through For(origin), so that a resend of it finds it
//     applied (Applied) instead of making it twice.
//   - Writes are not synced as they commit: call Sync where the client asks
//     for durability (fsync, close). A cluster owner's changes are synced by
//     the store itself once Replicate took them.
//   - A cluster server opens the store with the hooks of Options: Stamp
//     fences and stamps every change with the inode's ownership epoch,
//     Replicate sends it to a majority before it commits here, OnAllocIno
//     acquires a new inode before it is made, and NoOrphanPurge leaves
//     unlinked inodes to their owners. The replication layer (package
//     replica) works on raw transactions: View and UpdateRaw, which run no
//     hooks.
//
// # Space
//
// Badger must never run out of space on the data directory's file system
// (it writes through shared maps of sparse files: a full disk is SIGBUS).
// Every transaction is admitted before it commits, against a reserve; one
// that does not fit fails with wire.CodeNoSpace and writes nothing (space.go).
package store
