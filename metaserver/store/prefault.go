package store

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Prefaulting badger's value log on tmpfs. Badger writes the value log
// (file data) through a shared mapping of the file, so the first write to
// each page faults, inside badger's one writer goroutine; where the
// hypervisor shadows page tables a fault costs more than the copy. A
// goroutine of ours keeps the pages just ahead of the log's end populated
// and touched (populate), which costs less than the faults and is off the
// writer's path.
//
// Badger does not say where its log ends. The prefaulter learns it when it
// finds a log file (SEEK_HOLE: nothing of the file is populated ahead yet)
// and then adds what committed transactions wrote to the log, counted low
// (entry headers vary), so that it never runs more than prefaultAhead past
// the end: the pages it populates are pages badger writes next.

// onTmpfs reports whether dir is on tmpfs, where the prefaulter runs. On a
// disk, the pages it touches ahead would be written twice (zeros, then
// badger's data) by a sync between the two.
func onTmpfs(dir string) bool {
	var st syscall.Statfs_t
	return syscall.Statfs(dir, &st) == nil && st.Type == 0x01021994 // TMPFS_MAGIC
}

const (
	prefaultAhead = 8 << 20 // bytes kept populated past the log's end
	// prefaultStep is how far the end moves before the next call: a
	// populate call per step, not per transaction
	prefaultStep = 2 << 20
	// madvPopulateWrite is MADV_POPULATE_WRITE (Linux 5.14), which the
	// syscall package does not name
	madvPopulateWrite = 23
)

type prefaulter struct {
	dir      string      // badger's directory
	fileSize int64       // ValueLogFileSize: badger starts a new file past it
	space    *spaceGuard // nil: no limit
	log      *slog.Logger
	wrote    atomic.Int64 // log bytes committed since the goroutine last looked
	kick     chan struct{}
	stop     chan struct{}
	done     chan struct{}

	// the goroutine's
	file       string       // the log file badger writes
	addr, size uintptr      // its mapping
	end        int64        // where its written part ends, counted low
	populated  int64        // pages below this are populated
	failures   int          // populate calls failed in a row
	ahead      atomic.Int64 // bytes populated past the end, for tests
}

func startPrefaulter(dir string, fileSize int64, space *spaceGuard, log *slog.Logger) *prefaulter {
	p := &prefaulter{dir: dir, fileSize: fileSize, space: space, log: log, kick: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

// committed counts a committed transaction's writes to the value log: the
// values of threshold bytes or more, with their keys.
func (p *prefaulter) committed(bytes int64) {
	if p == nil || bytes == 0 {
		return
	}
	if p.wrote.Add(bytes) >= prefaultStep {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

func (p *prefaulter) close() {
	if p != nil {
		close(p.stop)
		<-p.done
	}
}

func (p *prefaulter) run() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case <-p.kick:
		}
		if err := p.advance(p.wrote.Swap(0)); err != nil {
			// (an old kernel, a file system without SEEK_HOLE): badger
			// faults its pages in itself, as it always did
			p.log.Info("not prefaulting the value log", "err", err)
			for {
				select {
				case <-p.stop:
					return
				case <-p.kick:
					p.wrote.Store(0)
				}
			}
		}
	}
}

// advance moves the end on by wrote bytes and populates the pages up to
// prefaultAhead past it.
func (p *prefaulter) advance(wrote int64) error {
	p.end += wrote
	if p.file == "" || p.end+prefaultAhead >= p.fileSize {
		// near a file's end badger may have started the next
		if err := p.findFile(); err != nil || p.file == "" {
			return err // nothing mapped yet: next time
		}
	}
	// not past fileSize: badger truncates a file it finished to its end,
	// a little past that
	target := min(p.end+prefaultAhead, p.fileSize, int64(p.size)) &^ (pageBytes - 1)
	from := max(p.populated, p.end&^(pageBytes-1))
	if target-from < prefaultStep {
		return nil
	}
	if !p.space.ample(target - from) {
		// the pages populated ahead count as used: near the reserve they
		// would turn writes away that badger could still take
		return nil
	}
	if err := p.populate(from, target); err != nil {
		// badger may have finished the file meanwhile and started the
		// next: look again, and give up only if that keeps failing
		if ferr := p.findFile(); ferr != nil {
			return ferr
		}
		if p.failures++; p.failures >= 3 {
			return err
		}
		return nil
	}
	p.failures = 0
	p.populated = target
	p.ahead.Store(p.populated - p.end)
	return nil
}

// populate maps the file's pages in [from, to) writable, and touches each:
// the hypervisor shadows a page table entry at the first access, wherever
// the kernel made it. The touch adds 0 atomically: a page badger writes at
// the same time keeps what it writes, and if the file was unmapped under
// us (badger finished it) the fault is an error, not a crash.
func (p *prefaulter) populate(from, to int64) error {
	if err := madvise(p.addr+uintptr(from), uintptr(to-from), madvPopulateWrite); err != nil {
		return err
	}
	return p.touch(from, to)
}

func (p *prefaulter) touch(from, to int64) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("touching the value log's pages: %v", r)
		}
	}()
	base := *(*unsafe.Pointer)(unsafe.Pointer(&p.addr)) // not Go memory: badger's mapping
	for off := from; off < to; off += pageBytes {
		atomic.AddUint32((*uint32)(unsafe.Add(base, off)), 0)
	}
	return nil
}

func madvise(addr, n uintptr, advice int) error {
	if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, addr, n, uintptr(advice)); e != 0 {
		return os.NewSyscallError("madvise", e)
	}
	return nil
}

const pageBytes = 4096

// findFile finds the newest value log file, its mapping, and where its
// written part ends: at its first hole, since nothing past the end of a
// file found anew is populated yet.
func (p *prefaulter) findFile() error {
	names, err := filepath.Glob(filepath.Join(p.dir, "*.vlog"))
	if err != nil || len(names) == 0 {
		return err
	}
	newest := slices.Max(names) // zero-padded numbers
	if newest == p.file {
		return nil
	}
	addr, size, err := mapping(newest)
	if err != nil || size == 0 {
		return err
	}
	f, err := os.Open(newest)
	if err != nil {
		return err
	}
	defer f.Close()
	end, err := f.Seek(0, 4 /* SEEK_HOLE */)
	if err != nil {
		return err
	}
	p.file, p.addr, p.size, p.end, p.populated = newest, addr, size, end, 0
	return nil
}

// mapping returns the address and size of this process's mapping of file
// (0 if none).
func mapping(file string) (uintptr, uintptr, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadString('\n')
		if strings.HasSuffix(strings.TrimSuffix(line, "\n"), " "+file) {
			span, _, _ := strings.Cut(line, " ")
			lo, hi, _ := strings.Cut(span, "-")
			a, err1 := strconv.ParseUint(lo, 16, 64)
			b, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 == nil && err2 == nil && b > a {
				return uintptr(a), uintptr(b - a), nil
			}
		}
		if err == io.EOF {
			return 0, 0, nil
		}
		if err != nil {
			return 0, 0, err
		}
	}
}
