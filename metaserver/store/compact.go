package store

import (
	"cmp"
	"slices"

	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// CompactBlocks commits compaction p of ino's map (blockmap.Map.CompactPlan):
// newBlock, durable in the block store already, holds the bytes of
// p.Extents one after another, and now backs their ranges. The extents p
// replaces must still be exactly in the map (CodeStale if not, nothing
// changed): the plan was made from the map as it was. The blocks left
// unreferenced become garbage as an overwrite's do, deletable at now plus
// Options.GarbageDelay, since a reader may still hold the old map. The
// file's bytes are the same, so its size, times and Version do not move.
// It returns the bytes of the blocks freed.
func (s *Store) CompactBlocks(ino ids.Ino, p blockmap.Plan, newBlock blockmap.Block, now int64) (freed uint64, err error) {
	if len(p.Extents) == 0 || newBlock.Size != p.Size {
		return 0, wire.Errf(wire.CodeInvalid, "compaction of %d extents, %d bytes, into a block of %d", len(p.Extents), p.Size, newBlock.Size)
	}
	_, err = s.update(func(tx *Tx) error {
		freed = 0
		n, err := tx.regularInode(ino)
		if err != nil {
			return err
		}
		if !n.mapped {
			return ErrNotMapped
		}
		m, err := tx.blockMap(ino)
		if err != nil {
			return err
		}
		if err := stillMapped(m, p.Extents); err != nil {
			return err
		}
		c, err := m.Apply(p.Write(newBlock.Unique, newBlock.Sums))
		if err != nil {
			return wire.Errf(wire.CodeInvalid, "%v", err)
		}
		for _, b := range c.Freed {
			freed += b.Size
		}
		return tx.persistChange(n, m, &c, now)
	})
	return freed, err
}

// stillMapped fails unless each of exts is one of m's extents as it is.
func stillMapped(m *blockmap.Map, exts []blockmap.Extent) error {
	have := m.Extents()
	for _, e := range exts {
		i, found := slices.BinarySearchFunc(have, e.Off, func(h blockmap.Extent, off uint64) int { return cmp.Compare(h.Off, off) })
		if !found || have[i] != e {
			return wire.Errf(wire.CodeStale, "compaction of %v: extent [%d, +%d) of block %x changed since it was planned", m.Ino(), e.Off, e.Len, e.Block)
		}
	}
	return nil
}
