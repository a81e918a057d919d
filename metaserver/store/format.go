package store

import (
	"encoding/binary"
	"fmt"
	"time"
)

// The store's format, kept in its 'F' record. A store without one was
// written before formats existed (format 1: file data in 64 KiB chunks
// under 'K'); Open converts it in place. Format 2 stored file data in
// pages as 3 does; 3 added the change count to attribute records, whose
// older records are read as they are (inodeFormatV1) and rewritten at
// their inode's next change. Open leaves a store at 3 at most: a file of
// any size may keep its data in pages until ConvertPagesToBlocks moves the
// data of every file over wire.InlineMax to blocks and sets 4. From then
// on a server with a block store keeps it so: a file stays in pages while
// it is at most InlineMax bytes and was never block-mapped (a cluster,
// which converts files as they are written, stays at 3). A store of a
// newer format is refused: its records would be misread.
const (
	pagesFormat = 3 // file data in PageSize pages under 'P' (or block maps); attribute records with a change count
	storeFormat = 4 // no file over wire.InlineMax keeps its data in pages

	recLegacyChunk  = 'K'
	legacyChunkSize = 64 << 10
	// legacyBatch chunks are converted per transaction (16 pages each).
	legacyBatch = 256
)

var formatKey = []byte{RecFormat, 0, 0, 0, 0, 0, 0, 0, 0}

// upgradeFormat checks the store's format and converts an older one.
func (s *Store) upgradeFormat() error {
	var format byte
	var found bool
	err := s.kv.view(func(t kvTxn) error {
		var err error
		found, err = t.get(formatKey, func(v []byte) error {
			if len(v) != 1 {
				return fmt.Errorf("corrupt store format record (%d bytes)", len(v))
			}
			format = v[0]
			return nil
		})
		return err
	})
	switch {
	case err != nil:
		return err
	case found && (format == storeFormat || format == pagesFormat):
		return nil
	case found && format > storeFormat:
		return fmt.Errorf("store format %d is newer than this leasefs reads (%d): run the leasefs that wrote it, or a newer one", format, storeFormat)
	case found && format == 2:
		// nothing to convert: its attribute records are read as they are
		return s.kv.update(func(t kvTxn) error { return t.set(formatKey, []byte{pagesFormat}) })
	case found:
		return fmt.Errorf("unknown store format %d", format)
	}
	start := time.Now()
	chunks, err := s.convertChunks()
	if err != nil {
		return fmt.Errorf("converting file data from 64 KiB chunks to %d-byte pages (%d chunks done; opening the store again resumes): %w", PageSize, chunks, err)
	}
	if chunks > 0 {
		s.log.Info("store upgraded: file data moved from 64 KiB chunks to pages", "chunks", chunks, "page_bytes", PageSize, "took", time.Since(start).Round(time.Millisecond))
	}
	return s.kv.update(func(t kvTxn) error { return t.set(formatKey, []byte{pagesFormat}) })
}

// convertChunks replaces every 64 KiB chunk record with the pages holding
// its bytes, legacyBatch chunks per transaction. Each transaction converts
// whole chunks, so a crash leaves every byte in exactly one of the two
// forms, and the next open carries on. Nothing reads the store meanwhile.
func (s *Store) convertChunks() (int, error) {
	total := 0
	for {
		n := 0
		err := s.kv.update(func(t kvTxn) error {
			n = 0
			type chunk struct{ key, val []byte }
			var batch []chunk
			err := t.scan([]byte{recLegacyChunk}, nil, false, true, func(k, v []byte) (bool, error) {
				if len(k) != 17 || len(v) > legacyChunkSize {
					return false, fmt.Errorf("corrupt chunk record %x (%d bytes)", k, len(v))
				}
				batch = append(batch, chunk{append([]byte(nil), k...), append([]byte(nil), v...)})
				return len(batch) < legacyBatch, nil
			})
			if err != nil {
				return err
			}
			for _, c := range batch {
				ino, ci := binary.BigEndian.Uint64(c.key[1:9]), binary.BigEndian.Uint64(c.key[9:])
				for off := 0; off < len(c.val); off += PageSize {
					key := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64([]byte{RecPage}, ino),
						(ci*legacyChunkSize+uint64(off))/PageSize)
					if err := t.set(key, c.val[off:min(off+PageSize, len(c.val))]); err != nil {
						return err
					}
				}
				if err := t.del(c.key); err != nil {
					return err
				}
			}
			n = len(batch)
			return nil
		})
		if err != nil {
			return total, err
		}
		total += n
		if n < legacyBatch {
			return total, nil
		}
	}
}

// LegacyHint explains a record of format 1 arriving from a peer ("" for
// any other).
func LegacyHint(key []byte) string {
	if len(key) > 0 && key[0] == recLegacyChunk {
		return " (a 64 KiB data chunk: the peer runs a leasefs older than store format 2; run one release on every server)"
	}
	return ""
}
