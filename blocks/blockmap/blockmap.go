package blockmap

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/internal/ids"
)

var (
	// ErrInvalid is an argument the map refuses (a malformed write, a range
	// that overflows); the map is unchanged.
	ErrInvalid = errors.New("blockmap: invalid argument")
	// ErrCorrupt is a set of records that breaks an invariant, found by Load.
	ErrCorrupt = errors.New("blockmap: records inconsistent")
	// ErrNXIO is lseek's ENXIO: SEEK_DATA or SEEK_HOLE at or past the end
	// of the file, or SEEK_DATA with no data after the offset.
	ErrNXIO = errors.New("blockmap: no data or hole at or after offset")
)

// MaxSize bounds every file offset, so that offsets fit lseek's off_t.
const MaxSize = math.MaxInt64

// Unique is the random part of a block's id; the inode is the file's.
type Unique = [16]byte

// Extent is a range of the file, [Off, Off+Len), backed by the range of
// block Block that starts at BlockOff.
type Extent struct {
	Off, Len uint64
	Block    Unique
	BlockOff uint64
}

// End is the file offset just past e.
func (e Extent) End() uint64 { return e.Off + e.Len }

// slice returns the part of e that covers [a, b), which must lie inside e.
func (e Extent) slice(a, b uint64) Extent {
	return Extent{Off: a, Len: b - a, Block: e.Block, BlockOff: e.BlockOff + (a - e.Off)}
}

// Block is an immutable block of the file: its size and its checksums
// (one per blocks.ChunkSize chunk).
type Block struct {
	Unique Unique
	Size   uint64
	Sums   blocks.Sums
}

func chunks(size uint64) int { return int((size + blocks.ChunkSize - 1) / blocks.ChunkSize) }

func (b *Block) check() error {
	if b.Size == 0 || b.Size > blocks.MaxBlock {
		return fmt.Errorf("block %x: size %d not in (0, %d]", b.Unique, b.Size, blocks.MaxBlock)
	}
	if len(b.Sums) != chunks(b.Size) {
		return fmt.Errorf("block %x: %d sums for %d bytes", b.Unique, len(b.Sums), b.Size)
	}
	return nil
}

type blockRef struct {
	Block
	refs int
}

// Map is one file's map from ranges to blocks. It is not safe for
// concurrent use; its owner (the store under the inode's ownership, a
// mount under its lock) serializes calls.
type Map struct {
	ino     ids.Ino
	ext     []Extent // sorted by Off, non-overlapping
	blocks  map[Unique]*blockRef
	scratch []Extent
}

// New returns the empty map of a file with no data.
func New(ino ids.Ino) *Map {
	return &Map{ino: ino, blocks: make(map[Unique]*blockRef)}
}

// Load builds the map of ino from its persisted records, in any order,
// and checks every invariant: extents do not overlap, each lies inside a
// known block, and every block is referenced by at least one extent.
func Load(ino ids.Ino, blks []Block, exts []Extent) (*Map, error) {
	m := New(ino)
	for i := range blks {
		b := blks[i]
		if err := b.check(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		if m.blocks[b.Unique] != nil {
			return nil, fmt.Errorf("%w: block %x twice", ErrCorrupt, b.Unique)
		}
		m.blocks[b.Unique] = &blockRef{Block: b}
	}
	m.ext = slices.Clone(exts)
	slices.SortFunc(m.ext, func(a, b Extent) int { return cmp.Compare(a.Off, b.Off) })
	for i, e := range m.ext {
		if err := m.checkExtent(e, nil); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		if i > 0 && m.ext[i-1].End() > e.Off {
			return nil, fmt.Errorf("%w: extents at %d and %d overlap", ErrCorrupt, m.ext[i-1].Off, e.Off)
		}
		m.blocks[e.Block].refs++
	}
	for u, b := range m.blocks {
		if b.refs == 0 {
			return nil, fmt.Errorf("%w: block %x referenced by no extent", ErrCorrupt, u)
		}
	}
	return m, nil
}

// checkExtent checks e alone: not empty, within MaxSize, inside its block
// (looked up in the map, or in extra, a write's new blocks).
func (m *Map) checkExtent(e Extent, extra map[Unique]*Block) error {
	if e.Len == 0 || e.Off > MaxSize || e.Len > MaxSize-e.Off {
		return fmt.Errorf("extent [%d, +%d): empty or past %d", e.Off, e.Len, uint64(MaxSize))
	}
	var size uint64
	if b := m.blocks[e.Block]; b != nil {
		size = b.Size
	} else if b := extra[e.Block]; b != nil {
		size = b.Size
	} else {
		return fmt.Errorf("extent at %d: unknown block %x", e.Off, e.Block)
	}
	if e.BlockOff > size || e.Len > size-e.BlockOff {
		return fmt.Errorf("extent at %d: [%d, +%d) outside block %x of %d bytes", e.Off, e.BlockOff, e.Len, e.Block, size)
	}
	return nil
}

// Ino is the file's inode.
func (m *Map) Ino() ids.Ino { return m.ino }

// ID is the full id of one of the file's blocks.
func (m *Map) ID(u Unique) blocks.ID { return blocks.ID{Ino: m.ino, Unique: u} }

// Extents returns the extents in file order; the caller must not change them.
func (m *Map) Extents() []Extent { return m.ext[:len(m.ext):len(m.ext)] }

// Blocks returns the number of blocks the map references.
func (m *Map) Blocks() int { return len(m.blocks) }

// Block returns block u and the number of extents that reference it.
func (m *Map) Block(u Unique) (Block, int, bool) {
	b := m.blocks[u]
	if b == nil {
		return Block{}, 0, false
	}
	return b.Block, b.refs, true
}

// StoredBytes is the file's st_blocks in bytes: the sum of its extents'
// lengths (the file's bytes that have data), rounded up to whole 512-byte
// sectors. Parts of blocks that no extent references are not counted (see
// BlockBytes).
func (m *Map) StoredBytes() uint64 {
	var n uint64
	for _, e := range m.ext {
		n += e.Len
	}
	return (n + 511) &^ 511
}

// BlockBytes is the size of the blocks the map references: what the block
// store holds for this file, overwritten parts of blocks included.
func (m *Map) BlockBytes() uint64 {
	var n uint64
	for _, b := range m.blocks {
		n += b.Size
	}
	return n
}

// search returns the index of the first extent that ends after off.
func (m *Map) search(off uint64) int {
	i, _ := slices.BinarySearchFunc(m.ext, off, func(e Extent, off uint64) int {
		if e.End() <= off {
			return -1
		}
		return 1
	})
	return i
}
