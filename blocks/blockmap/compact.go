package blockmap

import (
	"bytes"

	"github.com/leasefs/leasefs/blocks"
)

// The planner's rules bound the bytes rewritten per byte written, as a
// size-tiered LSM tree does. A merged window is mostly young bytes, in
// blocks at most 1/tierFanout of the window, which the rewrite moves to a
// block tierFanout times bigger at least; the rest of the window (old
// data next to the new) is paid for by them, youngFrac times their bytes
// at most. So a byte written in pieces of n bytes is young at most
// log_tierFanout(MaxBlock/n) times, and the rewrites cost at most
// youngFrac times that per byte written. A file only appended to has
// blocks as long as its extents, all young: at most log_tierFanout
// rewrites per byte. A sparse block's rewrite copies less than a third of
// the bytes overwritten in it.
const (
	// minRun is how many touching extents a fragmentation rewrite merges
	// at least.
	minRun = 4
	// tierFanout: no extent of a merged window, and no young block, is
	// more than 1/tierFanout of it.
	tierFanout = 4
	// youngFrac: at least 1/youngFrac of a merged window is young.
	youngFrac = 4
	// fragmentMax: a longer extent is no fragment. Merging pieces of a
	// MiB into blocks of four would rewrite all of a file written in
	// them (a writer that fsyncs every MiB) for little: each is one read
	// and one block file already. And on a nearly full disk the rewrite's
	// space comes back only after the garbage delay.
	fragmentMax = 256 << 10
	// sparseMin and sparseFrac: a block of at least sparseMin bytes of
	// which extents use less than 1/sparseFrac is rewritten.
	sparseMin  = 256 << 10
	sparseFrac = 4
	// maxPlanWork bounds the extents one search looks up for the young
	// rule: past it, only whole blocks count as young.
	maxPlanWork = 1 << 16
)

// Plan is one compaction: the data of Extents, read in file order and
// packed into one new block of Size bytes (at most blocks.MaxBlock), then
// committed with Apply(Write(...)). It is valid only while the map is
// unchanged, so its caller plans, copies and commits under one X lock.
type Plan struct {
	Extents []Extent
	Size    uint64
	// Gain is how many fewer extents the file has once the plan is applied.
	Gain int
	// Sparse is set for the rewrite of a mostly dead block (the other
	// rule merges fragments).
	Sparse bool
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

// CompactPlan plans the next compaction of the file, if one is due, by one
// of two rules:
//
//   - fragmentation: a window of at least minRun consecutive extents that
//     touch (extents apart from a hole stay apart: holes stay holes), each
//     at most fragmentMax bytes, of at
//     most blocks.MaxBlock bytes, none of them more than 1/tierFanout of
//     the window, at least 1/youngFrac of it in blocks no more than
//     1/tierFanout of it, merged into one extent; of those, the window
//     that removes the most extents, the first of them;
//   - dead space: a block of at least sparseMin bytes of which the
//     extents use less than 1/sparseFrac, its extents copied into a block
//     of their own so that it becomes garbage; the block with the most
//     dead bytes.
//
// A caller compacts a file by applying plans until it returns false; each
// plan either removes extents or frees a block's dead bytes, so that ends.
// The planning is linear in the extents.
func (m *Map) CompactPlan() (Plan, bool) {
	if l, r, ok := m.fragmented(); ok {
		return newPlan(m.ext[l:r+1], false), true
	}
	if exts := m.sparseBlock(); exts != nil {
		return newPlan(exts, true), true
	}
	return Plan{}, false
}

func newPlan(exts []Extent, sparse bool) Plan {
	p := Plan{Extents: append([]Extent(nil), exts...), Sparse: sparse}
	for i, e := range exts {
		p.Size += e.Len
		if i > 0 && exts[i-1].End() == e.Off {
			p.Gain++
		}
	}
	return p
}

// fragmented finds the fragmentation rule's window [l, r]. For each last
// extent r, the window starts at the first extent that keeps it in one
// touching run and within a block; while the window's longest extent
// (the rightmost of them) is too long, no window that starts at or before
// it and ends at r can hold it, so the start moves just past it. Each
// such move cuts the window's bytes by more than 1/tierFanout, so there
// are O(log MaxBlock) of them for each r. The longest window that fits
// is then checked for young bytes, if it would be the best.
func (m *Map) fragmented() (bestL, bestR int, ok bool) {
	n := len(m.ext)
	if n < minRun {
		return 0, 0, false
	}
	// pre[i]: bytes of the extents before i; whole[i]: those of them
	// that are all of their block
	pre, whole := make([]uint64, n+1), make([]uint64, n+1)
	for i, e := range m.ext {
		pre[i+1], whole[i+1] = pre[i]+e.Len, whole[i]
		if m.blocks[e.Block].Size == e.Len {
			whole[i+1] += e.Len
		}
	}
	// maxq holds indices in [l, r] whose extents are longer than every
	// extent after them up to r, from maxq[head]: the front is the
	// window's rightmost longest extent.
	maxq := make([]int, 0, 64)
	head, l, best, work := 0, 0, 0, 0
	for r, e := range m.ext {
		if e.Len > fragmentMax {
			l, head, maxq = r+1, 0, maxq[:0]
			continue
		}
		if r > 0 && m.ext[r-1].End() != e.Off {
			l, head, maxq = r, 0, maxq[:0]
		}
		for len(maxq) > head && m.ext[maxq[len(maxq)-1]].Len <= e.Len {
			maxq = maxq[:len(maxq)-1]
		}
		maxq = append(maxq, r)
		for pre[r+1]-pre[l] > blocks.MaxBlock {
			l++
		}
		for maxq[head] < l {
			head++
		}
		for i, cl := head, l; i < len(maxq) && r-cl+1 >= max(minRun, best+1); i++ {
			b := maxq[i]
			if w := pre[r+1] - pre[cl]; tierFanout*m.ext[b].Len <= w {
				// Whole blocks are no longer than the window's longest
				// extent, so young; only a window short of them needs
				// its blocks looked up.
				y := whole[r+1] - whole[cl]
				if y*youngFrac < w && work < maxPlanWork {
					work += r - cl + 1
					y = m.young(cl, r, w)
				}
				if y*youngFrac >= w {
					best, bestL, bestR = r-cl+1, cl, r
				}
				break
			}
			cl = b + 1
		}
		if head > 1024 && head > len(maxq)/2 {
			// keep the queue's slice from growing with the run
			maxq = append(maxq[:0], maxq[head:]...)
			head = 0
		}
	}
	return bestL, bestR, best > 0
}

// young returns the bytes of window [l, r], of w bytes, that are young:
// in blocks of at most w/tierFanout bytes, which the rewrite moves to a
// block tierFanout times bigger at least.
func (m *Map) young(l, r int, w uint64) uint64 {
	var y uint64
	for _, e := range m.ext[l : r+1] {
		if m.blocks[e.Block].Size*tierFanout <= w {
			y += e.Len
		}
	}
	return y
}

// sparseBlock returns the extents, in file order, of the dead-space
// rule's block, or nil.
func (m *Map) sparseBlock() []Extent {
	var live map[Unique]uint64
	for u, b := range m.blocks {
		if b.Size >= sparseMin {
			if live == nil {
				live = make(map[Unique]uint64)
			}
			live[u] = 0
		}
	}
	if live == nil {
		return nil
	}
	for _, e := range m.ext {
		if n, ok := live[e.Block]; ok {
			live[e.Block] = n + e.Len
		}
	}
	var best Unique
	var bestDead uint64
	for u, n := range live {
		size := m.blocks[u].Size
		if n*sparseFrac >= size {
			continue
		}
		dead := size - n
		if dead > bestDead || dead == bestDead && bytes.Compare(u[:], best[:]) < 0 {
			best, bestDead = u, dead
		}
	}
	if bestDead == 0 {
		return nil
	}
	var exts []Extent
	for _, e := range m.ext {
		if e.Block == best {
			exts = append(exts, e)
		}
	}
	return exts
}
