package blockmap

import (
	"encoding/binary"
	"fmt"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/internal/codec"
)

// Record versions: a parser refuses any other.
const (
	extentVersion = 1
	blockVersion  = 1
)

// ExtentRecordLen is the size of an extent's record: version, Off (8),
// Len and BlockOff (4 each: both at most blocks.MaxBlock), Block (16).
const ExtentRecordLen = 1 + 8 + 4 + 16 + 4

// BlockRecordLen is the size of the record of a block of size bytes:
// version, Unique (16), Size (4), the count of sums (4) and the sums
// (4 each, one per blocks.ChunkSize chunk).
func BlockRecordLen(size uint64) int { return 1 + 16 + 4 + 4 + 4*chunks(size) }

// maxSums is the number of checksums of the largest block.
const maxSums = (blocks.MaxBlock + blocks.ChunkSize - 1) / blocks.ChunkSize

// The 16 random bytes travel as two u64s, which the codec has; the bytes
// come back in the same order.
func putUnique(enc *codec.Enc, u Unique) {
	enc.U64(binary.LittleEndian.Uint64(u[:8]))
	enc.U64(binary.LittleEndian.Uint64(u[8:]))
}

func getUnique(d *codec.Dec) Unique {
	var u Unique
	binary.LittleEndian.PutUint64(u[:8], d.U64())
	binary.LittleEndian.PutUint64(u[8:], d.U64())
	return u
}

// AppendExtent appends e's record to b. e must be valid (as the map's
// extents are).
func AppendExtent(b []byte, e Extent) []byte {
	enc := codec.Enc{B: b}
	enc.U8(extentVersion)
	enc.U64(e.Off)
	enc.U32(uint32(e.Len))
	putUnique(&enc, e.Block)
	enc.U32(uint32(e.BlockOff))
	return enc.B
}

// ParseExtent decodes an extent's record and checks what it can alone:
// not empty, within MaxSize, inside a block of at most blocks.MaxBlock.
// Whether its block exists is Load's check.
func ParseExtent(b []byte) (Extent, error) {
	d := codec.NewDec(b)
	d.Version(extentVersion)
	var e Extent
	e.Off = d.U64()
	e.Len = uint64(d.U32())
	e.Block = getUnique(&d)
	e.BlockOff = uint64(d.U32())
	if err := d.End(); err != nil {
		return Extent{}, fmt.Errorf("blockmap: extent record: %w", err)
	}
	if e.Len == 0 || e.Off > MaxSize || e.Len > MaxSize-e.Off || e.BlockOff+e.Len > blocks.MaxBlock {
		return Extent{}, fmt.Errorf("blockmap: extent record [%d, +%d) at %d in its block: %w", e.Off, e.Len, e.BlockOff, ErrCorrupt)
	}
	return e, nil
}

// AppendBlock appends b's record to buf. b must be valid (as the map's
// blocks are).
func AppendBlock(buf []byte, b Block) []byte {
	enc := codec.Enc{B: buf}
	enc.U8(blockVersion)
	putUnique(&enc, b.Unique)
	enc.U32(uint32(b.Size))
	enc.U32(uint32(len(b.Sums)))
	for _, s := range b.Sums {
		enc.U32(s)
	}
	return enc.B
}

// ParseBlock decodes a block's record: a size in (0, blocks.MaxBlock] and
// one checksum per chunk of it.
func ParseBlock(buf []byte) (Block, error) {
	d := codec.NewDec(buf)
	d.Version(blockVersion)
	var b Block
	b.Unique = getUnique(&d)
	b.Size = uint64(d.U32())
	n := d.Count(maxSums, 4)
	if n > 0 {
		b.Sums = make(blocks.Sums, n)
		for i := range b.Sums {
			b.Sums[i] = d.U32()
		}
	}
	if err := d.End(); err != nil {
		return Block{}, fmt.Errorf("blockmap: block record: %w", err)
	}
	if err := b.check(); err != nil {
		return Block{}, fmt.Errorf("blockmap: block record: %w: %w", ErrCorrupt, err)
	}
	return b, nil
}
