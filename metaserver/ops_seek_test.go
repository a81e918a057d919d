package metaserver

import (
	"testing"

	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/wire"
)

// TestSeekBlocks: OpSeek in a block-mapped file answers from its map,
// to another client, under an S lock.
func TestSeekBlocks(t *testing.T) {
	s := startBlockTestServer(t)
	ctx := testContext(t)
	a, b := connect(t, s), connect(t, s)
	f := mustCreate(ctx, t, a, "f")
	takeX(ctx, t, a, f.Ino)
	blk := putBlock(t, f.Ino, []byte("hello, blocks"), s)
	size := 100 + blk.Size + 50 // a hole, the block, a hole
	if _, err := a.Call(ctx, commitReq(f.Ino, size, []blockmap.Block{blk}, whole(100, blk))); err != nil {
		t.Fatalf("commit: %v", err)
	}
	for _, c := range []struct {
		off    uint64
		whence uint32
		want   uint64
		code   wire.Code
	}{
		{0, wire.SeekData, 100, wire.CodeOK}, {0, wire.SeekHole, 0, wire.CodeOK},
		{105, wire.SeekHole, 100 + blk.Size, wire.CodeOK}, {100 + blk.Size, wire.SeekData, 0, wire.CodeNXIO},
		{size - 1, wire.SeekHole, size - 1, wire.CodeOK}, {size, wire.SeekHole, 0, wire.CodeNXIO},
	} {
		got, err := b.Seek(ctx, f.Ino, c.off, c.whence)
		if wire.CodeOf(err) != c.code || err == nil && got != c.want {
			t.Errorf("seek %d from %d: %d, %v; want %d, %v", c.whence, c.off, got, err, c.want, c.code)
		}
	}
}
