package client

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// Tests of the client's parts (parts.go) against a metadata server in
// this process, over loopback QUIC, without a mount.

// pattern returns n bytes that differ from offset to offset and with seed.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i/4096) ^ byte(i) ^ seed
	}
	return b
}

// readAll reads ino's first n bytes through c, in reads of step bytes.
func readAll(ctx context.Context, c *Client, ino ids.Ino, n, step int) ([]byte, error) {
	out := make([]byte, 0, n)
	buf := make([]byte, step)
	for len(out) < n {
		k, err := c.Read(ctx, ino, uint64(len(out)), buf)
		if err != nil {
			return nil, err
		}
		if k == 0 {
			break
		}
		out = append(out, buf[:k]...)
	}
	return out, nil
}

// createFile makes dir/name through c, open, and returns its attributes.
func createFile(ctx context.Context, t *testing.T, c *Client, dir ids.Ino, name string) *wire.Attr {
	t.Helper()
	a, err := c.CreateOpen(ctx, dir, name, 0o100644, 0, 0, 0)
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return a
}

// TestWriteBack: under the X lock a file's writes are buffered, not sent,
// until a flush; then another client reads them.
func TestWriteBack(t *testing.T) {
	s := startServer(t)
	c := connectTo(t, s, func(*Config) {})
	other := connectTo(t, s, func(*Config) {})
	ctx := context.Background()
	a := createFile(ctx, t, c, ids.RootIno, "f")
	data := pattern(3<<20, 1)
	// the first write may go through, and its reply grant the lock the
	// others are buffered under
	if _, err := c.Write(ctx, a.Ino, 0, data[:4096], false, false); err != nil {
		t.Fatal(err)
	}
	sent := c.Counters.Requests.Load()
	for off := 4096; off < len(data); off += 64 << 10 {
		end := min(off+64<<10, len(data))
		if _, err := c.Write(ctx, a.Ino, uint64(off), data[off:end], false, false); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.Counters.Requests.Load() - sent; n > 2 {
		t.Errorf("%d requests sent for writes that should be buffered", n)
	}
	if got := c.Stats().DirtyBytes; got < int64(len(data))-4096 {
		t.Errorf("%d bytes buffered, want at least %d", got, len(data)-4096)
	}
	// the writer reads its own writes from what it buffered
	if got, err := readAll(ctx, c, a.Ino, len(data), 1<<20); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the writer reads %d bytes (%v), not what it wrote", len(got), err)
	}
	if err := c.Flush(ctx, a.Ino); err != nil {
		t.Fatal(err)
	}
	if got := c.Stats().DirtyBytes; got != 0 {
		t.Errorf("%d bytes still buffered after a flush", got)
	}
	if err := c.Release(ctx, a.Ino); err != nil {
		t.Fatal(err)
	}
	b, err := other.Lookup(ctx, ids.RootIno, "f")
	if err != nil {
		t.Fatal(err)
	}
	if b.Size != uint64(len(data)) {
		t.Errorf("another client sees size %d, want %d", b.Size, len(data))
	}
	if got, err := readAll(ctx, other, b.Ino, len(data), 1<<20); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("another client reads %d bytes (%v), not what was written", len(got), err)
	}
}

// TestRevocationFlushes: writes buffered under an X lock reach the server
// before the lock goes: another client's read, which revokes it, sees them
// though the writer never flushed.
func TestRevocationFlushes(t *testing.T) {
	s := startServer(t)
	c := connectTo(t, s, func(*Config) {})
	other := connectTo(t, s, func(*Config) {})
	ctx := context.Background()
	a := createFile(ctx, t, c, ids.RootIno, "f")
	data := pattern(1<<20, 2)
	for off := 0; off < len(data); off += 16 << 10 {
		if _, err := c.Write(ctx, a.Ino, uint64(off), data[off:off+16<<10], false, false); err != nil {
			t.Fatal(err)
		}
	}
	if c.Stats().DirtyBytes == 0 {
		t.Fatal("nothing buffered: the test tests nothing")
	}
	revoked := c.Counters.Revocations.Load()
	within(t, 30*time.Second, "another client's read", func(ctx context.Context) error {
		b, err := other.Lookup(ctx, ids.RootIno, "f")
		if err != nil {
			return err
		}
		got, err := readAll(ctx, other, b.Ino, len(data), 256<<10)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, data) {
			return fmt.Errorf("another client reads %d bytes, not the %d buffered", len(got), len(data))
		}
		return nil
	})
	if c.Counters.Revocations.Load() == revoked {
		t.Error("the writer's lock was not revoked")
	}
	if got := c.Stats().DirtyBytes; got != 0 {
		t.Errorf("%d bytes still buffered after the revocation", got)
	}
}

// TestBehind: under a directory's X lock, creates and removals are sent
// behind the caller; another client that looks sees every one of them.
func TestBehind(t *testing.T) {
	s := startServer(t)
	c := connectTo(t, s, func(*Config) {})
	other := connectTo(t, s, func(*Config) {})
	const files = 50
	within(t, 60*time.Second, "creates and removals", func(ctx context.Context) error {
		d, err := c.Mkdir(ctx, ids.RootIno, "d", 0o40755, 0, 0, 0)
		if err != nil {
			return err
		}
		for i := range files {
			name := fmt.Sprint("f", i)
			// as the kernel does before an O_CREAT|O_EXCL open
			if _, err := c.Lookup(ctx, d.Ino, name); wire.CodeOf(err) != wire.CodeNotFound {
				return fmt.Errorf("lookup %s: %v", name, err)
			}
			a, err := c.CreateOpen(ctx, d.Ino, name, 0o100644, 0, 0, 0)
			if err != nil {
				return err
			}
			if _, err := c.Write(ctx, a.Ino, 0, []byte(name), false, false); err != nil {
				return err
			}
			if err := c.Flush(ctx, a.Ino); err != nil {
				return err
			}
			if err := c.Release(ctx, a.Ino); err != nil {
				return err
			}
		}
		for i := 0; i < files; i += 2 {
			if err := c.Unlink(ctx, d.Ino, fmt.Sprint("f", i)); err != nil {
				return err
			}
		}
		return nil
	})
	if c.Counters.CreatedBehind.Load() == 0 {
		t.Error("no create was sent behind the caller")
	}
	if c.Counters.RemovedBehind.Load() == 0 {
		t.Error("no removal was sent behind the caller")
	}
	within(t, 30*time.Second, "another client's look", func(ctx context.Context) error {
		d, err := other.Lookup(ctx, ids.RootIno, "d")
		if err != nil {
			return err
		}
		for i := range files {
			name := fmt.Sprint("f", i)
			a, err := other.Lookup(ctx, d.Ino, name)
			if i%2 == 0 {
				if wire.CodeOf(err) != wire.CodeNotFound {
					return fmt.Errorf("removed %s: %v, %v", name, a, err)
				}
				continue
			}
			if err != nil {
				return fmt.Errorf("created %s: %w", name, err)
			}
			got, err := readAll(ctx, other, a.Ino, 64, 64)
			if err != nil || string(got) != name {
				return fmt.Errorf("%s holds %q (%v)", name, got, err)
			}
		}
		ents, err := other.ListingByName(ctx, d.Ino)
		if err != nil {
			return err
		}
		if len(ents) != files/2 {
			return fmt.Errorf("%d entries listed, want %d", len(ents), files/2)
		}
		return nil
	})
}

// TestReadAhead: a file read sequentially is fetched ahead of its reader,
// and what the reader gets is the file.
func TestReadAhead(t *testing.T) {
	s := startServer(t)
	w := connectTo(t, s, func(*Config) {})
	c := connectTo(t, s, func(*Config) {})
	ctx := context.Background()
	a := createFile(ctx, t, w, ids.RootIno, "f")
	data := pattern(12<<20, 3)
	for off := 0; off < len(data); off += 1 << 20 {
		if _, err := w.Write(ctx, a.Ino, uint64(off), data[off:off+1<<20], false, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(ctx, a.Ino); err != nil {
		t.Fatal(err)
	}
	if err := w.Release(ctx, a.Ino); err != nil {
		t.Fatal(err)
	}
	b, err := c.Lookup(ctx, ids.RootIno, "f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Open(ctx, b.Ino, 0); err != nil {
		t.Fatal(err)
	}
	got, err := readAll(ctx, c, b.Ino, len(data), 128<<10)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, not the file's %d", len(got), len(data))
	}
	if c.Counters.Prefetches.Load() == 0 {
		t.Error("nothing was fetched ahead of a sequential reader")
	}
	// a random reader gets nothing fetched ahead (a read at 0 starts a
	// sequential one)
	r := connectTo(t, s, func(*Config) {})
	if _, err := r.Open(ctx, b.Ino, 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for i := 1; i < 32; i++ {
		off := uint64((i * 7919 % 3000) * 4096)
		if _, err := r.Read(ctx, b.Ino, off, buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, data[off:off+4096]) {
			t.Fatalf("a random read at %d returns other bytes", off)
		}
	}
	if n := r.Counters.Prefetches.Load(); n != 0 {
		t.Errorf("%d prefetches for a random reader", n)
	}
}
