package blocks

import (
	"context"
	"errors"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

// MaxBlock is the largest block a store takes.
const MaxBlock = 4 << 20

// AllInodes asks List for every block of the store (inode 0 is never a
// file's).
const AllInodes ids.Ino = 0

var (
	// ErrNotFound is returned by ReadAt for a block the store does not hold.
	ErrNotFound = errors.New("blocks: no such block")
	// ErrCorrupt is returned by a verified read whose bytes do not match
	// the block's checksums; the bytes are never handed out.
	ErrCorrupt = errors.New("blocks: block corrupt")
	// ErrTooBig is returned by Put for a block over MaxBlock.
	ErrTooBig = errors.New("blocks: block over MaxBlock")
	// ErrDenied is returned when a capability is missing, forged, expired
	// or for another operation or block.
	ErrDenied = errors.New("blocks: capability refused")
	// ErrOtherStore is returned by OpenFileStoreIfSame for a directory
	// holding another store, or none.
	ErrOtherStore = errors.New("blocks: not the expected block store")
)

// Store holds immutable blocks. Implementations are safe for concurrent
// use; they keep no reference to a caller's slice after a call returns.
type Store interface {
	// Put stores data (at most MaxBlock bytes) as block id. The block is
	// durable when Put returns nil, and no reader ever sees part of it
	// under its name. Putting the same id with the same bytes again is
	// harmless; a writer never puts other bytes under an id it used.
	Put(ctx context.Context, id ID, data []byte) error
	// ReadAt reads len(p) bytes of block id from off, as io.ReaderAt
	// does: fewer bytes only at the block's end, with io.EOF. A block the
	// store does not hold is ErrNotFound.
	ReadAt(ctx context.Context, id ID, p []byte, off int64) (int, error)
	// Delete removes block id; a missing block is not an error.
	Delete(ctx context.Context, id ID) error
	// List calls fn for each block of inode ino (every block for
	// AllInodes), in no particular order, and stops at fn's first error,
	// which it returns. Blocks put or deleted meanwhile may or may not be
	// seen; blocks being written are not.
	List(ctx context.Context, ino ids.Ino, fn func(id ID, size int64, mtime time.Time) error) error
	// Usage reports what the store holds.
	Usage(ctx context.Context) (Usage, error)
}

// Usage is what a store holds, and the room left where known.
type Usage struct {
	Bytes  int64 // sum of the blocks' sizes
	Blocks int64
	Free   int64 // bytes that can still be written; -1 if unknown
}

// countBlocks adds up the blocks st lists: Usage for a store that keeps
// no count.
func countBlocks(ctx context.Context, st Store) (Usage, error) {
	var u Usage
	err := st.List(ctx, AllInodes, func(_ ID, size int64, _ time.Time) error {
		u.Bytes += size
		u.Blocks++
		return nil
	})
	if err != nil {
		return Usage{}, err
	}
	return u, nil
}
