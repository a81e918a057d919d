package integration

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestBlockCompaction: a file of 100 KB appended 500 times a line, each
// append opening, writing and closing it as `echo line >> log` does, and a
// 1 MiB file written 300 times 4 KiB at random with an fsync after each,
// read back exactly from another mount, and once the garbage delay has
// passed the block directory holds few blocks, where each write used to
// leave one: the server compacts a file's blocks after each commit.
func TestBlockCompaction(t *testing.T) {
	s := startServer(t)
	a := startMount(t, s)
	blocksDir := filepath.Join(s.dir, "blocks")
	logPath, randPath := filepath.Join(a.dir, "log"), filepath.Join(a.dir, "rand")

	logWant := randomBytes(100_000)
	must(t, os.WriteFile(logPath, logWant, 0o644))
	start := time.Now()
	for i := range 500 {
		line := fmt.Appendf(nil, "line %d of the log\n", i)
		f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND, 0)
		must(t, err)
		_, err = f.Write(line)
		must(t, err)
		must(t, f.Close())
		logWant = append(logWant, line...)
	}
	t.Logf("500 appends in %v", time.Since(start).Round(time.Millisecond))

	const size, page = 1 << 20, 4096
	randWant := randomBytes(size)
	f, err := os.Create(randPath)
	must(t, err)
	t.Cleanup(func() { f.Close() })
	_, err = f.Write(randWant)
	must(t, err)
	must(t, f.Sync())
	r := rand.New(rand.NewPCG(28, 1))
	start = time.Now()
	for range 300 {
		off := r.IntN(size/page) * page
		data := randomBytes(page)
		_, err := f.WriteAt(data, int64(off))
		must(t, err)
		must(t, f.Sync())
		copy(randWant[off:], data)
	}
	must(t, f.Close())
	t.Logf("300 random 4 KiB writes with fsync in %v; %d block files now", time.Since(start).Round(time.Millisecond),
		len(blockFiles(t, blocksDir)))

	b := startMount(t, s)
	wantSame(t, filepath.Join(b.dir, "log"), logWant)
	wantSame(t, filepath.Join(b.dir, "rand"), randWant)

	// The log keeps at most 27 blocks (blockmap's TestCompactAppends),
	// the random file at most 70 (TestCompactRandomOverwrites); 802 writes
	// made a block each.
	const most = 27 + 70
	written := len(blockFiles(t, blocksDir))
	start = time.Now()
	waitFor(t, 90*time.Second, fmt.Sprintf("at most %d block files", most), func() bool {
		return len(blockFiles(t, blocksDir)) <= most
	})
	// the collector's next rounds delete what is left of the garbage
	time.Sleep(20 * time.Second)
	n := len(blockFiles(t, blocksDir))
	t.Logf("block files: %d after the writes (garbage not due yet), %d %v later", written, n, time.Since(start).Round(time.Second))
	if n > most {
		t.Errorf("%d block files, want at most %d", n, most)
	}
	wantSame(t, filepath.Join(b.dir, "log"), logWant)
	wantSame(t, filepath.Join(b.dir, "rand"), randWant)
}
