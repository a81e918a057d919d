package blocks

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"
)

func TestWiden(t *testing.T) {
	const C = ChunkSize
	for _, c := range []struct{ off, n, size, woff, wn int64 }{
		{0, 10, 4 * C, 0, C},
		{C + 1, 10, 4 * C, C, C},
		{C - 1, 2, 4 * C, 0, 2 * C},
		{3*C + 5, 100, 3*C + 50, 3 * C, 50},
		{0, 4 * C, 4 * C, 0, 4 * C},
		{5 * C, 10, 4 * C, 5 * C, 0},
	} {
		if woff, wn := Widen(c.off, c.n, c.size); woff != c.woff || wn != c.wn {
			t.Errorf("Widen(%d, %d, %d) = %d, %d; want %d, %d", c.off, c.n, c.size, woff, wn, c.woff, c.wn)
		}
	}
}

func TestSumsVerify(t *testing.T) {
	data := randBytes(3*ChunkSize+100, 2)
	s := Sum(data)
	if len(s) != 4 {
		t.Fatalf("%d sums", len(s))
	}
	if err := s.Verify(0, data); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(ChunkSize, data[ChunkSize:2*ChunkSize]); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(3*ChunkSize, data[3*ChunkSize:]); err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(data)
	bad[ChunkSize+7] ^= 1
	for _, c := range []struct {
		off  int64
		data []byte
	}{
		{0, bad},
		{ChunkSize, bad[ChunkSize : 2*ChunkSize]},
		{1, data[1:ChunkSize]},                                     // misaligned
		{0, data[:ChunkSize-1]},                                    // cut short
		{0, append(bytes.Clone(data), make([]byte, ChunkSize)...)}, // past the chunks
	} {
		if err := s.Verify(c.off, c.data); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Verify(%d, %d bytes) = %v, want ErrCorrupt", c.off, len(c.data), err)
		}
	}
}

// TestReadVerifiedCorrupt flips a byte in a block file: a verified read of
// any range touching that chunk fails with ErrCorrupt naming the block and
// hands out no bytes; ranges elsewhere still read.
func TestReadVerifiedCorrupt(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	data := randBytes(MaxBlock-12345, 3)
	id := NewID(9)
	if err := s.Put(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	sums := Sum(data)
	size := int64(len(data))
	check := func(off, n int64) error {
		p := make([]byte, n)
		got, err := ReadVerified(ctx, s, id, size, sums, p, off)
		if err == io.EOF && off+n > size {
			err = nil // a short read at the block's end
		}
		if err != nil {
			if got != 0 || !bytes.Equal(p, make([]byte, n)) {
				t.Fatalf("ReadVerified(%d, %d) failed (%v) but handed out bytes", off, n, err)
			}
			return err
		}
		want := min(n, size-off)
		if int64(got) != want || !bytes.Equal(p[:got], data[off:off+want]) {
			t.Fatalf("ReadVerified(%d, %d) = %d bytes, want %d, or wrong bytes", off, n, got, want)
		}
		return nil
	}
	for _, r := range [][2]int64{{0, size}, {100, 5000}, {ChunkSize - 1, 2}, {size - 10, 4096}, {2 * ChunkSize, ChunkSize}} {
		if err := check(r[0], r[1]); err != nil {
			t.Fatalf("ReadVerified(%d, %d): %v", r[0], r[1], err)
		}
	}

	const at = 5*ChunkSize + 17
	f, err := os.OpenFile(s.path(id), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{data[at] ^ 0x40}, at)
	f.Close()
	for _, r := range [][2]int64{{0, size}, {at, 1}, {5 * ChunkSize, ChunkSize}, {at - 1000, 2000}} {
		err := check(r[0], r[1])
		if !errors.Is(err, ErrCorrupt) || !bytes.Contains([]byte(err.Error()), []byte(id.String())) {
			t.Fatalf("ReadVerified(%d, %d) of a corrupt chunk: %v", r[0], r[1], err)
		}
	}
	if err := check(4*ChunkSize, ChunkSize); err != nil {
		t.Fatalf("an intact chunk: %v", err)
	}

	// a block cut short is corrupt too, and a missing one is not found
	if err := os.Truncate(s.path(id), size-1); err != nil {
		t.Fatal(err)
	}
	if err := check(size-100, 100); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("truncated block: %v", err)
	}
	s.Delete(ctx, id)
	if err := check(0, 10); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted block: %v", err)
	}
}
