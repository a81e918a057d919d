package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/testnet"
)

// two mounts of one server, as two client machines would have.
func twoMounts(t *testing.T) (a, b *mount) {
	s := startServer(t)
	return startMount(t, s), startMount(t, s)
}

// onServerAndCluster runs fn with two mounts of one server, and with two
// mounts of a 3-server cluster that start at different servers (so that
// their requests meet through redirects and hand-overs).
func onServerAndCluster(t *testing.T, fn func(t *testing.T, a, b *mount)) {
	onServerAndClusterWith(t, nil, fn)
}

// onServerAndClusterWith is onServerAndCluster with mounts given extra
// flags.
func onServerAndClusterWith(t *testing.T, mountArgs []string, fn func(t *testing.T, a, b *mount)) {
	t.Run("server", func(t *testing.T) {
		s := startServer(t)
		fn(t, startMount(t, s, mountArgs...), startMount(t, s, mountArgs...))
	})
	t.Run("cluster", func(t *testing.T) {
		c := startCluster(t, 3, clusterTimings()...)
		fn(t, c.mount(t, []int{0, 1, 2}, mountArgs...), c.mount(t, []int{1, 2, 0}, mountArgs...))
	})
}

// TestCoherentData: a read on B returns every byte of each write that
// returned on A, without fsync or close on A; stat agrees on size and mtime.
func TestCoherentData(t *testing.T) { onServerAndCluster(t, testCoherentData) }

func testCoherentData(t *testing.T, a, b *mount) {
	fa, err := os.Create(filepath.Join(a.dir, "f"))
	must(t, err)
	defer fa.Close()
	// B reads first so that it holds a lock and caches the file.
	if data, err := os.ReadFile(filepath.Join(b.dir, "f")); err != nil || len(data) != 0 {
		t.Fatalf("empty file on B: %q %v", data, err)
	}
	var want []byte
	for i := 0; i < 50; i++ {
		line := []byte(fmt.Sprintf("line %d\n", i))
		_, err := fa.Write(line)
		must(t, err)
		want = append(want, line...)
		got, err := os.ReadFile(filepath.Join(b.dir, "f"))
		must(t, err)
		if !bytes.Equal(got, want) {
			t.Fatalf("after write %d B reads %q, want %q", i, got, want)
		}
		sa, err := fa.Stat()
		must(t, err)
		sb, err := os.Stat(filepath.Join(b.dir, "f"))
		must(t, err)
		if sb.Size() != int64(len(want)) || !sb.ModTime().Equal(sa.ModTime()) {
			t.Fatalf("after write %d: B stat size %d mtime %v; A size %d mtime %v",
				i, sb.Size(), sb.ModTime(), sa.Size(), sa.ModTime())
		}
	}
	// A file B keeps open sees A's later writes too (its page cache is
	// dropped when A's write revokes B's lock).
	fb, err := os.Open(filepath.Join(b.dir, "f"))
	must(t, err)
	defer fb.Close()
	buf := make([]byte, 4096)
	n, _ := fb.ReadAt(buf, 0)
	if n != len(want) {
		t.Fatalf("B's open file reads %d bytes, want %d", n, len(want))
	}
	_, err = fa.WriteAt([]byte("CHANGED"), 0)
	must(t, err)
	n, _ = fb.ReadAt(buf, 0)
	if !bytes.HasPrefix(buf[:n], []byte("CHANGED")) {
		t.Fatalf("B's open file still reads %q after A overwrote it", buf[:7])
	}
}

// TestCoherentNamespace: creates, renames and removes on A are seen at
// once by lookup, stat and ls on B.
func TestCoherentNamespace(t *testing.T) { onServerAndCluster(t, testCoherentNamespace) }

func testCoherentNamespace(t *testing.T, a, b *mount) {
	ls := func() []string {
		ents, err := os.ReadDir(b.dir)
		must(t, err)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		return names
	}
	if _, err := os.Stat(filepath.Join(b.dir, "x")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err) // B caches the negative entry now
	}
	must(t, os.WriteFile(filepath.Join(a.dir, "x"), []byte("1"), 0o644))
	if _, err := os.Stat(filepath.Join(b.dir, "x")); err != nil {
		t.Fatalf("B does not see A's new file: %v", err)
	}
	if got := ls(); strings.Join(got, ",") != "x" {
		t.Fatalf("ls on B: %v", got)
	}
	must(t, os.Rename(filepath.Join(a.dir, "x"), filepath.Join(a.dir, "y")))
	if _, err := os.Stat(filepath.Join(b.dir, "x")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("B still sees the old name: %v", err)
	}
	if got := ls(); strings.Join(got, ",") != "y" {
		t.Fatalf("ls on B after rename: %v", got)
	}
	must(t, os.Mkdir(filepath.Join(a.dir, "d"), 0o755))
	must(t, os.Rename(filepath.Join(a.dir, "y"), filepath.Join(a.dir, "d", "z")))
	if data, err := os.ReadFile(filepath.Join(b.dir, "d", "z")); err != nil || string(data) != "1" {
		t.Fatalf("B reads moved file: %q %v", data, err)
	}
	must(t, os.Remove(filepath.Join(a.dir, "d", "z")))
	if _, err := os.Stat(filepath.Join(b.dir, "d", "z")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("B still sees the removed file: %v", err)
	}
	must(t, os.Chmod(filepath.Join(a.dir, "d"), 0o700))
	if st, err := os.Stat(filepath.Join(b.dir, "d")); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("B sees mode %v, %v", st.Mode(), err)
	}
}

// TestConcurrentAppend: two clients appending at once lose no record and
// never interleave within one write.
func TestConcurrentAppend(t *testing.T) { onServerAndCluster(t, testConcurrentAppend) }

func testConcurrentAppend(t *testing.T, a, b *mount) {
	const records = 200
	var wg sync.WaitGroup
	for i, m := range []*mount{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.OpenFile(filepath.Join(m.dir, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			for r := 0; r < records; r++ {
				rec := fmt.Sprintf("client %d record %03d %s\n", i, r, strings.Repeat("x", 100))
				if _, err := f.WriteString(rec); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	data, err := os.ReadFile(filepath.Join(a.dir, "log"))
	must(t, err)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != 2*records {
		t.Fatalf("%d records, want %d", len(lines), 2*records)
	}
	seen := map[string]bool{}
	for _, l := range lines {
		var c, r int
		var pad string
		if n, _ := fmt.Sscanf(l, "client %d record %d %s", &c, &r, &pad); n != 3 || len(pad) != 100 {
			t.Fatalf("interleaved or torn record %q", l)
		}
		seen[l] = true
	}
	if len(seen) != 2*records {
		t.Fatalf("%d distinct records, want %d", len(seen), 2*records)
	}
}

// TestFlockAcrossClients: flock -x on A blocks flock -x on B until A
// releases.
func TestFlockAcrossClients(t *testing.T) {
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("no flock(1)")
	}
	onServerAndCluster(t, testFlockAcrossClients)
}

func testFlockAcrossClients(t *testing.T, a, b *mount) {
	must(t, os.WriteFile(filepath.Join(a.dir, "lock"), nil, 0o644))
	holder := exec.Command("flock", "-x", filepath.Join(a.dir, "lock"), "sleep", "1.5")
	must(t, holder.Start())
	time.Sleep(300 * time.Millisecond) // let A take the lock
	if out, err := exec.Command("flock", "-xn", filepath.Join(b.dir, "lock"), "true").CombinedOutput(); err == nil {
		t.Fatalf("B took the lock A holds: %s", out)
	}
	start := time.Now()
	out, err := exec.Command("flock", "-x", filepath.Join(b.dir, "lock"), "true").CombinedOutput()
	if err != nil {
		t.Fatalf("B's blocking flock: %v %s", err, out)
	}
	waited := time.Since(start)
	must(t, holder.Wait())
	if waited < 800*time.Millisecond {
		t.Fatalf("B got the lock after %v, while A held it for 1.5s", waited)
	}
	// fcntl byte-range locks conflict across clients too.
	fa, err := os.OpenFile(filepath.Join(a.dir, "lock"), os.O_RDWR, 0)
	must(t, err)
	defer fa.Close()
	fb, err := os.OpenFile(filepath.Join(b.dir, "lock"), os.O_RDWR, 0)
	must(t, err)
	defer fb.Close()
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0, Start: 10, Len: 10}
	must(t, syscall.FcntlFlock(fa.Fd(), syscall.F_SETLK, &lk))
	lkb := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0, Start: 15, Len: 1}
	if err := syscall.FcntlFlock(fb.Fd(), syscall.F_SETLK, &lkb); !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EACCES) {
		t.Fatalf("overlapping fcntl lock on B: %v, want EAGAIN", err)
	}
	lkb.Start = 20 // no overlap
	must(t, syscall.FcntlFlock(fb.Fd(), syscall.F_SETLK, &lkb))
	fa.Close() // closing releases A's locks (the kernel's RELEASE is asynchronous)
	lkb.Start = 15
	waitFor(t, 3*time.Second, "A's close to release its lock", func() bool {
		return syscall.FcntlFlock(fb.Fd(), syscall.F_SETLK, &lkb) == nil
	})
}

type clientStatus struct {
	Requests   int64 `json:"requests"`
	Hits       int64 `json:"cache_hits"`
	DataLost   int64 `json:"data_lost"`
	ReclaimsOK int64 `json:"reclaims_ok"`
	Prefetches int64 `json:"prefetches"`
}

func mountStatus(t *testing.T, dir string) clientStatus {
	t.Helper()
	buf := make([]byte, 1<<16)
	n, err := syscall.Getxattr(dir, "user.leasefs.status", buf)
	must(t, err)
	var st clientStatus
	must(t, json.Unmarshal(buf[:n], &st))
	return st
}

// TestCachedOpsNoRoundTrip: a client working alone on its files serves
// cached stats and lookups without asking the server. (File data is not
// cached yet: every handle is direct_io, see fs.Node.Open.)
func TestCachedOpsNoRoundTrip(t *testing.T) {
	s := startServer(t)
	m := startMount(t, s)
	must(t, os.MkdirAll(filepath.Join(m.dir, "a/b"), 0o755))
	path := filepath.Join(m.dir, "a/b/f")
	must(t, os.WriteFile(path, bytes.Repeat([]byte("z"), 100_000), 0o644))
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	buf := make([]byte, 100_000)
	_, err = f.ReadAt(buf, 0) // warm: locks and caches
	must(t, err)
	_, err = os.Stat(path)
	must(t, err)
	before := mountStatus(t, m.dir)
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(path); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(filepath.Join(m.dir, "a/b/nonexistent")); !errors.Is(err, os.ErrNotExist) && i > 0 {
			t.Fatal(err)
		}
	}
	after := mountStatus(t, m.dir)
	// The first negative lookup may ask the server; nothing else may.
	if extra := after.Requests - before.Requests; extra > 2 {
		t.Fatalf("%d server requests for 200 cached stats and lookups", extra)
	}
	if after.Hits <= before.Hits {
		t.Fatalf("no cache hits recorded: %+v -> %+v", before, after)
	}
}

// TestCreateRoundTrips: creating and removing files in a directory this
// mount holds costs one server request per create and one per unlink: the
// replies carry the directory's new attributes, so the kernel's lookups of
// the directory between them are answered from the cache, and the create's
// reply grants the new file's lock, under which the mount counts the open
// itself (the close asks nothing either).
func TestCreateRoundTrips(t *testing.T) {
	s := startServer(t)
	m := startMount(t, s)
	dir := filepath.Join(m.dir, "d")
	must(t, os.Mkdir(dir, 0o755))
	_, err := os.Stat(dir)
	must(t, err)
	const n = 100
	before := mountStatus(t, m.dir)
	for i := range n {
		must(t, os.WriteFile(filepath.Join(dir, fmt.Sprint("f", i)), nil, 0o644))
	}
	created := mountStatus(t, m.dir)
	for i := range n {
		must(t, os.Remove(filepath.Join(dir, fmt.Sprint("f", i))))
	}
	syncDir(t, dir) // the removals went behind the calls: all at the server now
	removed := mountStatus(t, m.dir)
	if got := created.Requests - before.Requests; got > n+2 {
		t.Errorf("%d server requests for %d creates (want at most one each)", got, n)
	}
	if got := removed.Requests - created.Requests; got > n+2 {
		t.Errorf("%d server requests for %d unlinks", got, n)
	}

	// as tar extracts: the write and the attribute changes go in one
	// request at the close
	when := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	for i := range n {
		p := filepath.Join(dir, fmt.Sprint("t", i))
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		must(t, err)
		_, err = f.Write([]byte("contents"))
		must(t, err)
		must(t, f.Chown(1000, 1000))
		must(t, f.Chmod(0o644))
		must(t, os.Chtimes(p, when, when))
		must(t, f.Close())
	}
	extracted := mountStatus(t, m.dir)
	if got := extracted.Requests - removed.Requests; got > 2*n+2 {
		t.Errorf("%d server requests to extract %d files (want create and write each)", got, n)
	}
	st, err := os.Stat(filepath.Join(dir, "t7"))
	must(t, err)
	if sys := st.Sys().(*syscall.Stat_t); st.Mode().Perm() != 0o644 || sys.Uid != 1000 || !st.ModTime().Equal(when) || st.Size() != 8 {
		t.Errorf("extracted file: %v uid %d mtime %v size %d", st.Mode(), sys.Uid, st.ModTime(), st.Size())
	}
}

// patterned returns n bytes that differ from page to page (mul varies the
// pattern between tests).
func patterned(n, mul int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*mul + i>>12)
	}
	return b
}

// TestReadAheadCoherent: a mount reading a file sequentially fetches
// ahead of itself; a write by another mount to a part fetched ahead, and
// one by the reader itself, are seen by the reads that follow. The mounts
// reach the block store through the server's endpoint: only there does a
// sequential reader fetch ahead into its cache (one that sees the block
// directory reads large ranges from it as they are asked for).
func TestReadAheadCoherent(t *testing.T) {
	onServerAndClusterWith(t, []string{"--blocks-remote"}, testReadAheadCoherent)
}

// TestReadAheadKeptCoherent is TestReadAheadCoherent with a file larger
// than half the mounts' caches: its prefetches keep what they fetched for
// the reader instead of caching it, and must be as coherent.
func TestReadAheadKeptCoherent(t *testing.T) {
	onServerAndClusterWith(t, []string{"--blocks-remote", "--cache-mib", "8"}, testReadAheadCoherent)
}

// TestReadAheadKeptAbandoned: readers that stop halfway leave bytes kept
// for them; a later reader of another file still gets its readahead (the
// kept bytes give up their slots), and every read is right.
func TestReadAheadKeptAbandoned(t *testing.T) {
	s := startServer(t)
	a := startMount(t, s, "--blocks-remote", "--cache-mib", "8")
	b := startMount(t, s, "--blocks-remote", "--cache-mib", "8")
	const files, size = 6, 8 << 20
	for i := range files {
		must(t, os.WriteFile(filepath.Join(a.dir, fmt.Sprint("f", i)), patterned(size, i+1), 0o644))
	}
	buf := make([]byte, 1<<20)
	readFile := func(i, upTo int) {
		t.Helper()
		f, err := os.Open(filepath.Join(b.dir, fmt.Sprint("f", i)))
		must(t, err)
		defer f.Close()
		want := patterned(size, i+1)
		for off := 0; off < upTo; off += len(buf) {
			n, err := f.ReadAt(buf, int64(off))
			if n != len(buf) || !bytes.Equal(buf, want[off:off+n]) {
				t.Fatalf("f%d at %d: %d bytes (%v), or not the file's", i, off, n, err)
			}
		}
	}
	for i := range files - 1 {
		readFile(i, 2<<20) // and stop: up to 4 MiB kept ahead of each
	}
	before := mountStatus(t, b.dir)
	readFile(files-1, size)
	if st := mountStatus(t, b.dir); st.Prefetches-before.Prefetches < 4 {
		t.Fatalf("%d prefetches for an 8 MiB sequential read after abandoned readers", st.Prefetches-before.Prefetches)
	}
}

func testReadAheadCoherent(t *testing.T, a, b *mount) {
	const size = 12 << 20
	want := patterned(size, 7)
	must(t, os.WriteFile(filepath.Join(a.dir, "f"), want, 0o644))

	fb, err := os.OpenFile(filepath.Join(b.dir, "f"), os.O_RDWR, 0)
	must(t, err)
	defer fb.Close()
	before := mountStatus(t, b.dir)
	buf := make([]byte, 1<<20)
	readAt := func(off int) {
		t.Helper()
		n, err := fb.ReadAt(buf, int64(off))
		if err != nil && n != len(buf) {
			t.Fatalf("read at %d: %d bytes, %v", off, n, err)
		}
		if !bytes.Equal(buf[:n], want[off:off+n]) {
			i := 0
			for buf[i] == want[off+i] {
				i++
			}
			t.Fatalf("read at %d differs at %d: %q, want %q", off, off+i, buf[i:min(i+8, n)], want[off+i:off+i+8])
		}
	}
	readAt(0)
	readAt(1 << 20)
	if st := mountStatus(t, b.dir); st.Prefetches == before.Prefetches {
		t.Fatalf("no readahead after two sequential reads: %+v", st)
	}

	// A changes bytes B has fetched ahead (or is fetching)
	fa, err := os.OpenFile(filepath.Join(a.dir, "f"), os.O_WRONLY, 0)
	must(t, err)
	defer fa.Close()
	_, err = fa.WriteAt([]byte("CHANGED BY A"), 3<<20+100)
	must(t, err)
	must(t, fa.Close())
	copy(want[3<<20+100:], "CHANGED BY A")
	// B changes bytes ahead of its own reads
	_, err = fb.WriteAt([]byte("CHANGED BY B"), 4<<20+200)
	must(t, err)
	copy(want[4<<20+200:], "CHANGED BY B")
	for off := 2 << 20; off < size; off += 1 << 20 {
		readAt(off)
	}
	got, err := os.ReadFile(filepath.Join(a.dir, "f"))
	must(t, err)
	if !bytes.Equal(got, want) {
		t.Fatal("A reads another file than B")
	}
}

// TestNewFileXattrs: a mount knows a file it just created has no extended
// attributes (the kernel asks for security.capability before each write)
// without asking the server; an attribute it sets, or another mount sets,
// is seen.
func TestNewFileXattrs(t *testing.T) {
	a, b := twoMounts(t)
	pa, pb := filepath.Join(a.dir, "f"), filepath.Join(b.dir, "f")
	must(t, os.WriteFile(pa, []byte("x"), 0o644))
	buf := make([]byte, 64)
	before := mountStatus(t, a.dir)
	if _, err := syscall.Getxattr(pa, "user.x", buf); !errors.Is(err, syscall.ENODATA) {
		t.Fatalf("getxattr of a new file: %v", err)
	}
	if n, err := syscall.Listxattr(pa, buf); err != nil || n != 0 {
		t.Fatalf("listxattr of a new file: %d %v", n, err)
	}
	if got := mountStatus(t, a.dir).Requests - before.Requests; got != 0 {
		t.Fatalf("%d server requests for the xattrs of a file this mount created", got)
	}
	must(t, syscall.Setxattr(pa, "user.x", []byte("1"), 0))
	if n, err := syscall.Getxattr(pa, "user.x", buf); err != nil || string(buf[:n]) != "1" {
		t.Fatalf("getxattr after setxattr: %q %v", buf[:max(n, 0)], err)
	}
	must(t, syscall.Setxattr(pb, "user.y", []byte("2"), 0))
	if n, err := syscall.Getxattr(pa, "user.y", buf); err != nil || string(buf[:n]) != "2" {
		t.Fatalf("another mount's xattr: %q %v", buf[:max(n, 0)], err)
	}
	// and a new file of A's that B gave an attribute
	pa2, pb2 := filepath.Join(a.dir, "g"), filepath.Join(b.dir, "g")
	must(t, os.WriteFile(pa2, nil, 0o644))
	if _, err := syscall.Getxattr(pa2, "user.z", buf); !errors.Is(err, syscall.ENODATA) {
		t.Fatalf("getxattr of a new file: %v", err)
	}
	must(t, syscall.Setxattr(pb2, "user.z", []byte("3"), 0))
	if n, err := syscall.Getxattr(pa2, "user.z", buf); err != nil || string(buf[:n]) != "3" {
		t.Fatalf("another mount's xattr on a new file: %q %v", buf[:max(n, 0)], err)
	}
}

// TestBufferedAttrs: under its X lock a mount buffers chmod, chown and
// utimes like writes (tar sets all three on every file) and sends them
// after the writes; another mount sees them as soon as it looks, and the
// order of writes and time changes is kept. A truncating open comes after
// the writes buffered before it.
func TestBufferedAttrs(t *testing.T) {
	a, b := twoMounts(t)
	pa, pb := filepath.Join(a.dir, "f"), filepath.Join(b.dir, "f")
	fa, err := os.Create(pa)
	must(t, err)
	_, err = fa.Write([]byte("hello"))
	must(t, err)
	when := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	before := mountStatus(t, a.dir)
	must(t, fa.Chmod(0o640))
	must(t, fa.Chown(1234, 5678))
	must(t, os.Chtimes(pa, when, when))
	if got := mountStatus(t, a.dir).Requests - before.Requests; got != 0 {
		t.Errorf("%d server requests for chmod, chown and utimes under an X lock", got)
	}
	check := func(who, p string, mode os.FileMode, mtime time.Time, size int64) {
		t.Helper()
		st, err := os.Stat(p)
		must(t, err)
		sys := st.Sys().(*syscall.Stat_t)
		if st.Mode().Perm() != mode || sys.Uid != 1234 || sys.Gid != 5678 || !st.ModTime().Equal(mtime) || st.Size() != size {
			t.Fatalf("%s: mode %v uid %d gid %d mtime %v size %d; want %v 1234 5678 %v %d",
				who, st.Mode().Perm(), sys.Uid, sys.Gid, st.ModTime(), st.Size(), mode, mtime, size)
		}
	}
	check("A, buffered", pa, 0o640, when, 5)
	check("B", pb, 0o640, when, 5) // revokes A's lock: A flushes
	data, err := os.ReadFile(pb)
	if err != nil || string(data) != "hello" {
		t.Fatalf("B reads %q %v", data, err)
	}
	must(t, fa.Close())

	// utimes, then a write: the write's time wins, as on a local disk
	fa, err = os.OpenFile(pa, os.O_WRONLY, 0)
	must(t, err)
	_, err = fa.WriteAt([]byte("H"), 0) // X again
	must(t, err)
	must(t, os.Chtimes(pa, when, when))
	_, err = fa.WriteAt([]byte("E"), 1)
	must(t, err)
	must(t, fa.Close())
	st, err := os.Stat(pb)
	must(t, err)
	if st.ModTime().Equal(when) || time.Since(st.ModTime()) > time.Minute {
		t.Fatalf("B: mtime %v after utimes and then a write", st.ModTime())
	}

	// a write buffered before a truncating open does not outlive it
	f1, err := os.OpenFile(pa, os.O_WRONLY, 0)
	must(t, err)
	_, err = f1.WriteAt([]byte("abc"), 0)
	must(t, err)
	f2, err := os.OpenFile(pa, os.O_WRONLY|os.O_TRUNC, 0)
	must(t, err)
	must(t, f2.Close())
	must(t, f1.Close())
	if data, err := os.ReadFile(pb); err != nil || len(data) != 0 {
		t.Fatalf("B reads %q %v after a truncating open", data, err)
	}
}

// serverOpenFiles returns how many open handles the server counts for a
// mount's client (admin clients).
func serverOpenFiles(t *testing.T, s *server, client string) int {
	t.Helper()
	var cs []struct {
		Client    string `json:"client"`
		OpenFiles int    `json:"open_files"`
	}
	out := admin(t, append(s.adminArgs(), "--json", "clients")...)
	must(t, json.Unmarshal([]byte(out), &cs))
	for _, c := range cs {
		if c.Client == client {
			return c.OpenFiles
		}
	}
	t.Fatalf("server lists no client %s:\n%s", client, out)
	return 0
}

// TestOpenUnderLock: a mount opens a file it holds a lock on without asking
// the server. When the file is then removed, by another mount (whose unlink
// revokes the lock: the acknowledgement reports the open) or by this one
// (the unlink reports it), the server counts the open: the file keeps its
// data while open, and its close ends the count.
func TestOpenUnderLock(t *testing.T) {
	adminAddr := testnet.TCPAddr(t)
	s := startServer(t, "--admin", adminAddr)
	a, b := startMount(t, s), startMount(t, s)
	idA, _ := mountClient(t, a)

	for _, remover := range []*mount{b, a} {
		name := "by-" + filepath.Base(filepath.Dir(remover.dir))
		p := filepath.Join(a.dir, name)
		must(t, os.WriteFile(p, []byte("hello"), 0o644))
		before := mountStatus(t, a.dir)
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		must(t, err)
		defer f.Close() // an open file would keep the mount from unmounting
		if got := mountStatus(t, a.dir).Requests - before.Requests; got != 0 {
			t.Errorf("an open under the mount's lock asked the server %d times", got)
		}
		if n := serverOpenFiles(t, s, idA); n != 0 {
			t.Errorf("the server counts %d open files of a mount that opened locally, want 0", n)
		}
		must(t, os.Remove(filepath.Join(remover.dir, name)))
		if n := serverOpenFiles(t, s, idA); n != 1 {
			t.Fatalf("after the unlink the server counts %d open files of the mount, want 1", n)
		}
		if exists(p) {
			t.Fatalf("%s still exists after its unlink", p)
		}
		buf := make([]byte, 5)
		if _, err := f.ReadAt(buf, 0); err != nil || string(buf) != "hello" {
			t.Fatalf("read of the open, unlinked file: %q, %v", buf, err)
		}
		_, err = f.WriteAt([]byte("HE"), 0)
		must(t, err)
		must(t, f.Sync())
		if _, err := f.ReadAt(buf, 0); err != nil || string(buf) != "HEllo" {
			t.Fatalf("read back of the open, unlinked file: %q, %v", buf, err)
		}
		must(t, f.Close())
		// the last close of an unlinked file purges it (metaserver closeHandle)
		waitFor(t, 5*time.Second, "the close to reach the server", func() bool {
			return serverOpenFiles(t, s, idA) == 0
		})
	}
}

// TestReadAround: random page reads of a file that fits in the data cache
// fetch the server's whole chunk around each miss, so that later reads
// near it are served from the cache; another mount's write is still seen.
func TestReadAround(t *testing.T) {
	a, b := twoMounts(t)
	const size = 1 << 20
	want := patterned(size, 13)
	must(t, os.WriteFile(filepath.Join(b.dir, "f"), want, 0o644))
	f, err := os.Open(filepath.Join(a.dir, "f"))
	must(t, err)
	defer f.Close()
	pages := size / 4096
	order := make([]int, pages)
	for i := range order {
		order[i] = (i*97 + 31) % pages // every page once, never two in a row nor the first (readahead)
	}
	before := mountStatus(t, a.dir)
	buf := make([]byte, 4096)
	for _, p := range order {
		n, err := f.ReadAt(buf, int64(p*4096))
		if err != nil || n != len(buf) || !bytes.Equal(buf, want[p*4096:(p+1)*4096]) {
			t.Fatalf("read of page %d: %d bytes, %v, or wrong data", p, n, err)
		}
	}
	// a lookup and a getattr may come first; then one read per 64 KiB
	if got := mountStatus(t, a.dir).Requests - before.Requests; got > size/(64<<10)+4 {
		t.Errorf("%d server requests for %d random page reads of a %d KiB file", got, pages, size>>10)
	}
	fb, err := os.OpenFile(filepath.Join(b.dir, "f"), os.O_WRONLY, 0)
	must(t, err)
	_, err = fb.WriteAt([]byte("changed"), 70000)
	must(t, err)
	must(t, fb.Close())
	if _, err := f.ReadAt(buf[:7], 70000); err != nil || string(buf[:7]) != "changed" {
		t.Fatalf("after another mount's write: %q, %v", buf[:7], err)
	}
}

// TestAppendsSurviveEviction: appends go to the server as they are made,
// even under the mount's X lock. A mount evicted right after appending
// (frozen meanwhile, its lock stolen, another mount appending, so that
// buffered data could not be reclaimed) loses nothing and its fsync
// succeeds.
func TestAppendsSurviveEviction(t *testing.T) {
	adminAddr := testnet.TCPAddr(t)
	s := startServer(t, "--admin", adminAddr, "--client-lease", "500ms", "--delivery-timeout", "100ms")
	a, b := startMount(t, s), startMount(t, s)
	idA, _ := mountClient(t, a)
	fa, err := os.OpenFile(filepath.Join(a.dir, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	must(t, err)
	defer fa.Close()
	for _, rec := range []string{"a1\n", "a2\n", "a3\n"} { // the first grants X; the others could be buffered
		_, err := fa.WriteString(rec)
		must(t, err)
	}
	// a hears nothing of it until b has appended (a's renewals would
	// recover it at once)
	a.signal(syscall.SIGSTOP)
	evict(t, s, idA)
	fb, err := os.OpenFile(filepath.Join(b.dir, "log"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	defer fb.Close()
	_, err = fb.WriteString("b1\n") // waits until a's lock is stolen
	must(t, err)
	must(t, fb.Sync())
	a.signal(syscall.SIGCONT)
	if err := fa.Sync(); err != nil {
		t.Fatalf("fsync of the evicted mount's appends: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(b.dir, "log"))
	must(t, err)
	if string(got) != "a1\na2\na3\nb1\n" {
		t.Fatalf("log is %q", got)
	}
}

// evict makes server s fail client id now (through the API, not `leasefs
// admin`: exec closes this process's descriptors, and a close could wait
// for a frozen mount).
func evict(t *testing.T, s *server, id string) {
	t.Helper()
	s.adminCall(t, "POST", "/api/evict?client="+id)
}

// evictAndRecover evicts mount m's client id and waits until m recovered.
func evictAndRecover(t *testing.T, s *server, id string, m *mount) {
	t.Helper()
	evict(t, s, id)
	waitFor(t, 10*time.Second, "the mount to recover", func() bool {
		_, st := mountStats(t, m)
		return st.Recoveries > 0
	})
}

// syncDir fsyncs a directory.
func syncDir(t testing.TB, dir string) {
	t.Helper()
	d, err := os.Open(dir)
	must(t, err)
	defer d.Close()
	must(t, d.Sync())
}

// TestRemovedFileChangesDropped: changes a mount buffered for a file that
// was then removed are dropped, not reported as lost: after a NACK the
// mount reclaims what it buffered, and a removed file has nothing to
// reclaim into.
func TestRemovedFileChangesDropped(t *testing.T) {
	adminAddr := testnet.TCPAddr(t)
	s := startServer(t, "--admin", adminAddr, "--client-lease", "500ms", "--delivery-timeout", "100ms")
	m := startMount(t, s)
	p := filepath.Join(m.dir, "f")
	must(t, os.WriteFile(p, []byte("data"), 0o644))
	// buffered under the X lock the write left: not sent until a flush
	must(t, os.Chtimes(p, time.Unix(1e9, 0), time.Unix(1e9, 0)))
	must(t, os.Remove(p))
	id, _ := mountClient(t, m)
	evictAndRecover(t, s, id, m)
	// the recovery's reclaim, then a flush of what is left, have run
	must(t, os.WriteFile(filepath.Join(m.dir, "g"), []byte("after"), 0o644))
	if _, st := mountStats(t, m); st.DataLost != 0 {
		t.Fatalf("%d files reported lost; the mount's log:\n%s", st.DataLost, m.output())
	}
}

// TestRemoveBehind: under a directory's X lock a mount removes files and
// empty directories without waiting for the server, and whatever could see
// a removal sees it: another mount's listing and lookups, a create under a
// removed name, the other mount's view of a tree removed with rm -rf.
func TestRemoveBehind(t *testing.T) {
	s := startServer(t)
	// a's packets take 0-20 ms, so that what a sends behind can be
	// overtaken by what it acknowledges
	a, b := startMount(t, s, "--faults", "jitter=20ms,reorder=0.2"), startMount(t, s)
	tree := filepath.Join(a.dir, "tree")
	// made by a: a holds the directories' X locks and knows their entries
	for i := range 4 {
		d := filepath.Join(tree, fmt.Sprintf("d%d", i))
		must(t, os.MkdirAll(d, 0o755))
		for j := range 30 {
			must(t, os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d", j)), []byte("x"), 0o644))
		}
	}
	_, before := mountStats(t, a)
	out, err := exec.Command("rm", "-rf", tree).CombinedOutput()
	if err != nil {
		t.Fatalf("rm -rf: %v: %s", err, out)
	}
	_, after := mountStats(t, a)
	n, batches := after.RemovedBehind-before.RemovedBehind, after.BehindBatches-before.BehindBatches
	if n < 4*30+4 {
		t.Errorf("rm -rf of 120 files in 4 directories sent %d removals behind", n)
	}
	if batches == 0 || batches > n/2 {
		// (what queues while a batch is at the server goes in the next)
		t.Errorf("rm -rf sent %d removals behind in %d batches of several", n, batches)
	}
	t.Logf("rm -rf sent %d removals behind, in %d batches of several", n, batches)
	if _, err := os.Stat(filepath.Join(b.dir, "tree")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the other mount after rm -rf: %v", err)
	}

	// a name removed and created again at once
	p := filepath.Join(a.dir, "again")
	must(t, os.WriteFile(p, []byte("old"), 0o644))
	must(t, os.Remove(p))
	must(t, os.WriteFile(p, []byte("new"), 0o644))
	wantFile(t, filepath.Join(b.dir, "again"), []byte("new"))

	// a listing elsewhere right after removals
	d := filepath.Join(a.dir, "list")
	must(t, os.Mkdir(d, 0o755))
	for i := range 40 {
		must(t, os.WriteFile(filepath.Join(d, fmt.Sprintf("f%02d", i)), nil, 0o644))
	}
	for i := 0; i < 40; i += 2 {
		must(t, os.Remove(filepath.Join(d, fmt.Sprintf("f%02d", i))))
	}
	names, err := os.ReadDir(filepath.Join(b.dir, "list"))
	must(t, err)
	if len(names) != 20 || names[0].Name() != "f01" {
		t.Fatalf("the other mount lists %d names after 20 of 40 were removed (first %v)", len(names), names[0].Name())
	}
}

// TestReadHandleSeesWrites: a handle that keeps reading a file sees every
// write, through another handle of this mount or through another mount.
// (A kernel page cache kept for readers would fail it unless every write
// dropped the pages it changes.)
func TestReadHandleSeesWrites(t *testing.T) { onServerAndCluster(t, testReadHandleSeesWrites) }

func testReadHandleSeesWrites(t *testing.T, a, b *mount) {
	p := filepath.Join(a.dir, "f")
	must(t, os.WriteFile(p, patterned(256<<10, 3), 0o644))
	r, err := os.Open(p)
	must(t, err)
	defer r.Close()
	buf := make([]byte, 8)
	readAt := func(off int64) string {
		t.Helper()
		if _, err := r.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
		return string(buf)
	}
	readAt(0)
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	must(t, err)
	defer w.Close()
	for i := range 200 {
		v := fmt.Sprintf("local%03d", i)
		off := int64(i%4) * 4096
		_, err := w.WriteAt([]byte(v), off)
		must(t, err)
		if got := readAt(off); got != v {
			t.Fatalf("write %d through another handle of this mount: read %q, want %q", i, got, v)
		}
	}
	wb, err := os.OpenFile(filepath.Join(b.dir, "f"), os.O_WRONLY, 0)
	must(t, err)
	defer wb.Close()
	for i := range 50 {
		v := fmt.Sprintf("other%03d", i)
		_, err := wb.WriteAt([]byte(v), 8192)
		must(t, err)
		if got := readAt(8192); got != v {
			t.Fatalf("write %d through another mount: read %q, want %q", i, got, v)
		}
	}
}
