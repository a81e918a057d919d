package blockmap

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/leasefs/leasefs/blocks"
)

// Piece is one part of a read: a hole (read as zeros, nothing to fetch),
// or a range of a block.
type Piece struct {
	Off, Len uint64 // the file range
	Hole     bool
	// The rest is for data: the block, where the range starts in it, the
	// block's size and checksums, which ReadVerified needs.
	Block    blocks.ID
	BlockOff uint64
	Size     uint64
	Sums     blocks.Sums
}

// Fetch is the chunk-aligned range of the block a verified read of p
// fetches (blocks.Widen): the bytes of p start at p.BlockOff-off in it.
func (p Piece) Fetch() (off, n int64) {
	if p.Hole {
		return 0, 0
	}
	return blocks.Widen(int64(p.BlockOff), int64(p.Len), int64(p.Size))
}

// Lookup returns the pieces that cover [off, off+n), in file order, with
// no gaps. The map does not know the file's size: past the last extent
// everything is a hole, and the caller clips a read to the size first.
func (m *Map) Lookup(off, n uint64) ([]Piece, error) {
	if off > MaxSize || n > MaxSize-off {
		return nil, fmt.Errorf("%w: read [%d, +%d)", ErrInvalid, off, n)
	}
	if n == 0 {
		return nil, nil
	}
	end := off + n
	var ps []Piece
	cur := off
	for i := m.search(off); i < len(m.ext) && m.ext[i].Off < end; i++ {
		e := m.ext[i]
		if e.Off > cur {
			ps = append(ps, Piece{Off: cur, Len: e.Off - cur, Hole: true})
			cur = e.Off
		}
		part := e.slice(cur, min(e.End(), end))
		b := m.blocks[e.Block]
		ps = append(ps, Piece{Off: part.Off, Len: part.Len, Block: m.ID(e.Block),
			BlockOff: part.BlockOff, Size: b.Size, Sums: b.Sums})
		cur = part.End()
	}
	if cur < end {
		ps = append(ps, Piece{Off: cur, Len: end - cur, Hole: true})
	}
	return ps, nil
}

// SeekData is lseek's SEEK_DATA in a file of size bytes: the first offset
// at or after off that has data, or ErrNXIO if off is at or past size or
// only holes follow.
func (m *Map) SeekData(off, size uint64) (uint64, error) {
	if off >= size {
		return 0, ErrNXIO
	}
	i := m.search(off)
	if i == len(m.ext) || m.ext[i].Off >= size {
		return 0, ErrNXIO
	}
	return max(off, m.ext[i].Off), nil
}

// SeekHole is lseek's SEEK_HOLE in a file of size bytes: the first offset
// at or after off in a hole, where the end of the file counts as one, or
// ErrNXIO if off is at or past size.
func (m *Map) SeekHole(off, size uint64) (uint64, error) {
	if off >= size {
		return 0, ErrNXIO
	}
	cur := off
	for i := m.search(off); i < len(m.ext) && m.ext[i].Off <= cur; i++ {
		cur = m.ext[i].End()
	}
	return min(cur, size), nil
}

// ReadPieces fills buf, the file's bytes from start, with pieces from a
// Lookup that starts there, in order: holes as zeros, data by read (which
// the caller gives: blocks.ReadVerified from its store). A lookup may
// answer fewer pieces than cover buf: ReadPieces returns where the pieces
// it used end. A piece that does not follow the one before, or runs past
// buf, is ErrCorrupt; read's error is returned with its piece, for the
// caller to name.
func ReadPieces(start uint64, ps []Piece, buf []byte, read func(p *Piece, dst []byte) error) (end uint64, bad *Piece, err error) {
	end = start
	limit := start + uint64(len(buf))
	for i := range ps {
		p := &ps[i]
		if p.Off != end || p.Len > limit-end {
			return end, p, fmt.Errorf("%w: piece [%d, +%d) for bytes from %d to %d", ErrCorrupt, p.Off, p.Len, end, limit)
		}
		dst := buf[p.Off-start : p.Off-start+p.Len]
		if p.Hole {
			clear(dst)
		} else if err := read(p, dst); err != nil {
			return end, p, err
		}
		end += p.Len
	}
	return end, nil, nil
}

// ReadVerified reads piece p's bytes from st into dst, verified against
// its block's sums: ReadPieces' read for a store.
func ReadVerified(ctx context.Context, st blocks.Store) func(p *Piece, dst []byte) error {
	return func(p *Piece, dst []byte) error {
		n, err := blocks.ReadVerified(ctx, st, p.Block, int64(p.Size), p.Sums, dst, int64(p.BlockOff))
		if errors.Is(err, io.EOF) && n == len(dst) {
			return nil
		}
		return err
	}
}

// Slice returns the parts of ps, pieces in file order with no gaps (a
// Lookup's), that cover [off, end), trimmed to it: a read within a range
// looked up before needs no lookup of its own.
func Slice(ps []Piece, off, end uint64) []Piece {
	i, _ := slices.BinarySearchFunc(ps, off, func(p Piece, off uint64) int { return cmp.Compare(p.Off+p.Len, off+1) })
	var out []Piece
	for ; i < len(ps) && ps[i].Off < end; i++ {
		p := ps[i]
		lo, hi := max(p.Off, off), min(p.Off+p.Len, end)
		if !p.Hole {
			p.BlockOff += lo - p.Off
		}
		p.Off, p.Len = lo, hi-lo
		out = append(out, p)
	}
	return out
}
