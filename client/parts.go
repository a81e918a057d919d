package client

import (
	"context"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// The Client's parts with state of their own (doc.go, # Parts): what the
// Client, and each part, calls on the others.
var (
	_ writeBacker  = (*writeBack)(nil)
	_ behindSender = (*behind)(nil)
	_ readAheader  = (*readAhead)(nil)
)

// writeBacker is the write-back: writes and attribute changes buffered
// under an X lock until a flush sends them, and the losses of those the
// server refused or a recovery could not reclaim.
type writeBacker interface {
	// buffer buffers a write of data at off if the client may keep it
	// (Client.Write), and reports the bytes the file then buffers and
	// whether killSuidgid changed the mode.
	buffer(ctx context.Context, ino ids.Ino, off uint64, data []byte, killSuidgid bool) (ok bool, fileBytes int, killed bool, err error)
	// bufferAttr buffers an attribute change if the client may keep it,
	// and returns the attributes it gives (nil if not buffered).
	bufferAttr(ctx context.Context, req *wire.Request) (*wire.Attr, error)
	// flushBuffered sends ino's buffered changes; a change the server
	// refuses fails the file (lostGen), not the flush.
	flushBuffered(ctx context.Context, ino ids.Ino) error
	// flushAll flushes every file, after the changes sent behind.
	flushAll(ctx context.Context) error
	// flushOld flushes files dirty for longer than flushAge.
	flushOld(ctx context.Context)
	// reclaim reclaims every dirty file after a recovery.
	reclaim(ctx context.Context)
	// lost records a loss of ino's changes for its handles.
	lost(ino ids.Ino, err error)
	lostGen(ino ids.Ino) uint64
	lostErr(ino ids.Ino) error
	// holds reports whether ino has a dirty file; buffers whether it has
	// buffered writes, or is being written or flushed.
	holds(ino ids.Ino) bool
	buffers(ino ids.Ino) bool
	dirtyBytes() int64
	unsent() []Unsent
}

// behindSender is the changes sent behind the caller: removals and creates
// under a directory's X lock, made in the cache at once and sent in
// batches per directory, and the waits of whatever could observe them.
type behindSender interface {
	// create and remove make the change in the cache and send it behind
	// the caller if they may (false: send it and wait).
	create(ctx context.Context, parent ids.Ino, name string, mode, umask, uid, gid uint32) (*wire.Attr, bool, error)
	remove(ctx context.Context, parent ids.Ino, name string, child *wire.Attr, op wire.Op) (bool, error)
	// sendWithHeld sends change in one batch with ino's create, if that
	// is still held in its queue, and reports whether it did.
	sendWithHeld(ctx context.Context, ino ids.Ino, change *wire.Request) (bool, *wire.Reply, error)
	// waitFor waits for the changes req could observe (call).
	waitFor(ctx context.Context, req *wire.Request) error
	// wait and waitAll wait for the changes of or in inos, or for all;
	// opWait runs one of them for an operation whose context is ctx.
	wait(ctx context.Context, inos ...ids.Ino) error
	waitAll(ctx context.Context) error
	opWait(ctx context.Context, wait func(context.Context) error) error
	// busy reports whether a change of or in ino is in flight.
	busy(ino ids.Ino) bool
	// lostErr is the error ino's create sent behind failed with; isLost
	// whether there is one.
	lostErr(ino ids.Ino) error
	isLost(ino ids.Ino) bool
	// askInos asks the server for inode numbers for creates; resetInos
	// forgets those it has and asks again (after a lost session).
	askInos()
	resetInos()
}

// readAheader is the read-ahead: sequential readers' files fetched ahead
// into the cache, or kept for the reader.
type readAheader interface {
	// wait waits for a prefetch in flight that covers off, and reports
	// whether there was one.
	wait(ctx context.Context, ino ids.Ino, off uint64) bool
	// readDone records a read, and fetches ahead of a sequential one.
	readDone(ino ids.Ino, off uint64, n int)
	// take copies into buf what prefetches keep of ino at off, while it
	// is current: the bytes, their file version, and whether it could.
	take(ino ids.Ino, off uint64, buf []byte) (n int, version uint64, ok bool)
}
