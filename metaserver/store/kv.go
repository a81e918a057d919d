package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/ratelog"
)

// kvTxn is the store's view of one key-value transaction, the size of
// JuiceFS's pkg/meta/tkv.go kvtxn. Badger sits behind it today; a replication
// layer can wrap it (Tx already records every write per inode).
//
// Keys and values passed to set must stay unmodified until the transaction
// ends. Slices handed to callbacks are valid only during the callback.
type kvTxn interface {
	// get calls fn with the value of key and reports whether the key exists.
	get(key []byte, fn func(val []byte) error) (found bool, err error)
	set(key, val []byte) error
	del(key []byte) error
	// scan calls fn for the keys under prefix, in key order from start
	// (inclusive; nil means the whole prefix), or in reverse order from start
	// downwards when reverse is set, until fn returns false. Values are
	// read only when values is set (val is nil otherwise).
	scan(prefix, start []byte, reverse, values bool, fn func(key, val []byte) (more bool, err error)) error
	// admit checks that what the transaction wrote so far fits on the
	// file system (space.go), failing with wire.CodeNoSpace. The store's
	// update admits every transaction before it commits; a caller that
	// must know before it commits (a cluster owner, before it sends the
	// change to the other replicas) calls it itself.
	admit() error
}

// kvStore is a transactional key-value store.
type kvStore interface {
	// update runs fn in a read-write transaction and commits it. It returns
	// errConflict when the commit lost against a concurrent transaction; the
	// caller retries.
	update(fn func(kvTxn) error) error
	// view runs fn in a read-only transaction.
	view(fn func(kvTxn) error) error
	sync() error
	close() error
	size() (lsm, vlog int64)
}

// errConflict is what kvStore.update returns when it must be retried.
var errConflict = errors.New("store: transaction conflict")

// badgerKV is the kvStore over a badger database.
type badgerKV struct {
	db        *badger.DB
	pf        *prefaulter // nil: none
	threshold int         // values of this size or more go to the value log
	space     *spaceGuard // nil: in memory
	// gate is read-held by every update; Store.reclaim holds it to make
	// badger flush and compact, during which badger refuses writes.
	gate *sync.RWMutex
}

func (b badgerKV) update(fn func(kvTxn) error) error {
	var logged int64
	var cost txnCost
	if b.gate != nil {
		b.gate.RLock()
		defer b.gate.RUnlock()
	}
	err := b.db.Update(func(t *badger.Txn) error {
		if err := fn(badgerTxn{t, &logged, b.threshold, &cost, b.space}); err != nil {
			return err
		}
		return b.space.admit(&cost)
	})
	cost.done()
	if errors.Is(err, badger.ErrConflict) {
		return errConflict
	}
	if err == nil {
		b.pf.committed(logged)
		if cost.removes > 0 && b.space != nil {
			b.space.removed.Add(1)
		}
	}
	return err
}

func (b badgerKV) view(fn func(kvTxn) error) error {
	return b.db.View(func(t *badger.Txn) error { return fn(badgerTxn{t: t}) })
}

func (b badgerKV) sync() error  { return b.db.Sync() }
func (b badgerKV) close() error { return b.db.Close() }

// size is what the store takes on disk: its tables, and the blocks its value
// log files hold (they are sparse and mapped larger than they are written).
// badger's own Size reads its metrics, which are off.
func (b badgerKV) size() (lsm, vlog int64) {
	lsm = levelsSize(b.db)
	dir := b.db.Opts().ValueDir
	if b.db.Opts().InMemory || dir == "" {
		return lsm, 0
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		var st syscall.Stat_t
		if strings.HasSuffix(e.Name(), ".vlog") && syscall.Stat(filepath.Join(dir, e.Name()), &st) == nil {
			vlog += st.Blocks * 512
		}
	}
	return lsm, vlog
}

// levelsSize is the size of badger's table files.
func levelsSize(db *badger.DB) int64 {
	var n int64
	for _, l := range db.Levels() {
		n += l.Size
	}
	return n
}

type badgerTxn struct {
	t         *badger.Txn
	logged    *int64 // bytes set that go to the value log (update only)
	threshold int
	cost      *txnCost // update only
	space     *spaceGuard
}

func (b badgerTxn) get(key []byte, fn func(val []byte) error) (bool, error) {
	item, err := b.t.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fn == nil {
		return true, nil
	}
	return true, item.Value(fn)
}

func (b badgerTxn) set(key, val []byte) error {
	if b.logged != nil && len(val) >= b.threshold {
		// the entry's key with its version, value, a header of 2 bytes
		// or more and a checksum
		*b.logged += int64(len(key) + 8 + len(val) + 2 + 4)
	}
	if b.cost != nil {
		b.cost.set(key, val, len(val) >= b.threshold)
	}
	return b.t.Set(key, val)
}

func (b badgerTxn) del(key []byte) error {
	if b.cost != nil {
		b.cost.del(key)
	}
	return b.t.Delete(key)
}

func (b badgerTxn) admit() error {
	if b.cost == nil {
		return nil
	}
	return b.space.admit(b.cost)
}

func (b badgerTxn) scan(prefix, start []byte, reverse, values bool, fn func(key, val []byte) (bool, error)) error {
	opts := badger.IteratorOptions{Prefix: prefix, Reverse: reverse}
	it := b.t.NewIterator(opts)
	defer it.Close()
	seek := start
	if seek == nil {
		seek = prefix
		if reverse {
			// the largest key under prefix is below prefix+0xff...
			seek = append(append(make([]byte, 0, len(prefix)+16), prefix...),
				0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
		}
	}
	for it.Seek(seek); it.Valid(); it.Next() {
		item := it.Item()
		var more bool
		var err error
		if values {
			verr := item.Value(func(v []byte) error {
				more, err = fn(item.Key(), v)
				return nil
			})
			if verr != nil {
				return verr
			}
		} else {
			more, err = fn(item.Key(), nil)
		}
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// badgerLogger routes badger's log to slog: errors and warnings only, its
// info and debug chatter is dropped. A warning badger repeats (its block
// cache advice comes every minute, forever, after one large scan) is
// logged once an hour, with how many were left out.
type badgerLogger struct {
	log   *slog.Logger
	warns *ratelog.Limiter // keyed by the warning's format
}

func newBadgerLogger(log *slog.Logger) badgerLogger {
	return badgerLogger{log: log, warns: ratelog.NewLimiter(1, time.Hour, 64)}
}

func (l badgerLogger) Errorf(f string, a ...any) {
	l.log.Error("badger: " + trimNL(fmt.Sprintf(f, a...)))
}

func (l badgerLogger) Warningf(f string, a ...any) {
	l.warns.Warn(l.log, f, "badger: "+trimNL(fmt.Sprintf(f, a...)))
}
func (badgerLogger) Infof(string, ...any)  {}
func (badgerLogger) Debugf(string, ...any) {}

func trimNL(s string) string {
	for len(s) > 0 && s[len(s)-1] == '\n' {
		s = s[:len(s)-1]
	}
	return s
}

// Write is one record an operation wrote (or deleted, when Delete is set).
// Every record belongs to exactly one inode (DESIGN.md), so a replication
// layer can route each Write by Ino.
type Write struct {
	Key, Value []byte
	Delete     bool
}

// Ino is the inode the record belongs to.
func (w Write) Ino() ids.Ino { return KeyIno(w.Key) }

func (w Write) String() string {
	if w.Delete {
		return fmt.Sprintf("del %c %v %x", w.Key[0], w.Ino(), w.Key[9:])
	}
	return fmt.Sprintf("set %c %v %x (%d bytes)", w.Key[0], w.Ino(), w.Key[9:], len(w.Value))
}

// KeyIno is the inode a record key belongs to (0 for a key too short).
func KeyIno(key []byte) ids.Ino {
	if len(key) < 9 {
		return 0
	}
	return ids.Ino(binary.BigEndian.Uint64(key[1:9]))
}

// Tx is one store transaction: the only way store operations read and write
// records. It records every write (Writes), caches the inodes it loaded so an
// operation touching one inode twice (rename within a directory) sees its own
// changes, and writes the changed inodes back when the operation's function
// returns. Not safe for concurrent use.
type Tx struct {
	kv     kvTxn
	write  bool
	record bool // the writes are recorded (Writes): not in UpdateRaw
	writes []Write
	inodes []*inode // loaded in this transaction, at most a handful
	arena  []byte   // keys built in this transaction
	bufs   []*[]byte
	st     *Store
}

// Writes lists what the transaction wrote, in order. The caller must not
// modify the slices; values are valid until the next operation on the store.
func (tx *Tx) Writes() []Write { return tx.writes }

func (tx *Tx) reset(kv kvTxn, write bool) {
	tx.kv = kv
	tx.write = write
	tx.record = write
	tx.writes = tx.writes[:0]
	clear(tx.inodes)
	tx.inodes = tx.inodes[:0]
	tx.arena = tx.arena[:0]
	tx.releaseBufs()
}

func (tx *Tx) releaseBufs() {
	for _, b := range tx.bufs {
		pagePool.Put(b)
	}
	clear(tx.bufs)
	tx.bufs = tx.bufs[:0]
}

// key builds prefix|ino|suffix in the transaction's arena. The arena may be
// reallocated; earlier keys keep the old backing array alive, so they stay valid.
func (tx *Tx) key(prefix byte, ino ids.Ino, suffix []byte) []byte {
	n := len(tx.arena)
	if cap(tx.arena)-n < 9+len(suffix) {
		tx.arena = make([]byte, 0, max(512, 2*(9+len(suffix))))
		n = 0
	}
	tx.arena = append(tx.arena, prefix)
	tx.arena = binary.BigEndian.AppendUint64(tx.arena, uint64(ino))
	tx.arena = append(tx.arena, suffix...)
	return tx.arena[n:len(tx.arena):len(tx.arena)]
}

func (tx *Tx) keyStr(prefix byte, ino ids.Ino, suffix string) []byte {
	n := len(tx.arena)
	if cap(tx.arena)-n < 9+len(suffix) {
		tx.arena = make([]byte, 0, max(512, 2*(9+len(suffix))))
		n = 0
	}
	tx.arena = append(tx.arena, prefix)
	tx.arena = binary.BigEndian.AppendUint64(tx.arena, uint64(ino))
	tx.arena = append(tx.arena, suffix...)
	return tx.arena[n:len(tx.arena):len(tx.arena)]
}

// Key builds the record key kind|ino|suffix in the transaction's memory,
// valid until the transaction ends.
func (tx *Tx) Key(kind byte, ino ids.Ino, suffix []byte) []byte { return tx.key(kind, ino, suffix) }

// Key64 is Key with a big-endian 8-byte suffix.
func (tx *Tx) Key64(kind byte, ino ids.Ino, n uint64) []byte { return tx.key64(kind, ino, n) }

func (tx *Tx) key64(prefix byte, ino ids.Ino, n uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	return tx.key(prefix, ino, b[:])
}

func (tx *Tx) get(key []byte, fn func(val []byte) error) (bool, error) { return tx.kv.get(key, fn) }

func (tx *Tx) set(key, val []byte) error {
	if !tx.write {
		panic("store: write in a read-only transaction")
	}
	if err := tx.kv.set(key, val); err != nil {
		return err
	}
	if tx.record {
		tx.writes = append(tx.writes, Write{Key: key, Value: val})
	}
	return nil
}

func (tx *Tx) del(key []byte) error {
	if !tx.write {
		panic("store: delete in a read-only transaction")
	}
	if err := tx.kv.del(key); err != nil {
		return err
	}
	if tx.record {
		tx.writes = append(tx.writes, Write{Key: key, Delete: true})
	}
	return nil
}

func (tx *Tx) scan(prefix, start []byte, reverse, values bool, fn func(key, val []byte) (bool, error)) error {
	return tx.kv.scan(prefix, start, reverse, values, fn)
}

// Set writes a raw record; for a replication layer applying records.
func (tx *Tx) Set(key, val []byte) error {
	if len(key) < 9 {
		return fmt.Errorf("store: record key %x too short", key)
	}
	return tx.set(key, val)
}

// Delete deletes a raw record.
func (tx *Tx) Delete(key []byte) error {
	if len(key) < 9 {
		return fmt.Errorf("store: record key %x too short", key)
	}
	return tx.del(key)
}

// Get calls fn with a raw record's value and reports whether it exists.
func (tx *Tx) Get(key []byte, fn func(val []byte) error) (bool, error) { return tx.get(key, fn) }

// Scan calls fn for the records under prefix, in key order from start
// (inclusive; nil means the whole prefix), or in reverse order from start
// downwards when reverse is set, until fn returns false. Values are read
// only when values is set (val is nil otherwise). Slices handed to fn are
// valid only during the call.
func (tx *Tx) Scan(prefix, start []byte, reverse, values bool, fn func(key, val []byte) (more bool, err error)) error {
	return tx.scan(prefix, start, reverse, values, fn)
}

// Iterate calls fn for every record whose key starts with prefix, in key
// order, until fn returns false.
func (tx *Tx) Iterate(prefix []byte, fn func(key, val []byte) (bool, error)) error {
	return tx.scan(prefix, nil, false, true, fn)
}
