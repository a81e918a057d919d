package integration

import (
	"bytes"
	"context"
	le "encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/anishathalye/porcupine"

	"github.com/leasefs/leasefs/internal/testnet"
)

// mapShared maps size bytes of f shared (read and write if f is, else read
// only); unmapped at cleanup if the test did not.
func mapShared(t testing.TB, f *os.File, size int, write bool) []byte {
	t.Helper()
	prot := syscall.PROT_READ
	if write {
		prot |= syscall.PROT_WRITE
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, size, prot, syscall.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap MAP_SHARED of %s: %v", f.Name(), err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(m) })
	return m
}

// msync writes m's dirty pages back and waits for them (MS_SYNC).
func msync(m []byte) error {
	_, _, e := syscall.Syscall(syscall.SYS_MSYNC, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), syscall.MS_SYNC)
	if e != 0 {
		return e
	}
	return nil
}

// noHang runs fn, failing the test if it errs or hangs past d. A hang is
// a FUSE deadlock: the mounts' connections are aborted first, so that the
// call and the test's cleanup (munmap writes dirty pages back) return.
func noHang(t *testing.T, d time.Duration, what string, fn func() error, mounts ...*mount) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(d):
		for _, m := range mounts {
			abortFUSE(m.dir)
		}
		t.Fatalf("%s: still blocked after %v (a deadlock?)", what, d)
	}
}

// checkBytes fails unless got equals want, naming the first difference.
func checkBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	end := func(b []byte) []byte { return b[min(i, len(b)):min(i+16, len(b))] }
	t.Fatalf("%s: %d bytes, want %d; first difference at %d: %q, want %q", what, len(got), len(want), i, end(got), end(want))
}

// TestMmapShared: MAP_SHARED works read and write, with read()'s and
// write()'s coherence across mounts: what one mount stored through a
// mapping and msync'ed is what read() and mappings on both mounts see; a
// write() on the other mount is seen through an existing mapping once it
// returned; a store that was munmapped and closed without msync reaches
// the other mount once close returned.
func TestMmapShared(t *testing.T) {
	a, b := twoMounts(t)
	checkMmapShared(t, a, b)
}

// TestMmapSharedCluster is TestMmapShared, TestMmapDirtyUnderSharedLock
// and TestMmapRandom through mounts of two servers of a 3-server cluster:
// locks are granted and revoked by the file's owner, and fills and
// write-back follow redirects.
func TestMmapSharedCluster(t *testing.T) {
	c := startCluster(t, 3, clusterTimings()...)
	a, b := c.mount(t, []int{0, 1, 2}), c.mount(t, []int{1, 2, 0})
	checkMmapShared(t, a, b)
	checkDirtyUnderSharedLock(t, a, b)
	checkMmapRandom(t, a, b)
}

func checkMmapShared(t *testing.T, a, b *mount) {
	const size = 3 * 4096
	want := patterned(size, 7)
	must(t, os.WriteFile(filepath.Join(a.dir, "m"), want, 0o644))
	fa, err := os.OpenFile(filepath.Join(a.dir, "m"), os.O_RDWR, 0)
	must(t, err)
	defer fa.Close()
	ma := mapShared(t, fa, size, true)
	checkBytes(t, "A's mapping", ma, want)

	// a store through A's mapping, msync'ed: read() on both mounts
	copy(ma[100:], "stored through A's mapping")
	copy(want[100:], "stored through A's mapping")
	checkBytes(t, "A's mapping after its store", ma, want)
	must(t, msync(ma))
	got, err := os.ReadFile(filepath.Join(a.dir, "m"))
	must(t, err)
	checkBytes(t, "read() on A after msync", got, want)
	got, err = os.ReadFile(filepath.Join(b.dir, "m"))
	must(t, err)
	checkBytes(t, "read() on B after A's msync", got, want)

	// B's own mapping sees it too
	fb, err := os.OpenFile(filepath.Join(b.dir, "m"), os.O_RDWR, 0)
	must(t, err)
	defer fb.Close()
	mb := mapShared(t, fb, size, false)
	checkBytes(t, "B's mapping", mb, want)

	// a write() on B reaches A's existing mapping (and B's) once it returned
	_, err = fb.WriteAt([]byte("written by B"), 4096+10)
	must(t, err)
	copy(want[4096+10:], "written by B")
	checkBytes(t, "A's existing mapping after B's write", ma, want)
	checkBytes(t, "B's mapping after B's write", mb, want)

	// a store on A, msync'ed, reaches B's existing mapping
	copy(ma[2*4096+5:], "A again")
	copy(want[2*4096+5:], "A again")
	must(t, msync(ma))
	checkBytes(t, "B's existing mapping after A's msync", mb, want)

	// munmap and close, no msync: on B once close returned
	copy(ma[300:], "unmapped, not synced")
	copy(want[300:], "unmapped, not synced")
	must(t, syscall.Munmap(ma))
	must(t, fa.Close())
	got, err = os.ReadFile(filepath.Join(b.dir, "m"))
	must(t, err)
	checkBytes(t, "read() on B after A's munmap and close", got, want)
	checkBytes(t, "B's mapping after A's munmap and close", mb, want)
	for _, m := range []*mount{a, b} {
		if _, st := mountStats(t, m); st.NacksReceived != 0 || st.DataLost != 0 {
			t.Fatalf("%s: %+v", m.dir, st)
		}
	}
}

// TestMmapDirtyUnderSharedLock: a page stored through a mapping under an
// S lock (the mount only read the file) is dirty when another mount's
// write revokes that lock. The revocation drops the page, and the kernel
// writes it back from within the invalidation: that write-back must not
// wait for the X lock, which queues behind the very write that revokes
// (a deadlock: the server failed the mount after its delivery timeout and
// the mount hung). It goes after, and only the bytes the mapping changed,
// so the other mount's write to the same page stays.
func TestMmapDirtyUnderSharedLock(t *testing.T) {
	a, b := twoMounts(t)
	checkDirtyUnderSharedLock(t, a, b)
}

func checkDirtyUnderSharedLock(t *testing.T, a, b *mount) {
	const size = 2 * 4096
	want := patterned(size, 3)
	must(t, os.WriteFile(filepath.Join(b.dir, "d"), want, 0o644))
	fa, err := os.OpenFile(filepath.Join(a.dir, "d"), os.O_RDWR, 0)
	must(t, err)
	defer fa.Close()
	ma := mapShared(t, fa, size, true)
	checkBytes(t, "A's mapping", ma, want) // A holds S now
	copy(ma, "AAAAAAAAAA")
	copy(want, "AAAAAAAAAA")

	fb, err := os.OpenFile(filepath.Join(b.dir, "d"), os.O_RDWR, 0)
	must(t, err)
	defer fb.Close()
	noHang(t, 10*time.Second, "B's write while A's page is dirty", func() error {
		_, err := fb.WriteAt([]byte("BBBB"), 1000)
		return err
	}, a, b)
	copy(want[1000:], "BBBB")
	noHang(t, 10*time.Second, "A's msync", func() error { return msync(ma) }, a, b)
	got, err := os.ReadFile(filepath.Join(b.dir, "d"))
	must(t, err)
	checkBytes(t, "read() on B", got, want)
	checkBytes(t, "A's mapping", ma, want)
	for _, m := range []*mount{a, b} {
		if _, st := mountStats(t, m); st.NacksReceived != 0 || st.DataLost != 0 {
			t.Fatalf("%s: %+v", m.dir, st)
		}
	}
}

// TestMmapEvicted: pages stored through a mapping and not yet written
// back when the server failed the mount (its lock stolen) go to the
// server if nobody wrote the file meanwhile, like buffered writes
// reclaimed after a NACK; if another mount did, msync reports EIO and the
// other mount's write stays.
func TestMmapEvicted(t *testing.T) {
	adminAddr := testnet.TCPAddr(t)
	s := startServer(t, "--admin", adminAddr, "--client-lease", "500ms", "--delivery-timeout", "100ms")
	a, b := startMount(t, s), startMount(t, s)
	idA, _ := mountClient(t, a)
	const size = 4096
	for _, changed := range []bool{false, true} {
		name := fmt.Sprintf("m%v", changed)
		want := patterned(size, 5)
		must(t, os.WriteFile(filepath.Join(a.dir, name), want, 0o644))
		fa, err := os.OpenFile(filepath.Join(a.dir, name), os.O_RDWR, 0)
		must(t, err)
		ma := mapShared(t, fa, size, true)
		copy(ma[10:], "stored by A")
		// a hears nothing of it until b has written (a's renewals would
		// recover it at once)
		a.signal(syscall.SIGSTOP)
		evict(t, s, idA)
		if changed {
			_, err := fb(t, b, name).WriteAt([]byte("written by B"), 100)
			must(t, err) // waits until a's lock is stolen
			copy(want[100:], "written by B")
		}
		a.signal(syscall.SIGCONT)
		err = msync(ma)
		if changed {
			if err != syscall.EIO {
				t.Fatalf("msync of pages based on a stolen lock, the file changed since: %v, want EIO", err)
			}
		} else {
			must(t, err)
			copy(want[10:], "stored by A")
		}
		must(t, syscall.Munmap(ma))
		_ = fa.Close()
		got, err := os.ReadFile(filepath.Join(b.dir, name))
		must(t, err)
		checkBytes(t, name+" on B", got, want)
	}
}

// fb opens name on mount m for writing, closed at cleanup.
func fb(t *testing.T, m *mount, name string) *os.File {
	f, err := os.OpenFile(filepath.Join(m.dir, name), os.O_RDWR, 0)
	must(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

// TestSQLiteWAL: SQLite in WAL mode maps its -shm file shared; it failed
// with "disk I/O error" while every handle refused MAP_SHARED.
func TestSQLiteWAL(t *testing.T) {
	if _, err := exec.LookPath("sqlite3"); err != nil {
		t.Skip("no sqlite3 (.ci/run installs it)")
	}
	a, b := twoMounts(t)
	db := filepath.Join(a.dir, "w.db")
	var script strings.Builder
	script.WriteString("pragma journal_mode=wal;\ncreate table t(i integer primary key, v text);\n")
	for tx := 0; tx < 100; tx++ {
		script.WriteString("begin;\n")
		for r := 0; r < 100; r++ {
			fmt.Fprintf(&script, "insert into t(v) values('row %d of transaction %d');\n", r, tx)
		}
		script.WriteString("commit;\n")
	}
	script.WriteString("pragma integrity_check;\nselect count(*) from t;\n")
	out := sqlite(t, db, script.String())
	if out != "wal\nok\n10000\n" {
		t.Fatalf("sqlite3 printed %q", out)
	}
	// the other mount reads the database once sqlite closed it
	out = sqlite(t, filepath.Join(b.dir, "w.db"), "pragma integrity_check;\nselect count(*), max(i) from t;\n")
	if out != "ok\n10000|10000\n" {
		t.Fatalf("sqlite3 on the other mount printed %q", out)
	}
}

func sqlite(t *testing.T, db, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sqlite3", "-batch", "-bail", db)
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sqlite3 %s: %v\n%s", db, err, out)
	}
	return string(out)
}

// TestMmapRandom (fsx-style): a seeded random mix of stores through
// mappings (msync'ed), write()s, read()s and loads through mappings on two
// mounts of one file, each checked against a model: every operation sees
// every one that returned before it, on either mount.
func TestMmapRandom(t *testing.T) {
	a, b := twoMounts(t)
	checkMmapRandom(t, a, b)
}

func checkMmapRandom(t *testing.T, a, b *mount) {
	const size = 16 * 4096
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x6d6d6170))
			name := fmt.Sprintf("fsx%d", seed)
			model := patterned(size, int(seed)+1)
			must(t, os.WriteFile(filepath.Join(a.dir, name), model, 0o644))
			type side struct {
				name string
				f    *os.File
				m    []byte
			}
			open := func(mnt *mount, label string) *side {
				f, err := os.OpenFile(filepath.Join(mnt.dir, name), os.O_RDWR, 0)
				must(t, err)
				s := &side{name: label, f: f}
				s.m, err = syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
				must(t, err)
				return s
			}
			sides := []*side{open(a, "A"), open(b, "B")}
			t.Cleanup(func() {
				for _, s := range sides {
					_ = syscall.Munmap(s.m)
					s.f.Close()
				}
			})
			randBytes := func(n int) []byte {
				p := make([]byte, n)
				for i := range p {
					p[i] = byte(rng.IntN(256))
				}
				return p
			}
			var log []string
			fail := func(format string, args ...any) {
				t.Helper()
				if len(log) > 12 {
					log = log[len(log)-12:]
				}
				t.Fatalf("seed %d, after\n  %s\n%s", seed, strings.Join(log, "\n  "), fmt.Sprintf(format, args...))
			}
			for op := 0; op < 300; op++ {
				s := sides[rng.IntN(2)]
				off := rng.IntN(size)
				n := 1 + rng.IntN(min(size-off, 3*4096))
				switch k := rng.IntN(7); k {
				case 0, 1: // store through the mapping, check it there, msync
					p := randBytes(n)
					copy(s.m[off:], p)
					copy(model[off:], p)
					log = append(log, fmt.Sprintf("%s store [%d,+%d)", s.name, off, n))
					if !bytes.Equal(s.m[off:off+n], p) {
						fail("%s: its own store not in its mapping", s.name)
					}
					if err := msync(s.m); err != nil {
						fail("%s msync: %v", s.name, err)
					}
				case 2: // write()
					p := randBytes(n)
					if _, err := s.f.WriteAt(p, int64(off)); err != nil {
						fail("%s write: %v", s.name, err)
					}
					copy(model[off:], p)
					log = append(log, fmt.Sprintf("%s write [%d,+%d)", s.name, off, n))
				case 3, 4: // load through the mapping
					log = append(log, fmt.Sprintf("%s load [%d,+%d)", s.name, off, n))
					if !bytes.Equal(s.m[off:off+n], model[off:off+n]) {
						fail("%s load differs from the model", s.name)
					}
				case 5: // read()
					got := make([]byte, n)
					if _, err := s.f.ReadAt(got, int64(off)); err != nil {
						fail("%s read: %v", s.name, err)
					}
					log = append(log, fmt.Sprintf("%s read [%d,+%d)", s.name, off, n))
					if !bytes.Equal(got, model[off:off+n]) {
						fail("%s read differs from the model", s.name)
					}
				case 6: // store, munmap and close without msync, open and map again
					p := randBytes(n)
					copy(s.m[off:], p)
					copy(model[off:], p)
					log = append(log, fmt.Sprintf("%s store [%d,+%d), munmap, close", s.name, off, n))
					if err := syscall.Munmap(s.m); err != nil {
						fail("%s munmap: %v", s.name, err)
					}
					if err := s.f.Close(); err != nil {
						fail("%s close: %v", s.name, err)
					}
					mnt := a
					if s.name == "B" {
						mnt = b
					}
					*s = *open(mnt, s.name)
				}
			}
			got, err := os.ReadFile(filepath.Join(a.dir, name))
			must(t, err)
			checkBytes(t, "the file at the end", got, model)
		})
	}
	for _, m := range []*mount{a, b} {
		if _, st := mountStats(t, m); st.NacksReceived != 0 || st.DataLost != 0 {
			t.Fatalf("%s: %+v", m.dir, st)
		}
	}
}

// TestMmapFaultsDuringRevocation: threads keep faulting pages of a
// mapping on A in while B's write()s revoke A's lock, so that fills come
// while A's revocation drops the pages, after the kernel's walk passed
// them too. The walk is slow (every page is dirty: A stored into it, and
// it is written back from within the walk), so fills are held up past
// fillHold and served under the lock being revoked, and the invalidation
// must run again. Once a write returned on B, every page of A's mapping
// shows it: no page read under the lock revoked survives the revocation.
func TestMmapFaultsDuringRevocation(t *testing.T) {
	a, b := twoMounts(t)
	const pages = 256
	const size = pages * 4096
	must(t, os.WriteFile(filepath.Join(b.dir, "m"), make([]byte, size), 0o644))
	fa, err := os.OpenFile(filepath.Join(a.dir, "m"), os.O_RDWR, 0)
	must(t, err)
	defer fa.Close()
	ma := mapShared(t, fa, size, true)
	fbw := fb(t, b, "m")
	stop := make(chan struct{})
	done := make(chan struct{})
	const faulters = 3
	for i := range faulters {
		go func() {
			defer func() { done <- struct{}{} }()
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			var sink byte
			for {
				select {
				case <-stop:
					_ = sink
					return
				default:
				}
				sink += ma[rng.IntN(pages)*4096+rng.IntN(4096)]
			}
		}()
	}
	defer func() {
		close(stop)
		for range faulters {
			<-done
		}
	}()
	buf := make([]byte, size)
	for round := uint64(1); round <= 20; round++ {
		// A's stores (the second half of each page, which B's writes
		// leave as A made it once A's pages are written back)
		for p := range pages {
			le.LittleEndian.PutUint64(ma[p*4096+2048:], round)
		}
		for p := range pages {
			le.LittleEndian.PutUint64(buf[p*4096:], round)
			copy(buf[p*4096+2048:p*4096+4096], ma[p*4096+2048:p*4096+4096])
		}
		noHang(t, 10*time.Second, "B's write", func() error {
			_, err := fbw.WriteAt(buf, 0)
			return err
		}, a, b)
		for p := range pages {
			if got := le.LittleEndian.Uint64(ma[p*4096:]); got != round {
				t.Fatalf("round %d: page %d of A's mapping shows %d after B's write returned", round, p, got)
			}
		}
	}
	must(t, msync(ma))
	got, err := os.ReadFile(filepath.Join(b.dir, "m"))
	must(t, err)
	checkBytes(t, "the file on B", got, ma)
	for _, m := range []*mount{a, b} {
		if _, st := mountStats(t, m); st.NacksReceived != 0 || st.DataLost != 0 {
			t.Fatalf("%s: %+v", m.dir, st)
		}
	}
}

// TestLinearizableMapped is TestLinearizable with mappings in play, on
// three mounts: on A one writer per file stores through a mapping and
// msyncs (the operation spans both), on B one writes with write(), and
// readers use read() on A and B and load from a mapping on C. Every read
// must be explained by some order of the completed writes. (A reader of
// the writing mount's mapping could not be: it sees a store before its
// msync, and the bytes of its own write() as they were while that is in
// flight, when other mounts may see them already; see client/mapped.go.)
func TestLinearizableMapped(t *testing.T) {
	s := startServer(t)
	a, b, c := startMount(t, s), startMount(t, s), startMount(t, s)
	const files = 2
	for f := 0; f < files; f++ {
		must(t, os.WriteFile(filepath.Join(a.dir, "reg"+itoa(f)), make([]byte, 8), 0o644))
	}
	var mu sync.Mutex
	histories := make([][]porcupine.Operation, files)
	start := time.Now()
	deadline := start.Add(4 * time.Second)
	var wg sync.WaitGroup
	worker := 0
	var workers []string // what each worker (its ClientId) does, for a failure
	record := func(f int, op porcupine.Operation) {
		mu.Lock()
		histories[f] = append(histories[f], op)
		mu.Unlock()
	}
	for f := 0; f < files; f++ {
		for _, m := range []*mount{a, b, c} {
			for role := 0; role < 3; role++ { // a writer (on A and B) and readers
				if m == c && role == 0 {
					continue
				}
				id := worker
				worker++
				fh, err := os.OpenFile(filepath.Join(m.dir, "reg"+itoa(f)), os.O_RDWR, 0)
				must(t, err)
				t.Cleanup(func() { fh.Close() })
				var mapped []byte
				if m == a && role == 0 || m == c {
					mapped = mapShared(t, fh, 8, m == a)
				}
				how := map[bool]string{true: "mapping", false: "read()/write()"}[mapped != nil]
				workers = append(workers, fmt.Sprintf("%d: %s on %s (%s)", id, map[bool]string{true: "writer", false: "reader"}[role == 0],
					map[*mount]string{a: "A", b: "B", c: "C"}[m], how))
				wg.Add(1)
				go func(write bool) {
					defer wg.Done()
					if mapped != nil {
						// a load from a mapping whose connection
						// waitOrDump aborted faults: an error, not
						// the end of the test binary
						debug.SetPanicOnFault(true)
						defer func() {
							if r := recover(); r != nil {
								t.Errorf("worker %d: %v", id, r)
							}
						}()
					}
					buf := make([]byte, 8)
					for n := uint64(1); time.Now().Before(deadline); n++ {
						op := porcupine.Operation{ClientId: id}
						call := time.Since(start).Nanoseconds()
						switch {
						case write:
							v := uint64(id)<<32 | n
							le.LittleEndian.PutUint64(buf, v)
							var err error
							if mapped != nil {
								copy(mapped, buf)
								err = msync(mapped)
							} else {
								_, err = fh.WriteAt(buf, 0)
							}
							if err != nil {
								t.Error(err)
								return
							}
							op.Input = regInput{write: true, value: v}
						case mapped != nil:
							op.Input, op.Output = regInput{}, le.LittleEndian.Uint64(mapped)
						default:
							if _, err := fh.ReadAt(buf, 0); err != nil {
								t.Error(err)
								return
							}
							op.Input, op.Output = regInput{}, le.LittleEndian.Uint64(buf)
						}
						op.Call, op.Return = call, time.Since(start).Nanoseconds()
						record(f, op)
						if mapped != nil && !write {
							// a load takes no system call: paced, or
							// millions of them make the history too
							// long to check
							time.Sleep(200 * time.Microsecond)
						}
					}
				}(role == 0)
			}
		}
	}
	// far past the workers' 4 s: a hang, which the dumps name
	waitOrDump(t, &wg, 30*time.Second, []*proc{s.proc, a.proc, b.proc, c.proc}, a, b, c)
	for f, h := range histories {
		if len(h) < 50 {
			t.Fatalf("file %d: only %d operations recorded", f, len(h))
		}
		res := porcupine.CheckOperationsTimeout(registerModel, h, 30*time.Second)
		if res != porcupine.Ok {
			explainStale(t, h)
			explainZones(t, h)
			t.Logf("workers: %s", strings.Join(workers, ", "))
			t.Fatalf("file %d: history of %d operations is %v", f, len(h), res)
		}
		t.Logf("file %d: %d operations, linearizable", f, len(h))
	}
}

// waitOrDump waits for wg, which should be done by now. Past d it fails
// the test after collecting what names the hang: each process's
// goroutines (SIGUSR1; into its log, kept whole with LEASEFS_KEEP_LOGS)
// and the kernel stacks of this process's threads waiting in FUSE or in a
// page fault; it then aborts the mounts' connections so that those waits end.
func waitOrDump(t *testing.T, wg *sync.WaitGroup, d time.Duration, procs []*proc, mounts ...*mount) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(d):
	}
	for _, p := range procs {
		p.signal(syscall.SIGUSR1)
	}
	tasks, _ := filepath.Glob("/proc/self/task/*/stack")
	for _, task := range tasks {
		if b, err := os.ReadFile(task); err == nil && (strings.Contains(string(b), "fuse") || strings.Contains(string(b), "filemap_fault")) {
			t.Logf("%s:\n%s", task, b)
		}
	}
	time.Sleep(time.Second) // for the dumps to reach the logs
	for _, m := range mounts {
		abortFUSE(m.dir)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	t.Fatalf("workers still running after %v: goroutine dumps are in the logs", d)
}

// resident reports how many of m's pages are in the page cache (mincore).
func resident(t *testing.T, m []byte) int {
	t.Helper()
	vec := make([]byte, (len(m)+4095)/4096)
	if _, _, e := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatalf("mincore: %v", e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestMmapLeaseLapse: a mount whose lease is about to lapse (its server
// stopped answering) drops the pages of its mappings, as it drops the
// kernel's names and attributes: the kernel serves them without asking,
// and once the lease lapsed the server may let another mount change the
// file.
func TestMmapLeaseLapse(t *testing.T) {
	const tau = time.Second
	s := startServer(t, "--client-lease", tau.String(), "--delivery-timeout", (tau / 4).String())
	a := startMount(t, s, "--soft-timeout", "2s")
	const size = 4 * 4096
	want := patterned(size, 9)
	writeSync(t, filepath.Join(a.dir, "m"), want)
	fa, err := os.Open(filepath.Join(a.dir, "m"))
	must(t, err)
	defer fa.Close()
	ma := mapShared(t, fa, size, false)
	checkBytes(t, "A's mapping", ma, want)
	if n := resident(t, ma); n != size/4096 {
		t.Fatalf("%d pages resident after reading them all", n)
	}
	s.signal(syscall.SIGSTOP)
	waitStopped(t, s.proc)
	defer s.signal(syscall.SIGCONT)
	waitFor(t, 5*time.Second, "the mapping's pages to be dropped", func() bool { return resident(t, ma) == 0 })
	s.signal(syscall.SIGCONT)
	checkBytes(t, "A's mapping after the server resumed", ma, want)
}
