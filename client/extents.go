package client

import (
	"bytes"
	"cmp"
	"slices"
	"sync"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// maxPending is how many extents dirtyFile.pending holds before they are
// merged into settled: a merge moves all extents, an insert into pending
// at most this many.
const maxPending = 256

// extents returns f's extents, in ascending order.
func (f *dirtyFile) extents() []extent {
	f.settle()
	return f.settled
}

// settle merges pending into settled, from the back, in place.
func (f *dirtyFile) settle() {
	n, m := len(f.settled), len(f.pending)
	if m == 0 {
		return
	}
	f.settled = slices.Grow(f.settled, m)[:n+m]
	i, j := n-1, m-1
	for k := n + m - 1; j >= 0; k-- {
		if i >= 0 && f.settled[i].off > f.pending[j].off {
			f.settled[k] = f.settled[i]
			i--
		} else {
			f.settled[k] = f.pending[j]
			j--
		}
	}
	clear(f.pending)
	f.pending = f.pending[:0]
}

// endingAfter returns the index of the first of the sorted extents that
// ends after off.
func endingAfter(extents []extent, off uint64) int {
	i, _ := slices.BinarySearchFunc(extents, off, func(e extent, off uint64) int {
		return cmp.Compare(e.end(), off+1)
	})
	return i
}

// add buffers a write of data at off: bytes of extents it overlaps are
// overwritten in place, the rest become new extents; a write that continues
// the last extent extends it, so sequential writes become large requests.
func (f *dirtyFile) add(off uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	end := off + uint64(len(data))
	p := endingAfter(f.pending, off)
	if p < len(f.pending) && f.pending[p].off < end {
		f.settle()
		p = 0
	}
	// the first extent ending after off: extents before it are untouched
	i := endingAfter(f.settled, off)
	switch {
	case i == len(f.settled) && p == len(f.pending):
		f.appendAt(off, data)
		return
	case i == len(f.settled) || f.settled[i].off >= end:
		f.pending = slices.Insert(f.pending, p, extent{off: off, data: f.extentData(data)})
		f.bytes += len(data)
		if len(f.pending) >= maxPending {
			f.settle()
		}
		return
	}
	var merged []extent
	pos, j := off, i
	for ; j < len(f.settled) && f.settled[j].off < end; j++ {
		e := f.settled[j]
		if pos < e.off {
			merged = append(merged, extent{off: pos, data: f.extentData(data[pos-off : e.off-off])})
			f.bytes += int(e.off - pos)
		}
		lo, hi := max(off, e.off), min(end, e.end())
		copy(e.data[lo-e.off:hi-e.off], data[lo-off:hi-off])
		merged = append(merged, e)
		pos = hi
	}
	if pos < end {
		merged = append(merged, extent{off: pos, data: f.extentData(data[pos-off:])})
		f.bytes += int(end - pos)
	}
	f.settled = slices.Replace(f.settled, i, j, merged...)
}

// appendAt adds a write after every extent: it extends the last settled
// extent if it continues it, in chunk buffers for a sequential writer.
func (f *dirtyFile) appendAt(off uint64, data []byte) {
	for len(data) > 0 {
		n := len(f.settled)
		if n == 0 || f.settled[n-1].end() != off || len(f.settled[n-1].data) >= flushChunk {
			f.settled = append(f.settled, extent{off: off, data: newExtentData(len(data))})
			n++
		}
		last := &f.settled[n-1]
		take := min(len(data), flushChunk-len(last.data))
		if cap(last.data)-len(last.data) < take {
			last.data = growExtentData(last.data, take)
		}
		last.data = append(last.data, data[:take]...)
		f.bytes += take
		off += uint64(take)
		data = data[take:]
	}
}

func (e extent) end() uint64 { return e.off + uint64(len(e.data)) }

// chunkBufs holds flushChunk buffers: the extents a sequential writer
// fills, and the data of vectored write requests, which gather scattered
// pages. Fresh memory costs a page fault per 4 KiB on first touch: the
// cost of a sequential write's copy into its extent, and of a fresh 1 MiB
// buffer per vectored request. Extents of small writes stay on the heap,
// sized to their data: a random writer's thousands of extents must not
// take a chunk each.
var chunkBufs = sync.Pool{New: func() any { b := make([]byte, 0, flushChunk); return &b }}

// pooledExtent is the size from which an extent's data goes into a pooled
// chunk buffer.
const pooledExtent = flushChunk / 16

// newExtentData returns an empty buffer for an extent whose first write
// has n bytes.
func newExtentData(n int) []byte {
	if n >= pooledExtent {
		return (*chunkBufs.Get().(*[]byte))[:0]
	}
	return make([]byte, 0, n)
}

// growExtentData makes room for n more bytes after data: by doubling on
// the heap (append grows a large slice by a quarter, which copied a
// growing extent several times over), then in a pooled chunk buffer.
func growExtentData(data []byte, n int) []byte {
	if len(data)+n >= pooledExtent {
		return append(newExtentData(flushChunk), data...)
	}
	return slices.Grow(data, max(n, len(data)))
}

// Slabs: a random writer makes thousands of page extents per file, and
// fresh heap memory for each costs a page fault per page on first touch.
// Past slabAfter extents,
// a file's small extents are carved from pooled slabs instead; the slabs
// go back when the file is retired. A file with few extents (most of
// them) keeps its data on the heap, sized to it: a slab each would cost
// 64 KiB per small file.
const (
	slabSize  = 64 << 10
	slabAfter = 16
)

var slabBufs = sync.Pool{New: func() any { b := make([]byte, 0, slabSize); return &b }}

// extentData returns a copy of data for a new extent of f.
func (f *dirtyFile) extentData(data []byte) []byte {
	if len(f.settled)+len(f.pending) < slabAfter || len(data) > slabSize/4 {
		return bytes.Clone(data)
	}
	n := len(f.slabs)
	if n == 0 || cap(f.slabs[n-1])-len(f.slabs[n-1]) < len(data) {
		f.slabs = append(f.slabs, (*slabBufs.Get().(*[]byte))[:0])
		n++
	}
	slab := f.slabs[n-1]
	start := len(slab)
	slab = append(slab, data...)
	f.slabs[n-1] = slab
	// capped: growing the extent (appendAt) moves it, not over the next
	return slab[start:len(slab):len(slab)]
}

// free empties f and gives its buffers back, once nothing sends its
// extents any more.
func (f *dirtyFile) free() {
	freeExtents(f.settled)
	freeExtents(f.pending)
	for _, slab := range f.slabs {
		slab = slab[:0]
		slabBufs.Put(&slab)
	}
	f.settled, f.pending, f.slabs, f.bytes = nil, nil, nil, 0
}

// freeExtents gives the extents' chunk buffers back, once nothing sends
// them any more.
func freeExtents(extents []extent) {
	for _, e := range extents {
		if cap(e.data) == flushChunk {
			b := e.data[:0]
			chunkBufs.Put(&b)
		}
	}
}

// packWrites turns disjoint ascending extents into write requests of up
// to flushChunk bytes each: a large extent is split into plain writes;
// small ones share vectored writes (wire.Request.Spans), within the spans
// and chunks one request may carry. Random page writes thus cost one
// request and one transaction per few hundred pages, not one each.
func packWrites(ino ids.Ino, extents []extent) []*wire.Request {
	var (
		reqs      []*wire.Request
		cur       *wire.Request
		lastChunk uint64
		chunks    int
	)
	for _, e := range extents {
		for off := 0; off < len(e.data); {
			n := min(len(e.data)-off, flushChunk)
			pos := e.off + uint64(off)
			first, last := pos/serverChunk, (pos+uint64(n)-1)/serverChunk
			more := int(last-first) + 1
			if cur != nil && first == lastChunk {
				more--
			}
			if cur == nil || len(cur.Data)+n > flushChunk || len(cur.Spans) == wire.MaxSpans || chunks+more > maxRequestChunks {
				cur = &wire.Request{Op: wire.OpWrite, Ino: ino}
				reqs = append(reqs, cur)
				chunks, more = 0, int(last-first)+1
			}
			cur.Spans = append(cur.Spans, wire.Span{Off: pos, Len: uint32(n)})
			if cur.Data == nil {
				// the extent's own bytes, no copy: the flush sends them
				// under f.mu, which keeps writes out of the extents; the
				// capped slice makes a later span's append copy
				cur.Data = e.data[off : off+n : off+n]
			} else {
				if len(cur.Spans) == 2 {
					buf := *chunkBufs.Get().(*[]byte)
					cur.Data = append(buf[:0], cur.Data...)
				}
				cur.Data = append(cur.Data, e.data[off:off+n]...)
			}
			chunks += more
			lastChunk = last
			off += n
		}
	}
	for _, r := range reqs {
		if len(r.Spans) == 1 {
			// a plain write: what every server version takes
			r.Off, r.Spans = r.Spans[0].Off, nil
		}
	}
	return reqs
}

// releaseWrites returns the buffers of requests packWrites made, once
// nothing sends them any more.
func releaseWrites(reqs []*wire.Request) {
	for _, r := range reqs {
		if len(r.Spans) > 1 {
			b := r.Data[:0]
			chunkBufs.Put(&b)
			r.Data = nil
		}
	}
}

// writeRange is the bytes a write request covers, from its first to past
// its last byte.
func writeRange(r *wire.Request) (start, end uint64) {
	if len(r.Spans) == 0 {
		return r.Off, r.Off + uint64(len(r.Data))
	}
	last := r.Spans[len(r.Spans)-1]
	return r.Spans[0].Off, last.Off + uint64(last.Len)
}
