package blockmap

import (
	"fmt"
	"slices"
)

// Change is what an operation did, keyed as the store keys extents, by
// their Off: the store deletes Removed, writes Added and Changed (which
// hold the new values), writes NewBlocks and deletes Freed, all in the
// transaction that commits the operation. Freed blocks are referenced by
// no extent any more; the collector deletes them from the block store
// once no reader can still hold them.
type Change struct {
	Removed   []Extent // old extents whose Off starts no extent now
	Added     []Extent // extents at an Off that started none before
	Changed   []Extent // extents at an Off that started one before, new values
	NewBlocks []Block
	Freed     []Block
}

// Empty reports whether the operation changed nothing.
func (c *Change) Empty() bool {
	return len(c.Removed)+len(c.Added)+len(c.Changed)+len(c.NewBlocks)+len(c.Freed) == 0
}

// span is a file range [lo, hi).
type span struct{ lo, hi uint64 }

// Apply overlays a write: exts, sorted by Off and not overlapping, each a
// range of one of newBlks, blocks the map does not hold yet, each of them
// referenced by some extent. What the write covers is trimmed from the
// extents already there (split, shortened, or removed); extents of the
// write that are contiguous in the file and in one block are merged. The
// map is unchanged on error.
func (m *Map) Apply(newBlks []Block, exts []Extent) (Change, error) {
	w, err := m.checkWrite(newBlks, exts)
	if err != nil {
		return Change{}, err
	}
	if len(w) == 0 {
		return Change{}, nil
	}
	cut := make([]span, len(w))
	for i, e := range w {
		cut[i] = span{e.Off, e.End()}
	}
	var c Change
	for i := range newBlks {
		b := newBlks[i]
		m.blocks[b.Unique] = &blockRef{Block: b}
		c.NewBlocks = append(c.NewBlocks, b)
	}
	m.overlay(cut, w, &c)
	return c, nil
}

// checkWrite validates a write and returns its extents with contiguous
// neighbours merged.
func (m *Map) checkWrite(newBlks []Block, exts []Extent) ([]Extent, error) {
	nb := make(map[Unique]*Block, len(newBlks))
	for i := range newBlks {
		b := &newBlks[i]
		if err := b.check(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if m.blocks[b.Unique] != nil || nb[b.Unique] != nil {
			return nil, fmt.Errorf("%w: block %x is not new", ErrInvalid, b.Unique)
		}
		nb[b.Unique] = b
	}
	used := make(map[Unique]bool, len(newBlks))
	w := make([]Extent, 0, len(exts))
	for i, e := range exts {
		if err := m.checkExtent(e, nb); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if nb[e.Block] == nil {
			return nil, fmt.Errorf("%w: extent at %d references block %x, not one of the write's", ErrInvalid, e.Off, e.Block)
		}
		if i > 0 && exts[i-1].End() > e.Off {
			return nil, fmt.Errorf("%w: write's extents at %d and %d overlap or are out of order", ErrInvalid, exts[i-1].Off, e.Off)
		}
		used[e.Block] = true
		if n := len(w); n > 0 && contiguous(w[n-1], e) {
			w[n-1].Len += e.Len
			continue
		}
		w = append(w, e)
	}
	if len(used) != len(newBlks) {
		return nil, fmt.Errorf("%w: %d of the write's %d blocks referenced by no extent", ErrInvalid, len(newBlks)-len(used), len(newBlks))
	}
	return w, nil
}

// contiguous reports whether b continues a, in the file and in one block.
func contiguous(a, b Extent) bool {
	return a.Block == b.Block && a.End() == b.Off && a.BlockOff+a.Len == b.BlockOff
}

// Truncate drops the data at and after size.
func (m *Map) Truncate(size uint64) (Change, error) {
	if size > MaxSize {
		return Change{}, fmt.Errorf("%w: truncate to %d", ErrInvalid, size)
	}
	var c Change
	m.overlay([]span{{size, MaxSize}}, nil, &c)
	return c, nil
}

// PunchHole drops the data of [off, off+n): fallocate's PUNCH_HOLE. The
// file's size is the caller's business.
func (m *Map) PunchHole(off, n uint64) (Change, error) {
	if off > MaxSize || n > MaxSize-off {
		return Change{}, fmt.Errorf("%w: punch [%d, +%d)", ErrInvalid, off, n)
	}
	var c Change
	if n > 0 {
		m.overlay([]span{{off, off + n}}, nil, &c)
	}
	return c, nil
}

// ZeroRange is fallocate's ZERO_RANGE: holes read as zeros, so it is
// PunchHole (the range keeps no space, which ZERO_RANGE allows).
func (m *Map) ZeroRange(off, n uint64) (Change, error) { return m.PunchHole(off, n) }

// overlay removes the sorted, disjoint ranges cut from the map's extents
// and inserts w (which lies inside cut), recording the difference in c.
func (m *Map) overlay(cut []span, w []Extent, c *Change) {
	i := m.search(cut[0].lo)
	j := i
	last := cut[len(cut)-1].hi
	for j < len(m.ext) && m.ext[j].Off < last {
		j++
	}
	old := m.ext[i:j]
	// repl is what replaces old: the parts of old outside cut, merged with w.
	repl := m.scratch[:0]
	k := 0 // next extent of w
	r := 0 // first range of cut that may still overlap
	for _, e := range old {
		for r < len(cut) && cut[r].hi <= e.Off {
			r++
		}
		cur := e.Off
		for q := r; q < len(cut) && cut[q].lo < e.End(); q++ {
			if cut[q].lo > cur {
				repl, k = m.emit(repl, w, k, e.slice(cur, cut[q].lo))
			}
			cur = max(cur, cut[q].hi)
		}
		if cur < e.End() {
			repl, k = m.emit(repl, w, k, e.slice(cur, e.End()))
		}
	}
	repl = append(repl, w[k:]...)
	m.scratch = repl[:0]
	m.diff(old, repl, c)
	m.ext = slices.Replace(m.ext, i, j, repl...)
}

// emit appends the extents of w before e, then e.
func (m *Map) emit(repl, w []Extent, k int, e Extent) ([]Extent, int) {
	for k < len(w) && w[k].Off < e.Off {
		repl = append(repl, w[k])
		k++
	}
	return append(repl, e), k
}

// diff records in c how repl differs from old, both sorted by Off, and
// moves the blocks' reference counts from old to repl.
func (m *Map) diff(old, repl []Extent, c *Change) {
	for _, e := range repl {
		m.blocks[e.Block].refs++
	}
	a, b := 0, 0
	for a < len(old) || b < len(repl) {
		switch {
		case b == len(repl) || a < len(old) && old[a].Off < repl[b].Off:
			c.Removed = append(c.Removed, old[a])
			a++
		case a == len(old) || repl[b].Off < old[a].Off:
			c.Added = append(c.Added, repl[b])
			b++
		default:
			if old[a] != repl[b] {
				c.Changed = append(c.Changed, repl[b])
			}
			a++
			b++
		}
	}
	for _, e := range old {
		br := m.blocks[e.Block]
		if br.refs--; br.refs == 0 {
			c.Freed = append(c.Freed, br.Block)
			delete(m.blocks, e.Block)
		} else if br.refs < 0 {
			panic(fmt.Sprintf("blockmap: block %x referenced %d times", e.Block, br.refs))
		}
	}
}
