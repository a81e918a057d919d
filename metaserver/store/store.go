package store

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// Record kinds: the first byte of every key (the key layout is in doc.go).
const (
	RecAttr    = 'A'
	RecEntry   = 'D'
	RecCookie  = 'C'
	RecPage    = 'P'
	RecXattr   = 'X'
	RecSymlink = 'L'
	RecRepl    = 'E'
	RecDone    = 'R'
	RecServer  = 'S'
	RecFormat  = 'F'
	RecStage   = 'T'
	RecExtent  = 'B'
	RecBlock   = 'U'
	RecGarbage = 'G'
)

const (
	// PageSize is the size of a file data page: a small write rewrites
	// one page, not more (4 KiB, the kernel's page and the unit of
	// random I/O).
	PageSize = 4 << 10
	// MaxFileSize bounds file sizes (page indexes stay far from overflow);
	// Config.MaxFileSize may set a lower bound.
	MaxFileSize = wire.MaxFileSize
	// NameMax is the longest name in bytes.
	NameMax = 255
	// XattrNameMax and XattrSizeMax are Linux's limits.
	XattrNameMax = 255
	XattrSizeMax = 64 << 10
	// XattrListMax bounds an inode's names list, each name and its NUL:
	// Linux's listxattr returns at most this much (XATTR_LIST_MAX), and
	// fails with E2BIG for a longer list, whatever the buffer.
	XattrListMax = 64 << 10
	// SymlinkMax is the longest symlink target (PATH_MAX).
	SymlinkMax = 4096

	// firstCookie leaves cookies 0..2 free: 0 means "from the start", and
	// the FUSE layer may use 1 and 2 for "." and "..".
	firstCookie = 3
	// inoBatch inode numbers are reserved per counter write, so creates do
	// not all conflict on the counter record.
	inoBatch = 1024
	// maxRetries bounds the retries of a transaction that keeps conflicting.
	maxRetries = 64
	// deleteBatch bounds how many page records one transaction deletes
	// (badger caps a transaction's size by the memtable size).
	deleteBatch = 4096
	// valueLogFileSize is where badger starts a new value log file.
	valueLogFileSize = 256 << 20
)

// Rename flags (linux/fs.h).
const (
	RenameNoReplace = 1 << 0
	RenameExchange  = 1 << 1
	RenameWhiteout  = 1 << 2
)

// Xattr flags (linux/xattr.h).
const (
	XattrCreate  = 1
	XattrReplace = 2
)

// Attr is an inode's attributes. Mode carries the type bits (syscall.S_IFMT).
type Attr struct {
	Ino                 ids.Ino
	Mode                uint32
	Nlink               uint32
	Uid, Gid            uint32
	Rdev                uint32
	Size                uint64
	Blocks              uint64 // 512-byte blocks: a block-mapped file's stored bytes, else from Size
	Atime, Mtime, Ctime int64  // unix nanoseconds (file times are wall-clock by nature)
	Version             uint64 // incremented on every data or size change (reclaim compares it)
	// Change is incremented each time the attribute record is written:
	// a client caching attributes keeps the newest by it, whatever order
	// the replies arrive in.
	Change uint64
}

// IsDir reports whether the inode is a directory.
func (a *Attr) IsDir() bool { return a.Mode&syscall.S_IFMT == syscall.S_IFDIR }

// SetAttrIn says which attributes SetAttr changes (Valid: wire.SetMode etc.).
type SetAttrIn struct {
	Valid               uint32
	Mode, Uid, Gid      uint32
	Size                uint64
	Atime, Mtime, Ctime int64
}

// DirEntry is one directory entry. Off is its cookie: pass it back to
// ReadDir to continue after it.
type DirEntry struct {
	Name string
	Ino  ids.Ino
	Mode uint32 // type bits only
	Off  uint64
}

// StatFs is the file system's usage.
type StatFs struct {
	Blocks, Bfree, Bavail, Files, Ffree uint64
	Bsize, NameLen                      uint32
}

// Options configures Open.
type Options struct {
	ServerID ids.ServerID // 1..255: the high byte of the inode numbers it allocates
	Logger   *slog.Logger
	InMemory bool // tests: no files, no lock
	// RootUid and RootGid own the root directory when it is created.
	RootUid, RootGid uint32
	// OnCommit, if set, is called after every committed operation with the
	// records it wrote, in order (the replication seam). Values are valid only
	// during the call. Called on the operation's goroutine.
	OnCommit func(writes []Write)
	// Stamp, if set, makes every operation after Open an owner's
	// change: it is called in the operation's transaction once the
	// operation wrote its records, before it is admitted and replicated,
	// and fences and stamps every inode written (replica.Stamp: an error
	// fails the operation, nothing is written). OnCommit sees the stamps.
	Stamp func(tx *Tx) error
	// Replicate, if set, is called for every operation that writes
	// something, inside its transaction before the local commit, with the
	// writes (valid only during the call); an error aborts the operation
	// (a cluster owner that could not reach enough other replicas: the
	// change is not acknowledged and not committed here). After it
	// succeeds the store commits and syncs; if that fails, Uncommitted is
	// called with the writes (the other replicas are ahead of this one).
	// Called on the operation's goroutine.
	Replicate   func(writes []Write) error
	Uncommitted func(writes []Write)
	// OnAllocIno, if set, is called with each new inode number before the
	// operation that creates it runs (outside any transaction); an error
	// fails the operation. A cluster server acquires the new inode here.
	OnAllocIno func(ino ids.Ino) error
	// MaxFileSize, if not zero, is the largest file size taken, below
	// MaxFileSize.
	MaxFileSize uint64
	// NoOrphanPurge skips the purge of unlinked inodes at open: in a
	// cluster the records are replicated and only an inode's owner may
	// delete them.
	NoOrphanPurge bool
	// GarbageDelay is how long after its last reference went a block may
	// be deleted: no reader may still hold a lock under which it read the
	// map (the server passes τ(1+δ) and a margin; 0: DefaultGarbageDelay).
	GarbageDelay time.Duration
	// Clock, if set, is the time in unix nanoseconds for the changes that
	// take none from their caller (Purge); tests set it.
	Clock func() int64

	// valueThreshold overrides where values go (LSM below, value log at or
	// above); for the benchmark that chose the default.
	valueThreshold int64
	// Statfs, if set, stands for the data directory's file system's
	// free and total bytes (tests: a full disk without filling one).
	Statfs func(dir string) (avail, total int64, err error)
}

// ErrDataDirInUse is what Open returns when another process holds the
// data directory (errors.Is matches the *DataDirInUseError it returns).
var ErrDataDirInUse = errors.New("store: data directory in use")

// DataDirInUseError says which process holds a data directory.
type DataDirInUseError struct {
	Dir string
	PID int // 0 if unknown
}

func (e *DataDirInUseError) Error() string {
	pid := "unknown pid"
	if e.PID > 0 {
		pid = "pid " + strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("data directory %s is in use by another leasefs server (%s)", e.Dir, pid)
}

func (e *DataDirInUseError) Is(target error) bool { return target == ErrDataDirInUse }

// Store is a server's badger store: namespace, attributes, xattrs, symlinks
// and file data. Safe for concurrent use: each operation is one transaction,
// retried when it conflicts with a concurrent one. For(origin) gives a view
// of the same store whose changes record the client request they are for
// (done.go).
type Store struct {
	*storeCore
	origin Origin
	umask  uint32 // applied by creates (WithUmask)
}

type storeCore struct {
	kv          kvStore
	db          *badger.DB
	log         *slog.Logger
	server      ids.ServerID
	dir         string
	lock        *os.File
	onCommit    func([]Write)
	stamp       func(*Tx) error // set after init: root and orphan purge are local
	repl        func([]Write) error
	uncommitted func([]Write)
	onAlloc     func(ids.Ino) error
	maxSize     uint64 // the largest file size taken
	garbageWait int64  // GarbageDelay in nanoseconds
	clock       func() int64
	convertStep func(ids.Ino, string) error // tests: convertHook

	// changeMu serialises changes recorded with the same inode (striped;
	// see update).
	changeMu [256]sync.Mutex

	pf    *prefaulter // nil in memory
	space *spaceGuard // nil in memory
	gate  sync.RWMutex

	inoMu    sync.Mutex
	nextIno  uint64 // next counter value to hand out
	inoLimit uint64 // counter values below this are reserved on disk

	stop    chan struct{}
	done    chan struct{}
	closeMu sync.Mutex
	closed  bool
}

// Open opens (creating) the badger store in DIR/db. It takes an
// exclusive lock on DIR/LOCK (flock), so a second server on the same DIR fails
// at once with ErrDataDirInUse. It creates the root directory if absent and
// purges orphans (unlinked inodes left by a crash: nothing is open after a
// restart).
func Open(dir string, opts Options) (*Store, error) {
	if opts.ServerID == 0 {
		return nil, errors.New("store: server id must be 1..255")
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Store{storeCore: &storeCore{log: log, server: opts.ServerID, dir: dir, onCommit: opts.OnCommit,
		maxSize: MaxFileSize, stop: make(chan struct{}), done: make(chan struct{})}}
	if opts.MaxFileSize != 0 {
		s.maxSize = min(opts.MaxFileSize, MaxFileSize)
	}
	s.garbageWait = int64(cmp.Or(opts.GarbageDelay, DefaultGarbageDelay))
	s.clock = opts.Clock
	if s.clock == nil {
		s.clock = func() int64 { return time.Now().UnixNano() }
	}
	bopts := badger.DefaultOptions("")
	sizes := badgerSizes{vlogFile: valueLogFileSize}
	if opts.InMemory {
		s.dir = ""
		bopts = bopts.WithInMemory(true)
	} else {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("store: open %s: %w", dir, err)
		}
		lock, err := lockDir(dir)
		if err != nil {
			return nil, err
		}
		s.lock = lock
		dbDir := filepath.Join(dir, "db")
		if s.space, err = newSpaceGuard(dir, dbDir, log, opts.Statfs); err != nil {
			s.unlock()
			return nil, fmt.Errorf("store: open %s: %w", dir, err)
		}
		sizes = s.space.sizes
		if err := s.space.prepareStart(); err != nil {
			s.unlock()
			return nil, fmt.Errorf("store: open %s: %w", dir, err)
		}
		bopts = bopts.WithDir(dbDir).WithValueDir(dbDir)
	}
	vt := int64(1 << 10)
	if opts.valueThreshold > 0 {
		vt = opts.valueThreshold
	}
	// Memory: this runs beside other processes. Data pages (4 KiB) go to
	// the value log (ValueThreshold 1 KiB), which also keeps a 4 MiB write
	// within badger's transaction size limit (15% of the memtable); metadata
	// stays in the LSM tree.
	bopts = bopts.
		WithLogger(newBadgerLogger(log)).
		WithSyncWrites(false). // Sync() at fsync/close; a process kill loses nothing the kernel has
		WithNumMemtables(2).
		WithMemTableSize(memtableSize).
		WithValueThreshold(vt).
		WithBlockCacheSize(16 << 20).
		WithIndexCacheSize(8 << 20).
		WithNumCompactors(2).
		WithNumLevelZeroTables(3).
		WithNumLevelZeroTablesStall(8).
		WithValueLogFileSize(sizes.vlogFile).
		WithCompression(options.None). // pages are mostly incompressible or tiny metadata
		WithMetricsEnabled(false).
		WithDetectConflicts(true)
	if opts.InMemory {
		// no value log in memory: every value lives in the memtable, whose
		// size caps a transaction (15%), so give a 4 MiB write room
		bopts = bopts.WithValueThreshold(1 << 20).WithMemTableSize(64 << 20)
	}
	db, err := badger.Open(bopts)
	if err != nil {
		s.unlock()
		return nil, fmt.Errorf("store: open %s: %w", dir, err)
	}
	s.db = db
	kv := badgerKV{db: db, threshold: int(bopts.ValueThreshold)}
	if !opts.InMemory {
		kv.space, kv.gate = s.space, &s.gate
	}
	if !opts.InMemory && onTmpfs(bopts.ValueDir) {
		// the path as the kernel names the mapping
		dbDir, err := filepath.Abs(bopts.ValueDir)
		if real, rerr := filepath.EvalSymlinks(dbDir); err == nil && rerr == nil {
			dbDir = real
		}
		s.pf = startPrefaulter(dbDir, sizes.vlogFile, s.space, log)
		kv.pf = s.pf
	}
	s.kv = kv
	if err := s.init(opts); err != nil {
		s.pf.close()
		db.Close()
		s.unlock()
		return nil, fmt.Errorf("store: open %s: %w", dir, err)
	}
	s.stamp = opts.Stamp
	s.repl, s.uncommitted, s.onAlloc = opts.Replicate, opts.Uncommitted, opts.OnAllocIno
	if opts.InMemory {
		close(s.done)
	} else {
		s.space.prepareWAL()
		go s.spaceLoop()
	}
	return s, nil
}

// lockDir takes DIR/LOCK and writes our pid into it.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, "LOCK")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		var pid int
		if b, rerr := io.ReadAll(io.LimitReader(f, 32)); rerr == nil {
			pid, _ = strconv.Atoi(string(bytes.TrimSpace(b)))
		}
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &DataDirInUseError{Dir: dir, PID: pid}
		}
		return nil, fmt.Errorf("store: lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

func (s *Store) unlock() {
	s.space.close()
	if s.lock != nil {
		// the pid stays in the file: harmless, the flock is what counts
		s.lock.Close()
		s.lock = nil
	}
}

func (s *Store) init(opts Options) error {
	if err := s.upgradeFormat(); err != nil {
		return err
	}
	// inode counter
	var counter uint64
	err := s.kv.view(func(t kvTxn) error {
		_, err := t.get(s.counterKey(), func(v []byte) error {
			if len(v) != 8 {
				return fmt.Errorf("corrupt inode counter record (%d bytes)", len(v))
			}
			counter = binary.BigEndian.Uint64(v)
			return nil
		})
		return err
	})
	if err != nil {
		return err
	}
	if counter == 0 {
		counter = 1 // MakeIno(server, 0) is the counter's own key
	}
	s.nextIno, s.inoLimit = counter, counter

	// root
	_, err = s.update(func(tx *Tx) error {
		ok, err := tx.get(tx.key(RecAttr, ids.RootIno, nil), nil)
		if err != nil || ok {
			return err
		}
		now := time.Now().UnixNano()
		root := &inode{Attr: Attr{Ino: ids.RootIno, Mode: syscall.S_IFDIR | 0o755, Nlink: 2,
			Uid: opts.RootUid, Gid: opts.RootGid, Atime: now, Mtime: now, Ctime: now},
			parent: ids.RootIno, nextCookie: firstCookie}
		tx.addInode(root)
		return nil
	})
	if err != nil || opts.NoOrphanPurge {
		return err
	}
	return s.purgeOrphans()
}

// purgeOrphans deletes unlinked inodes a crash left behind.
func (s *Store) purgeOrphans() error {
	var orphans []ids.Ino
	err := s.kv.view(func(t kvTxn) error {
		return t.scan([]byte{RecAttr}, nil, false, true, func(k, v []byte) (bool, error) {
			var in inode
			if err := in.decode(KeyIno(k), v); err != nil {
				return false, err
			}
			if in.Nlink == 0 {
				orphans = append(orphans, in.Ino)
			}
			return true, nil
		})
	})
	if err != nil {
		return err
	}
	for _, ino := range orphans {
		s.log.Info("purging unlinked inode left by a crash", "ino", ino)
		if err := s.Purge(ino); err != nil {
			if wire.CodeOf(err) == wire.CodeNoSpace {
				// on a full disk the store opens all the same: the
				// next start purges what is left
				s.log.Warn("purging unlinked inodes left by a crash: no space", "err", err)
				return nil
			}
			return err
		}
	}
	return nil
}

func (s *Store) counterKey() []byte {
	return binary.BigEndian.AppendUint64([]byte{RecServer}, uint64(ids.MakeIno(s.server, 0)))
}

// allocIno hands out a new inode number.
func (s *Store) allocIno() (ids.Ino, error) { return s.AllocInos(1) }

// AllocInos hands out n consecutive new inode numbers and returns the
// first, reserving a batch on disk when the reserved ones do not suffice.
// Numbers reserved but unused before a restart are skipped, never reused.
func (s *Store) AllocInos(n uint64) (ids.Ino, error) {
	s.inoMu.Lock()
	defer s.inoMu.Unlock()
	if s.nextIno+n > s.inoLimit {
		limit := s.nextIno + max(n, inoBatch)
		if limit >= 1<<56 {
			return 0, wire.Errf(wire.CodeNoSpace, "inode numbers of %v exhausted", s.server)
		}
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], limit)
		if err := s.kv.update(func(t kvTxn) error { return t.set(s.counterKey(), v[:]) }); err != nil {
			return 0, err
		}
		s.inoLimit = limit
	}
	first := s.nextIno
	s.nextIno += n
	return ids.MakeIno(s.server, first), nil
}

// handedOut reports whether this store's allocator handed ino out.
func (s *Store) handedOut(ino ids.Ino) bool {
	s.inoMu.Lock()
	defer s.inoMu.Unlock()
	counter := uint64(ino) & (1<<56 - 1)
	return ino == ids.MakeIno(s.server, counter) && counter >= 1 && counter < s.nextIno
}

// Close closes the store, syncing it, and releases the data directory.
// Later calls do nothing.
func (s *Store) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	close(s.stop)
	<-s.done
	s.pf.close()
	err := s.db.Close() // syncs
	s.unlock()
	return err
}

// Sync makes every write so far durable.
func (s *Store) Sync() error { return s.kv.sync() }

// Size is the on-disk size of the LSM tree and the value log.
func (s *Store) Size() (lsm, vlog int64) { return s.kv.size() }

// Update runs fn in one read-write transaction, retried when it conflicts
// with a concurrent one (fn must be safe to run again), and returns what it
// wrote.
func (s *Store) Update(fn func(tx *Tx) error) (writes []Write, err error) {
	tx, err := s.update(fn)
	if err != nil {
		return nil, err
	}
	return tx.writes, nil
}

// Apply writes records (from another replica's Update) in one transaction.
func (s *Store) Apply(writes []Write) error {
	_, err := s.update(func(tx *Tx) error {
		for _, w := range writes {
			var err error
			if w.Delete {
				err = tx.Delete(w.Key)
			} else {
				err = tx.Set(w.Key, w.Value)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

func (s *Store) update(fn func(tx *Tx) error) (*Tx, error) {
	if s.origin.Ino != 0 {
		// Changes recorded with one inode go one after the other: they
		// would conflict anyway (they rewrite its attributes, and one
		// client's all rewrite its record of finished requests), and a
		// replicated change can no longer be retried when its local
		// commit conflicts (the replicas have it already). Waiting here
		// beats a retry storm of removals behind (client/behind.go).
		mu := &s.changeMu[uint64(s.origin.Ino)%uint64(len(s.changeMu))]
		mu.Lock()
		defer mu.Unlock()
	}
	tx := &Tx{st: s}
	var err error
	replicated := false
	for range maxRetries {
		err = s.kv.update(func(t kvTxn) error {
			tx.reset(t, true)
			if err := fn(tx); err != nil {
				return err
			}
			if err := tx.flush(); err != nil {
				return err
			}
			if s.origin.Client != 0 && len(tx.writes) > 0 {
				if err := tx.recordDone(s.origin, time.Now().UnixNano()); err != nil {
					return err
				}
			}
			if s.stamp != nil && len(tx.writes) > 0 {
				if err := s.stamp(tx); err != nil {
					return err
				}
			}
			// Before the other replicas get it: a change this one has
			// no space for is made nowhere.
			if err := t.admit(); err != nil {
				return err
			}
			if s.repl != nil && len(tx.writes) > 0 {
				// The other replicas first, then this one: a change
				// that does not reach a majority is nowhere but on
				// the replicas that took it, all its inodes together,
				// never half-adopted from this store.
				if err := s.repl(tx.writes); err != nil {
					return err
				}
				replicated = true
			}
			return nil
		})
		if err != errConflict || replicated {
			break
		}
	}
	if replicated && err == nil {
		err = s.kv.sync()
	}
	if replicated && err != nil {
		// the other replicas are ahead of this one
		if s.uncommitted != nil {
			s.uncommitted(tx.writes)
		}
		tx.releaseBufs()
		return nil, wire.Errf(wire.CodeUnavailable, "change replicated but not committed here: %v", err)
	}
	if err == errConflict {
		tx.releaseBufs()
		return nil, wire.Errf(wire.CodeAgain, "transaction kept conflicting")
	}
	if err == nil && s.onCommit != nil && len(tx.writes) > 0 {
		s.onCommit(tx.writes)
	}
	tx.releaseBufs()
	return tx, err
}

// UpdateRaw runs fn in one read-write transaction, retried when it
// conflicts with a concurrent one, without the hooks of an operation
// (no stamp, replication or OnCommit) and without recording its writes:
// the replication layer's own changes (replica.Apply, transfers).
func (s *Store) UpdateRaw(fn func(tx *Tx) error) error {
	tx := &Tx{st: s}
	var err error
	for range maxRetries {
		err = s.kv.update(func(t kvTxn) error {
			tx.reset(t, true)
			tx.record = false
			return fn(tx)
		})
		if err != errConflict {
			break
		}
	}
	tx.releaseBufs()
	if err == errConflict {
		return wire.Errf(wire.CodeAgain, "transaction kept conflicting")
	}
	return err
}

// View runs fn in one read-only transaction.
func (s *Store) View(fn func(tx *Tx) error) error { return s.view(fn) }

// Logger is the store's logger.
func (s *Store) Logger() *slog.Logger { return s.log }

func (s *Store) view(fn func(tx *Tx) error) error {
	tx := &Tx{st: s}
	err := s.kv.view(func(t kvTxn) error {
		tx.reset(t, false)
		return fn(tx)
	})
	tx.releaseBufs()
	return err
}

// inode is the attribute record: the public attributes plus a directory's
// parent (for the rename loop check) and its next readdir cookie.
type inode struct {
	Attr
	parent     ids.Ino
	nextCookie uint64
	// mapped: the file's data is a block map ('B' and 'U' records), not
	// pages; stored is its Map.StoredBytes. Kept in the attribute record,
	// so that st_blocks and the check of a page write cost no lookup.
	mapped  bool
	stored  uint64
	dirty   bool
	deleted bool
}

// The attribute record's formats: 1 had no Change (read as 0, written as
// 2 at the inode's next change); a block-mapped file's is 2's and its
// stored bytes, under its own format byte, which a leasefs that does not
// know block maps refuses instead of reading the file as pages.
const (
	inodeFormat       = 2
	inodeSize         = 1 + 5*4 + 5*8 + 2*8 + 8
	inodeSizeOld      = inodeSize - 8
	inodeFormatV1     = 1
	inodeFormatMapped = 3
	inodeSizeMapped   = inodeSize + 8
)

func (in *inode) encode(b []byte) []byte {
	if in.mapped {
		b = append(b, inodeFormatMapped)
	} else {
		b = append(b, inodeFormat)
	}
	b = binary.BigEndian.AppendUint32(b, in.Mode)
	b = binary.BigEndian.AppendUint32(b, in.Nlink)
	b = binary.BigEndian.AppendUint32(b, in.Uid)
	b = binary.BigEndian.AppendUint32(b, in.Gid)
	b = binary.BigEndian.AppendUint32(b, in.Rdev)
	b = binary.BigEndian.AppendUint64(b, in.Size)
	b = binary.BigEndian.AppendUint64(b, uint64(in.Atime))
	b = binary.BigEndian.AppendUint64(b, uint64(in.Mtime))
	b = binary.BigEndian.AppendUint64(b, uint64(in.Ctime))
	b = binary.BigEndian.AppendUint64(b, in.Version)
	b = binary.BigEndian.AppendUint64(b, uint64(in.parent))
	b = binary.BigEndian.AppendUint64(b, in.nextCookie)
	b = binary.BigEndian.AppendUint64(b, in.Change)
	if in.mapped {
		b = binary.BigEndian.AppendUint64(b, in.stored)
	}
	return b
}

func (in *inode) decode(ino ids.Ino, v []byte) error {
	if !(len(v) == inodeSize && v[0] == inodeFormat || len(v) == inodeSizeOld && v[0] == inodeFormatV1 ||
		len(v) == inodeSizeMapped && v[0] == inodeFormatMapped) {
		return wire.Errf(wire.CodeIO, "corrupt attribute record of %v (%d bytes)", ino, len(v))
	}
	format := v[0]
	v = v[1:]
	u32 := func() uint32 { x := binary.BigEndian.Uint32(v); v = v[4:]; return x }
	u64 := func() uint64 { x := binary.BigEndian.Uint64(v); v = v[8:]; return x }
	in.Ino = ino
	in.Mode, in.Nlink, in.Uid, in.Gid, in.Rdev = u32(), u32(), u32(), u32(), u32()
	in.Size = u64()
	in.Atime, in.Mtime, in.Ctime = int64(u64()), int64(u64()), int64(u64())
	in.Version = u64()
	in.parent = ids.Ino(u64())
	in.nextCookie = u64()
	in.Change = 0
	if len(v) >= 8 {
		in.Change = u64()
	}
	in.mapped, in.stored = format == inodeFormatMapped, 0
	if in.mapped {
		in.stored = u64()
	}
	in.setBlocks()
	return nil
}

// setBlocks sets st_blocks: what a block-mapped file stores, else its size
// (holes in pages are not tracked).
func (in *inode) setBlocks() {
	if in.mapped {
		in.Blocks = in.stored / 512
	} else {
		in.Blocks = (in.Size + 511) / 512
	}
}

var (
	errNotFound = wire.Err(wire.CodeNotFound)
	errNotDir   = wire.Err(wire.CodeNotDir)
	errIsDir    = wire.Err(wire.CodeIsDir)
	errExists   = wire.Err(wire.CodeExists)
	errNoData   = wire.Err(wire.CodeNoData)
)

// inode loads an inode once per transaction; later calls return the same
// (possibly modified) value. errNotFound if it does not exist.
func (tx *Tx) inode(ino ids.Ino) (*inode, error) {
	for _, in := range tx.inodes {
		if in.Ino == ino {
			if in.deleted {
				return nil, errNotFound
			}
			return in, nil
		}
	}
	in := &inode{}
	var derr error
	ok, err := tx.get(tx.key(RecAttr, ino, nil), func(v []byte) error {
		derr = in.decode(ino, v)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	if !ok {
		return nil, errNotFound
	}
	tx.inodes = append(tx.inodes, in)
	return in, nil
}

// dir loads a directory: errNotDir if ino is something else.
func (tx *Tx) dir(ino ids.Ino) (*inode, error) {
	in, err := tx.inode(ino)
	if err != nil {
		return nil, err
	}
	if !in.IsDir() {
		return nil, errNotDir
	}
	return in, nil
}

// addInode adds a new inode to the transaction (written at flush).
func (tx *Tx) addInode(in *inode) {
	in.touch()
	tx.inodes = append(tx.inodes, in)
}

// touch marks in changed by the transaction, to be written at flush: its
// Change counts the transaction once, and what the operation returns of
// its attributes (after touch) carries the new count.
func (in *inode) touch() {
	if !in.dirty {
		in.dirty = true
		in.Change++
	}
	in.setBlocks()
}

// flush writes the inodes the operation changed or deleted.
func (tx *Tx) flush() error {
	for _, in := range tx.inodes {
		var err error
		switch {
		case in.deleted:
			err = tx.del(tx.key(RecAttr, in.Ino, nil))
		case in.dirty:
			err = tx.set(tx.key(RecAttr, in.Ino, nil), in.encode(make([]byte, 0, inodeSizeMapped)))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// CheckName validates a name in a directory.
func CheckName(name string) error {
	if name == "" || name == "." || name == ".." {
		return wire.Errf(wire.CodeInvalid, "invalid name %q", name)
	}
	if len(name) > NameMax {
		return wire.Errf(wire.CodeNameTooLong, "name of %d bytes", len(name))
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '/' || name[i] == 0 {
			return wire.Errf(wire.CodeInvalid, "name %q contains '/' or NUL", name)
		}
	}
	return nil
}
