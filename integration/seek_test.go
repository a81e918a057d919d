package integration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// lseek's whence values for holes (not in package syscall).
const (
	seekData = 3
	seekHole = 4
)

// sparseLayout builds a file: writes of len bytes at off, then a size.
type sparseLayout struct {
	name   string
	writes [][2]int64 // off, len
	size   int64
}

var sparseLayouts = []sparseLayout{
	{name: "empty"},
	{name: "all-data", writes: [][2]int64{{0, 10000}}, size: 10000},
	{name: "hole-at-start", writes: [][2]int64{{64 << 10, 8 << 10}}, size: 72 << 10},
	{name: "hole-at-end", writes: [][2]int64{{0, 8 << 10}}, size: 1 << 20},
	{name: "holes-between", writes: [][2]int64{{0, 4096}, {64 << 10, 4096}, {1 << 20, 12 << 10}}, size: 2 << 20},
	{name: "past-4GiB", writes: [][2]int64{{4096, 4096}, {5 << 30, 8 << 10}}, size: 5<<30 + 1<<20},
	{name: "past-4GiB-to-end", writes: [][2]int64{{5 << 30, 8 << 10}}, size: 5<<30 + 8<<10},
}

// build writes l at path through f, left open (where the size is the end
// of the last write, its writes are still buffered on the mount).
func (l sparseLayout) build(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	must(t, err)
	for i, w := range l.writes {
		b := []byte(strings.Repeat(strconv.Itoa(i+1), int(w[1])))
		_, err := f.WriteAt(b, w[0])
		must(t, err)
	}
	// a truncation would send the buffered writes first
	if st, err := f.Stat(); err != nil || st.Size() != l.size {
		must(t, f.Truncate(l.size))
	}
	return f
}

// seekProbes are the offsets a layout is sought from: its edges and
// around them.
func (l sparseLayout) seekProbes() []int64 {
	ps := []int64{0, 1, 4095, 4096, l.size - 1, l.size, l.size + 1, l.size + 1<<20}
	for _, w := range l.writes {
		ps = append(ps, w[0]-1, w[0], w[0]+1, w[0]+w[1]-1, w[0]+w[1], w[0]+w[1]+1)
	}
	return ps
}

// seeks answers every probe of l in f, SEEK_DATA and SEEK_HOLE, as text:
// "whence@off=result" or "=ENXIO".
func seeks(t *testing.T, f *os.File, l sparseLayout) []string {
	t.Helper()
	var out []string
	for _, off := range l.seekProbes() {
		if off < 0 {
			continue
		}
		for _, whence := range []int{seekData, seekHole} {
			got, err := syscall.Seek(int(f.Fd()), off, whence)
			res := strconv.FormatInt(got, 10)
			if err != nil {
				res = err.(syscall.Errno).Error()
				if errors.Is(err, syscall.ENXIO) {
					res = "ENXIO"
				}
			}
			out = append(out, fmt.Sprintf("%d@%d=%s", whence, off, res))
		}
	}
	return out
}

func sameSeeks(t *testing.T, what string, got, want []string) {
	t.Helper()
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%s: lseek %s, want %s (tmpfs)", what, got[i], want[i])
		}
	}
}

// TestSeekHoles: SEEK_DATA and SEEK_HOLE on a mount answer as tmpfs does
// for the same file: on the mount that wrote it while its writes are
// still buffered there, and on another mount; of one server, and of a
// cluster (where the file's owner answers).
func TestSeekHoles(t *testing.T) { onServerAndCluster(t, testSeekHoles) }

func testSeekHoles(t *testing.T, a, b *mount) {
	ref := tmpfsDir(t, "seek")
	for _, l := range sparseLayouts {
		t.Run(l.name, func(t *testing.T) {
			rf := l.build(t, filepath.Join(ref, l.name))
			want := seeks(t, rf, l)
			rf.Close()
			os.Remove(rf.Name())

			f := l.build(t, filepath.Join(a.dir, l.name))
			defer f.Close()
			sameSeeks(t, "writing mount, writes buffered", seeks(t, f, l), want)
			g, err := os.Open(filepath.Join(b.dir, l.name))
			must(t, err)
			defer g.Close()
			sameSeeks(t, "other mount", seeks(t, g, l), want)
		})
	}
}
