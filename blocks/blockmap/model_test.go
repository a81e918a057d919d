package blockmap

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/leasefs/leasefs/blocks"
)

var (
	seedFlag = flag.Uint64("blockmap.seed", 0, "seed of TestModel (0: from the clock)")
	opsFlag  = flag.Int("blockmap.ops", 10000, "operations of TestModel")
)

// model is the reference: the file's bytes and which of them have data,
// the block store's contents, and the records as the store would hold
// them after applying every Change.
type model struct {
	t       *testing.T
	r       *rand.Rand
	m       *Map
	size    uint64
	data    []byte
	has     []bool
	store   map[Unique][]byte
	recExt  map[uint64]Extent
	recBlk  map[Unique]Block
	nextUID uint64
	plans   [2]int // fragmentation and dead-space compactions applied
}

const modelSpan = 64 << 10 // offsets the model uses

// TestModel runs random writes, truncates, punches, reads, seeks,
// compactions and reloads against the map and a plain byte array with a
// bitmap of the bytes that have data, and checks after each step that
// they agree, that the reference counts are the extents pointing into
// each block, and that the Changes, applied to a record set, give the
// map's records.
func TestModel(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d: rerun with go test ./blocks/blockmap -run TestModel -args -blockmap.seed=%d", seed, seed)
		}
	})
	md := &model{t: t, r: rand.New(rand.NewPCG(seed, 1)), m: New(42),
		data: make([]byte, modelSpan), has: make([]bool, modelSpan),
		store: map[Unique][]byte{}, recExt: map[uint64]Extent{}, recBlk: map[Unique]Block{}}
	counts := map[string]int{}
	most := 0
	for i := range *opsFlag {
		op := md.step()
		counts[op]++
		most = max(most, len(md.m.ext))
		md.check()
		if t.Failed() {
			t.Fatalf("op %d (%s) broke the model; extents %v", i, op, md.m.ext)
		}
	}
	t.Logf("ops %v; %d fragment and %d dead-space compactions; at most %d extents; %d extents, %d blocks at the end",
		counts, md.plans[0], md.plans[1], most, len(md.m.ext), len(md.m.blocks))
}

func (md *model) uid() Unique {
	md.nextUID++
	var un Unique
	un[0] = byte(md.nextUID)
	un[1] = byte(md.nextUID >> 8)
	un[15] = 1 // never the zero value
	return un
}

func (md *model) rng(maxLen int) (off, n uint64) {
	off = uint64(md.r.IntN(modelSpan))
	n = uint64(md.r.IntN(min(maxLen, modelSpan-int(off))) + 1)
	return off, n
}

func (md *model) step() string {
	switch p := md.r.IntN(100); {
	case p < 40:
		md.write()
		return "write"
	case p < 45:
		// Mostly a small cut, so that fragmentation builds up.
		size := md.size - uint64(md.r.IntN(int(md.size)/8+1))
		if md.r.IntN(8) == 0 {
			size = uint64(md.r.IntN(modelSpan))
		}
		if md.r.IntN(4) == 0 {
			size = md.size + uint64(md.r.IntN(1000)) // grow: a hole at the end
		}
		size = min(size, modelSpan)
		md.apply(md.m.Truncate(size))
		for i := size; i < modelSpan; i++ {
			md.data[i], md.has[i] = 0, false
		}
		md.size = size
		return "truncate"
	case p < 55:
		off, n := md.rng(2000)
		md.apply(md.m.PunchHole(off, n))
		for i := off; i < off+n; i++ {
			md.data[i], md.has[i] = 0, false
		}
		return "punch"
	case p < 75:
		md.read()
		return "read"
	case p < 90:
		md.seek()
		return "seek"
	case p < 92:
		md.compact()
		return "compact"
	default:
		md.reload()
		return "reload"
	}
}

// write makes one block and points one to three extents into it.
func (md *model) write() {
	off, _ := md.rng(1)
	nExt := 1 + md.r.IntN(3)
	un := md.uid()
	var exts []Extent
	boff := uint64(md.r.IntN(100))
	for range nExt {
		if off >= modelSpan {
			break
		}
		maxLen := 3000
		if md.r.IntN(2) == 0 {
			maxLen = 200
		}
		n := uint64(1 + md.r.IntN(min(maxLen, modelSpan-int(off))))
		exts = append(exts, Extent{Off: off, Len: n, Block: un, BlockOff: boff})
		boff += n
		if md.r.IntN(3) != 0 {
			boff += uint64(md.r.IntN(50)) // else contiguous in the block
		}
		off += n
		if md.r.IntN(3) != 0 {
			off += uint64(md.r.IntN(500)) // else contiguous in the file
		}
	}
	pad := uint64(md.r.IntN(100))
	if md.r.IntN(20) == 0 {
		pad += sparseMin // a block mostly dead from the start
	}
	content := make([]byte, boff+pad)
	for i := range content {
		content[i] = byte(md.r.Uint32())
	}
	b := Block{Unique: un, Size: uint64(len(content)), Sums: blocks.Sum(content)}
	md.store[un] = content
	md.apply(md.m.Apply([]Block{b}, exts))
	for _, e := range exts {
		copy(md.data[e.Off:e.End()], content[e.BlockOff:e.BlockOff+e.Len])
		for i := e.Off; i < e.End(); i++ {
			md.has[i] = true
		}
		md.size = max(md.size, e.End())
	}
}

// apply checks a Change against the map and applies it to the records.
func (md *model) apply(c Change, err error) {
	t := md.t
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range c.Removed {
		if md.recExt[e.Off] != e {
			t.Errorf("removed %v, records hold %v", e, md.recExt[e.Off])
		}
		delete(md.recExt, e.Off)
	}
	for _, e := range c.Added {
		if _, ok := md.recExt[e.Off]; ok {
			t.Errorf("added %v over a record", e)
		}
		md.recExt[e.Off] = e
	}
	for _, e := range c.Changed {
		if old, ok := md.recExt[e.Off]; !ok || old == e {
			t.Errorf("changed %v: record %v", e, old)
		}
		md.recExt[e.Off] = e
	}
	for _, b := range c.NewBlocks {
		md.recBlk[b.Unique] = b
	}
	for _, b := range c.Freed {
		if _, ok := md.recBlk[b.Unique]; !ok {
			t.Errorf("freed unknown block %x", b.Unique)
		}
		delete(md.recBlk, b.Unique)
		delete(md.store, b.Unique) // a later read of it fails the test
	}
}

func (md *model) check() {
	t := md.t
	t.Helper()
	md.m.mustCheck(t)
	if len(md.recExt) != len(md.m.ext) || len(md.recBlk) != len(md.m.blocks) {
		t.Fatalf("records: %d extents, %d blocks; map: %d, %d", len(md.recExt), len(md.recBlk), len(md.m.ext), len(md.m.blocks))
	}
	for _, e := range md.m.ext {
		if md.recExt[e.Off] != e {
			t.Fatalf("record at %d is %v, map has %v", e.Off, md.recExt[e.Off], e)
		}
		if e.End() > md.size {
			t.Fatalf("extent %v past the size %d", e, md.size)
		}
	}
	var n uint64
	for _, h := range md.has {
		if h {
			n++
		}
	}
	if got := md.m.StoredBytes(); got != (n+511)/512*512 {
		t.Fatalf("StoredBytes %d, %d bytes have data", got, n)
	}
}

// readMap reads [off, off+n) through Lookup and the store.
func (md *model) readMap(off, n uint64) []byte {
	t := md.t
	ps, err := md.m.Lookup(off, n)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 0, n)
	at := off
	for _, p := range ps {
		if p.Off != at || p.Len == 0 {
			t.Fatalf("piece %+v at %d", p, at)
		}
		at += p.Len
		if p.Hole {
			out = append(out, make([]byte, p.Len)...)
			continue
		}
		content, ok := md.store[p.Block.Unique]
		if !ok || p.Block.Ino != 42 {
			t.Fatalf("piece %+v: block not in the store", p)
		}
		fo, fn := p.Fetch()
		if fo%blocks.ChunkSize != 0 || uint64(fo) > p.BlockOff || uint64(fo+fn) < p.BlockOff+p.Len || uint64(fo+fn) > p.Size {
			t.Fatalf("piece %+v: fetch %d+%d", p, fo, fn)
		}
		fetched := content[fo : fo+fn]
		if err := p.Sums.Verify(fo, fetched); err != nil {
			t.Fatalf("piece %+v: %v", p, err)
		}
		out = append(out, fetched[p.BlockOff-uint64(fo):][:p.Len]...)
	}
	if at != off+n {
		t.Fatalf("pieces end at %d, want %d", at, off+n)
	}
	return out
}

func (md *model) read() {
	off, n := md.rng(20000)
	if got := md.readMap(off, n); !bytes.Equal(got, md.data[off:off+n]) {
		md.t.Fatalf("read [%d, +%d) differs", off, n)
	}
}

func (md *model) seek() {
	off := uint64(md.r.IntN(int(md.size) + 10))
	wantD, wantH := uint64(0), uint64(0)
	errD, errH := off >= md.size, off >= md.size
	if !errD {
		wantD = off
		for wantD < md.size && !md.has[wantD] {
			wantD++
		}
		errD = wantD == md.size
		wantH = off
		for wantH < md.size && md.has[wantH] {
			wantH++
		}
	}
	d, err := md.m.SeekData(off, md.size)
	if (err != nil) != errD || !errD && d != wantD {
		md.t.Fatalf("SeekData(%d, %d) = %d, %v; want %d, ENXIO %v", off, md.size, d, err, wantD, errD)
	}
	h, err := md.m.SeekHole(off, md.size)
	if (err != nil) != errH || !errH && h != wantH {
		md.t.Fatalf("SeekHole(%d, %d) = %d, %v; want %d, ENXIO %v", off, md.size, h, err, wantH, errH)
	}
}

// compact applies CompactPlan's plans, one or until there is none, and
// checks each against the rule it follows and the file's bytes after it.
func (md *model) compact() {
	all := md.r.IntN(2) == 0
	for {
		p, ok := md.m.CompactPlan()
		if !ok {
			return
		}
		md.checkPlan(p)
		if p.Sparse {
			md.plans[1]++
		} else {
			md.plans[0]++
		}
		before := len(md.m.ext)
		var content []byte
		for _, e := range p.Extents {
			content = append(content, md.readMap(e.Off, e.Len)...)
		}
		if uint64(len(content)) != p.Size || p.Size > blocks.MaxBlock {
			md.t.Fatalf("plan %+v: %d bytes", p, len(content))
		}
		un := md.uid()
		md.store[un] = content
		md.apply(md.m.Apply(p.Write(un, blocks.Sum(content))))
		if len(md.m.ext) != before-p.Gain {
			md.t.Fatalf("compaction gained %d extents, plan said %d", before-len(md.m.ext), p.Gain)
		}
		if got := md.readMap(0, md.size); !bytes.Equal(got, md.data[:md.size]) {
			md.t.Fatalf("compaction %+v changed the file's bytes", p)
		}
		if !all {
			return
		}
	}
}

// checkPlan checks that p follows one of CompactPlan's rules.
func (md *model) checkPlan(p Plan) {
	t := md.t
	if p.Sparse {
		b, refs, _ := md.m.Block(p.Extents[0].Block)
		var live uint64
		for _, e := range p.Extents {
			live += e.Len
			if e.Block != b.Unique {
				t.Fatalf("sparse plan %+v: extents of two blocks", p)
			}
		}
		if refs != len(p.Extents) || b.Size < sparseMin || live*sparseFrac >= b.Size {
			t.Fatalf("sparse plan of block %+v (%d extents): %+v", b, refs, p)
		}
		return
	}
	var longest, young uint64
	for i, e := range p.Extents {
		longest = max(longest, e.Len)
		if b, _, _ := md.m.Block(e.Block); b.Size*tierFanout <= p.Size {
			young += e.Len
		}
		if i > 0 && p.Extents[i-1].End() != e.Off {
			t.Fatalf("plan %+v: extents %d and %d do not touch", p, i-1, i)
		}
	}
	if len(p.Extents) < minRun || longest*tierFanout > p.Size || young*youngFrac < p.Size || p.Gain != len(p.Extents)-1 {
		t.Fatalf("fragmentation plan %+v breaks the rule", p)
	}
}

// reload encodes every record, parses them back and loads a new map.
func (md *model) reload() {
	t := md.t
	var bs []Block
	var es []Extent
	for _, b := range md.m.blocks {
		rec := AppendBlock(nil, b.Block)
		if len(rec) != BlockRecordLen(b.Size) {
			t.Fatalf("block record %d bytes, BlockRecordLen %d", len(rec), BlockRecordLen(b.Size))
		}
		b2, err := ParseBlock(rec)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b2)
	}
	for _, e := range md.m.ext {
		rec := AppendExtent(nil, e)
		if len(rec) != ExtentRecordLen {
			t.Fatalf("extent record %d bytes", len(rec))
		}
		e2, err := ParseExtent(rec)
		if err != nil {
			t.Fatal(err)
		}
		es = append(es, e2)
	}
	md.r.Shuffle(len(es), func(i, j int) { es[i], es[j] = es[j], es[i] })
	m2, err := Load(md.m.ino, bs, es)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m2.ext, md.m.ext) {
		t.Fatal("reload changed the extents")
	}
	md.m = m2
}

func (md *model) String() string { return fmt.Sprint(md.m.ext) }
