package blocks

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// The benchmarks move 4 MiB blocks; the Baseline ones move the same bytes
// with plain file calls (os.OpenFile, Write, Sync, Close; ReadAt on an open
// file), which is what the stores are measured against.

const benchBlock = MaxBlock

func BenchmarkFileStorePut(b *testing.B) {
	s, err := OpenFileStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	benchPut(b, s)
}

func BenchmarkFileStoreReadAt(b *testing.B) {
	s, err := OpenFileStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	benchReadAt(b, s, false)
}

func BenchmarkFileStoreReadVerified(b *testing.B) {
	s, err := OpenFileStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	benchReadAt(b, s, true)
}

func BenchmarkRemoteStorePut(b *testing.B) {
	bs := startServer(b)
	b.Run("http1", func(b *testing.B) { benchPut(b, bs.remote(b)) })
	b.Run("http2", func(b *testing.B) { benchPut(b, bs.remoteH2(b)) })
}

func BenchmarkRemoteStoreReadAt(b *testing.B) {
	bs := startServer(b)
	b.Run("http1", func(b *testing.B) { benchReadAt(b, bs.remote(b), false) })
	b.Run("http2", func(b *testing.B) { benchReadAt(b, bs.remoteH2(b), false) })
}

// The S3 benchmarks run against versitygw on the loopback, its posix
// backend on a temp directory; the CPU reported is this process's only.
func BenchmarkS3StorePut(b *testing.B) {
	s, _ := openS3(b, "")
	benchPut(b, s)
}

func BenchmarkS3StoreReadAt(b *testing.B) {
	s, _ := openS3(b, "")
	benchReadAt(b, s, false)
}

func benchPut(b *testing.B, s Store) {
	ctx := context.Background()
	data := randBytes(benchBlock, 1)
	b.SetBytes(benchBlock)
	defer reportCPU(b)()
	for b.Loop() {
		if err := s.Put(ctx, NewID(1), data); err != nil {
			b.Fatal(err)
		}
	}
}

// reportCPU reports the process's CPU time per operation (client and
// server alike, for the remote stores), which a loaded machine disturbs
// less than the wall-clock rate.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() { b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op") }
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchReadAt(b *testing.B, s Store, verified bool) {
	ctx := context.Background()
	const n = 8
	var blocks [n]ID
	data := randBytes(benchBlock, 1)
	sums := Sum(data)
	for i := range blocks {
		blocks[i] = NewID(1)
		if err := s.Put(ctx, blocks[i], data); err != nil {
			b.Fatal(err)
		}
	}
	p := make([]byte, benchBlock)
	b.SetBytes(benchBlock)
	defer reportCPU(b)()
	i := 0
	for b.Loop() {
		var err error
		if verified {
			_, err = ReadVerified(ctx, s, blocks[i%n], benchBlock, sums, p, 0)
		} else {
			_, err = s.ReadAt(ctx, blocks[i%n], p, 0)
		}
		if err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkBaselineWriteFile(b *testing.B) {
	dir := b.TempDir()
	data := randBytes(benchBlock, 1)
	b.SetBytes(benchBlock)
	defer reportCPU(b)()
	i := 0
	for b.Loop() {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprint(i)), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.Write(data); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		f.Close()
		i++
	}
}

func BenchmarkBaselineReadAt(b *testing.B) {
	dir := b.TempDir()
	data := randBytes(benchBlock, 1)
	var files [8]*os.File
	for i := range files {
		p := filepath.Join(dir, fmt.Sprint(i))
		if err := os.WriteFile(p, data, 0o600); err != nil {
			b.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		files[i] = f
	}
	p := make([]byte, benchBlock)
	b.SetBytes(benchBlock)
	defer reportCPU(b)()
	i := 0
	for b.Loop() {
		if _, err := files[i%len(files)].ReadAt(p, 0); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
