package wire

import (
	"fmt"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/codec"
	"github.com/leasefs/leasefs/internal/ids"
)

// Bounds of the block map operations: a commit of MaxCommit blocks of
// blocks.MaxBlock and as many extents, or MaxPieces pieces, is under
// 300 KiB, far inside MaxData.
const (
	MaxCommit = 1024
	MaxPieces = 1024
)

// The encodings of a commit and of pieces carry their own version, so
// that they can change without a new Version for every message.
const blockMapVersion = 1

// AppendCommit encodes an OpCommitBlocks request's Data: the new blocks
// and the extents they back, as the store records them
// (blockmap.AppendBlock, AppendExtent).
func AppendCommit(b []byte, blks []blockmap.Block, exts []blockmap.Extent) []byte {
	e := codec.Enc{B: b}
	e.U8(blockMapVersion)
	e.U32(uint32(len(blks)))
	for _, blk := range blks {
		e.Bytes(blockmap.AppendBlock(nil, blk))
	}
	e.U32(uint32(len(exts)))
	for _, x := range exts {
		e.Bytes(blockmap.AppendExtent(nil, x))
	}
	return e.B
}

// ParseCommit reads what AppendCommit wrote: at most MaxCommit blocks and
// MaxCommit extents, each valid alone (whether they fit the map is the
// store's check).
func ParseCommit(b []byte) ([]blockmap.Block, []blockmap.Extent, error) {
	d := codec.NewDec(b)
	d.Version(blockMapVersion)
	n := d.Count(MaxCommit, 4+blockmap.BlockRecordLen(1))
	var blks []blockmap.Block
	for range n {
		rec := d.Bytes(blockmap.BlockRecordLen(blocks.MaxBlock))
		if d.Err() != nil {
			break
		}
		blk, err := blockmap.ParseBlock(rec)
		if err != nil {
			return nil, nil, Errf(CodeBadMessage, "commit: %v", err)
		}
		blks = append(blks, blk)
	}
	n = d.Count(MaxCommit, 4+blockmap.ExtentRecordLen)
	var exts []blockmap.Extent
	for range n {
		rec := d.Bytes(blockmap.ExtentRecordLen)
		if d.Err() != nil {
			break
		}
		x, err := blockmap.ParseExtent(rec)
		if err != nil {
			return nil, nil, Errf(CodeBadMessage, "commit: %v", err)
		}
		exts = append(exts, x)
	}
	if err := d.End(); err != nil {
		return nil, nil, Errf(CodeBadMessage, "commit: %v", err)
	}
	return blks, exts, nil
}

// pieceMinLen is the encoding of a hole: Off, Len, Hole.
const pieceMinLen = 8 + 8 + 1

// AppendPieces encodes an OpLookupBlocks reply's Data: each piece's file
// range, and for data its block's full id, size and checksums and where
// the range starts in it.
func AppendPieces(b []byte, ps []blockmap.Piece) []byte {
	e := codec.Enc{B: b}
	e.U8(blockMapVersion)
	e.U32(uint32(len(ps)))
	for _, p := range ps {
		e.U64(p.Off)
		e.U64(p.Len)
		e.Bool(p.Hole)
		if p.Hole {
			continue
		}
		e.U64(uint64(p.Block.Ino))
		e.B = append(e.B, p.Block.Unique[:]...)
		e.U64(p.BlockOff)
		e.U64(p.Size)
		e.U32(uint32(len(p.Sums)))
		for _, s := range p.Sums {
			e.U32(s)
		}
	}
	return e.B
}

// ParsePieces reads what AppendPieces wrote: at most MaxPieces pieces,
// each one following the one before, and each range of data inside its
// block, which has one checksum per blocks.ChunkSize.
func ParsePieces(b []byte) ([]blockmap.Piece, error) {
	d := codec.NewDec(b)
	d.Version(blockMapVersion)
	n := d.Count(MaxPieces, pieceMinLen)
	var ps []blockmap.Piece
	for i := 0; i < n && d.Err() == nil; i++ {
		p := blockmap.Piece{Off: d.U64(), Len: d.U64(), Hole: d.Bool()}
		if !p.Hole {
			p.Block.Ino = ids.Ino(d.U64())
			p.Block.Unique = getUnique(&d)
			p.BlockOff, p.Size = d.U64(), d.U64()
			if k := d.Count(blocks.MaxBlock/blocks.ChunkSize, 4); k > 0 {
				p.Sums = make(blocks.Sums, k)
				for j := range p.Sums {
					p.Sums[j] = d.U32()
				}
			}
		}
		if d.Err() != nil {
			break
		}
		if err := checkPiece(p, ps); err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	if err := d.End(); err != nil {
		return nil, Errf(CodeBadMessage, "pieces: %v", err)
	}
	return ps, nil
}

func getUnique(d *codec.Dec) blockmap.Unique {
	var u blockmap.Unique
	for i := range u {
		u[i] = d.U8()
	}
	return u
}

// checkPiece checks p alone and against the pieces before it.
func checkPiece(p blockmap.Piece, before []blockmap.Piece) error {
	bad := func(why string) error {
		return Errf(CodeBadMessage, "piece %d [%d, +%d): %s", len(before), p.Off, p.Len, why)
	}
	switch {
	case p.Len == 0 || p.Off > blockmap.MaxSize || p.Len > blockmap.MaxSize-p.Off:
		return bad("empty or past the largest file")
	case len(before) > 0 && before[len(before)-1].Off+before[len(before)-1].Len != p.Off:
		return bad("not where the piece before ends")
	case p.Hole:
		return nil
	case p.Size == 0 || p.Size > blocks.MaxBlock:
		return bad(fmt.Sprintf("block of %d bytes", p.Size))
	case p.BlockOff > p.Size || p.Len > p.Size-p.BlockOff:
		return bad(fmt.Sprintf("at %d of a block of %d bytes", p.BlockOff, p.Size))
	case uint64(len(p.Sums)) != (p.Size+blocks.ChunkSize-1)/blocks.ChunkSize:
		return bad(fmt.Sprintf("%d checksums for %d bytes", len(p.Sums), p.Size))
	}
	return nil
}
