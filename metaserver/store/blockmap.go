package store

// File data as block maps (package blocks/blockmap): a file's extents
// ('B'), the blocks they point into ('U'), and the blocks whose last
// reference went, kept until no reader can still fetch them ('G'). A file
// holds its data in pages or in a block map, never both; the attribute
// record says which (inode.mapped). The store keeps no block: the server
// hands LookupBlocks' pieces to a mount, which fetches them from the block
// store.

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"slices"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// DefaultGarbageDelay is Options.GarbageDelay's default: far longer than
// any client lease (τ is 2 s by default), so that a store opened without
// the server's value never frees a block a reader may still hold.
const DefaultGarbageDelay = time.Minute

var (
	// ErrMapped is what the page operations (Read, ReadAt, Write and the
	// like) return for a block-mapped file: its data is not in the store
	// (LookupBlocks says where it is).
	ErrMapped = wire.Errf(wire.CodeInvalid, "file data is in blocks, not pages")
	// ErrNotMapped is what the block map operations return for a file
	// whose data is in pages.
	ErrNotMapped = wire.Errf(wire.CodeInvalid, "file data is in pages, not blocks")
)

// Key suffixes: an extent's is its file offset (8), a block's its id's
// random part (16), garbage's its due time (8) and the block's random part.
const (
	extentKeyLen  = 9 + 8
	blockKeyLen   = 9 + 16
	garbageKeyLen = 9 + 8 + 16
)

func (tx *Tx) blockKey(ino ids.Ino, u blockmap.Unique) []byte {
	return tx.key(RecBlock, ino, u[:])
}

// garbageKey is 'G' ino due unique: the inode first, as every record's,
// so the garbage replicates and transfers with its inode and a new owner
// after a failover still collects it.
func (tx *Tx) garbageKey(ino ids.Ino, due int64, u blockmap.Unique) []byte {
	var b [24]byte
	binary.BigEndian.PutUint64(b[:], uint64(due))
	copy(b[8:], u[:])
	return tx.key(RecGarbage, ino, b[:])
}

// blockMap loads ino's block map from its records (empty if it has none).
func (tx *Tx) blockMap(ino ids.Ino) (*blockmap.Map, error) {
	var blks []blockmap.Block
	var exts []blockmap.Extent
	corrupt := func(k []byte, err error) error {
		return wire.Errf(wire.CodeIO, "block map of %v: record %x: %v", ino, k, err)
	}
	err := tx.scan(tx.key(RecBlock, ino, nil), nil, false, true, func(k, v []byte) (bool, error) {
		b, err := blockmap.ParseBlock(v)
		if err == nil && (len(k) != blockKeyLen || !bytes.Equal(k[9:], b.Unique[:])) {
			err = blockmap.ErrCorrupt
		}
		if err != nil {
			return false, corrupt(k, err)
		}
		blks = append(blks, b)
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	err = tx.scan(tx.key(RecExtent, ino, nil), nil, false, true, func(k, v []byte) (bool, error) {
		e, err := blockmap.ParseExtent(v)
		if err == nil && (len(k) != extentKeyLen || binary.BigEndian.Uint64(k[9:]) != e.Off) {
			err = blockmap.ErrCorrupt
		}
		if err != nil {
			return false, corrupt(k, err)
		}
		exts = append(exts, e)
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	m, err := blockmap.Load(ino, blks, exts)
	if err != nil {
		return nil, wire.Errf(wire.CodeIO, "block map of %v: %v", ino, err)
	}
	return m, nil
}

// persistChange writes what an operation did to n's map m, exactly c, and
// records the blocks it freed as garbage, deletable at now plus the
// store's delay.
func (tx *Tx) persistChange(n *inode, m *blockmap.Map, c *blockmap.Change, now int64) error {
	ino := n.Ino
	for _, e := range c.Removed {
		if err := tx.del(tx.key64(RecExtent, ino, e.Off)); err != nil {
			return err
		}
	}
	if err := tx.putRecords(ino, c); err != nil {
		return err
	}
	due := now + tx.st.garbageWait
	for _, b := range c.Freed {
		if err := tx.del(tx.blockKey(ino, b.Unique)); err != nil {
			return err
		}
		if err := tx.setGarbage(ino, due, b.Unique, b.Size); err != nil {
			return err
		}
	}
	n.mapped = true
	n.stored = m.StoredBytes()
	return nil
}

// putRecords writes the extents c adds or changes and its new blocks.
func (tx *Tx) putRecords(ino ids.Ino, c *blockmap.Change) error {
	for _, es := range [][]blockmap.Extent{c.Added, c.Changed} {
		for _, e := range es {
			if err := tx.set(tx.key64(RecExtent, ino, e.Off), blockmap.AppendExtent(nil, e)); err != nil {
				return err
			}
		}
	}
	for _, b := range c.NewBlocks {
		if err := tx.set(tx.blockKey(ino, b.Unique), blockmap.AppendBlock(nil, b)); err != nil {
			return err
		}
	}
	return nil
}

// setGarbage records a block whose last reference went: its size is the
// value (what deleting it gives back).
func (tx *Tx) setGarbage(ino ids.Ino, due int64, u blockmap.Unique, size uint64) error {
	return tx.set(tx.garbageKey(ino, due, u), binary.BigEndian.AppendUint64(nil, size))
}

// hasPages reports whether ino has a data page.
func (tx *Tx) hasPages(ino ids.Ino) (bool, error) {
	found := false
	err := tx.scan(tx.key(RecPage, ino, nil), nil, false, false, func([]byte, []byte) (bool, error) {
		found = true
		return false, nil
	})
	return found, err
}

// BlockMap returns ino's block map as its records hold it: empty for a
// file with no data yet, ErrNotMapped for a file whose data is in pages.
func (s *Store) BlockMap(ino ids.Ino) (*blockmap.Map, error) {
	var m *blockmap.Map
	err := s.view(func(tx *Tx) error {
		n, err := tx.regularInode(ino)
		if err != nil {
			return err
		}
		if !n.mapped {
			if pages, err := tx.hasPages(ino); err != nil || pages {
				return cmpErr(err, ErrNotMapped)
			}
		}
		m, err = tx.blockMap(ino)
		return err
	})
	return m, err
}

func cmpErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// CommitBlocks commits a write of ino's data: newBlocks, already durable
// in the block store, and exts, the file ranges they now back (sorted,
// disjoint, each inside one of newBlocks; blockmap.Map.Apply). The file's
// size becomes at least size, which must cover every extent, and its
// mtime, ctime, Version and Change move as a write's do. The blocks the
// write leaves unreferenced become garbage, deletable at now plus
// Options.GarbageDelay (DueGarbageAfter).
//
// A file whose data is in pages is refused (ErrNotMapped: ConvertFile
// it first); one with no data becomes block-mapped. Made for a client
// request (For), a change whose origin the store has recorded already is
// not made again: the current attributes are returned.
func (s *Store) CommitBlocks(ino ids.Ino, newBlocks []blockmap.Block, exts []blockmap.Extent, size uint64, now int64) (Attr, error) {
	var a Attr
	_, err := s.update(func(tx *Tx) error {
		n, m, done, err := tx.blockWriteInode(ino)
		if err != nil || done {
			a = n.Attr
			return err
		}
		err = tx.commitBlocks(n, m, newBlocks, exts, size, now)
		a = n.Attr
		return err
	})
	return a, err
}

// WriteBlock is WriteSetAttr for a file whose data is in blocks: the
// spans' bytes are blk's, one after another (blk is durable in the block
// store already), and the block and the attribute changes commit in one
// transaction, which CommitBlocks' rules govern.
func (s *Store) WriteBlock(ino ids.Ino, blk blockmap.Block, spans []wire.Span, in SetAttrIn, now int64) (Attr, error) {
	return s.writeBlock(ino, blk, func(uint64) []wire.Span { return spans }, in, now)
}

// AppendBlock is WriteBlock of blk at the file's end as its transaction
// finds it (O_APPEND).
func (s *Store) AppendBlock(ino ids.Ino, blk blockmap.Block, in SetAttrIn, now int64) (Attr, error) {
	return s.writeBlock(ino, blk, func(size uint64) []wire.Span {
		return []wire.Span{{Off: size, Len: uint32(blk.Size)}}
	}, in, now)
}

// writeBlock is WriteBlock with the spans that spansAt gives for the
// file's size.
func (s *Store) writeBlock(ino ids.Ino, blk blockmap.Block, spansAt func(size uint64) []wire.Span, in SetAttrIn, now int64) (Attr, error) {
	if in.Valid&^wire.WriteAttrs != 0 {
		return Attr{}, wire.Errf(wire.CodeInvalid, "a write cannot carry attribute changes %#x", in.Valid&^wire.WriteAttrs)
	}
	var a Attr
	_, err := s.update(func(tx *Tx) error {
		n, m, done, err := tx.blockWriteInode(ino)
		if err != nil || done {
			a = n.Attr
			return err
		}
		spans := spansAt(n.Size)
		if err := checkSpans(spans, int(blk.Size), s.maxSize); err != nil {
			return err
		}
		exts := make([]blockmap.Extent, 0, len(spans))
		var at, end uint64
		for _, sp := range spans {
			if sp.Len > 0 {
				exts = append(exts, blockmap.Extent{Off: sp.Off, Len: uint64(sp.Len), Block: blk.Unique, BlockOff: at})
				at += uint64(sp.Len)
				end = sp.Off + uint64(sp.Len)
			}
		}
		if err := tx.commitBlocks(n, m, []blockmap.Block{blk}, exts, end, now); err != nil {
			return err
		}
		if in.Valid != 0 {
			if err := tx.setAttrs(n, in, now); err != nil {
				return err
			}
			n.touch()
		}
		a = n.Attr
		return nil
	})
	return a, err
}

// blockWriteInode loads a regular file whose data is in blocks (or none)
// and its map for a change, unless the store finds the change made
// already (done: n is the file as it is).
func (tx *Tx) blockWriteInode(ino ids.Ino) (n *inode, m *blockmap.Map, done bool, err error) {
	n, m, err = tx.mappedInode(ino)
	if err != nil {
		return &inode{}, nil, false, err
	}
	done, err = tx.applied(tx.st.origin)
	return n, m, done, err
}

// commitBlocks is CommitBlocks in the transaction, of n and its map m.
func (tx *Tx) commitBlocks(n *inode, m *blockmap.Map, newBlocks []blockmap.Block, exts []blockmap.Extent, size uint64, now int64) error {
	newSize := max(n.Size, size)
	if newSize > tx.st.maxSize {
		return wire.Errf(wire.CodeTooBig, "size %d", newSize)
	}
	c, err := m.Apply(newBlocks, exts)
	if err != nil {
		return wire.Errf(wire.CodeInvalid, "%v", err)
	}
	if e := m.Extents(); len(e) > 0 && e[len(e)-1].End() > newSize {
		return wire.Errf(wire.CodeInvalid, "extent ends at %d, past the size %d", e[len(e)-1].End(), newSize)
	}
	if c.Empty() && newSize == n.Size && n.mapped {
		return nil
	}
	if err := tx.persistChange(n, m, &c, now); err != nil {
		return err
	}
	if err := tx.killCapability(n.Ino); err != nil {
		return err
	}
	n.Size = newSize
	n.Version++
	n.Mtime, n.Ctime = now, now
	n.touch()
	return nil
}

// mappedInode loads a regular file and its block map: ErrNotMapped if its
// data is in pages.
func (tx *Tx) mappedInode(ino ids.Ino) (*inode, *blockmap.Map, error) {
	n, err := tx.regularInode(ino)
	if err != nil {
		return nil, nil, err
	}
	if !n.mapped {
		if pages, err := tx.hasPages(ino); err != nil || pages {
			return nil, nil, cmpErr(err, ErrNotMapped)
		}
	}
	m, err := tx.blockMap(ino)
	if err != nil {
		return nil, nil, err
	}
	return n, m, nil
}

// truncateBlocks drops a block-mapped file's data at and past size.
func (tx *Tx) truncateBlocks(n *inode, size uint64, now int64) error {
	m, err := tx.blockMap(n.Ino)
	if err != nil {
		return err
	}
	c, err := m.Truncate(size)
	if err != nil {
		return wire.Errf(wire.CodeInvalid, "%v", err)
	}
	return tx.persistChange(n, m, &c, now)
}

// shrinkBlocks is shrink for a block-mapped file: it cuts the extents past
// size from the end, deleteBatch at a time, each step one transaction that
// leaves the file shorter but valid (its size cut to the step's lowest
// extent), and leaves the last deleteBatch to SetAttr's transaction.
func (s *Store) shrinkBlocks(ino ids.Ino, size uint64, now int64) error {
	for {
		done := true
		_, err := s.update(func(tx *Tx) error {
			done = true
			n, err := tx.inode(ino)
			if err != nil || !n.mapped || n.Size <= size {
				return err
			}
			m, err := tx.blockMap(ino)
			if err != nil {
				return err
			}
			exts := m.Extents()
			i, _ := slices.BinarySearchFunc(exts, size, func(e blockmap.Extent, size uint64) int {
				return cmp.Compare(e.End(), size+1)
			})
			if len(exts)-i <= deleteBatch {
				return nil
			}
			cut := max(size, exts[len(exts)-deleteBatch].Off)
			c, err := m.Truncate(cut)
			if err != nil {
				return wire.Errf(wire.CodeInvalid, "%v", err)
			}
			if err := tx.persistChange(n, m, &c, now); err != nil {
				return err
			}
			n.Size = cut
			n.Version++
			n.Mtime, n.Ctime = now, now
			n.touch()
			done = false
			return nil
		})
		if err != nil || done {
			return err
		}
	}
}

// LookupBlocks returns the pieces, holes and ranges of blocks, that cover
// [off, off+n) of a block-mapped file, clipped to its size (none at or past
// it), and the attributes they belong to (their Version orders reads of
// the file). ErrNotMapped for a file whose data is in pages: Read it.
func (s *Store) LookupBlocks(ino ids.Ino, off, n uint64) ([]blockmap.Piece, Attr, error) {
	var ps []blockmap.Piece
	var a Attr
	err := s.view(func(tx *Tx) error {
		in, err := tx.regularInode(ino)
		if err != nil {
			return err
		}
		if !in.mapped {
			return ErrNotMapped
		}
		a = in.Attr
		if off >= in.Size {
			ps = nil
			return nil
		}
		m, err := tx.blockMap(ino)
		if err != nil {
			return err
		}
		ps, err = m.Lookup(off, min(n, in.Size-off))
		if err != nil {
			return wire.Errf(wire.CodeInvalid, "%v", err)
		}
		return nil
	})
	return ps, a, err
}

// purgeBlocks deletes up to deleteBatch of unlinked n's extent and block
// records, from the key from (nil: the first), each block into garbage due
// at due. It reports the last key it deleted and whether none are left.
func (tx *Tx) purgeBlocks(n *inode, from []byte, due int64) (last []byte, done bool, err error) {
	type rec struct {
		key  []byte
		size uint64
	}
	var recs []rec
	for _, kind := range [...]byte{RecExtent, RecBlock} {
		var start []byte
		if from != nil {
			if from[0] > kind {
				continue // this kind is gone already
			}
			if from[0] == kind {
				start = from
			}
		}
		err := tx.scan(tx.key(kind, n.Ino, nil), start, false, kind == RecBlock, func(k, v []byte) (bool, error) {
			r := rec{key: tx.key(kind, n.Ino, k[9:])}
			if kind == RecBlock {
				// a corrupt record is collected all the same, as an
				// empty block: the purge must not stop at it
				b, _ := blockmap.ParseBlock(v)
				r.size = b.Size
			}
			recs = append(recs, r)
			return len(recs) < deleteBatch, nil
		})
		if err != nil {
			return nil, false, err
		}
		if len(recs) == deleteBatch {
			break
		}
	}
	for _, r := range recs {
		if err := tx.del(r.key); err != nil {
			return nil, false, err
		}
		if r.key[0] == RecBlock && len(r.key) == blockKeyLen {
			if err := tx.setGarbage(n.Ino, due, blockmap.Unique(r.key[9:]), r.size); err != nil {
				return nil, false, err
			}
		}
	}
	if len(recs) == deleteBatch {
		return recs[len(recs)-1].key, false, nil
	}
	return nil, true, nil
}

// Garbage is a block whose last reference went, and when it may be
// deleted.
type Garbage struct {
	ID   blocks.ID
	Due  int64 // unix nanoseconds
	Size uint64
}

// DueGarbageAfter returns up to limit (0: no limit) blocks whose last
// reference went and that may be deleted at now (their due time is not
// after it), in key order, from the record after after (nil: the first)
// and only of the inodes keep takes (nil: all), so that a collector that
// owns some inodes, or could not delete the first blocks, still reaches
// the rest. It reads every record from after on, due or not.
func (s *Store) DueGarbageAfter(now int64, after *Garbage, limit int, keep func(ids.Ino) bool) ([]Garbage, error) {
	var out []Garbage
	err := s.view(func(tx *Tx) error {
		out = out[:0]
		var start []byte
		if after != nil {
			// the smallest key above after's
			start = append(tx.garbageKey(after.ID.Ino, after.Due, after.ID.Unique), 0)
		}
		return tx.scan([]byte{RecGarbage}, start, false, true, func(k, v []byte) (bool, error) {
			if len(k) != garbageKeyLen {
				return true, nil
			}
			g := Garbage{ID: blocks.ID{Ino: KeyIno(k), Unique: blockmap.Unique(k[17:])},
				Due: int64(binary.BigEndian.Uint64(k[9:]))}
			if len(v) == 8 {
				g.Size = binary.BigEndian.Uint64(v)
			}
			if g.Due <= now && (keep == nil || keep(g.ID.Ino)) {
				out = append(out, g)
			}
			return limit <= 0 || len(out) < limit, nil
		})
	})
	return out, err
}

// UnknownBlocks returns those of list that no record names: no block map
// references them ('U') and they are not garbage ('G'). A block in the
// block store that is unknown was never committed (its writer crashed or
// was fenced before its commit) or its commit is still on its way.
func (s *Store) UnknownBlocks(list []blocks.ID) ([]blocks.ID, error) {
	var out []blocks.ID
	err := s.view(func(tx *Tx) error {
		out = out[:0]
		// one inode's garbage is read once, and only if one of its blocks
		// has no 'U' record: most listed blocks have one
		garbage := map[blocks.ID]bool{}
		scanned := map[ids.Ino]bool{}
		for _, id := range list {
			found, err := tx.get(tx.blockKey(id.Ino, id.Unique), func([]byte) error { return nil })
			if err != nil {
				return err
			}
			if found {
				continue
			}
			if !scanned[id.Ino] {
				scanned[id.Ino] = true
				err := tx.scan(tx.key(RecGarbage, id.Ino, nil), nil, false, false, func(k, _ []byte) (bool, error) {
					if len(k) == garbageKeyLen {
						garbage[blocks.ID{Ino: id.Ino, Unique: blockmap.Unique(k[17:])}] = true
					}
					return true, nil
				})
				if err != nil {
					return err
				}
			}
			if !garbage[id] {
				out = append(out, id)
			}
		}
		return nil
	})
	return out, err
}

// ForgetGarbage deletes the garbage records of gone (blocks the collector
// deleted from the block store), one transaction per deleteBatch of them;
// blocks without one are skipped.
func (s *Store) ForgetGarbage(gone []blocks.ID) error {
	gone = slices.Clone(gone)
	slices.SortFunc(gone, func(a, b blocks.ID) int {
		if a.Ino != b.Ino {
			return cmp.Compare(a.Ino, b.Ino)
		}
		return bytes.Compare(a.Unique[:], b.Unique[:])
	})
	for len(gone) > 0 {
		batch := gone[:min(len(gone), deleteBatch)]
		gone = gone[len(batch):]
		_, err := s.update(func(tx *Tx) error {
			for i := 0; i < len(batch); {
				j := i
				for j < len(batch) && batch[j].Ino == batch[i].Ino {
					j++
				}
				if err := tx.forgetGarbage(batch[i].Ino, batch[i:j]); err != nil {
					return err
				}
				i = j
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// forgetGarbage deletes the garbage records of gone, all blocks of ino
// sorted by their random part.
func (tx *Tx) forgetGarbage(ino ids.Ino, gone []blocks.ID) error {
	var keys [][]byte
	err := tx.scan(tx.key(RecGarbage, ino, nil), nil, false, false, func(k, _ []byte) (bool, error) {
		if len(k) != garbageKeyLen {
			return true, nil
		}
		if _, found := slices.BinarySearchFunc(gone, k[17:], func(id blocks.ID, u []byte) int {
			return bytes.Compare(id.Unique[:], u)
		}); found {
			keys = append(keys, tx.key(RecGarbage, ino, k[9:]))
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := tx.del(k); err != nil {
			return err
		}
	}
	return nil
}
