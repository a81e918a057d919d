package client

import (
	"context"
	"errors"
	"io"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/cache"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/transport"
	"github.com/leasefs/leasefs/wire"
)

// fetched is file data read from the server or the block store for a read
// or a prefetch, and what came with it.
type fetched struct {
	data    []byte
	info    readInfo
	recycle func() // gives data's buffer back once the caller copied it
}

// fetch reads [start, end) of ino (fewer bytes at the end of the file)
// and, if fill, caches it under the S lock the lookup took. gen is the
// cache's data generation from before the caller flushed its own writes:
// a write buffered since makes what comes back uncacheable.
//
// With a block store, the owner answers with the file's block map for the
// range (or, for a small file, its bytes: one round trip), and the blocks
// are read straight from the store, verified against their checksums.
// Without one, the server reads the data itself (OpRead).
func (c *Client) fetch(ctx context.Context, ino ids.Ino, start, end, gen uint64, fill bool) (fetched, error) {
	st := c.blockStore()
	if st != nil {
		if w, ok := c.cachedMap(ino, start, end); ok {
			return c.fetchBlocks(ctx, st, ino, start, end, gen, w, fill, fetched{info: readInfo{cached: true, version: w.version}})
		}
	}
	op, ask := wire.OpLookupBlocks, max(end-start, mapWindowBytes)
	if st == nil {
		op, ask = wire.OpRead, end-start
	}
	var f fetched
	rep, err := c.call(ctx, &wire.Request{Op: op, Ino: ino, Off: start, Size: ask},
		func(ch *cache.Cache, rep *wire.Reply) {
			// (only a reply in the current session gets here)
			for _, g := range rep.Grants {
				if g.Ino == ino {
					f.info.grant = g.Seq
				}
			}
			if rep.Code != wire.CodeOK || rep.Attr == nil || !inline(op, rep) {
				return
			}
			ch.PutData(ino, start, rep.Data, uint64(len(rep.Data)) < ask, rep.Attr.Version, gen)
		})
	if err != nil {
		return fetched{}, err
	}
	if rep.Attr != nil {
		f.info.version = rep.Attr.Version
	}
	if inline(op, rep) {
		c.Counters.ReadBytes.Add(int64(len(rep.Data)))
		f.data = rep.Data
		f.recycle = func() { transport.Recycle(rep.Encoded()) }
		return f, nil
	}
	ps, err := wire.ParsePieces(rep.Data)
	if err != nil || rep.Attr == nil {
		return fetched{}, wire.Errf(wire.CodeBadMessage, "block map of %v: %v", ino, err)
	}
	w := &mapWindow{start: start, end: start, size: rep.Attr.Size, version: rep.Attr.Version, ps: ps}
	if len(ps) > 0 {
		w.end = ps[len(ps)-1].Off + ps[len(ps)-1].Len
	}
	c.withCache(func(ch *cache.Cache) {
		v, _ := ch.Map(ino)
		ws, _ := v.(mapWindows)
		ch.PutMap(ino, ws.with(w), w.version, gen)
	})
	return c.fetchBlocks(ctx, st, ino, start, end, gen, w, fill, f)
}

// mapWindowBytes is how much of a file's block map a lookup asks for at
// least: reads within it, while the lock lasts, need no lookup.
const mapWindowBytes = 64 << 20

// mapWindow is what a lookup answered of a file's block map from start:
// pieces to end (the file's size then, unless the reply was cut short).
type mapWindow struct {
	start, end, size, version uint64
	ps                        []blockmap.Piece
}

// mapWindows are the windows of a file's map looked up so far, newest
// first: random reads over a file larger than one window find theirs.
type mapWindows []*mapWindow

// maxMapWindows bounds the windows kept per file (1 GiB of map).
const maxMapWindows = 16

// with returns ws with w first, the oldest dropped past maxMapWindows,
// and those of another version gone.
func (ws mapWindows) with(w *mapWindow) mapWindows {
	out := mapWindows{w}
	for _, o := range ws {
		if len(out) < maxMapWindows && o.version == w.version {
			out = append(out, o)
		}
	}
	return out
}

// covers reports whether w says where every byte of [start, end) that
// the file has is.
func (w *mapWindow) covers(start, end uint64) bool {
	return start >= w.start && min(end, w.size) <= w.end
}

// cachedMap returns the block map window cached for ino if it covers
// [start, end), under a lock this client holds.
func (c *Client) cachedMap(ino ids.Ino, start, end uint64) (*mapWindow, bool) {
	var w *mapWindow
	ok := c.cached(func(ch *cache.Cache) bool {
		v, _ := ch.Map(ino)
		ws, _ := v.(mapWindows)
		for _, o := range ws {
			if o.covers(start, end) {
				w = o
				return true
			}
		}
		return false
	})
	return w, ok
}

// fetchBlocks reads [start, end) of ino (fewer bytes at the end of the
// file) from its blocks, where w says they are, into f, and caches the
// bytes if fill, unless they stream (Client.streams).
func (c *Client) fetchBlocks(ctx context.Context, st blocks.Store, ino ids.Ino, start, end, gen uint64, w *mapWindow, fill bool, f fetched) (fetched, error) {
	n := min(end, max(w.size, start)) - start
	f.data, f.recycle = fetchBuffer(int(n))
	if err := c.readPieces(ctx, st, ino, start, blockmap.Slice(w.ps, start, start+n), f.data); err != nil {
		f.recycle()
		return fetched{}, err
	}
	c.Counters.ReadBytes.Add(int64(n))
	if fill && !c.streams(st, end-start) {
		c.withCache(func(ch *cache.Cache) {
			ch.PutData(ino, start, f.data, n < end-start, w.version, gen)
		})
	}
	return f, nil
}

// inline reports whether rep carries the file's bytes rather than pieces.
func inline(op wire.Op, rep *wire.Reply) bool {
	return op == wire.OpRead || rep.Flags&wire.InlineData != 0
}

// fetchBuffer returns a buffer of n bytes, pooled when a chunk buffer
// holds it, and the function that gives it back.
func fetchBuffer(n int) ([]byte, func()) {
	if n > flushChunk {
		return make([]byte, n), func() {}
	}
	b := (*chunkBufs.Get().(*[]byte))[:n]
	return b, func() { b = b[:0]; chunkBufs.Put(&b) }
}

// readPieces fills buf, the file's bytes from start, with the pieces a
// lookup returned: holes as zeros, data from the blocks. A lookup answers
// at most wire.MaxPieces pieces: the rest of buf is looked up again. A
// block missing from the store or not matching its checksums is EIO,
// never the wrong bytes, and an error in the log naming the file.
func (c *Client) readPieces(ctx context.Context, st blocks.Store, ino ids.Ino, start uint64, ps []blockmap.Piece, buf []byte) error {
	rctx, cancel := c.opContext(ctx, false)
	defer cancel()
	end := start + uint64(len(buf))
	for pos := start; ; {
		next, bad, err := blockmap.ReadPieces(pos, ps, buf[pos-start:], blockmap.ReadVerified(rctx, st))
		if err != nil {
			return c.blockReadErr(rctx, ino, bad, err)
		}
		if pos = next; pos == end {
			return nil
		}
		rep, err := c.Call(ctx, &wire.Request{Op: wire.OpLookupBlocks, Ino: ino, Off: pos, Size: end - pos})
		if err != nil {
			return err
		}
		if ps, err = wire.ParsePieces(rep.Data); err != nil || rep.Flags&wire.InlineData != 0 || len(ps) == 0 {
			// the file shrank or changed kind under a lock we no
			// longer hold
			return wire.Errf(wire.CodeAgain, "block map of %v changed during a read", ino)
		}
	}
}

// blockReadErr is the error of a read that could not use piece p.
func (c *Client) blockReadErr(ctx context.Context, ino ids.Ino, p *blockmap.Piece, err error) error {
	if ctx.Err() != nil {
		return c.softErr(ctx, ctx.Err())
	}
	if errors.Is(err, blocks.ErrCorrupt) || errors.Is(err, blocks.ErrNotFound) || errors.Is(err, io.EOF) {
		c.Counters.BlocksBad.Add(1)
		c.log.Error("file data unreadable: a block is missing or corrupt; the read returns EIO",
			"path", c.PathOf(ino), "ino", ino, "block", p.Block, "file_offset", p.Off, "err", err)
	}
	return wire.Errf(wire.CodeIO, "block %s of %s: %v", p.Block, c.PathOf(ino), err)
}

// blockStore is the block store file data is read from and written to,
// as this mount reaches it (nil: the servers keep file data themselves).
// The servers of a cluster share one store: the home server's is it.
func (c *Client) blockStore() blocks.Store {
	st, _ := c.Blocks()
	return st
}

// streamBytes is the size from which a read or write of a block-mapped
// file, with the block directory on this host, bypasses the data cache.
const streamBytes = 128 << 10

// streams reports whether n bytes of file data read from or written to st
// bypass the data cache: st is the block directory itself, from which the
// bytes come back as cheaply as from the cache (a copy from the kernel's
// page cache), and n is no small random access (whose lookup the cache
// saves). Filling the cache cost more than the rest of a sequential read
// or write together: a fault per fresh page, and a copy.
func (c *Client) streams(st blocks.Store, n uint64) bool {
	_, local := st.(*blocks.FileStore)
	return local && n >= streamBytes
}
