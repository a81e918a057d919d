package client

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"

	"github.com/leasefs/leasefs/cache"
	"github.com/leasefs/leasefs/wire"
)

// TestDirtyFileWrites: buffered writes, overlapping or not, leave disjoint
// ascending extents holding what the writes made in their order, and the
// requests a flush packs them into carry exactly those bytes within a
// request's bounds.
func TestDirtyFileWrites(t *testing.T) {
	noise := make([]byte, 4*flushChunk)
	for i := range noise {
		noise[i] = byte(i*7 + i>>11)
	}
	ones := bytes.Repeat([]byte{1}, 4*flushChunk)
	for seed := range uint64(30) {
		r := rand.New(rand.NewPCG(seed, 9))
		var f dirtyFile
		var model, dirty []byte // the file's bytes and which of them were written
		size := 1 + r.IntN(32<<20)
		for range 1 + r.IntN(1000) {
			off, n := r.IntN(size), 1+r.IntN(4096)
			switch {
			case seed%2 == 1: // random pages, as a database or the perf suite writes
				off, n = off&^4095, 4096
			case r.IntN(4) == 0:
				n = 1 + r.IntN(2*flushChunk)
			case r.IntN(3) == 0 && len(f.settled) > 0: // continue the last settled extent
				off = int(f.settled[len(f.settled)-1].end())
			}
			k := r.IntN(len(noise) - n)
			data := noise[k : k+n : k+n]
			f.add(uint64(off), data)
			if len(model) < off+n {
				model = append(model, make([]byte, off+n-len(model))...)
				dirty = append(dirty, make([]byte, off+n-len(dirty))...)
			}
			copy(model[off:], data)
			copy(dirty[off:off+n], ones)
		}
		image := make([]byte, len(model))
		written := make([]byte, len(model))
		var prevEnd uint64
		total := 0
		for i, e := range f.extents() {
			if len(e.data) == 0 || (i > 0 && e.off < prevEnd) {
				t.Fatalf("seed %d: extent %d (%d+%d) is empty or not after the one before (end %d)", seed, i, e.off, len(e.data), prevEnd)
			}
			prevEnd = e.end()
			copy(image[e.off:], e.data)
			copy(written[e.off:e.end()], ones)
			total += len(e.data)
		}
		if !bytes.Equal(written, dirty) || !bytes.Equal(image, model) || total != f.bytes {
			t.Fatalf("seed %d: extents differ from the writes (bytes %d, counted %d)", seed, total, f.bytes)
		}

		sent := make([]byte, len(model))
		var last uint64
		for i, req := range packWrites(1, f.extents()) {
			spans := req.Spans
			if spans == nil {
				spans = []wire.Span{{Off: req.Off, Len: uint32(len(req.Data))}}
			} else if len(spans) == 1 {
				t.Fatalf("seed %d: request %d is a vectored write of one span", seed, i)
			}
			if len(req.Data) > flushChunk || len(spans) > wire.MaxSpans {
				t.Fatalf("seed %d: request %d carries %d bytes in %d spans", seed, i, len(req.Data), len(spans))
			}
			// what the server checks: ascending, disjoint, the data's length
			if _, err := wire.ParseRequest(req.Append(nil)); err != nil {
				t.Fatalf("seed %d: request %d: %v", seed, i, err)
			}
			chunks := map[uint64]bool{}
			data := req.Data
			for _, sp := range spans {
				if sp.Off < last {
					t.Fatalf("seed %d: request %d is not after the one before", seed, i)
				}
				last = sp.Off + uint64(sp.Len)
				copy(sent[sp.Off:], data[:sp.Len])
				data = data[sp.Len:]
				for c := sp.Off / serverChunk; c <= (last-1)/serverChunk; c++ {
					chunks[c] = true
				}
			}
			if len(chunks) > maxRequestChunks {
				t.Fatalf("seed %d: request %d touches %d chunks", seed, i, len(chunks))
			}
		}
		if !bytes.Equal(sent, image) {
			t.Fatalf("seed %d: the requests carry other bytes than the extents", seed)
		}
	}
}

// TestExtentBuffers: a sequential writer's extents are whole chunks in
// chunk buffers (pooled: no fresh memory per megabyte), however small its
// writes; a random writer's page extents take no more than their pages.
func TestExtentBuffers(t *testing.T) {
	record := bytes.Repeat([]byte("r"), 10<<10)
	var seq dirtyFile
	for off := uint64(0); off < 3*flushChunk; off += uint64(len(record)) {
		seq.add(off, record)
	}
	// 10 KiB records do not end on a chunk: the last one's tail begins a
	// fourth extent
	if len(seq.extents()) != 4 {
		t.Fatalf("3 MiB of records made %d extents", len(seq.extents()))
	}
	for i, e := range seq.extents()[:3] {
		if e.off != uint64(i*flushChunk) || len(e.data) != flushChunk || cap(e.data) != flushChunk {
			t.Errorf("sequential extent %d: %d+%d (cap %d), want a whole chunk in a chunk buffer", i, e.off, len(e.data), cap(e.data))
		}
	}
	var big dirtyFile
	big.add(100, bytes.Repeat([]byte("b"), 2*flushChunk+5))
	if len(big.extents()) != 3 || big.bytes != 2*flushChunk+5 || cap(big.extents()[0].data) != flushChunk {
		t.Errorf("a write of two chunks and a bit made %d extents of %d bytes", len(big.extents()), big.bytes)
	}
	var random dirtyFile
	page := bytes.Repeat([]byte("p"), 4096)
	for i := range 100 {
		random.add(uint64((i*37%100)*3)*4096, page) // each page once, out of order
	}
	for _, e := range random.extents() {
		if cap(e.data) > 2*len(page) {
			t.Fatalf("a page extent holds a buffer of %d bytes", cap(e.data))
		}
	}
	// past the first slabAfter, page extents share pooled slabs
	if want := (100 - slabAfter + slabSize/len(page) - 1) / (slabSize / len(page)); len(random.slabs) != want {
		t.Errorf("100 page extents took %d slabs, want %d", len(random.slabs), want)
	}
	random.free()
	if random.slabs != nil || random.bytes != 0 || len(random.extents()) != 0 {
		t.Error("free left buffers or extents")
	}
}

// BenchmarkDirtyFileSequential buffers a file written sequentially in
// tar's 10 KiB records, flushed at every flushChunk as the client does.
func BenchmarkDirtyFileSequential(b *testing.B) {
	record := make([]byte, 10<<10)
	b.SetBytes(8 << 20)
	b.ReportAllocs()
	for b.Loop() {
		f := &dirtyFile{}
		for off := uint64(0); off < 8<<20; off += uint64(len(record)) {
			f.add(off, record)
			if f.bytes >= flushChunk {
				freeExtents(f.extents())
				f.settled, f.bytes = nil, 0
			}
		}
	}
}

// BenchmarkDirtyFileRandom buffers 16,384 random 4 KiB page writes into a
// 256 MiB file (64 MiB, the flush threshold) and packs them into requests,
// as the suite's random buffered writes do.
func BenchmarkDirtyFileRandom(b *testing.B) {
	page := make([]byte, 4096)
	const pages = 256 << 20 / 4096
	b.SetBytes(64 << 20)
	b.ReportAllocs()
	for b.Loop() {
		f := &dirtyFile{}
		for i := range 16384 {
			f.add(uint64((i*7919*7919+i*104729)%pages)*4096, page)
		}
		releaseWrites(packWrites(1, f.extents()))
		f.free()
	}
}

// TestRetireKeepsNewerChanges: a flush that waited for a dirty file while
// another flush sent it finds it retired; retiring it again must not drop
// the buffered attributes of the file's next dirty file (a chmod made
// since), which the cache gives over replies until they are sent.
func TestRetireKeepsNewerChanges(t *testing.T) {
	const ino = 5
	c := &Client{cache: cache.New(10)}
	w := newWriteBack(c)
	c.wb = w
	c.cache.Granted(wire.Grant{Ino: ino, Mode: wire.LockExclusive, Seq: 1})
	c.cache.SetAttr(&wire.Attr{Ino: ino, Mode: 0o100644, Change: 1})
	ctx := context.Background()
	first, _ := w.lockFile(ctx, ino) // a flush sends it...
	w.retire(ino, first)
	first.mu.unlock()
	next, _ := w.lockFile(ctx, ino) // ...and a chmod is buffered since
	c.cache.SetLocal(&wire.Attr{Ino: ino, Mode: 0o600}, wire.SetMode)
	next.mu.unlock()
	_ = first.mu.lock(ctx) // the flush that waited for the first
	w.retire(ino, first)
	first.mu.unlock()
	if a, _ := c.cache.Attr(ino); a == nil || a.Mode&0o777 != 0o600 {
		t.Fatalf("the chmod buffered after the first flush is gone from the cache: %+v", a)
	}
	_ = next.mu.lock(ctx)
	w.retire(ino, next) // its own flush
	next.mu.unlock()
	if c.cache.LocalFields(ino) != 0 {
		t.Fatal("buffered attributes kept after their flush")
	}
}
