package locks

import (
	"fmt"
	"math"
	"slices"

	"github.com/leasefs/leasefs/internal/ids"
)

// LockType is a POSIX lock type. The values are Linux's F_RDLCK, F_WRLCK and
// F_UNLCK so that shells convert with a plain cast.
type LockType uint8

const (
	ReadLock  LockType = 0 // F_RDLCK; LOCK_SH for flock
	WriteLock LockType = 1 // F_WRLCK; LOCK_EX for flock
	Unlock    LockType = 2 // F_UNLCK; LOCK_UN for flock
)

func (l LockType) String() string {
	switch l {
	case ReadLock:
		return "read"
	case WriteLock:
		return "write"
	case Unlock:
		return "unlock"
	}
	return fmt.Sprintf("locktype(%d)", uint8(l))
}

// ToEOF is the End of a range that extends to the end of the file (l_len 0).
const ToEOF = math.MaxUint64

// Owner identifies a lock owner: the kernel's lock owner (fcntl: the process's
// files table; flock: the open file description) on one client.
type Owner struct {
	Client ids.ClientID
	Owner  uint64
}

func (o Owner) String() string { return fmt.Sprintf("%v/owner:%x", o.Client, o.Owner) }

// PosixLock is a POSIX advisory lock, a request to set one, or a conflicting
// lock reported by Get. fcntl and flock locks are separate namespaces, as in
// Linux: a flock lock never conflicts with an fcntl lock.
type PosixLock struct {
	Owner Owner
	Pid   uint32 // reported by F_GETLK
	Flock bool   // flock(2) whole-file lock instead of an fcntl range
	Type  LockType
	// Start and End are inclusive byte offsets; End is ToEOF for "to the
	// end of the file". Ignored for flock.
	Start, End uint64
}

func (l PosixLock) overlaps(m PosixLock) bool {
	return l.Flock == m.Flock && (l.Flock || l.Start <= m.End && m.Start <= l.End)
}

func (l PosixLock) conflicts(m PosixLock) bool {
	return l.Owner != m.Owner && l.overlaps(m) && (l.Type == WriteLock || m.Type == WriteLock)
}

// WaiterID names a blocked SetWait request.
type WaiterID uint64

// PosixGrant reports that a blocked request was granted (and applied).
type PosixGrant struct {
	Waiter WaiterID
	Ino    ids.Ino
	Lock   PosixLock
}

// PosixConfig bounds a PosixTable.
type PosixConfig struct {
	MaxLocks   int // locks per inode (ranges split); more fail with ErrTooManyLocks
	MaxWaiters int // blocked requests per inode
}

// DefaultPosixConfig returns 4096 locks and 1024 waiters per inode.
func DefaultPosixConfig() PosixConfig { return PosixConfig{MaxLocks: 4096, MaxWaiters: 1024} }

type posixWaiter struct {
	id  WaiterID
	ino ids.Ino
	lk  PosixLock
}

type posixInode struct {
	locks   []PosixLock // sorted by owner, namespace, start
	waiters []posixWaiter
}

// PosixTable is the server's table of POSIX advisory locks. Not safe for
// concurrent use. Blocked requests are retried in arrival order whenever a
// lock on their inode goes away; POSIX promises no fairness, this gives
// first-come first-served among requests that conflict with each other.
type PosixTable struct {
	cfg    PosixConfig
	inodes map[ids.Ino]*posixInode
	nextID WaiterID
	where  map[WaiterID]ids.Ino
}

// NewPosixTable returns an empty table. It panics on a config without room
// for one lock and one waiter.
func NewPosixTable(cfg PosixConfig) *PosixTable {
	if cfg.MaxLocks < 1 || cfg.MaxWaiters < 1 {
		panic("locks: NewPosixTable: limits must be at least 1")
	}
	return &PosixTable{cfg: cfg, inodes: map[ids.Ino]*posixInode{}, where: map[WaiterID]ids.Ino{}}
}

func validate(lk PosixLock) error {
	if lk.Type > Unlock {
		return fmt.Errorf("%w: lock type %d", ErrBadMode, lk.Type)
	}
	if !lk.Flock && lk.Start > lk.End {
		return fmt.Errorf("%w: %d-%d", ErrBadRange, lk.Start, lk.End)
	}
	return nil
}

// Get returns the first lock of another owner that would block lk (F_GETLK),
// and false if lk could be set.
func (t *PosixTable) Get(ino ids.Ino, lk PosixLock) (PosixLock, bool, error) {
	if err := validate(lk); err != nil {
		return PosixLock{}, false, err
	}
	if lk.Type == Unlock {
		return PosixLock{}, false, nil
	}
	if in := t.inodes[ino]; in != nil {
		for _, l := range in.locks {
			if l.conflicts(lk) {
				return l, true, nil
			}
		}
	}
	return PosixLock{}, false, nil
}

// Set sets, changes or removes (Type Unlock) a lock without waiting
// (F_SETLK, flock with LOCK_NB). A conflict fails with ErrConflict and
// changes nothing. Removing a lock may grant blocked requests, returned.
func (t *PosixTable) Set(ino ids.Ino, lk PosixLock) ([]PosixGrant, error) {
	if err := validate(lk); err != nil {
		return nil, err
	}
	in := t.inodes[ino]
	if in == nil {
		if lk.Type == Unlock {
			return nil, nil
		}
		in = &posixInode{}
		t.inodes[ino] = in
	}
	if lk.Type != Unlock {
		if c, ok := t.conflict(in, lk); ok {
			t.tidy(ino)
			return nil, fmt.Errorf("%w: %v holds %v %d-%d", ErrConflict, c.Owner, c.Type, c.Start, c.End)
		}
	}
	if err := t.apply(in, lk); err != nil {
		t.tidy(ino)
		return nil, err
	}
	return t.retry(ino), nil
}

// SetWait is Set for a request that may block (F_SETLKW, flock without
// LOCK_NB). It returns the request's id; if it was granted at once the
// returned grants include it, otherwise it waits until a later call returns
// a grant with its id, or it is cancelled. A request that would close a cycle
// of fcntl owners waiting for each other fails with ErrDeadlock (EDEADLK).
func (t *PosixTable) SetWait(ino ids.Ino, lk PosixLock) (WaiterID, []PosixGrant, error) {
	if err := validate(lk); err != nil {
		return 0, nil, err
	}
	t.nextID++
	id := t.nextID
	in := t.inodes[ino]
	if in == nil {
		in = &posixInode{}
		t.inodes[ino] = in
	}
	if _, ok := t.conflict(in, lk); !ok || lk.Type == Unlock {
		if err := t.apply(in, lk); err != nil {
			t.tidy(ino)
			return 0, nil, err
		}
		grants := append([]PosixGrant{{Waiter: id, Ino: ino, Lock: lk}}, t.retry(ino)...)
		t.tidy(ino)
		return id, grants, nil
	}
	if len(in.waiters) >= t.cfg.MaxWaiters {
		return 0, nil, fmt.Errorf("%w: %v has %d", ErrTooManyWaiters, ino, len(in.waiters))
	}
	if !lk.Flock && t.wouldDeadlock(ino, lk) {
		return 0, nil, fmt.Errorf("%w: %v on %v", ErrDeadlock, lk.Owner, ino)
	}
	in.waiters = append(in.waiters, posixWaiter{id: id, ino: ino, lk: lk})
	t.where[id] = ino
	return id, nil, nil
}

// Cancel withdraws a blocked request (the caller was interrupted).
func (t *PosixTable) Cancel(id WaiterID) error {
	ino, ok := t.where[id]
	if !ok {
		return fmt.Errorf("%w: posix waiter %d", ErrNotWaiting, id)
	}
	in := t.inodes[ino]
	in.waiters = slices.DeleteFunc(in.waiters, func(w posixWaiter) bool { return w.id == id })
	delete(t.where, id)
	t.tidy(ino)
	return nil
}

// ReleaseOwner removes every lock and blocked request of owner on ino, in
// both namespaces (the file was closed), and returns the grants that became
// possible.
func (t *PosixTable) ReleaseOwner(client ids.ClientID, owner uint64, ino ids.Ino) []PosixGrant {
	o := Owner{Client: client, Owner: owner}
	return t.remove(ino, func(o2 Owner) bool { return o2 == o })
}

// Steal removes every lock and blocked request of client on every inode (the
// client timed out) and returns the grants that became possible, in inode
// order.
func (t *PosixTable) Steal(client ids.ClientID) []PosixGrant {
	inos := make([]ids.Ino, 0, len(t.inodes))
	for ino := range t.inodes {
		inos = append(inos, ino)
	}
	slices.Sort(inos)
	var out []PosixGrant
	for _, ino := range inos {
		out = append(out, t.remove(ino, func(o Owner) bool { return o.Client == client })...)
	}
	return out
}

// Locks returns ino's locks (caller owns the slice).
func (t *PosixTable) Locks(ino ids.Ino) []PosixLock {
	if in := t.inodes[ino]; in != nil {
		return slices.Clone(in.locks)
	}
	return nil
}

// Waiting returns the blocked requests on ino in arrival order.
func (t *PosixTable) Waiting(ino ids.Ino) []PosixGrant {
	in := t.inodes[ino]
	if in == nil {
		return nil
	}
	out := make([]PosixGrant, len(in.waiters))
	for i, w := range in.waiters {
		out[i] = PosixGrant{Waiter: w.id, Ino: ino, Lock: w.lk}
	}
	return out
}

// Len returns the number of inodes with locks or waiters.
func (t *PosixTable) Len() int { return len(t.inodes) }

func (t *PosixTable) remove(ino ids.Ino, match func(Owner) bool) []PosixGrant {
	in := t.inodes[ino]
	if in == nil {
		return nil
	}
	in.locks = slices.DeleteFunc(in.locks, func(l PosixLock) bool { return match(l.Owner) })
	in.waiters = slices.DeleteFunc(in.waiters, func(w posixWaiter) bool {
		if match(w.lk.Owner) {
			delete(t.where, w.id)
			return true
		}
		return false
	})
	return t.retry(ino)
}

func (t *PosixTable) conflict(in *posixInode, lk PosixLock) (PosixLock, bool) {
	for _, l := range in.locks {
		if l.conflicts(lk) {
			return l, true
		}
	}
	return PosixLock{}, false
}

// apply replaces owner's locks over lk's range (same namespace) by lk,
// splitting partly covered locks and merging with adjacent ones of the same
// type. The caller has checked for conflicts.
func (t *PosixTable) apply(in *posixInode, lk PosixLock) error {
	var keep, mine []PosixLock
	for _, l := range in.locks {
		if l.Owner != lk.Owner || l.Flock != lk.Flock {
			keep = append(keep, l)
		} else {
			mine = append(mine, l)
		}
	}
	var next []PosixLock
	if lk.Flock {
		// One flock lock per owner: converting replaces it (Linux
		// drops the old lock first as well).
		if lk.Type != Unlock {
			next = append(next, lk)
		}
	} else {
		add := lk
		for _, l := range mine {
			if !l.overlaps(add) && !(l.Type == add.Type && adjacent(l, add)) {
				next = append(next, l)
				continue
			}
			if l.Type == add.Type && add.Type != Unlock {
				// Merge: same type, overlapping or touching.
				add.Start, add.End = min(add.Start, l.Start), max(add.End, l.End)
				continue
			}
			if !l.overlaps(lk) {
				next = append(next, l)
				continue
			}
			// Different type: keep the parts outside lk's range.
			if l.Start < lk.Start {
				left := l
				left.End = lk.Start - 1
				next = append(next, left)
			}
			if l.End > lk.End {
				right := l
				right.Start = lk.End + 1
				next = append(next, right)
			}
		}
		if add.Type != Unlock {
			next = append(next, add)
		}
	}
	if len(keep)+len(next) > t.cfg.MaxLocks {
		return fmt.Errorf("%w: %d", ErrTooManyLocks, len(keep)+len(next))
	}
	in.locks = append(keep, next...)
	slices.SortFunc(in.locks, cmpLock)
	return nil
}

// adjacent reports whether a and b touch without overlapping.
func adjacent(a, b PosixLock) bool {
	return a.End != ToEOF && a.End+1 == b.Start || b.End != ToEOF && b.End+1 == a.Start
}

func cmpLock(a, b PosixLock) int {
	switch {
	case a.Owner.Client != b.Owner.Client:
		return cmpU(uint64(a.Owner.Client), uint64(b.Owner.Client))
	case a.Owner.Owner != b.Owner.Owner:
		return cmpU(a.Owner.Owner, b.Owner.Owner)
	case a.Flock != b.Flock:
		if a.Flock {
			return 1
		}
		return -1
	}
	return cmpU(a.Start, b.Start)
}

func cmpU(a, b uint64) int {
	if a < b {
		return -1
	}
	if a > b {
		return 1
	}
	return 0
}

// retry grants, in arrival order, the blocked requests on ino that no longer
// conflict.
func (t *PosixTable) retry(ino ids.Ino) []PosixGrant {
	in := t.inodes[ino]
	if in == nil {
		return nil
	}
	var out []PosixGrant
	for i := 0; i < len(in.waiters); {
		w := in.waiters[i]
		if _, blocked := t.conflict(in, w.lk); blocked {
			i++
			continue
		}
		if err := t.apply(in, w.lk); err != nil {
			i++ // no room yet: stays blocked until locks go away
			continue
		}
		in.waiters = slices.Delete(in.waiters, i, i+1)
		delete(t.where, w.id)
		out = append(out, PosixGrant{Waiter: w.id, Ino: ino, Lock: w.lk})
	}
	t.tidy(ino)
	return out
}

func (t *PosixTable) tidy(ino ids.Ino) {
	if in := t.inodes[ino]; in != nil && len(in.locks) == 0 && len(in.waiters) == 0 {
		delete(t.inodes, ino)
	}
}

// wouldDeadlock reports whether lk's owner, by waiting, would close a cycle:
// some owner that holds a lock blocking lk waits (transitively) for a lock
// held by lk's owner. Waiters on every inode count, as in Linux.
func (t *PosixTable) wouldDeadlock(ino ids.Ino, lk PosixLock) bool {
	// blockers returns the owners holding locks that block w.
	blockers := func(wino ids.Ino, w PosixLock) []Owner {
		var out []Owner
		for _, l := range t.inodes[wino].locks {
			if l.conflicts(w) && !slices.Contains(out, l.Owner) {
				out = append(out, l.Owner)
			}
		}
		return out
	}
	seen := map[Owner]bool{}
	stack := blockers(ino, lk)
	for len(stack) > 0 {
		o := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if o == lk.Owner {
			return true
		}
		if seen[o] {
			continue
		}
		seen[o] = true
		for wino, in := range t.inodes {
			for _, w := range in.waiters {
				if w.lk.Owner == o && !w.lk.Flock {
					stack = append(stack, blockers(wino, w.lk)...)
				}
			}
		}
	}
	return false
}
