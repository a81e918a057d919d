package client

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"syscall"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/cache"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// Writes of a file larger than wire.InlineMax go to the block store: the
// flush packs the file's dirty extents into new blocks, puts them (the
// mount's own kernel file I/O when it sees the server's block directory,
// HTTPS otherwise), and then commits the map change to the inode's owner
// (OpCommitBlocks), under the X lock the writes were buffered under. A
// small file's writes go to the server inline (OpWrite), which keeps them
// beside its attributes.

// putParallel is how many blocks one flush puts at once.
const putParallel = 4

// blockBufs hold a block being packed: blocks.MaxBlock each.
var blockBufs = sync.Pool{New: func() any { b := make([]byte, 0, blocks.MaxBlock); return &b }}

// inBlocks reports whether ino's buffered extents go to the block store:
// the mount reaches one and the file is, or becomes, larger than inline
// data may be.
func (w *writeBack) inBlocks(ino ids.Ino, exts []extent) bool {
	if len(exts) == 0 || w.c.blockStore() == nil {
		return false
	}
	if exts[len(exts)-1].end() > wire.InlineMax {
		return true
	}
	var a *wire.Attr
	w.c.withCache(func(ch *cache.Cache) { a, _ = ch.Attr(ino) })
	return a != nil && a.Size > wire.InlineMax
}

// packedBlock is one new block: its bytes (until put), its record and the
// extents of the file it backs.
type packedBlock struct {
	id   blocks.ID
	data *[]byte
	blk  blockmap.Block
	exts []blockmap.Extent
	put  bool // in the store
}

// packBlocks calls put with each block the extents make, in file order:
// a block is full at blocks.MaxBlock bytes or wire.MaxCommit extents, so
// that one commit request can always carry it.
func packBlocks(ino ids.Ino, exts []extent, put func(*packedBlock) bool) {
	var cur *packedBlock
	flush := func() bool {
		if cur == nil {
			return true
		}
		b := cur
		cur = nil
		return put(b)
	}
	for _, e := range exts {
		for k := 0; k < len(e.data); {
			if cur == nil {
				cur = &packedBlock{id: blocks.NewID(ino), data: blockBufs.Get().(*[]byte)}
				*cur.data = (*cur.data)[:0]
			}
			n := min(len(e.data)-k, blocks.MaxBlock-len(*cur.data))
			cur.exts = append(cur.exts, blockmap.Extent{Off: e.off + uint64(k), Len: uint64(n),
				Block: cur.id.Unique, BlockOff: uint64(len(*cur.data))})
			*cur.data = append(*cur.data, e.data[k:k+n]...)
			k += n
			if len(*cur.data) == blocks.MaxBlock || len(cur.exts) == wire.MaxCommit {
				if !flush() {
					return
				}
			}
		}
	}
	flush()
}

// putBlocks puts the blocks exts make into st, putParallel at once, and
// returns the commits that reference them, in file order. A store out of
// space is wire.CodeNoSpace (the flush fails the file: ENOSPC at its next
// fsync or close); nothing is committed then, and the blocks put are
// orphans the servers' collector removes.
func (w *writeBack) putBlocks(ctx context.Context, st blocks.Store, ino ids.Ino, exts []extent) ([]*wire.Request, error) {
	pctx, cancel := w.c.opContext(ctx, false)
	defer cancel()
	var (
		packed   []*packedBlock
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		slots    = make(chan struct{}, putParallel)
	)
	packBlocks(ino, exts, func(b *packedBlock) bool {
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed {
			blockBufs.Put(b.data)
			return false
		}
		packed = append(packed, b)
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			err := w.putBlock(pctx, st, b)
			if err != nil {
				mu.Lock()
				firstErr = cmp.Or(firstErr, err)
				mu.Unlock()
			}
		}()
		return true
	})
	wg.Wait()
	if firstErr != nil {
		w.dropPut(pctx, st, packed)
		if errors.Is(firstErr, syscall.ENOSPC) {
			w.c.noteNoSpace()
			return nil, wire.Errf(wire.CodeNoSpace, "block store: %v", firstErr)
		}
		if pctx.Err() != nil {
			return nil, w.c.softErr(ctx, pctx.Err())
		}
		return nil, firstErr
	}
	return commitRequests(ino, packed), nil
}

// dropPut deletes the blocks a failed flush put: on a full store their
// room is what the next write needs, and nothing will commit them. A
// store a mount may not delete from (the server's endpoint) keeps them
// until the collector finds them unreferenced, as does a request that
// gives up meanwhile.
func (w *writeBack) dropPut(ctx context.Context, st blocks.Store, packed []*packedBlock) {
	for _, b := range packed {
		if !b.put {
			continue
		}
		if err := st.Delete(ctx, b.id); err != nil {
			w.c.log.Debug("block of a failed flush left to the collector", "block", b.id, "err", err)
			return
		}
	}
}

// putBlock checksums b and puts it, then gives its buffer back.
func (w *writeBack) putBlock(ctx context.Context, st blocks.Store, b *packedBlock) error {
	defer func() { blockBufs.Put(b.data); b.data = nil }()
	data := *b.data
	b.blk = blockmap.Block{Unique: b.id.Unique, Size: uint64(len(data)), Sums: blocks.Sum(data)}
	if err := st.Put(ctx, b.id, data); err != nil {
		return err
	}
	b.put = true
	w.c.Counters.BlocksPut.Add(1)
	w.c.Counters.WrittenBytes.Add(int64(len(data)))
	return nil
}

// commitRequests makes the OpCommitBlocks requests for blocks put, each
// within wire.MaxCommit blocks and extents; Size is where the last
// extent it commits ends (the file grows to it).
func commitRequests(ino ids.Ino, packed []*packedBlock) []*wire.Request {
	var reqs []*wire.Request
	for i := 0; i < len(packed); {
		var (
			blks []blockmap.Block
			exts []blockmap.Extent
		)
		for ; i < len(packed) && len(exts)+len(packed[i].exts) <= wire.MaxCommit; i++ {
			blks = append(blks, packed[i].blk)
			exts = append(exts, packed[i].exts...)
		}
		reqs = append(reqs, &wire.Request{Op: wire.OpCommitBlocks, Ino: ino,
			Data: wire.AppendCommit(nil, blks, exts), Size: exts[len(exts)-1].End()})
	}
	return reqs
}
