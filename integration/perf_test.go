package integration

import (
	"bytes"
	bin "encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/internal/testnet"
)

// The performance suite. Run it with
//
//	go test ./integration -run '^$' -bench 'Perf$' -benchmem -benchtime 1x
//
// (-benchtime 3x runs three interleaved passes and reports medians;
// LEASEFS_PERF_FULL=1 uses the full sizes). Each workload runs on a
// leasefs mount (server data directory on tmpfs) and on go-fuse's loopback
// over a tmpfs directory with FUSE passthrough off (each served by a process
// of its own), in the same run; the ratio is loopback time / leasefs time,
// so 1.0 is the FUSE limit.

// perfSizes scales the workloads.
type perfSizes struct {
	seqMiB     []int    // sequential write+fsync / cold read / re-read, one row set per size
	randMiB    int      // file size for the random 4 KiB reads and writes
	randOps    int      // number of random 4 KiB reads, and of writes
	files      int      // create / stat / unlink / open-append-close count
	tarSubdirs []string // parts of GOROOT/src to untar; nil: all of it
}

var (
	perfTiny = perfSizes{seqMiB: []int{4}, randMiB: 4, randOps: 200, files: 100, tarSubdirs: []string{"encoding/json"}}
	// perfDefault keeps the whole suite under about three minutes here.
	perfDefault = perfSizes{seqMiB: []int{128}, randMiB: 64, randOps: 4000, files: 2000,
		tarSubdirs: []string{"encoding", "archive", "go", "net"}}
	// perfFull is the full table, with 512 and 256 MiB sequential rows.
	perfFull = perfSizes{seqMiB: []int{512, 256}, randMiB: 256, randOps: 20000, files: 10000}
)

const chunkSize = 1 << 20

// perfEnv is what the workloads share: the sizes, a tarball of Go source,
// its entry count and the random source for offsets.
type perfEnv struct {
	sz      perfSizes
	tarball string
	tarSrc  string   // directory the tarball was made from (for diff in verify mode)
	entries []string // the tarball's listing
	verify  bool     // also diff the untarred tree (smoke test)
	base    []byte   // one MiB of random bytes; chunk i is base with i in its first 8 bytes
}

func newPerfEnv(t testing.TB, sz perfSizes, scratch string, verify bool) *perfEnv {
	t.Helper()
	e := &perfEnv{sz: sz, verify: verify, base: make([]byte, chunkSize)}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range e.base {
		e.base[i] = byte(r.Uint32())
	}
	src := filepath.Join(goroot(t), "src")
	parts := sz.tarSubdirs
	if parts == nil {
		parts = []string{"."}
	}
	e.tarSrc = src
	e.tarball = filepath.Join(scratch, "src.tar")
	run(t, src, "tar", append([]string{"cf", e.tarball}, parts...)...)
	e.entries = strings.Split(strings.TrimSpace(run(t, "", "tar", "tf", e.tarball)), "\n")
	return e
}

// stampChunk makes buf (a clone of base) chunk i. The writers reuse one
// buffer: a fresh MiB per write made the Go writer, not the file system,
// the bottleneck of a sequential write.
func stampChunk(buf []byte, i int) []byte {
	bin.LittleEndian.PutUint64(buf, uint64(i))
	return buf
}

// perfStep is one timed workload. prep runs untimed before it, check untimed
// after it; steps of one side run in order in the same directory, so a step
// may use what an earlier one left.
type perfStep struct {
	name  string
	cold  bool // run on the side's cold root, if it has one
	prep  func(e *perfEnv, dir string) error
	run   func(e *perfEnv, dir string) error
	check func(e *perfEnv, dir string) error
}

func perfSteps(sz perfSizes) []perfStep {
	var steps []perfStep
	for _, mib := range sz.seqMiB {
		name := "seq-" + strconv.Itoa(mib) + "MiB"
		file := name
		steps = append(steps,
			perfStep{name: "seqwrite-fsync-" + strconv.Itoa(mib) + "MiB",
				run:   func(e *perfEnv, dir string) error { return e.writeSeq(filepath.Join(dir, file), mib) },
				check: func(e *perfEnv, dir string) error { return e.sizeIs(filepath.Join(dir, file), int64(mib)*chunkSize) }},
			// Cold: nothing of the file in the kernel's caches, nor in a
			// leasefs mount's own, which kept what it wrote: another mount
			// of the same server reads it.
			perfStep{name: "seqread-cold-" + strconv.Itoa(mib) + "MiB", cold: true,
				prep: func(*perfEnv, string) error { return dropCaches() },
				run:  func(e *perfEnv, dir string) error { return e.readSeq(filepath.Join(dir, file), mib) }},
			// Steps run pass by pass (every pass of one step, then the
			// next step), so the cold reads of the other passes came in
			// between: read it once more first, untimed, to re-read a
			// file just read.
			perfStep{name: "reread-" + strconv.Itoa(mib) + "MiB",
				prep: func(e *perfEnv, dir string) error { return e.readSeq(filepath.Join(dir, file), mib) },
				run:  func(e *perfEnv, dir string) error { return e.readSeq(filepath.Join(dir, file), mib) }},
		)
	}
	var written map[int64]uint64 // randwrite's offsets and stamps, checked afterwards
	steps = append(steps,
		perfStep{name: "randread-4k",
			prep: func(e *perfEnv, dir string) error {
				if err := e.writeSeq(filepath.Join(dir, "rand"), e.sz.randMiB); err != nil {
					return err
				}
				return dropCaches()
			},
			run: func(e *perfEnv, dir string) error { return e.randRead(filepath.Join(dir, "rand")) }},
		perfStep{name: "randwrite-4k-buffered",
			run: func(e *perfEnv, dir string) (err error) {
				written, err = e.randWrite(filepath.Join(dir, "rand"))
				return err
			},
			check: func(e *perfEnv, dir string) error { return checkRandWrites(filepath.Join(dir, "rand"), written) }},
		perfStep{name: "create",
			prep: func(_ *perfEnv, dir string) error { return os.Mkdir(filepath.Join(dir, "files"), 0o755) },
			run: func(e *perfEnv, dir string) error {
				for i := range e.sz.files {
					fd, err := syscall.Open(filepath.Join(dir, "files", "f"+strconv.Itoa(i)), syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY|syscall.O_CLOEXEC, 0o644)
					if err != nil {
						return fmt.Errorf("create %d: %w", i, err)
					}
					if err := syscall.Close(fd); err != nil {
						return fmt.Errorf("close %d: %w", i, err)
					}
				}
				return nil
			},
			check: func(e *perfEnv, dir string) error { return countEntries(filepath.Join(dir, "files"), e.sz.files) }},
		perfStep{name: "stat",
			// past the loopback's 1 s attribute timeout, so the kernel asks again
			prep: func(*perfEnv, string) error { time.Sleep(1100 * time.Millisecond); return nil },
			run: func(e *perfEnv, dir string) error {
				var st syscall.Stat_t
				for i := range e.sz.files {
					if err := syscall.Lstat(filepath.Join(dir, "files", "f"+strconv.Itoa(i)), &st); err != nil {
						return fmt.Errorf("stat %d: %w", i, err)
					}
					if st.Size != 0 || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
						return fmt.Errorf("stat %d: size %d mode %o", i, st.Size, st.Mode)
					}
				}
				return nil
			}},
		perfStep{name: "unlink",
			run: func(e *perfEnv, dir string) error {
				for i := range e.sz.files {
					if err := syscall.Unlink(filepath.Join(dir, "files", "f"+strconv.Itoa(i))); err != nil {
						return fmt.Errorf("unlink %d: %w", i, err)
					}
				}
				return nil
			},
			check: func(_ *perfEnv, dir string) error { return countEntries(filepath.Join(dir, "files"), 0) }},
		perfStep{name: "open-append-close",
			run: func(e *perfEnv, dir string) error {
				p := filepath.Join(dir, "log")
				for i := range e.sz.files {
					f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
					if err != nil {
						return err
					}
					if _, err := fmt.Fprintf(f, "line %d\n", i); err != nil {
						f.Close()
						return err
					}
					if err := f.Close(); err != nil {
						return err
					}
				}
				return nil
			},
			check: func(e *perfEnv, dir string) error {
				b, err := os.ReadFile(filepath.Join(dir, "log"))
				if err != nil {
					return err
				}
				var want bytes.Buffer
				for i := range e.sz.files {
					fmt.Fprintf(&want, "line %d\n", i)
				}
				if !bytes.Equal(b, want.Bytes()) {
					return fmt.Errorf("log: %d bytes, want %d, or content differs", len(b), want.Len())
				}
				return nil
			}},
		perfStep{name: "untar",
			prep: func(_ *perfEnv, dir string) error { return os.Mkdir(filepath.Join(dir, "untar"), 0o755) },
			run: func(e *perfEnv, dir string) error {
				_, err := runCmd(filepath.Join(dir, "untar"), "tar", "xf", e.tarball)
				return err
			},
			check: func(e *perfEnv, dir string) error {
				for _, name := range e.entries {
					if _, err := os.Lstat(filepath.Join(dir, "untar", name)); err != nil {
						return fmt.Errorf("untar: %w", err)
					}
				}
				if e.verify {
					for _, p := range e.sz.tarSubdirs {
						if _, err := runCmd("", "diff", "-r", filepath.Join(e.tarSrc, p), filepath.Join(dir, "untar", p)); err != nil {
							return err
						}
					}
				}
				return nil
			}},
		perfStep{name: "rm-rf",
			run: func(_ *perfEnv, dir string) error {
				_, err := runCmd(dir, "rm", "-rf", "untar")
				return err
			},
			check: func(_ *perfEnv, dir string) error {
				if _, err := os.Lstat(filepath.Join(dir, "untar")); !errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("untar still there after rm -rf: %v", err)
				}
				return nil
			}},
	)
	return steps
}

func runCmd(dir, name string, args ...string) (string, error) {
	out, err := runErr(dir, name, args...)
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return out, nil
}

func (e *perfEnv) writeSeq(p string, mib int) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	buf := slices.Clone(e.base)
	for i := range mib {
		if _, err := f.Write(stampChunk(buf, i)); err != nil {
			f.Close()
			return fmt.Errorf("write %s chunk %d: %w", p, i, err)
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("fsync %s: %w", p, err)
	}
	return f.Close()
}

// readSeq reads p in 1 MiB reads and compares every chunk (memcmp is cheap
// next to a FUSE round trip, and the same on both sides).
func (e *perfEnv) readSeq(p string, mib int) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, chunkSize)
	for i := range mib {
		if _, err := io.ReadFull(f, buf); err != nil {
			return fmt.Errorf("read %s chunk %d: %w", p, i, err)
		}
		if bin.LittleEndian.Uint64(buf) != uint64(i) || !bytes.Equal(buf[8:], e.base[8:]) {
			return fmt.Errorf("read %s: chunk %d differs", p, i)
		}
	}
	if n, _ := f.Read(buf); n != 0 {
		return fmt.Errorf("read %s: %d bytes past the end", p, n)
	}
	return nil
}

func (e *perfEnv) sizeIs(p string, want int64) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.Size() != want {
		return fmt.Errorf("%s: size %d, want %d", p, st.Size(), want)
	}
	return nil
}

// randRead does randOps 4 KiB preads at 4 KiB-aligned offsets of a file
// written by writeSeq and checks each against the pattern.
func (e *perfEnv) randRead(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	r := rand.New(rand.NewPCG(3, 4))
	pages := int64(e.sz.randMiB) * chunkSize / 4096
	buf := make([]byte, 4096)
	for range e.sz.randOps {
		off := r.Int64N(pages) * 4096
		if _, err := f.ReadAt(buf, off); err != nil {
			return fmt.Errorf("pread %s at %d: %w", p, off, err)
		}
		in := int(off % chunkSize)
		got, want := buf, e.base[in:in+4096]
		if in == 0 {
			if bin.LittleEndian.Uint64(buf) != uint64(off/chunkSize) {
				return fmt.Errorf("pread %s at %d: wrong chunk stamp", p, off)
			}
			got, want = got[8:], want[8:]
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("pread %s at %d: data differs", p, off)
		}
	}
	return nil
}

// randWrite does randOps 4 KiB pwrites (no fsync) at random aligned offsets;
// each page is filled with a stamp so the check can tell them apart. The
// close is timed too: it is where a write-back cache pays.
func (e *perfEnv) randWrite(p string) (map[int64]uint64, error) {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(5, 6))
	pages := int64(e.sz.randMiB) * chunkSize / 4096
	written := make(map[int64]uint64, e.sz.randOps)
	buf := make([]byte, 4096)
	for i := range e.sz.randOps {
		off := r.Int64N(pages) * 4096
		stamp := uint64(i)<<32 | 0xfeed
		for j := 0; j < len(buf); j += 8 {
			bin.LittleEndian.PutUint64(buf[j:], stamp)
		}
		if _, err := f.WriteAt(buf, off); err != nil {
			f.Close()
			return nil, fmt.Errorf("pwrite %s at %d: %w", p, off, err)
		}
		written[off] = stamp
	}
	return written, f.Close()
}

func checkRandWrites(p string, written map[int64]uint64) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for off, stamp := range written {
		if _, err := f.ReadAt(buf, off); err != nil {
			return fmt.Errorf("read back %s at %d: %w", p, off, err)
		}
		for j := 0; j < len(buf); j += 8 {
			if bin.LittleEndian.Uint64(buf[j:]) != stamp {
				return fmt.Errorf("read back %s at %d+%d: %#x, want %#x", p, off, j, bin.LittleEndian.Uint64(buf[j:]), stamp)
			}
		}
	}
	return nil
}

func countEntries(dir string, want int) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(ents) != want {
		return fmt.Errorf("%s: %d entries, want %d", dir, len(ents), want)
	}
	return nil
}

// dropCaches empties the page, dentry and inode caches so that the next read
// goes through FUSE to the file system.
func dropCaches() error {
	syscall.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		return fmt.Errorf("drop caches (needs root): %w", err)
	}
	return nil
}

// tmpfsDir returns a fresh directory on tmpfs (/dev/shm), removed at cleanup,
// so that neither file system measures a disk.
func tmpfsDir(t testing.TB, name string) string {
	t.Helper()
	var st syscall.Statfs_t
	const tmpfsMagic = 0x01021994
	if err := syscall.Statfs("/dev/shm", &st); err != nil || st.Type != tmpfsMagic {
		t.Skip("/dev/shm is not a tmpfs")
	}
	d, err := os.MkdirTemp("/dev/shm", "leasefs-perf-"+name+"-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// startPerfLeasefs starts a server whose data directory is on tmpfs and
// mounts it; both log at info level (debug logging costs time).
func startPerfLeasefs(t testing.TB, mountArgs ...string) (*server, *mount) {
	t.Helper()
	requireFUSE(t)
	s := &server{dir: tmpfsDir(t, "data"), addr: testnet.UDPAddr(t), extra: []string{"--log-level", "info"}}
	s.tokenFile = filepath.Join(s.dir, "token")
	s.start(t)
	return s, startMount(t, s, append(mountArgs, "--log-level", "info")...)
}

// perfSettle is m's sync, which ends each timed step; a build from
// before the mount's status socket (LEASEFS_BINARY) is timed without it.
func perfSettle(m *mount) func() error {
	return func() error {
		err := m.sync()
		if err != nil && os.Getenv("LEASEFS_BINARY") != "" && strings.Contains(err.Error(), "no status socket") {
			return nil
		}
		return err
	}
}

// perfMountArgs are the perf suite's extra mount flags:
// LEASEFS_PERF_REMOTE=1 makes its mounts reach the block store through
// the server's HTTPS endpoint, as mounts on other hosts do.
func perfMountArgs() []string {
	if os.Getenv("LEASEFS_PERF_REMOTE") == "1" {
		return []string{"--blocks-remote"}
	}
	return nil
}

// mountLoopback mounts go-fuse's loopback over a tmpfs directory, served by
// a process of its own (TestLoopbackDaemon: this test binary started again)
// as any FUSE file system is, leasefs's mount too. Served by the process
// that also runs the workloads, it was up to a third faster for small
// operations on this machine, where a switch between threads of one
// process costs much less than one between two processes.
func mountLoopback(t testing.TB) string {
	t.Helper()
	requireFUSE(t)
	src := tmpfsDir(t, "loopback")
	mnt := filepath.Join(t.TempDir(), "loopback")
	must(t, os.Mkdir(mnt, 0o755))
	t.Cleanup(func() {
		if isMounted(mnt) { // the daemon did not unmount
			_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
	startHelper(t, "TestLoopbackDaemon", src+"\n"+mnt, "mounted")
	return mnt
}

// TestLoopbackDaemon is mountLoopback's daemon: it mounts go-fuse's
// loopback of its argument's source directory at its mountpoint (a newline
// between them), with passthrough off, and serves until its test is done.
//
// Passthrough: in go-fuse v2.12 a LoopbackFile offers its fd
// (FilePassthroughFder) and the bridge registers it as a backing file
// whenever the kernel granted CAP_PASSTHROUGH at INIT; reads and writes then
// bypass the FUSE server. Masking the capability makes the registration
// fail, so every read and write goes through FUSE. Timeouts and sizes follow
// go-fuse's example/loopback, with leasefs's 1 MiB max write.
func TestLoopbackDaemon(t *testing.T) {
	src, mnt, ok := strings.Cut(helperArg(), "\n")
	if !ok {
		t.Skip("run by mountLoopback")
	}
	root, err := gofs.NewLoopbackRoot(src)
	must(t, err)
	sec := time.Second
	opts := &gofs.Options{
		AttrTimeout:  &sec,
		EntryTimeout: &sec,
		MountOptions: fuse.MountOptions{
			FsName:               "loopback",
			Name:                 "loopback",
			MaxWrite:             1 << 20,
			MaxReadAhead:         1 << 20,
			DisabledCapabilities: fuse.CAP_PASSTHROUGH,
		},
	}
	if os.Geteuid() == 0 {
		opts.DirectMount = true
		opts.AllowOther = true
	}
	srv, err := gofs.Mount(mnt, root, opts)
	must(t, err)
	helperWait("mounted")
	if err := srv.Unmount(); err != nil {
		_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
	}
}

// runStep runs one step in dir and returns the time of its timed part: the
// step's work, then settle (if set). A leasefs mount sends some changes
// behind the caller (creates, removals, attribute changes under X); they
// are its work too, and left running they would slow the other side's
// pass that follows.
func runStep(e *perfEnv, st perfStep, dir string, settle func() error) (time.Duration, error) {
	if st.prep != nil {
		if err := st.prep(e, dir); err != nil {
			return 0, fmt.Errorf("%s: prepare: %w", st.name, err)
		}
	}
	start := time.Now()
	if err := st.run(e, dir); err != nil {
		return 0, fmt.Errorf("%s: %w", st.name, err)
	}
	if settle != nil {
		if err := settle(); err != nil {
			return 0, fmt.Errorf("%s: settle: %w", st.name, err)
		}
	}
	d := time.Since(start)
	if st.check != nil {
		if err := st.check(e, dir); err != nil {
			return 0, fmt.Errorf("%s: check: %w", st.name, err)
		}
	}
	return d, nil
}

// vmRSS returns a process's resident, peak resident and anonymous resident
// set in KiB. Badger maps its files, which here live on tmpfs, so VmRSS
// counts store pages too; RssAnon is the process's own heap and stacks.
func vmRSS(pid int) (rss, hwm, anon int) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1, -1, -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		switch k {
		case "VmRSS":
			rss = n
		case "VmHWM":
			hwm = n
		case "RssAnon":
			anon = n
		}
	}
	return rss, hwm, anon
}

// rssOf formats a process's resident set sizes (vmRSS) under name.
func rssOf(name string, p *proc) string {
	r, h, a := vmRSS(p.cmd.Process.Pid)
	return fmt.Sprintf("%s %7d KiB (peak %7d, anon %7d)", name, r, h, a)
}

func rssLine(when string, s *server, m *mount) string {
	return fmt.Sprintf("RSS %-12s %s   %s", when, rssOf("server", s.proc), rssOf("mount", m.proc))
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// perfSizesFromEnv is perfDefault, or perfFull with LEASEFS_PERF_FULL=1.
func perfSizesFromEnv() perfSizes {
	if os.Getenv("LEASEFS_PERF_FULL") == "1" {
		return perfFull
	}
	return perfDefault
}

// perfSide is one file system a benchmark compares: a mounted root, and
// for a leasefs mount its sync (syncMount), which ends each timed step.
type perfSide struct {
	name, root string
	// cold, if set, is the root of another mount of the same files, with
	// caches of its own, where the cold steps run.
	cold   string
	settle func() error
}

// perfRow is one workload's median time on each side, in the sides' order.
type perfRow struct {
	name string
	med  []time.Duration
}

// runPerfPasses runs every workload as a sub-benchmark, b.N times on each
// side in turn (so -benchtime 3x gives three interleaved passes), and
// returns the medians of the last call; report turns one workload's
// medians into metrics.
func runPerfPasses(b *testing.B, e *perfEnv, sides []perfSide, report func(b *testing.B, med []time.Duration)) []perfRow {
	var rows []perfRow
	for _, st := range perfSteps(e.sz) {
		// The testing package calls the function with N=1 and then, for
		// -benchtime Nx with N > 1, again with N; every step sees the same
		// calls, so counting passes per step across calls gives step k the
		// directories step k-1 used. Only the last call's times are reported.
		pass := 0
		b.Run(st.name, func(b *testing.B) {
			times := make([][]time.Duration, len(sides))
			for range b.N {
				pass++
				for i, side := range sides {
					root := side.root
					if st.cold && side.cold != "" {
						root = side.cold
					}
					dir := filepath.Join(root, "pass"+strconv.Itoa(pass))
					if err := os.MkdirAll(dir, 0o755); err != nil {
						b.Fatal(err)
					}
					d, err := runStep(e, st, dir, side.settle)
					if err != nil {
						b.Fatalf("%s (%s): %v", side.name, side.root, err)
					}
					times[i] = append(times[i], d)
				}
			}
			med := make([]time.Duration, len(sides))
			for i := range sides {
				med[i] = median(times[i])
			}
			report(b, med)
			if len(rows) > 0 && rows[len(rows)-1].name == st.name {
				rows = rows[:len(rows)-1] // an earlier call's times
			}
			rows = append(rows, perfRow{st.name, med})
		})
	}
	return rows
}

// BenchmarkPerf runs every workload once per b.N on leasefs and then on the
// loopback (so -benchtime 3x gives three interleaved passes) and reports the
// medians and their ratio.
func BenchmarkPerf(b *testing.B) {
	sz := perfSizesFromEnv()
	s, m := startPerfLeasefs(b, perfMountArgs()...)
	reader := startMount(b, s, append(perfMountArgs(), "--log-level", "info")...)
	loop := mountLoopback(b)
	e := newPerfEnv(b, sz, tmpfsDir(b, "scratch"), false)
	atRest := rssLine("at rest", s, m)

	rows := runPerfPasses(b, e, []perfSide{{name: "leasefs", root: m.dir, cold: reader.dir, settle: perfSettle(m)}, {name: "loopback", root: loop}}, func(b *testing.B, med []time.Duration) {
		l, p := med[0], med[1]
		b.ReportMetric(float64(l.Nanoseconds()), "ns/op")
		b.ReportMetric(l.Seconds(), "leasefs-s")
		b.ReportMetric(p.Seconds(), "loopback-s")
		b.ReportMetric(p.Seconds()/l.Seconds(), "ratio")
	})
	var out strings.Builder
	fmt.Fprintf(&out, "\nleasefs vs go-fuse loopback (passthrough off), tmpfs, sizes %+v\n", sz)
	fmt.Fprintf(&out, "%-26s %12s %12s %7s\n", "workload", "leasefs", "loopback", "ratio")
	for _, r := range rows {
		l, p := r.med[0], r.med[1]
		fmt.Fprintf(&out, "%-26s %12s %12s %7.2f\n", r.name, l.Round(time.Microsecond),
			p.Round(time.Microsecond), p.Seconds()/l.Seconds())
	}
	fmt.Fprintf(&out, "%s\n%s\n", atRest, rssLine("after suite", s, m))
	fmt.Print(out.String())
}

// runPerfSmoke runs every workload at the tiny size, with the data checks
// (tar's tree diffed against its source), in a fresh directory under root.
func runPerfSmoke(t *testing.T, root string) {
	t.Helper()
	e := newPerfEnv(t, perfTiny, tmpfsDir(t, "scratch"), true)
	dir := filepath.Join(root, "smoke")
	must(t, os.Mkdir(dir, 0o755))
	for _, st := range perfSteps(perfTiny) {
		d, err := runStep(e, st, dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%-26s %v", st.name, d)
	}
}

// TestPerfSmoke runs every workload of the suite at a tiny size against
// leasefs only, with the data checks, so the suite cannot rot unnoticed.
func TestPerfSmoke(t *testing.T) {
	s, m := startPerfLeasefs(t)
	runPerfSmoke(t, m.dir)
	t.Log(rssLine("after smoke", s, m))
}
