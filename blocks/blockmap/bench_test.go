package blockmap

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/leasefs/leasefs/blocks"
)

func benchUnique(i uint64) Unique {
	var un Unique
	binary.LittleEndian.PutUint64(un[:], i+1)
	return un
}

// BenchmarkApplySequential writes a 1 GiB file in 1 MiB writes, each its
// own block, then writes it again (exact overwrites) and so on.
func BenchmarkApplySequential(b *testing.B) {
	const write, file = 1 << 20, 1 << 30
	sums := make(blocks.Sums, chunks(write))
	m := New(1)
	var i uint64
	for b.Loop() {
		un := benchUnique(i)
		off := i * write % file
		if _, err := m.Apply([]Block{{Unique: un, Size: write, Sums: sums}}, []Extent{{Off: off, Len: write, Block: un}}); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(len(m.ext)), "extents")
}

// BenchmarkApplyRandom4K overwrites a 64 MiB file, first written as 4 MiB
// blocks, at random 4 KiB-aligned offsets, each write its own block.
// "fresh" starts again from the 16 whole blocks every 16,384 writes (the
// map grows to about 13,000 extents, most writes split one), "steady"
// never does (16,384 extents, most writes replace one exactly).
func BenchmarkApplyRandom4K(b *testing.B) {
	const file, write = 64 << 20, 4096
	var i uint64
	whole := func() *Map {
		m := New(1)
		for off := uint64(0); off < file; off += blocks.MaxBlock {
			un := benchUnique(i)
			i++
			if _, err := m.Apply([]Block{{Unique: un, Size: blocks.MaxBlock, Sums: make(blocks.Sums, maxSums)}},
				[]Extent{{Off: off, Len: blocks.MaxBlock, Block: un}}); err != nil {
				b.Fatal(err)
			}
		}
		return m
	}
	for _, fresh := range []bool{true, false} {
		name := map[bool]string{true: "fresh", false: "steady"}[fresh]
		b.Run(name, func(b *testing.B) {
			m := whole()
			r := rand.New(rand.NewPCG(1, 2))
			sums := blocks.Sums{0}
			n, most := 0, 0
			for b.Loop() {
				if fresh && n == file/write {
					b.StopTimer()
					m, n = whole(), 0
					b.StartTimer()
				}
				un := benchUnique(i)
				i++
				n++
				off := r.Uint64N(file/write) * write
				if _, err := m.Apply([]Block{{Unique: un, Size: write, Sums: sums}}, []Extent{{Off: off, Len: write, Block: un}}); err != nil {
					b.Fatal(err)
				}
				most = max(most, len(m.ext))
			}
			b.ReportMetric(float64(most), "extents")
		})
	}
}

// BenchmarkCompact plans and applies compactions of a 64 MiB file made of
// 16,384 4 KiB extents, 4 MiB at a time (the rewrite's I/O not counted).
func BenchmarkCompact(b *testing.B) {
	const file, write = 64 << 20, 4096
	sums := blocks.Sums{0}
	var i uint64
	fragmented := func() *Map {
		m := New(1)
		for off := uint64(0); off < file; off += write {
			un := benchUnique(i)
			i++
			if _, err := m.Apply([]Block{{Unique: un, Size: write, Sums: sums}}, []Extent{{Off: off, Len: write, Block: un}}); err != nil {
				b.Fatal(err)
			}
		}
		return m
	}
	m := fragmented()
	bigSums := make(blocks.Sums, maxSums)
	for b.Loop() {
		p, ok := m.CompactPlan()
		if !ok {
			b.StopTimer()
			m = fragmented()
			b.StartTimer()
			continue
		}
		un := benchUnique(i)
		i++
		if _, err := m.Apply(p.Write(un, bigSums[:chunks(p.Size)])); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApplyRandomUnaligned4K overwrites a 64 MiB file at random byte
// offsets, 4 KiB a write: most writes split or trim two extents.
func BenchmarkApplyRandomUnaligned4K(b *testing.B) {
	const file, write = 64 << 20, 4096
	m := New(1)
	r := rand.New(rand.NewPCG(1, 2))
	sums := blocks.Sums{0}
	var i uint64
	for b.Loop() {
		un := benchUnique(i)
		i++
		off := r.Uint64N(file - write)
		if _, err := m.Apply([]Block{{Unique: un, Size: write, Sums: sums}}, []Extent{{Off: off, Len: write, Block: un}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(m.ext)), "extents")
}
