package blocks

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// ChunkSize is the unit of a block's checksums: a read is verified in
// whole chunks, so a range read fetches at most a chunk more on each side.
const ChunkSize = 64 << 10

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Sums are a block's checksums, CRC-32C of each ChunkSize chunk (the last
// one may be short). They live in the block map, not in the block, so a
// range read is one request and a store never has to be trusted.
type Sums []uint32

// Sum computes data's checksums.
func Sum(data []byte) Sums {
	s := make(Sums, 0, (len(data)+ChunkSize-1)/ChunkSize)
	for len(data) > 0 {
		n := min(len(data), ChunkSize)
		s = append(s, crc32.Checksum(data[:n], castagnoli))
		data = data[n:]
	}
	return s
}

// Verify checks data, the bytes of the block from blockOff, which must be
// a multiple of ChunkSize; data must end at a chunk boundary or at the
// block's end. A mismatch, a misaligned range or one past the block's
// chunks is ErrCorrupt.
func (s Sums) Verify(blockOff int64, data []byte) error {
	if blockOff < 0 || blockOff%ChunkSize != 0 {
		return fmt.Errorf("blocks: verify at %d: not chunk-aligned: %w", blockOff, ErrCorrupt)
	}
	for i := blockOff / ChunkSize; len(data) > 0; i++ {
		n := min(len(data), ChunkSize)
		if i >= int64(len(s)) {
			return fmt.Errorf("blocks: %d bytes past the block's %d chunks: %w", len(data), len(s), ErrCorrupt)
		}
		if crc32.Checksum(data[:n], castagnoli) != s[i] {
			return fmt.Errorf("blocks: chunk %d: checksum mismatch: %w", i, ErrCorrupt)
		}
		data = data[n:]
	}
	return nil
}

// Widen returns the chunk-aligned range that covers [off, off+n) of a
// block of size bytes, clipped to the block: what a verified read fetches.
func Widen(off, n, size int64) (woff, wn int64) {
	end := min(off+n, size)
	if off >= end {
		return off, 0
	}
	woff = off / ChunkSize * ChunkSize
	wend := min((end+ChunkSize-1)/ChunkSize*ChunkSize, size)
	return woff, wend - woff
}

// ReadVerified reads len(p) bytes from off of block id, whose size and
// checksums the caller knows (from the block map), and verifies them
// before any reaches p. It reads fewer bytes only at the block's end, with
// io.EOF. A block shorter than size, or whose bytes do not match sums, is
// ErrCorrupt wrapped with id; a missing block is ErrNotFound.
func ReadVerified(ctx context.Context, s Store, id ID, size int64, sums Sums, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("blocks: read %s at %d: negative offset", id, off)
	}
	woff, wn := Widen(off, int64(len(p)), size)
	if wn == 0 {
		return 0, io.EOF
	}
	buf := p
	if woff != off || wn > int64(len(p)) {
		buf = make([]byte, wn)
	}
	buf = buf[:wn]
	n, err := s.ReadAt(ctx, id, buf, woff)
	if err != nil && !(errors.Is(err, io.EOF) && n == len(buf)) {
		if errors.Is(err, io.EOF) {
			return 0, fmt.Errorf("blocks: %s: %d bytes at %d, want %d: %w", id, n, woff, wn, ErrCorrupt)
		}
		return 0, err
	}
	if err := sums.Verify(woff, buf); err != nil {
		clear(buf) // a caller ignoring the error must not find the bytes in p
		return 0, fmt.Errorf("blocks: %s: %w", id, err)
	}
	n = copy(p, buf[off-woff:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
