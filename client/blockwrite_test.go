package client

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// TestBlockData: a file larger than inline data is written to the block
// store by the writing client (blocks put, the map committed) and read
// from it by another, through the server's directory and through its
// endpoint; scattered small writes into it share blocks; a small file
// stays inline.
func TestBlockData(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
	}{{"local", func(*Config) {}}, {"remote", remoteBlocks}} {
		t.Run(tc.name, func(t *testing.T) { testBlockData(t, tc.set) })
	}
}

func testBlockData(t *testing.T, set func(*Config)) {
	s := startBlockServer(t)
	a, b := connectTo(t, s, set), connectTo(t, s, set)
	rng := rand.New(rand.NewPCG(1, 2))
	want := make([]byte, 9<<20+123)
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	within(t, 60*time.Second, "block data", func(ctx context.Context) error {
		f := createFile(ctx, t, a, ids.RootIno, "big")
		for off := 0; off < len(want); off += 1 << 20 {
			if _, err := a.Write(ctx, f.Ino, uint64(off), want[off:min(off+1<<20, len(want))], false, false); err != nil {
				return err
			}
		}
		if err := a.Fsync(ctx, f.Ino); err != nil {
			return err
		}
		if n := a.Counters.BlocksPut.Load(); n != 3 {
			t.Errorf("9 MiB put as %d blocks, want 3", n)
		}
		if err := readsAs(ctx, b, f.Ino, want); err != nil {
			return err
		}
		// 300 scattered 100-byte writes: one block, one commit
		put := a.Counters.BlocksPut.Load()
		for range 300 {
			off := rng.IntN(len(want) - 100)
			p := make([]byte, 100)
			for i := range p {
				p[i] = byte(rng.Uint32())
			}
			copy(want[off:], p)
			if _, err := a.Write(ctx, f.Ino, uint64(off), p, false, false); err != nil {
				return err
			}
		}
		if err := a.Fsync(ctx, f.Ino); err != nil {
			return err
		}
		if n := a.Counters.BlocksPut.Load() - put; n != 1 {
			t.Errorf("300 small writes put as %d blocks, want 1", n)
		}
		if err := readsAs(ctx, b, f.Ino, want); err != nil {
			return err
		}
		// a small file: inline, no block
		put = a.Counters.BlocksPut.Load()
		g := createFile(ctx, t, a, ids.RootIno, "small")
		small := bytes.Repeat([]byte("inline "), 1000)
		if _, err := a.Write(ctx, g.Ino, 0, small, false, false); err != nil {
			return err
		}
		if err := a.Fsync(ctx, g.Ino); err != nil {
			return err
		}
		if n := a.Counters.BlocksPut.Load() - put; n != 0 {
			t.Errorf("a %d-byte file put %d blocks", len(small), n)
		}
		return readsAs(ctx, b, g.Ino, small)
	})
}

// readsAs reads ino through c in 128 KiB reads and compares with want.
func readsAs(ctx context.Context, c *Client, ino ids.Ino, want []byte) error {
	got := make([]byte, 0, len(want))
	buf := make([]byte, 128<<10)
	for {
		n, err := c.Read(ctx, ino, uint64(len(got)), buf)
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("read %d bytes, want %d; equal prefix %d", len(got), len(want), commonPrefix(got, want))
	}
	return nil
}

func commonPrefix(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// TestPackBlocks: extents pack into blocks of at most MaxBlock bytes and
// MaxCommit extents, the extents pointing at their bytes in them.
func TestPackBlocks(t *testing.T) {
	var exts []extent
	for i := range 3000 {
		exts = append(exts, extent{off: uint64(i) * 8192, data: bytes.Repeat([]byte{byte(i)}, 100)})
	}
	exts = append(exts, extent{off: 1 << 30, data: make([]byte, 9<<20)})
	var got []*packedBlock
	packBlocks(7, exts, func(b *packedBlock) bool {
		c := *b
		d := append([]byte(nil), *b.data...)
		c.data = &d
		c.blk = blockmap.Block{Unique: b.id.Unique, Size: uint64(len(d)), Sums: blocks.Sum(d)}
		got = append(got, &c)
		return true
	})
	var total, nexts int
	for _, b := range got {
		if len(*b.data) > blocks.MaxBlock || len(b.exts) > wire.MaxCommit {
			t.Fatalf("block of %d bytes, %d extents", len(*b.data), len(b.exts))
		}
		for _, x := range b.exts {
			if x.Off < 1<<30 && (*b.data)[x.BlockOff] != byte(x.Off/8192) {
				t.Fatalf("extent %+v points at the wrong bytes", x)
			}
		}
		total += len(*b.data)
		nexts += len(b.exts)
	}
	if total != 3000*100+9<<20 || len(got) != 5 {
		t.Errorf("%d bytes in %d blocks", total, len(got))
	}
	reqs := commitRequests(7, got)
	for _, r := range reqs {
		blks, xs, err := wire.ParseCommit(r.Data)
		if err != nil || len(xs) > wire.MaxCommit {
			t.Fatalf("commit of %d blocks %d extents: %v", len(blks), len(xs), err)
		}
	}
}
