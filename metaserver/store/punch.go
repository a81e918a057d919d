package store

import (
	"encoding/binary"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// maxPunchPages bounds the pages one Punch may touch, which keeps its
// transaction within badger's size limit: those of wire.MaxPunch bytes
// anywhere.
const maxPunchPages = wire.MaxPunch/PageSize + 1

// Punch is fallocate's PUNCH_HOLE (flags wire.PunchHole|wire.PunchKeepSize)
// or ZERO_RANGE (wire.PunchZeroRange, maybe with wire.PunchKeepSize) of
// length bytes from off in ino: afterwards the range reads zeros. In a file
// in pages, whole pages in the range go and the edge pages are zeroed
// (bytes past a page's stored length are a hole already); in a
// block-mapped file, the block map drops the range's data. ZERO_RANGE
// without PunchKeepSize grows the file to off+length.
func (s *Store) Punch(ino ids.Ino, off, length uint64, flags uint32, now int64) (Attr, error) {
	switch flags {
	case wire.PunchHole | wire.PunchKeepSize, wire.PunchZeroRange, wire.PunchZeroRange | wire.PunchKeepSize:
	default:
		return Attr{}, wire.Errf(wire.CodeNotSupported, "fallocate mode %#x", flags)
	}
	end := off + length
	switch {
	case length == 0:
		return Attr{}, wire.Errf(wire.CodeInvalid, "fallocate of no bytes")
	case end < off || end > s.maxSize:
		return Attr{}, wire.Errf(wire.CodeTooBig, "fallocate past %d", s.maxSize)
	}
	var a Attr
	_, err := s.update(func(tx *Tx) error {
		n, err := tx.regularInode(ino)
		if err != nil {
			return err
		}
		if done, err := tx.applied(s.origin); err != nil || done {
			a = n.Attr
			return err
		}
		if hi := min(end, n.Size); off < hi {
			if n.mapped {
				err = tx.punchBlocks(n, off, hi-off, now)
			} else {
				err = tx.punchPages(n, off, hi)
			}
			if err != nil {
				return err
			}
		}
		if flags&wire.PunchKeepSize == 0 {
			n.Size = max(n.Size, end)
		}
		n.Version++
		n.Mtime, n.Ctime = now, now
		n.touch()
		a = n.Attr
		return nil
	})
	return a, err
}

// punchBlocks drops a block-mapped file's data in [off, off+length).
func (tx *Tx) punchBlocks(n *inode, off, length uint64, now int64) error {
	m, err := tx.blockMap(n.Ino)
	if err != nil {
		return err
	}
	c, err := m.PunchHole(off, length)
	if err != nil {
		return wire.Errf(wire.CodeInvalid, "%v", err)
	}
	if c.Empty() {
		return nil
	}
	return tx.persistChange(n, m, &c, now)
}

// punchPages zeros [off, end) of a file in pages (end at most its size):
// a page the range covers from its start to its stored end goes, and
// another has its stored bytes in the range zeroed, in place, as a file
// system of pages does (a hole is whole pages, for lseek too).
func (tx *Tx) punchPages(n *inode, off, end uint64) error {
	first, last := off/PageSize, (end-1)/PageSize
	if last-first+1 > maxPunchPages {
		return wire.Errf(wire.CodeTooBig, "a punch may touch at most %d pages of %d bytes", maxPunchPages, PageSize)
	}
	type edit struct {
		key []byte
		val []byte // nil: delete
	}
	var edits []edit
	err := tx.scan(tx.key(RecPage, n.Ino, nil), tx.key64(RecPage, n.Ino, first), false, true, func(k, v []byte) (bool, error) {
		pi := binary.BigEndian.Uint64(k[9:])
		if pi > last {
			return false, nil
		}
		start := pi * PageSize
		s0 := max(off, start) - start
		e0 := min(end-start, PageSize)
		key := tx.key(RecPage, n.Ino, k[9:])
		switch have := uint64(len(v)); {
		case have <= s0:
		case s0 == 0 && e0 >= have:
			edits = append(edits, edit{key: key})
		default:
			val := append([]byte(nil), v...)
			clear(val[s0:min(e0, have)])
			edits = append(edits, edit{key, val})
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, e := range edits {
		if e.val == nil {
			err = tx.del(e.key)
		} else {
			err = tx.set(e.key, e.val)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
