package store

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/leasefs/leasefs/wire"
)

// Space on the data directory's file system. Badger writes its value log,
// its write-ahead logs (memtable .mem files) and its tables through shared
// memory maps of sparse files: a page the file system cannot back when
// badger first touches it kills the server with SIGBUS, and a restart that
// replays the logs onto the same full disk dies the same way. So badger
// must never run out of space, and the server keeps it from doing so:
//
//   - Every transaction is admitted before it commits (spaceGuard.admit),
//     with what it will add to the value log and the write-ahead log counted
//     high; one that would leave less than the reserve free fails with
//     wire.CodeNoSpace (ENOSPC at the client) and writes nothing.
//   - The reserve is the floor, which covers what badger writes on its own
//     (the tables its memtables will be flushed into, a compaction, the
//     first pages of new files), and the room, which removals may use: a
//     transaction that removes records and adds nothing to the value log
//     may go down to the floor, so that a full file system can be emptied.
//   - The room is held by a file (DIR/space-reserve, allocated), so that
//     what fills the file system from outside cannot take it: a removal
//     that needs it, or a start that finds less than the floor free, gives
//     it up; it is taken again once the space is there.
//   - When space is short and records were removed, the store makes
//     badger give their space back at once (Store.reclaim) instead of at
//     its next compaction and value log collection.
//   - Badger's next write-ahead log is made ahead, its blocks allocated
//     (prepareWAL): its writes there take no block from the file system.
//     Value log files badger creates itself (exclusively), and tables it
//     creates and fills in one call: what admission counts and the floor
//     cover them (on tmpfs the prefaulter populates the value log's pages
//     ahead, as before).
//   - Badger's file sizes fit the file system (sizesFor).
//
// statfs reports the free space less the reserve: what clients can write.

const (
	// reserveFile holds the room in the data directory.
	reserveFile = "space-reserve"
	// spareBytes: the floor's part for badger's small files (DISCARD,
	// MANIFEST) and the first pages of the files it starts.
	spareBytes = 2 << 20
	// maxGCRatio is the least garbage a value log file collected with
	// hardly any space left must hold: its rewrite is a few KiB.
	maxGCRatio = 0.999
	// maxCompaction bounds the LSM tree's part of the floor: a compaction
	// writes its tables before it deletes those it merged, but never the
	// whole of a large tree at once.
	maxCompaction = 512 << 20
	// txnSlack covers the partial pages a transaction's entries start in
	// the value log and the write-ahead log.
	txnSlack = 2 * pageBytes
	// entryOverhead is the most badger adds to an entry: a header of up
	// to 22 bytes, the key's 8-byte version and a 4-byte checksum.
	entryOverhead = 22 + 8 + 4
	// valuePointerBytes is what stands for a value-log value in the
	// write-ahead log.
	valuePointerBytes = 12
	// txnMarkerBytes is badger's commit entry per transaction.
	txnMarkerBytes = entryOverhead + 16 + 20
)

// ErrNoSpace: the data directory's file system is too full to open the
// store safely.
var ErrNoSpace = errors.New("store: data file system full")

// memtableSize is badger's MemTableSize. Not smaller on a small file
// system: it caps a transaction (15% of it), and a scattered write of
// maxWritePages pieces under 1 KiB, which stay in the LSM tree, takes 2.2
// MB of that.
const memtableSize = 16 << 20

// badgerSizes are sizes the store picks, fitted to the file system.
type badgerSizes struct {
	// vlogFile is ValueLogFileSize. On a small file system 256 MiB
	// files would leave all the data in the newest, which is never
	// collected: removed data would never give its space back.
	vlogFile int64
	// room is the removals' room (space.go), walAhead what prepareWAL
	// allocates of the next write-ahead log: the whole of one (a
	// memtable is full past its size by a batch, 15%, at most) on a
	// large file system, a sixteenth of a small one.
	room, walAhead int64
}

func sizesFor(total int64) badgerSizes {
	return badgerSizes{
		vlogFile: clampMiB(total/8, 8<<20, valueLogFileSize),
		// removals' deletion markers, and the tables they are flushed
		// into (a purge of a 1 GiB file writes 9 MiB of them); the
		// reserve file also lets a server start on a file system filled
		// from outside, which replays and flushes the write-ahead logs
		room:     clampMiB(total/16, 4<<20, memtableSize) + spareBytes,
		walAhead: clampMiB(total/16, 4<<20, memtableSize+memtableSize*15/100+1<<20),
	}
}

func clampMiB(v, lo, hi int64) int64 {
	return min(max(v, lo), hi) &^ (1<<20 - 1)
}

// txnCost is what one transaction adds to badger's files, counted high.
type txnCost struct {
	vlog, wal int64
	removes   int   // records of names, attributes or data deleted
	admitted  int64 // bytes admitted so far
	// walAdmitted is the part of wal admitted so far
	walAdmitted int64
	guard       *spaceGuard // that admitted them
}

// bytes is the space the transaction may take.
func (c *txnCost) bytes() int64 { return c.vlog + c.wal + txnMarkerBytes + txnSlack }

// set counts a record written; vlog says whether its value goes to the
// value log.
func (c *txnCost) set(key, val []byte, vlog bool) {
	if vlog {
		c.vlog += int64(entryOverhead + len(key) + len(val))
		c.wal += int64(entryOverhead + len(key) + valuePointerBytes)
	} else {
		c.wal += int64(entryOverhead + len(key) + len(val))
	}
}

func (c *txnCost) del(key []byte) {
	c.wal += int64(entryOverhead + len(key))
	if len(key) > 0 {
		switch key[0] {
		case RecAttr, RecEntry, RecCookie, RecPage, RecXattr, RecSymlink, RecExtent, RecBlock, RecGarbage:
			c.removes++
		}
	}
}

// removal reports whether the transaction gives space back: it removes
// records and adds nothing to the value log.
func (c *txnCost) removal() bool { return c.removes > 0 && c.vlog == 0 }

// done ends the transaction: what was admitted for it is committed (or
// not written at all).
func (c *txnCost) done() {
	if c.admitted > 0 {
		c.guard.release(c.admitted)
		c.admitted = 0
	}
}

// spaceGuard keeps badger's file system from filling. Safe for concurrent
// use.
type spaceGuard struct {
	dir   string // the data directory (the reserve file's)
	log   *slog.Logger
	sizes badgerSizes
	room  int64
	// statfs reports the bytes free to us and the file system's size
	// (Options.Statfs for tests).
	statfs  func(dir string) (avail, total int64, err error)
	dirFile *os.File // dir, for fstatfs (nil with a test's statfs)

	dbDir string // badger's

	mu      sync.Mutex
	pending int64 // admitted, not yet committed (so not yet in statfs)
	// lastAvail is what statfs said at lastStat, committed what was
	// admitted and committed since: admit asks statfs again only when
	// that is old or the space near the reserve (availLocked).
	lastAvail, committed int64
	lastStat             time.Time
	held                 int64 // the reserve file's allocated bytes
	lsm                  int64 // the LSM tree's size
	// walByLog is what was admitted to each of badger's write-ahead logs
	// (memtable .mem files) still on disk: the tables their memtables
	// become. A log's blocks say nothing of it, allocated ahead as they
	// are (prepareWAL). walCur is what was admitted since measure last
	// gave it to the newest log, the one badger writes (what it gave
	// there went partly to the one before, if badger started a log
	// meanwhile: counted twice until that is flushed and deleted).
	walByLog map[string]int64
	memWAL   int64 // the sum of walByLog
	walCur   int64
	full     bool // refusing changes that add data (logged once)

	noPrealloc atomic.Bool // the file system has no fallocate: prepareWAL stops

	// refused counts transactions refused, removed the removals
	// committed: the store's loop reclaims when space is short and
	// either moved since it last did.
	refused, removed atomic.Int64
}

// newSpaceGuard measures dir's file system and the reserve file in it;
// badger's files are in dbDir.
func newSpaceGuard(dir, dbDir string, log *slog.Logger, statfs func(string) (int64, int64, error)) (*spaceGuard, error) {
	g := &spaceGuard{dir: dir, dbDir: dbDir, log: log, statfs: statfs}
	if statfs == nil {
		f, err := os.Open(dir)
		if err != nil {
			return nil, err
		}
		g.dirFile = f
		g.statfs = func(string) (int64, int64, error) { return fstatfsBytes(f) }
	}
	_, total, err := g.statfs(dir)
	if err != nil {
		g.close()
		return nil, err
	}
	g.sizes = sizesFor(total)
	g.room = g.sizes.room
	g.held = allocatedBytes(filepath.Join(dir, reserveFile))
	return g, nil
}

// close closes the data directory the guard keeps open.
func (g *spaceGuard) close() {
	if g != nil && g.dirFile != nil {
		g.dirFile.Close()
		g.dirFile = nil
	}
}

// fstatfsBytes is the free bytes and size of f's file system (fstatfs: no
// path to walk, half a statfs's cost).
func fstatfsBytes(f *os.File) (avail, total int64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(int(f.Fd()), &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", f.Name(), err)
	}
	unit := st.Frsize
	if unit == 0 {
		unit = st.Bsize
	}
	return int64(st.Bavail) * unit, int64(st.Blocks) * unit, nil
}

// statLocked asks statfs, and keeps its answer for availLocked. Called
// with mu held.
func (g *spaceGuard) statLocked() (avail, total int64, err error) {
	avail, total, err = g.statfs(g.dir)
	if err == nil {
		g.lastAvail, g.committed, g.lastStat = avail, 0, time.Now()
	}
	return avail, total, err
}

const (
	// statfsAge and statfsMargin: admit takes statfs's last answer less
	// what it admitted since, if it is younger than statfsAge and leaves
	// statfsMargin above the limit; it asks again otherwise. A
	// transaction costs a few µs; statfs another.
	statfsAge    = 100 * time.Millisecond
	statfsMargin = 256 << 20
)

// availLocked is the free space for admitting need bytes under limit.
// Called with mu held.
func (g *spaceGuard) availLocked(need, limit int64) (int64, error) {
	// a test's statfs (no dirFile) is asked every time: it changes when
	// the test says
	if g.dirFile != nil && time.Since(g.lastStat) < statfsAge {
		if avail := g.lastAvail - g.committed; avail-g.pending-need >= limit+statfsMargin {
			return avail, nil
		}
	}
	avail, _, err := g.statLocked()
	return avail, err
}

// release ends the admission of n bytes: they are written.
func (g *spaceGuard) release(n int64) {
	g.mu.Lock()
	g.pending -= n
	g.committed += n
	g.mu.Unlock()
}

func allocatedBytes(path string) int64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// floor is what badger may write on its own: the tables its memtables
// are flushed into (half as much again as their write-ahead logs, counted
// high: an entry's key, value, offset and filter bits, and each block's
// index), a compaction's new tables, and its small files. Called with mu
// held.
func (g *spaceGuard) floor() int64 {
	return (g.memWAL+g.walCur)*3/2 + min(g.lsm, maxCompaction) + spareBytes
}

// limitLocked is the free space a change that adds data must leave: the
// floor and the part of the room the reserve file does not hold.
func (g *spaceGuard) limitLocked() int64 { return g.floor() + g.room - g.held }

// admit admits what c added since it was last admitted, or fails with
// wire.CodeNoSpace. The space stays counted as pending until c.done.
func (g *spaceGuard) admit(c *txnCost) error {
	if g == nil {
		return nil
	}
	n := c.bytes() - c.admitted
	if n <= 0 || c.vlog+c.wal == 0 {
		return nil // (a transaction that wrote nothing commits nothing)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	avail, err := g.availLocked(n, g.limitLocked())
	if err != nil {
		return wire.Errf(wire.CodeIO, "%v", err)
	}
	free := avail - g.pending - n
	if c.removal() {
		if free < g.floor() && g.held > 0 {
			freed := g.giveUpLocked("a removal needs it")
			free += freed
		}
		if free < g.floor() {
			g.refused.Add(1)
			return wire.Errf(wire.CodeNoSpace, "data file system full: %d bytes free, a removal needs %d above the %d badger keeps for itself",
				max(avail-g.pending, 0), n, g.floor())
		}
	} else if free < g.limitLocked() {
		g.refused.Add(1)
		err := wire.Errf(wire.CodeNoSpace, "data file system full: %d bytes free, %d more needed above the %d-byte reserve",
			max(avail-g.pending, 0), n, g.floor()+g.room)
		if !g.full {
			g.full = true
			g.log.Warn("refusing changes that add data until space is freed", "err", err)
		}
		return err
	} else if g.full && free >= g.limitLocked()+g.sizes.vlogFile {
		// a value log file's worth above the limit: a small change that
		// fits between refused ones is no news
		g.full = false
		g.log.Info("space freed: taking changes again", "free", free-g.limitLocked())
	}
	g.pending += n
	g.walCur += c.wal - c.walAdmitted
	c.walAdmitted = c.wal
	c.admitted += n
	c.guard = g
	return nil
}

// AdmitOutside admits n bytes that another writer on the data
// directory's file system (the block store, when its directory is there)
// is about to write, as a change adding data is admitted: CodeNoSpace if
// they would leave less than the reserve free, so that block writes never
// take the space badger needs. release, called once they are written (or
// not), ends the admission.
func (s *Store) AdmitOutside(n int64) (release func(), err error) {
	g := s.space
	if g == nil || n <= 0 {
		return func() {}, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	avail, err := g.availLocked(n, g.limitLocked())
	if err != nil {
		return nil, wire.Errf(wire.CodeIO, "%v", err)
	}
	if avail-g.pending-n < g.limitLocked() {
		g.refused.Add(1)
		return nil, wire.Errf(wire.CodeNoSpace, "data file system full: %d bytes free, a block of %d needs them above the %d-byte reserve",
			max(avail-g.pending, 0), n, g.floor()+g.room)
	}
	g.pending += n
	return func() { g.release(n) }, nil
}

// KeepFree is the free space writers beside the store on its file system
// must leave (AdmitOutside's limit): what a mount putting blocks in a
// directory there is told to keep. 0 without a space guard.
func (s *Store) KeepFree() int64 {
	g := s.space
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.limitLocked()
}

// reserveBytes counts n bytes badger is about to write on its own (a value
// log collection's rewrite, which gives space back) as pending, if they fit
// above the floor, and returns their release. If they do not, the floor
// was eaten from outside (what the store admits leaves it free): the
// reserve file is given up.
func (g *spaceGuard) reserveBytes(n int64) (func(), bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	avail, _, err := g.statLocked()
	if err != nil {
		return nil, false
	}
	if avail-g.pending-n < g.floor() && avail+g.held-g.pending-n >= g.floor() {
		avail += g.giveUpLocked("collecting the value log needs it")
	}
	if avail-g.pending-n < g.floor() {
		return nil, false
	}
	g.pending += n
	return func() { g.release(n) }, true
}

// headroom is the free space above the floor.
func (g *spaceGuard) headroom() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	avail, _, err := g.statLocked()
	if err != nil {
		return 0
	}
	return max(avail-g.pending-g.floor(), 0)
}

// free returns the bytes clients can still write (the free space less the
// reserve) and the file system's size.
func (g *spaceGuard) free() (free, total int64, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	avail, total, err := g.statLocked()
	if err != nil {
		return 0, 0, err
	}
	return max(avail-g.pending-g.limitLocked(), 0), total, nil
}

// short reports whether space is short enough that removed records should
// give their space back now: less than two value log files above the
// reserve.
func (g *spaceGuard) short() bool {
	free, _, err := g.free()
	return err == nil && free < 2*g.sizes.vlogFile
}

// ample reports whether n bytes can go to something other than clients'
// changes (pages populated ahead of the value log) without bringing the
// reserve near.
func (g *spaceGuard) ample(n int64) bool {
	if g == nil {
		return true
	}
	free, _, err := g.free()
	return err == nil && free >= n+4*prefaultAhead
}

// measure records the LSM tree's size (its compactions' part of the
// floor) and the write-ahead logs on disk: what was admitted since the
// last look goes to the newest, and deleted logs (flushed) drop out. A log
// found at the first look (left by the last run, which badger replays and
// flushes) counts up to its last byte written (writtenBytes).
func (g *spaceGuard) measure(lsm int64) {
	g.mu.Lock()
	first := g.walByLog == nil
	g.mu.Unlock()
	logs := map[string]int64{}
	newest, newestFid := "", -1
	names, _ := filepath.Glob(filepath.Join(g.dbDir, "*.mem"))
	for _, name := range names {
		var st syscall.Stat_t
		if syscall.Stat(name, &st) != nil || st.Size == 0 {
			continue // (made ahead: prepareWAL)
		}
		base := filepath.Base(name)
		logs[base] = 0
		if first {
			logs[base] = writtenBytes(name, st.Blocks*512)
		}
		if fid, err := strconv.Atoi(strings.TrimSuffix(base, ".mem")); err == nil && fid > newestFid {
			newest, newestFid = base, fid
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lsm = lsm
	g.memWAL = 0
	for name := range logs {
		if n, ok := g.walByLog[name]; ok {
			logs[name] = n
		}
		if name == newest {
			logs[name] += g.walCur
		}
		g.memWAL += logs[name]
	}
	if newest != "" {
		g.walCur = 0
	}
	g.walByLog = logs
}

// writtenBytes is how much of a write-ahead log badger wrote: up to its
// last byte not zero (it writes from the start, and zeroes the next
// entry's place), or blocks if it cannot be read. Its allocated blocks
// would count what prepareWAL allocated ahead.
func writtenBytes(name string, blocks int64) int64 {
	f, err := os.Open(name)
	if err != nil {
		return blocks
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return blocks
	}
	buf := make([]byte, 1<<20)
	for end := fi.Size(); end > 0; {
		n := min(end, int64(len(buf)))
		if _, err := f.ReadAt(buf[:n], end-n); err != nil {
			return blocks
		}
		for i := n - 1; i >= 0; i-- {
			if buf[i] != 0 {
				return end - n + i + 1
			}
		}
		end -= n
	}
	return 0
}

func filesBytes(pattern string, size func(string) int64) int64 {
	names, _ := filepath.Glob(pattern)
	var n int64
	for _, name := range names {
		n += size(name)
	}
	return n
}

// prepareStart gives the reserve file up if the file system has less than
// opening badger needs: it replays the write-ahead logs left and flushes
// them into tables, and may compact (a restart on a full disk). If even
// that is not enough it fails: badger would die of SIGBUS.
func (g *spaceGuard) prepareStart() error {
	// a log made ahead is empty, which badger would not open
	if names, err := filepath.Glob(filepath.Join(g.dbDir, "*.mem")); err == nil {
		for _, name := range names {
			if fi, err := os.Stat(name); err == nil && fi.Size() == 0 {
				os.Remove(name)
			}
		}
	}
	g.measure(filesBytes(filepath.Join(g.dbDir, "*.sst"), func(name string) int64 {
		fi, err := os.Stat(name)
		if err != nil {
			return 0
		}
		return fi.Size()
	}))
	g.mu.Lock()
	defer g.mu.Unlock()
	need := g.floor()
	avail, _, err := g.statLocked()
	if err != nil {
		return err
	}
	if avail < need && g.held > 0 {
		avail += g.giveUpLocked(fmt.Sprintf("%d bytes free, opening the store needs up to %d", avail, need))
	}
	if avail < need {
		return fmt.Errorf("%w: %d bytes free on the data directory's file system, opening the store needs up to %d: free some space",
			ErrNoSpace, avail, need)
	}
	return nil
}

// prepareWAL makes badger's next write-ahead log (memtable .mem file)
// before badger does: an empty file with its blocks allocated past its end
// (FALLOC_FL_KEEP_SIZE), which badger opens, extends, maps and writes as a
// file of its own. Its writes into the log then take no block from the
// file system, so nothing that fills it meanwhile can fail them. The
// active log is the newest: the next one is numbered one more. Not if
// the space would come out of the floor.
func (g *spaceGuard) prepareWAL() {
	if g.noPrealloc.Load() {
		return
	}
	names, err := filepath.Glob(filepath.Join(g.dbDir, "*.mem"))
	if err != nil {
		return
	}
	newest := -1
	for _, name := range names {
		fid, err := strconv.Atoi(strings.TrimSuffix(filepath.Base(name), ".mem"))
		if err != nil {
			continue
		}
		fi, err := os.Stat(name)
		if err != nil {
			continue
		}
		if fi.Size() == 0 {
			return // made already, not yet taken
		}
		newest = max(newest, fid)
	}
	if newest < 0 {
		return
	}
	size := g.sizes.walAhead
	g.mu.Lock()
	defer g.mu.Unlock()
	avail, _, err := g.statLocked()
	if err != nil || avail-g.pending-size < g.floor() {
		return
	}
	path := filepath.Join(g.dbDir, fmt.Sprintf("%05d.mem", newest+1))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return // (badger made it meanwhile)
	}
	err = syscall.Fallocate(int(f.Fd()), fallocKeepSize, 0, size)
	f.Close()
	if err != nil {
		os.Remove(path)
		if !errors.Is(err, syscall.ENOSPC) {
			// a file system without it: badger allocates as it writes
			g.noPrealloc.Store(true)
			g.log.Info("not allocating badger's write-ahead logs ahead", "err", err)
		}
	}
}

// fallocKeepSize is FALLOC_FL_KEEP_SIZE.
const fallocKeepSize = 1

// giveUpLocked deletes the reserve file and returns the bytes it held.
func (g *spaceGuard) giveUpLocked(why string) int64 {
	held := g.held
	if err := os.Remove(filepath.Join(g.dir, reserveFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		g.log.Warn("cannot give up the space reserve file", "err", err)
		return 0
	}
	g.held = 0
	g.log.Warn("data file system short of space: gave up the space reserve file", "bytes", held, "why", why)
	return held
}

// keepReserve allocates the reserve file up to the room if the space is
// there: it moves space from free to held, which leaves what clients may
// write unchanged, but must not take the floor. Once given up it waits
// for a room more (space reclaimed), not to be given up again at once.
// If something else filled the file system into the floor, it gives the
// reserve file up: badger's own writes need the space now.
func (g *spaceGuard) keepReserve() {
	g.mu.Lock()
	defer g.mu.Unlock()
	avail, _, err := g.statLocked()
	if err != nil {
		return
	}
	if g.held > 0 && avail-g.pending < g.floor() {
		g.giveUpLocked(fmt.Sprintf("the file system filled from outside: %d bytes free", avail))
		return
	}
	if g.held >= g.room || avail-g.pending-(g.room-g.held) < g.floor()+g.room {
		return
	}
	path := filepath.Join(g.dir, reserveFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return
	}
	err = syscall.Fallocate(int(f.Fd()), 0, 0, g.room)
	f.Close()
	was := g.held
	g.held = allocatedBytes(path)
	if err != nil {
		// (a file system without fallocate: the room stays free space,
		// which the limit counts as such)
		if g.held > 0 {
			g.held = 0
			os.Remove(path)
		}
		return
	}
	if was == 0 {
		g.log.Info("space reserve file allocated", "bytes", g.held)
	}
}

const (
	// spaceTick is how often the store looks at its space.
	spaceTick = time.Second
	// gcPeriod is how often the value log is collected when space is not
	// short.
	gcPeriod = time.Minute
	// reclaimAgain: space short, changes refused, but nothing removed
	// since the last reclaim: overwritten pages may still give space back,
	// but not every tick (each reclaim rewrites the LSM tree's top).
	reclaimAgain = 30 * time.Second
)

// reclaimPrefix is a key no record has: Store.reclaim writes it and drops
// it, which makes badger flush its memtables and compact level 0.
var reclaimPrefix = []byte("~leasefs-reclaim")

// spaceLoop keeps the reserve file, gives the space of removed records
// back when space is short, and collects the value log.
func (s *Store) spaceLoop() {
	defer close(s.done)
	t := time.NewTicker(spaceTick)
	defer t.Stop()
	var (
		prevRemoved         int64 // removals as of the last tick
		removed, refused    int64 // as of the last reclaim
		lastReclaim, lastGC = time.Now(), time.Now()
	)
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.space.measure(levelsSize(s.db))
		r, f := s.space.removed.Load(), s.space.refused.Load()
		settled := r == prevRemoved // not in the middle of a purge
		prevRemoved = r
		switch {
		case !s.space.short():
			if time.Since(lastGC) >= gcPeriod {
				s.collect()
				lastGC = time.Now()
			}
		case settled && r != removed || f != refused && time.Since(lastReclaim) >= reclaimAgain:
			removed, refused = r, f
			s.reclaim()
			lastReclaim, lastGC = time.Now(), time.Now()
		default:
			// files whose garbage a compaction of badger's own counted
			s.collect()
			lastGC = time.Now()
		}
		// after a reclaim at once: the reserve is there again before
		// the space it gave back is taken
		s.space.keepReserve()
		s.space.prepareWAL()
	}
}

// reclaim makes badger give back the space of removed records now. A
// removal is a deletion marker in a memtable; its space comes back once the
// memtable is flushed, a compaction merges the marker with the records it
// deletes (counting their value log bytes as discardable), and the value
// log collection rewrites what is still live of a file and deletes it.
// Badger has no call to flush, but dropping a prefix flushes every
// memtable and compacts level 0 into the base level: we drop one key of
// our own. Writes wait meanwhile (gate); badger would refuse them.
func (s *Store) reclaim() {
	start := time.Now()
	s.gate.Lock()
	err := s.db.Update(func(t *badger.Txn) error { return t.Set(reclaimPrefix, nil) })
	if err == nil {
		err = s.db.DropPrefix(reclaimPrefix)
	}
	s.gate.Unlock()
	if err != nil {
		s.log.Warn("reclaiming space of removed records", "err", err)
		return
	}
	n := s.collect()
	free, _, _ := s.space.free()
	s.log.Info("space short: reclaimed removed records' space", "value_log_files", n, "free", free,
		"took", time.Since(start).Round(time.Millisecond))
}

// collect rewrites value log files mostly garbage and deletes them, as
// many as the free space above the floor allows, and returns how many.
// The rewrite is badger's own write: its bytes are counted as pending
// while it runs.
func (s *Store) collect() int {
	// a file ends past the size by a write at most
	fileMax := float64(s.space.sizes.vlogFile + wire.MaxData + 1<<20)
	n := 0
	for ; n < 16; n++ { // bounded: a few files per look
		// live entries go to the value log again, and their keys to the
		// write-ahead log: a twentieth more
		ratio := 0.5
		if head := float64(s.space.headroom()); head < fileMax*(1-ratio)*1.05 {
			// short: only files mostly garbage, as much as fits
			ratio = min(1-head/(fileMax*1.05), maxGCRatio)
		}
		release, ok := s.space.reserveBytes(int64(fileMax * (1 - ratio) * 1.05))
		if !ok {
			break
		}
		err := s.db.RunValueLogGC(ratio)
		release()
		if err != nil {
			break
		}
	}
	return n
}
