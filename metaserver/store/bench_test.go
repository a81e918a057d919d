package store

import (
	"fmt"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
)

// Run: go test ./metaserver -run '^$' -bench Store -benchmem
//
// The lsm variants keep chunks in the LSM tree (ValueThreshold 1 MiB) instead
// of the value log (the default, 1 KiB), to compare.

func benchStore(b *testing.B, vt int64) *Store {
	s := openTestStore(b, b.TempDir(), Options{valueThreshold: vt})
	b.Cleanup(func() { s.Close() })
	return s
}

var variants = []struct {
	name string
	vt   int64
}{{"vlog", 0}, {"lsm", 1 << 20}}

// BenchmarkStoreWrite64K writes 64 KiB sequentially (whole chunks), a new
// file every 64 MiB.
func BenchmarkStoreWrite64K(b *testing.B) {
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			s := benchStore(b, v.vt)
			data := make([]byte, PageSize)
			for i := range data {
				data[i] = byte(i*7 + i>>8)
			}
			var f Attr
			b.SetBytes(PageSize)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if i%1024 == 0 {
					var err error
					if f, err = s.Create(ids.RootIno, fmt.Sprint("f", i), reg|0o644, 0, 0, 0, 1); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := s.Write(f.Ino, uint64(i%1024)*PageSize, data, 2); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if err := s.Sync(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkStoreWrite1M writes 1 MiB (16 chunks) per call, as a FUSE mount
// with big writes sends them.
func BenchmarkStoreWrite1M(b *testing.B) {
	s := benchStore(b, 0)
	data := make([]byte, 1<<20)
	var f Attr
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%64 == 0 {
			f = must[Attr](b)(s.Create(ids.RootIno, fmt.Sprint("f", i), reg|0o644, 0, 0, 0, 1))
		}
		if _, err := s.Write(f.Ino, uint64(i%64)<<20, data, 2); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStoreWrite4K appends 4 KiB at a time: the partial-chunk
// read-modify-write path.
func BenchmarkStoreWrite4K(b *testing.B) {
	s := benchStore(b, 0)
	data := make([]byte, 4096)
	var f Attr
	b.SetBytes(4096)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%16384 == 0 {
			f = must[Attr](b)(s.Create(ids.RootIno, fmt.Sprint("f", i), reg|0o644, 0, 0, 0, 1))
		}
		if _, err := s.Write(f.Ino, uint64(i%16384)*4096, data, 2); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStoreRead64K reads a 64 MiB file sequentially in 64 KiB reads.
func BenchmarkStoreRead64K(b *testing.B) {
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			s := benchStore(b, v.vt)
			f := must[Attr](b)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
			data := make([]byte, 1<<20)
			for i := range data {
				data[i] = byte(i)
			}
			for off := uint64(0); off < 64<<20; off += 1 << 20 {
				must[Attr](b)(s.Write(f.Ino, off, data, 1))
			}
			b.SetBytes(PageSize)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				got, err := s.Read(f.Ino, uint64(i%1024)*PageSize, PageSize)
				if err != nil || len(got) != PageSize {
					b.Fatal(err, len(got))
				}
			}
		})
	}
}

// BenchmarkStoreReadAt64K is BenchmarkStoreRead64K into a reused buffer.
func BenchmarkStoreReadAt64K(b *testing.B) {
	s := benchStore(b, 0)
	f := must[Attr](b)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	data := make([]byte, 1<<20)
	for off := uint64(0); off < 64<<20; off += 1 << 20 {
		must[Attr](b)(s.Write(f.Ino, off, data, 1))
	}
	buf := make([]byte, PageSize)
	b.SetBytes(PageSize)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if n, err := s.ReadAt(f.Ino, uint64(i%1024)*PageSize, buf); err != nil || n != PageSize {
			b.Fatal(err, n)
		}
	}
}

// BenchmarkStoreCreate creates empty files, 10,000 per directory.
func BenchmarkStoreCreate(b *testing.B) {
	s := benchStore(b, 0)
	var d Attr
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%10000 == 0 {
			d = must[Attr](b)(s.Mkdir(ids.RootIno, fmt.Sprint("d", i), 0o755, 0, 0, 1))
		}
		if _, err := s.Create(d.Ino, fmt.Sprint("file-", i), reg|0o644, 0, 0, 0, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStoreLookup looks up names in a directory of 10,000.
func BenchmarkStoreLookup(b *testing.B) {
	s := benchStore(b, 0)
	d := must[Attr](b)(s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 1))
	names := make([]string, 10000)
	for i := range names {
		names[i] = fmt.Sprint("file-", i)
		must[Attr](b)(s.Create(d.Ino, names[i], reg|0o644, 0, 0, 0, 1))
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := s.Lookup(d.Ino, names[i%len(names)]); err != nil {
			b.Fatal(err)
		}
	}
}
