// Package blocks stores file data as immutable blocks, apart from the
// metadata servers: a directory (FileStore), a directory reached through
// its server over HTTPS (Handler and RemoteStore), and an S3-compatible
// object store (S3Store), all behind one Store interface shaped to fit S3
// (whole-object puts, range reads, list by prefix, delete; no rename, no
// append).
//
// # Blocks
//
// A block is named by an ID: the inode it belongs to and 16 random bytes
// its writer picks. It is written once, whole, at most MaxBlock bytes, and
// never changed: an overwrite of file data writes a new block and commits
// a new block map. Its text form "<ino hex>/<unique hex>" is its key, so
// one inode's blocks list together.
//
// # Durability
//
// Put returns nil only once the block is durable (for FileStore: written
// to a temp file, synced, renamed into place, its directories synced; over
// HTTP: the server's Put returned before the 200; S3Store: the object
// store answered the PUT, which it checked against the block's CRC-32C).
// No reader ever sees a
// part of a block under its name. A writer may commit a block map that
// references a block only after its Put returned nil.
//
// # Integrity
//
// Checksums live in the block map, not in the block: Sums holds a CRC-32C
// per ChunkSize chunk, and ReadVerified widens a read to whole chunks,
// checks them and returns ErrCorrupt (wrapped with the id) instead of
// wrong bytes. Stores do not verify: a store is never trusted.
//
// # Deletion
//
// Only the metadata server's collector deletes blocks and lists the
// store: blocks no committed map references (a writer that crashed or
// lost its lock before its commit), and blocks a map stopped referencing,
// once no client can still read them under a lock it holds. Mounts never
// delete.
//
// # Remote access
//
// Handler serves a store's blocks to mounts on other hosts over TLS with
// the cluster certificate, which RemoteStore pins. Every request carries a
// Capability: one operation (read or write) on one block until an expiry,
// signed with HMAC-SHA256 under a key the servers derive from the cluster
// secret, the same model as an S3 presigned URL. The inode's owner issues
// capabilities to a mount under its lock; the block server checks only
// the signature, the operation, the block and the expiry. Delete and List
// are not served.
package blocks
