package blockmap

import "github.com/leasefs/leasefs/blocks"

// Plan is one compaction: the data of Extents, read in file order and
// packed into one new block of Size bytes (at most blocks.MaxBlock), then
// committed with Apply(Write(...)). It is valid only while the map is
// unchanged, so its caller plans, copies and commits under one X lock.
type Plan struct {
	Extents []Extent
	Size    uint64
	// Gain is how many fewer extents the file has once the plan is applied.
	Gain int
}

// Write is the block record and the extents to Apply once the plan's data
// is in the new block u, whose checksums are sums.
func (p Plan) Write(u Unique, sums blocks.Sums) ([]Block, []Extent) {
	exts := make([]Extent, len(p.Extents))
	var at uint64
	for i, e := range p.Extents {
		exts[i] = Extent{Off: e.Off, Len: e.Len, Block: u, BlockOff: at}
		at += e.Len
	}
	return []Block{{Unique: u, Size: p.Size, Sums: sums}}, exts
}

// Compact plans the compaction that removes the most extents by rewriting
// at most blocks.MaxBlock bytes: the run of consecutive extents, their
// data adding up to at most a block, in which the most extents touch the
// next one (a rewrite merges those; extents separated by a hole stay
// apart, so holes stay holes). It returns false if the best run gains
// fewer than minGain extents (at least 1). The work is one pass over the
// extents; a caller compacts a file by calling it until it returns false.
func (m *Map) Compact(minGain int) (Plan, bool) {
	minGain = max(minGain, 1)
	// Two pointers: for each last extent r, the window [l, r] is the
	// longest whose data fits in a block; the gain, touching pairs inside
	// the window, only grows as the window does, so the longest is best.
	var bytes uint64
	best, bestL, bestR := 0, 0, 0
	gain := 0 // touching pairs in [l, r]
	l := 0
	for r, e := range m.ext {
		bytes += e.Len
		if r > l && m.ext[r-1].End() == e.Off {
			gain++
		}
		for bytes > blocks.MaxBlock {
			bytes -= m.ext[l].Len
			if l+1 <= r && m.ext[l].End() == m.ext[l+1].Off {
				gain--
			}
			l++
		}
		if gain > best {
			best, bestL, bestR = gain, l, r
		}
	}
	if best < minGain {
		return Plan{}, false
	}
	p := Plan{Extents: append([]Extent(nil), m.ext[bestL:bestR+1]...), Gain: best}
	for _, e := range p.Extents {
		p.Size += e.Len
	}
	return p, true
}
