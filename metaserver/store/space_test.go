package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// fakeDisk stands for a data directory's file system whose free space
// the test sets (Options.Statfs).
type fakeDisk struct {
	mu           sync.Mutex
	avail, total int64
}

func (d *fakeDisk) statfs(string) (int64, int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.avail, d.total, nil
}

func (d *fakeDisk) set(avail int64) {
	d.mu.Lock()
	d.avail = avail
	d.mu.Unlock()
}

// floorOf and limitOf read a guard's floor and growth limit.
func floorOf(g *spaceGuard) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.floor()
}

func limitOf(g *spaceGuard) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.limitLocked()
}

// TestSpaceAdmission: on a full file system a change that adds data fails
// with CodeNoSpace and writes nothing, a removal still goes through (down
// to the floor, giving up the reserve file for it), statfs reports the
// space less the reserve, and the reserve file is taken again once the
// space is there.
func TestSpaceAdmission(t *testing.T) {
	disk := &fakeDisk{avail: 64 << 20, total: 64 << 20}
	dir := t.TempDir()
	s := openTestStore(t, dir, Options{Statfs: disk.statfs})
	defer s.Close()
	g := s.space
	if g.sizes != (badgerSizes{vlogFile: 8 << 20, room: 6 << 20, walAhead: 4 << 20}) {
		t.Fatalf("sizes on 64 MiB: %+v", g.sizes)
	}
	reserve := filepath.Join(dir, reserveFile)
	g.keepReserve()
	if g.held < g.room || allocatedBytes(reserve) < g.room {
		t.Fatalf("reserve file holds %d (%d on disk), want %d", g.held, allocatedBytes(reserve), g.room)
	}
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	g2 := must[Attr](t)(s.Create(ids.RootIno, "g", reg|0o644, 0, 0, 0, 1))
	data := make([]byte, 1<<20)
	must[Attr](t)(s.Write(f.Ino, 0, data, 2))
	st := must[StatFs](t)(s.StatFs())
	if want := (disk.avail - limitOf(g)) / 4096; int64(st.Bavail) != want || st.Blocks != 64<<20/4096 {
		t.Fatalf("statfs: %d of %d blocks free, want %d (the reserve is %d)", st.Bavail, st.Blocks, want, limitOf(g))
	}

	// Full: with the reserve file held, changes may go down to the floor;
	// less is left above it than a MiB of data or a new name takes.
	disk.set(floorOf(g) + 4<<10)
	_, err := s.Write(f.Ino, 1<<20, data, 3)
	wantCode(t, err, wire.CodeNoSpace)
	_, err = s.Create(ids.RootIno, "h", reg|0o644, 0, 0, 0, 3)
	wantCode(t, err, wire.CodeNoSpace)
	_, err = s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 3)
	wantCode(t, err, wire.CodeNoSpace)
	wantCode(t, s.SetXattr(f.Ino, "user.a", make([]byte, 2000), 0, 3), wire.CodeNoSpace)
	if a := must[Attr](t)(s.GetAttr(f.Ino)); a.Size != 1<<20 {
		t.Fatalf("a refused write changed the size to %d", a.Size)
	}
	if _, err := s.Lookup(ids.RootIno, "h"); wire.CodeOf(err) != wire.CodeNotFound {
		t.Fatalf("a refused create made the name: %v", err)
	}
	if st := must[StatFs](t)(s.StatFs()); st.Bavail > 1 {
		t.Fatalf("a full file system reports %d blocks free", st.Bavail)
	}
	// what is there reads back
	if got := must[[]byte](t)(s.Read(f.Ino, 0, 1<<20)); len(got) != 1<<20 {
		t.Fatalf("read %d bytes", len(got))
	}
	// a removal that fits above the floor leaves the reserve file
	disk.set(floorOf(g) + 64<<10)
	_, _, err = s.Unlink(ids.RootIno, "f", 4, func(ids.Ino) bool { return true })
	wantCode(t, err, wire.CodeOK)
	if g.held == 0 {
		t.Fatal("a removal above the floor gave the reserve file up")
	}

	// Below the floor: a removal takes the reserve file's space.
	disk.set(floorOf(g) - 1)
	_, _, err = s.Unlink(ids.RootIno, "g", 5, func(ids.Ino) bool { return true })
	wantCode(t, err, wire.CodeOK)
	if g.held != 0 || allocatedBytes(reserve) != 0 {
		t.Fatalf("a removal below the floor left the reserve file (%d bytes)", g.held)
	}
	g.keepReserve()
	if g.held != 0 {
		t.Fatal("the reserve file was taken again without the space for it")
	}
	// nothing left to give: a removal fails too, and changes nothing
	d := must[Attr](t)(func() (Attr, error) {
		disk.set(64 << 20)
		return s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 6)
	}())
	disk.set(floorOf(g) - 1)
	err = s.Rmdir(ids.RootIno, "d", 7)
	wantCode(t, err, wire.CodeNoSpace)
	if a := must[Attr](t)(s.GetAttr(d.Ino)); a.Nlink != 2 {
		t.Fatalf("a refused rmdir changed the directory: %+v", a)
	}
	_ = g2

	// the space back: the reserve file is taken again
	disk.set(64 << 20)
	g.keepReserve()
	if g.held < g.room {
		t.Fatalf("the reserve file holds %d with the space back, want %d", g.held, g.room)
	}
	// filled from outside into the floor: badger's own writes get the
	// reserve file's space
	disk.set(floorOf(g) - 1)
	g.keepReserve()
	if g.held != 0 {
		t.Fatal("the reserve file kept with the floor taken from outside")
	}
}

// TestSpaceStart: a store opens on a full file system by giving up its
// reserve file; without one (or with too little) it refuses to open with
// ErrNoSpace instead of letting badger die of SIGBUS.
func TestSpaceStart(t *testing.T) {
	disk := &fakeDisk{avail: 64 << 20, total: 64 << 20}
	dir := t.TempDir()
	s := openTestStore(t, dir, Options{Statfs: disk.statfs})
	s.space.keepReserve()
	if s.space.held == 0 {
		t.Fatal("no reserve file")
	}
	must[any](t)(nil, s.Close())

	disk.set(0)
	s = openTestStore(t, dir, Options{Statfs: disk.statfs})
	if s.space.held != 0 || allocatedBytes(filepath.Join(dir, reserveFile)) != 0 {
		t.Fatal("opened on a full file system without giving up the reserve file")
	}
	must[any](t)(nil, s.Close())

	_, err := Open(dir, Options{ServerID: 1, Logger: quiet, Statfs: disk.statfs})
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("opened on a full file system without a reserve: %v, want ErrNoSpace", err)
	}
	// and it left the directory usable
	disk.set(64 << 20)
	s = openTestStore(t, dir, Options{Statfs: disk.statfs})
	must[any](t)(nil, s.Close())
}

// TestSpaceSizes: value log files, the removals' room and the write-ahead
// log allocated ahead fit the file system, up to the sizes a large one
// gets.
func TestSpaceSizes(t *testing.T) {
	for _, c := range []struct {
		total int64
		want  badgerSizes
	}{
		{32 << 20, badgerSizes{vlogFile: 8 << 20, room: 6 << 20, walAhead: 4 << 20}},
		{96 << 20, badgerSizes{vlogFile: 12 << 20, room: 8 << 20, walAhead: 6 << 20}},
		{1 << 30, badgerSizes{vlogFile: 128 << 20, room: 18 << 20, walAhead: 19 << 20}},
		{1 << 40, badgerSizes{vlogFile: valueLogFileSize, room: 18 << 20, walAhead: 19 << 20}},
	} {
		if got := sizesFor(c.total); got != c.want {
			t.Errorf("%d MiB: %+v, want %+v", c.total>>20, got, c.want)
		}
	}
}

// TestSpacePreallocatedWAL: badger's next write-ahead log is made ahead,
// its blocks allocated, and badger takes it as its own when its memtable
// fills; one made ahead and never taken does not stop the store opening
// again (badger refuses an empty log).
func TestSpacePreallocatedWAL(t *testing.T) {
	disk := &fakeDisk{avail: 64 << 20, total: 64 << 20}
	dir := t.TempDir()
	s := openTestStore(t, dir, Options{Statfs: disk.statfs})
	next := func() (string, int64) {
		t.Helper()
		names, _ := filepath.Glob(filepath.Join(dir, "db", "*.mem"))
		for _, n := range names {
			var st syscall.Stat_t
			if syscall.Stat(n, &st) == nil && st.Size == 0 {
				return filepath.Base(n), st.Blocks * 512
			}
		}
		return "", 0
	}
	name, held := next()
	if name == "" || held < s.space.sizes.walAhead {
		t.Fatalf("next write-ahead log %q holds %d bytes, want %d or more", name, held, s.space.sizes.walAhead)
	}
	must[any](t)(nil, s.Close())
	s = openTestStore(t, dir, Options{Statfs: disk.statfs})
	defer s.Close()
	name, _ = next()
	// fill the memtable (values under the value log's threshold stay in it)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	val := bytes.Repeat([]byte{7}, 1000)
	for i := 0; ; i++ {
		if taken, _ := next(); taken != name {
			break
		}
		if i == 60000 {
			t.Fatalf("badger never took %s", name)
		}
		wantCode(t, s.SetXattr(f.Ino, "user.x"+strconv.Itoa(i%64), val, 0, int64(i+2)), wire.CodeOK)
		if i%256 == 0 {
			// as the store's loop does every second
			s.space.measure(0)
			s.space.prepareWAL()
		}
	}
	var st syscall.Stat_t
	must[any](t)(nil, syscall.Stat(filepath.Join(dir, "db", name), &st))
	if st.Size == 0 {
		t.Fatalf("%s was deleted, not taken", name)
	}
	// what was written to it counts, not what was allocated ahead
	s.space.measure(0)
	if w := s.space.walByLog[name]; w >= 1<<20 {
		t.Fatalf("%s counts as %d bytes written just after badger took it", name, w)
	}
	s.space.prepareWAL()
	if n, _ := next(); n == "" || n == name {
		t.Fatalf("no log made ahead after badger took %s (%q)", name, n)
	}
	if v := must[[]byte](t)(s.GetXattr(f.Ino, "user.x5")); !bytes.Equal(v, val) {
		t.Fatal("xattr reads back different")
	}
}

// TestWrittenBytes: a write-ahead log left by a killed server counts as
// what was written of it, not its blocks allocated ahead.
func TestWrittenBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "00007.mem")
	f, err := os.Create(path)
	must[any](t)(nil, err)
	must[any](t)(nil, syscall.Fallocate(int(f.Fd()), fallocKeepSize, 0, 6<<20))
	must[any](t)(nil, f.Truncate(8<<20))
	_, err = f.WriteAt(bytes.Repeat([]byte{1}, 300_001), 20)
	must[any](t)(nil, err)
	f.Close()
	var st syscall.Stat_t
	must[any](t)(nil, syscall.Stat(path, &st))
	if w := writtenBytes(path, st.Blocks*512); w != 300_021 {
		t.Fatalf("%d bytes written, %d allocated: counted %d", 300_021, st.Blocks*512, w)
	}
}

// TestAdmitOutside: bytes another writer puts on the data directory's
// file system are admitted while they leave the reserve free, and count
// as pending until released; past the reserve they are refused with
// CodeNoSpace.
func TestAdmitOutside(t *testing.T) {
	disk := &fakeDisk{avail: 64 << 20, total: 64 << 20}
	s := openTestStore(t, t.TempDir(), Options{Statfs: disk.statfs})
	defer s.Close()
	g := s.space
	limit := limitOf(g)
	disk.set(limit + 1<<20)
	release, err := s.AdmitOutside(1 << 19)
	if err != nil {
		t.Fatalf("half a MiB above the reserve: %v", err)
	}
	// the first half is pending: another half MiB and a byte do not fit
	if _, err := s.AdmitOutside(1<<19 + 1); !errors.Is(err, wire.Err(wire.CodeNoSpace)) {
		t.Fatalf("past the reserve with the first pending: %v, want CodeNoSpace", err)
	}
	release()
	disk.set(limit + 1<<20 - 1<<19) // the first half written
	if _, err := s.AdmitOutside(1<<19 + 1); !errors.Is(err, wire.Err(wire.CodeNoSpace)) {
		t.Fatalf("past the reserve: %v, want CodeNoSpace", err)
	}
	release, err = s.AdmitOutside(1 << 19)
	if err != nil {
		t.Fatalf("up to the reserve: %v", err)
	}
	release()
}
