package blocks

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

// testStoreContract checks what the Store interface promises on s, which
// must be empty. A store that does not serve Delete, List and Usage
// (errors.ErrUnsupported, as RemoteStore) is checked on the rest.
func testStoreContract(t *testing.T, s Store) {
	t.Run("PutRead", func(t *testing.T) { testPutRead(t, s) })
	t.Run("Empty", func(t *testing.T) { testEmptyBlock(t, s) })
	if err := s.Delete(context.Background(), NewID(1)); errors.Is(err, errors.ErrUnsupported) {
		t.Logf("Delete, List and Usage not served: %v", err)
		return
	}
	t.Run("ListDeleteUsage", func(t *testing.T) { testListDeleteUsage(t, s) })
}

func testPutRead(t *testing.T, s Store) {
	ctx := context.Background()
	data := randBytes(MaxBlock-1000, 1)
	size := int64(len(data))
	id := NewID(7)
	if err := s.Put(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		off, n int64
		want   int
		eof    bool
	}{
		{0, size, len(data), false},
		{12345, 4096, 4096, false},
		{size - 10, 100, 10, true},
		{size, 10, 0, true},
		{size + 1, 10, 0, true},
		{MaxBlock + 1, 1, 0, true},
	} {
		p := make([]byte, c.n)
		n, err := s.ReadAt(ctx, id, p, c.off)
		if n != c.want || (err == io.EOF) != c.eof || err != nil && err != io.EOF {
			t.Fatalf("ReadAt(%d, %d) = %d, %v; want %d, eof %v", c.off, c.n, n, err, c.want, c.eof)
		}
		if n > 0 && !bytes.Equal(p[:n], data[c.off:c.off+int64(n)]) {
			t.Fatalf("ReadAt(%d, %d): wrong bytes", c.off, c.n)
		}
	}
	if n, err := s.ReadAt(ctx, NewID(7), make([]byte, 1), 0); !errors.Is(err, ErrNotFound) || n != 0 {
		t.Fatalf("missing block: %d, %v; want ErrNotFound", n, err)
	}
	// the same id and bytes again is harmless
	if err := s.Put(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 100)
	if n, err := s.ReadAt(ctx, id, p, 500); n != 100 || err != nil || !bytes.Equal(p, data[500:600]) {
		t.Fatalf("after a second Put: %d, %v", n, err)
	}
	if err := s.Put(ctx, NewID(7), make([]byte, MaxBlock+1)); !errors.Is(err, ErrTooBig) {
		t.Fatalf("oversized Put: %v", err)
	}
	// a whole MaxBlock fits
	full := NewID(8)
	if err := s.Put(ctx, full, randBytes(MaxBlock, 2)); err != nil {
		t.Fatalf("Put of MaxBlock bytes: %v", err)
	}
	if n, err := s.ReadAt(ctx, full, make([]byte, 10), MaxBlock-5); n != 5 || err != io.EOF {
		t.Fatalf("end of a MaxBlock block: %d, %v", n, err)
	}
}

func testEmptyBlock(t *testing.T, s Store) {
	ctx := context.Background()
	id := NewID(9)
	if err := s.Put(ctx, id, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ReadAt(ctx, id, make([]byte, 10), 0); n != 0 || err != io.EOF {
		t.Fatalf("read of an empty block: %d, %v; want 0, EOF", n, err)
	}
}

func testListDeleteUsage(t *testing.T, s Store) {
	ctx := context.Background()
	// what the subtests before put
	before := listAll(t, s, AllInodes)
	u0, err := s.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var all, ino5 []string
	var bytes int64
	for i := range 20 {
		ino := ids.Ino(i%4 + 5)
		if ino == 7 || ino == 8 {
			ino += 100 // not the inodes of PutRead's blocks
		}
		id := NewID(ino)
		size := 1000 * (i + 1)
		if err := s.Put(ctx, id, randBytes(size, uint64(i))); err != nil {
			t.Fatal(err)
		}
		bytes += int64(size)
		all = append(all, id.String())
		if ino == 5 {
			ino5 = append(ino5, id.String())
		}
	}
	all = append(all, before...)
	slices.Sort(all)
	slices.Sort(ino5)
	if got := listAll(t, s, AllInodes); !slices.Equal(got, all) {
		t.Fatalf("List(all) = %v, want %v", got, all)
	}
	if got := listAll(t, s, 5); !slices.Equal(got, ino5) {
		t.Fatalf("List(5) = %v, want %v", got, ino5)
	}
	if got := listAll(t, s, 99); len(got) != 0 {
		t.Fatalf("List(99) = %v", got)
	}
	u, err := s.Usage(ctx)
	if err != nil || u.Bytes != u0.Bytes+bytes || u.Blocks != u0.Blocks+20 || u.Free == 0 || u.Free < -1 {
		t.Fatalf("Usage = %+v, %v; want %d bytes in %d blocks more than %+v, Free -1 or some", u, err, bytes, 20, u0)
	}
	var sizes int64
	if err := s.List(ctx, 6, func(id ID, size int64, mtime time.Time) error {
		sizes += size
		if d := time.Since(mtime); d < -time.Minute || d > time.Hour {
			t.Errorf("block %s: mtime %v", id, mtime)
		}
		return nil
	}); err != nil || sizes != 1000*(2+6+10+14+18) {
		t.Fatalf("List(6) sizes sum to %d, %v", sizes, err)
	}
	stop := errors.New("stop")
	calls := 0
	if err := s.List(ctx, AllInodes, func(ID, int64, time.Time) error { calls++; return stop }); err != stop || calls != 1 {
		t.Fatalf("List stopping: %v after %d calls", err, calls)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.List(cancelled, AllInodes, func(ID, int64, time.Time) error { return nil }); err == nil {
		t.Fatal("List with a cancelled context returned nil")
	}

	for _, text := range ino5 {
		id, _ := ParseID(text)
		if err := s.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, id); err != nil {
			t.Fatalf("deleting again: %v", err)
		}
		if _, err := s.ReadAt(ctx, id, make([]byte, 1), 0); !errors.Is(err, ErrNotFound) {
			t.Fatalf("read of a deleted block: %v", err)
		}
	}
	if got := listAll(t, s, 5); len(got) != 0 {
		t.Fatalf("after deletes: %v", got)
	}
	// and a Put to the inode works again
	if err := s.Put(ctx, NewID(5), []byte("again")); err != nil {
		t.Fatal(err)
	}
	if got := listAll(t, s, AllInodes); len(got) != len(all)-len(ino5)+1 {
		t.Fatalf("%d blocks, want %d", len(got), len(all)-len(ino5)+1)
	}
}
