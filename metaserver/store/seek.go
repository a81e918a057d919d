package store

import (
	"encoding/binary"
	"errors"

	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// errNXIO is lseek's ENXIO: no data (or hole) at or after the offset.
var errNXIO = wire.Err(wire.CodeNXIO)

// Seek is lseek's SEEK_DATA (wire.SeekData) or SEEK_HOLE (wire.SeekHole)
// from off in ino: the first offset at or after off with data, or in a
// hole (the end of the file counts as one), with ext4's answers: an
// offset at or past the size, or no data after off, is CodeNXIO. In a
// file in pages, a page's stored bytes are data (zeros included) and
// missing pages and the bytes past a page's stored length are holes; in a
// block-mapped file, the block map's extents are the data.
func (s *Store) Seek(ino ids.Ino, off uint64, whence uint32) (uint64, error) {
	if whence != wire.SeekData && whence != wire.SeekHole {
		return 0, wire.Errf(wire.CodeInvalid, "seek whence %d", whence)
	}
	var got uint64
	err := s.view(func(tx *Tx) error {
		n, err := tx.regularInode(ino)
		if err != nil {
			return err
		}
		if off >= n.Size {
			return errNXIO
		}
		if !n.mapped {
			got, err = tx.seekPages(ino, off, n.Size, whence == wire.SeekData)
			return err
		}
		m, err := tx.blockMap(ino)
		if err != nil {
			return err
		}
		if whence == wire.SeekData {
			got, err = m.SeekData(off, n.Size)
		} else {
			got, err = m.SeekHole(off, n.Size)
		}
		if errors.Is(err, blockmap.ErrNXIO) {
			return errNXIO
		}
		return err
	})
	return got, err
}

// seekPages answers Seek in a file in pages of size bytes (off < size)
// with one scan of its pages from off's: the data of page pi is
// [pi*PageSize, pi*PageSize+len(value)).
func (tx *Tx) seekPages(ino ids.Ino, off, size uint64, data bool) (uint64, error) {
	found := false
	cur := off // SEEK_HOLE: everything in [off, cur) is data
	err := tx.scan(tx.key(RecPage, ino, nil), tx.key64(RecPage, ino, off/PageSize), false, true, func(k, v []byte) (bool, error) {
		start := binary.BigEndian.Uint64(k[9:]) * PageSize
		end := start + uint64(len(v))
		switch {
		case start >= size:
			return false, nil
		case data:
			if end > off {
				found, cur = true, max(off, start)
			}
			return !found, nil
		case start > cur || end <= cur:
			return false, nil // cur is in missing pages or a page's unstored tail
		}
		cur = end
		return end == start+PageSize, nil
	})
	switch {
	case err != nil:
		return 0, err
	case data && (!found || cur >= size):
		return 0, errNXIO
	}
	return min(cur, size), nil
}
