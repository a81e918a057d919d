package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// fallocate's mode bits (linux/falloc.h).
const (
	fallocKeepSize  = 0x01
	fallocPunchHole = 0x02
	fallocZeroRange = 0x10
)

// punchStep is one fallocate of a file: PUNCH_HOLE|KEEP_SIZE, or
// ZERO_RANGE (zero, with grow unless keep).
type punchStep struct {
	zero, keep bool
	off, len   int64
}

// apply does s on f; onTmpfs does a ZERO_RANGE as tmpfs can (it has
// none): a punched hole, then a truncation up to the range's end.
func (s punchStep) apply(t *testing.T, f *os.File, onTmpfs bool) {
	t.Helper()
	mode := uint32(fallocPunchHole | fallocKeepSize)
	if s.zero && !onTmpfs {
		mode = fallocZeroRange
		if s.keep {
			mode |= fallocKeepSize
		}
	}
	if err := syscall.Fallocate(int(f.Fd()), mode, s.off, s.len); err != nil {
		t.Fatalf("fallocate %#x of %d at %d: %v", mode, s.len, s.off, err)
	}
	if s.zero && onTmpfs && !s.keep {
		st, err := f.Stat()
		must(t, err)
		if end := s.off + s.len; end > st.Size() {
			must(t, f.Truncate(end))
		}
	}
}

const pg = 4096

// punchSteps leave data and holes of whole pages, as tmpfs keeps them: a
// partly zeroed page stays data.
var punchSteps = []punchStep{
	{off: pg + 100, len: 200},                  // inside a page
	{off: 2*pg + 10, len: 3 * pg},              // across pages: 3 and 4 become a hole
	{off: 7 * pg, len: pg},                     // a whole page
	{off: 8*pg + 100, len: 20 * pg},            // past the end: 9 becomes a hole
	{zero: true, off: 10*pg - 50, len: 2 * pg}, // grows to 12 pages
	{zero: true, keep: true, off: 11 * pg, len: 5 * pg},
}

// TestPunch: fallocate's PUNCH_HOLE and ZERO_RANGE zero ranges of a file
// whose writes are still buffered on the mount: the bytes, the size and
// SEEK_DATA/SEEK_HOLE agree with tmpfs's, on that mount and on another;
// a mount that read the file reads the zeros of a later punch on another;
// PUNCH_HOLE without KEEP_SIZE fails as on Linux.
func TestPunch(t *testing.T) { onServerAndCluster(t, testPunch) }

func testPunch(t *testing.T, a, b *mount) {
	ref := tmpfsDir(t, "punch")
	l := sparseLayout{name: "punched", writes: [][2]int64{{0, 10 * pg}}, size: 10 * pg}
	for _, s := range punchSteps {
		l.writes = append(l.writes, [2]int64{s.off, s.len}) // their edges are the probes
	}
	build := func(path string, onTmpfs bool) *os.File {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		must(t, err)
		_, err = f.WriteAt(bytes.Repeat([]byte("x"), 10*pg), 0)
		must(t, err)
		for _, s := range punchSteps {
			s.apply(t, f, onTmpfs)
		}
		return f
	}
	rf := build(filepath.Join(ref, "f"), true)
	want, err := os.ReadFile(rf.Name())
	must(t, err)
	l.size = int64(len(want))
	wantSeeks := seeks(t, rf, l)
	rf.Close()

	f := build(filepath.Join(a.dir, "f"), false)
	defer f.Close()
	for _, m := range []*mount{a, b} {
		got, err := os.ReadFile(filepath.Join(m.dir, "f"))
		must(t, err)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: read %d bytes that differ from tmpfs's %d", m.dir, len(got), len(want))
		}
		g, err := os.Open(filepath.Join(m.dir, "f"))
		must(t, err)
		sameSeeks(t, m.dir, seeks(t, g, l), wantSeeks)
		g.Close()
	}
	// both mounts have read the file: their cached pages must not outlive
	// a punch
	must(t, syscall.Fallocate(int(f.Fd()), fallocPunchHole|fallocKeepSize, 0, pg))
	clear(want[:pg])
	for _, m := range []*mount{a, b} {
		if got, err := os.ReadFile(filepath.Join(m.dir, "f")); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s after another punch: %d bytes, %v; differ from what is expected", m.dir, len(got), err)
		}
	}
	if err := syscall.Fallocate(int(f.Fd()), fallocPunchHole, 0, pg); err != syscall.EOPNOTSUPP {
		t.Errorf("PUNCH_HOLE without KEEP_SIZE: %v; want EOPNOTSUPP", err)
	}
}
