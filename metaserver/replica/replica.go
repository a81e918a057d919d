package replica

// Replicated records, per inode and fenced by the inode's ownership epoch
// (DESIGN.md, "Servers, ownership and replication").
//
// Every inode's replication state is its 'E' record: the epoch (PaxosLease
// ballot) of the owner that last changed it and its version, the number of
// changes made to it, monotonic across owners. A change to one inode made by
// the owner of epoch e is stamped (e, v); a replica applies it only on top of
// the state it was made from, (e, v-1), or on an inode it has never seen
// changed (version 0, which is empty). So within one epoch (epoch, version)
// names one state of the inode, and a replica never holds a state that no
// owner made.
//
// # Caller's duties
//
// The owner's store is opened with StoreOptions.OwnerEpoch: each operation
// is then fenced and stamped in its own transaction (stampOwned), and
// OnCommit's writes, split with SplitByInode, are the ReplicaChanges to send.
// Sync the owner's store before counting it in the majority. Replicas call
// ApplyReplica (synced). A replica that answers ErrVersionGap needs the
// inode's state: copy it over with CopyInode (store_transfer.go), a page at
// a time, whatever its size.
//
// A new owner of epoch e first reads ReplicaState from a majority, takes
// the newest, and makes a majority (itself included) hold it stamped e
// (RestampInode where a replica holds it already, CopyInode with Epoch e
// elsewhere) before it serves a change to the inode.
//
// # Safety
//
// Every path that writes replicated records goes through admit: a stored
// epoch newer than the offered one rejects the whole batch with a
// *StaleEpochError, so a deposed owner cannot overwrite anything whatever the
// clocks do. 'S' (the server's inode counter) is never replicated.

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"slices"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/wire"
)

// Replica is the replication layer over one server's store: the changes,
// states and digests a cluster server exchanges with its peers. Safe for
// concurrent use.
type Replica struct {
	st  *store.Store
	log *slog.Logger
}

// New returns the replication layer over st.
func New(st *store.Store) *Replica { return &Replica{st: st, log: st.Logger()} }

// replPrefixes are the record kinds replicated with an inode, in key order,
// its 'E' state excluded.
var replPrefixes = [...]byte{store.RecAttr, store.RecCookie, store.RecEntry, store.RecSymlink, store.RecPage, store.RecDone, store.RecXattr}

// MaxIno is the largest inode number; a digest page through it is the last.
const MaxIno = ids.Ino(^uint64(0))

// MaxSnapshotRecords bounds the records of one InodeSnapshot (a file of up
// to 16 MiB), which InodeState holds in memory; transfers between servers
// go a page at a time instead (CopyInode).
const MaxSnapshotRecords = 4096

const (
	replFormat = 1
	// replSwitching marks an 'E' record whose state is being switched in
	// from a transfer's staging (store_transfer.go): the replica holds it,
	// partly still staged.
	replSwitching = 2
	replSize      = 1 + 8 + 8
)

var (
	// ErrStaleEpoch: a change or snapshot carries an older epoch than the
	// replica has seen for the inode (errors.As gives *StaleEpochError).
	ErrStaleEpoch = errors.New("metaserver: stale epoch")
	// ErrVersionGap: the replica's state of the inode is not the one the
	// change was made from (it missed changes, or holds another owner's
	// unacknowledged ones); it needs the inode's state (ReplaceInode).
	// errors.As gives *VersionGapError.
	ErrVersionGap = errors.New("metaserver: replica needs the inode's state")
	// ErrBadChange: a malformed change or snapshot (records of another
	// inode or of a local kind, zero epoch or version).
	ErrBadChange = errors.New("metaserver: malformed replica change")
	// ErrSnapshotTooBig: the inode has more than MaxSnapshotRecords records
	// for InodeState.
	ErrSnapshotTooBig = errors.New("metaserver: inode too big for one snapshot")
)

// StaleEpochError names the inode whose stored epoch (Seen) is newer than
// the one offered. errors.Is(err, ErrStaleEpoch) matches it.
type StaleEpochError struct {
	Ino           ids.Ino
	Offered, Seen ids.Epoch
}

func (e *StaleEpochError) Error() string {
	return fmt.Sprintf("metaserver: stale epoch for %v: offered %v, seen %v", e.Ino, e.Offered, e.Seen)
}

func (e *StaleEpochError) Is(target error) bool { return target == ErrStaleEpoch }

// VersionGapError: a change stamped (Epoch, Version) of Ino met a replica at
// (SeenEpoch, SeenVersion), which is not its base. errors.Is(err,
// ErrVersionGap) matches it.
type VersionGapError struct {
	Ino         ids.Ino
	Epoch       ids.Epoch
	Version     uint64
	SeenEpoch   ids.Epoch
	SeenVersion uint64
}

func (e *VersionGapError) Error() string {
	return fmt.Sprintf("metaserver: change %v/%d of %v does not follow the replica's %v/%d",
		e.Epoch, e.Version, e.Ino, e.SeenEpoch, e.SeenVersion)
}

func (e *VersionGapError) Is(target error) bool { return target == ErrVersionGap }

// replState is an inode's 'E' record. The zero value is an inode never
// changed under replication.
type replState struct {
	epoch   ids.Epoch
	version uint64
}

func (r replState) less(o replState) bool {
	return r.epoch < o.epoch || r.epoch == o.epoch && r.version < o.version
}

func (r replState) encode(b []byte) []byte {
	b = append(b, replFormat)
	b = binary.BigEndian.AppendUint64(b, uint64(r.epoch))
	return binary.BigEndian.AppendUint64(b, r.version)
}

func (r replState) encodeSwitching(b []byte) []byte {
	b = r.encode(b)
	b[len(b)-replSize] = replSwitching
	return b
}

func decodeRepl(ino ids.Ino, v []byte) (replState, error) {
	r, _, err := decodeReplEntry(ino, v)
	return r, err
}

// decodeReplEntry also reports whether the state is being switched in.
func decodeReplEntry(ino ids.Ino, v []byte) (replState, bool, error) {
	if len(v) != replSize || v[0] != replFormat && v[0] != replSwitching {
		return replState{}, false, wire.Errf(wire.CodeIO, "corrupt replication record of %v (%d bytes)", ino, len(v))
	}
	return replState{ids.Epoch(binary.BigEndian.Uint64(v[1:])), binary.BigEndian.Uint64(v[9:])}, v[0] == replSwitching, nil
}

// replState is the state the replica claims for ino (held, even while
// being switched in).
func heldState(tx *store.Tx, ino ids.Ino) (replState, error) {
	r, _, err := replEntry(tx, ino)
	return r, err
}

// replEntry is replState, and whether the inode's records are being
// switched to it (they must not be read or changed until settled).
func replEntry(tx *store.Tx, ino ids.Ino) (replState, bool, error) {
	var r replState
	var switching bool
	var derr error
	_, err := tx.Get(tx.Key(store.RecRepl, ino, nil), func(v []byte) error {
		r, switching, derr = decodeReplEntry(ino, v)
		return nil
	})
	if err == nil {
		err = derr
	}
	return r, switching, err
}

// setReplState writes the 'E' record through tx.Set, so that an owner's
// writes carry it.
func setReplState(tx *store.Tx, ino ids.Ino, r replState) error {
	return tx.Set(tx.Key(store.RecRepl, ino, nil), r.encode(make([]byte, 0, replSize)))
}

// admit is the one rule for applying a change stamped (epoch, version) to an
// inode whose stored state is seen: replicas (ApplyReplica) and the owner
// (stampOwned) both use it. It reports whether to apply the change; false
// with a nil error is a duplicate (already applied: do nothing).
func admit(ino ids.Ino, seen replState, epoch ids.Epoch, version uint64) (bool, error) {
	switch {
	case seen.epoch > epoch:
		// fencing: nothing from a deposed owner (DESIGN.md)
		return false, &StaleEpochError{Ino: ino, Offered: epoch, Seen: seen.epoch}
	case seen.epoch == epoch && seen.version >= version:
		return false, nil
	case seen.epoch == epoch && seen.version+1 == version:
		return true, nil
	case seen.version == 0 && version == 1:
		// an inode never changed is empty in every epoch: the base of any
		// owner's first change
		return true, nil
	}
	return false, &VersionGapError{Ino: ino, Epoch: epoch, Version: version,
		SeenEpoch: seen.epoch, SeenVersion: seen.version}
}

// replicated reports whether a record key is a replicated record of some
// inode, its 'E' state excluded.
func replicated(key []byte) bool {
	return len(key) >= 9 && bytes.IndexByte(replPrefixes[:], key[0]) >= 0
}

// Stamp is the store's Stamp for an owner (store.Options.Stamp): it fences
// and stamps every inode the transaction wrote, in ascending inode order,
// with the epoch epochOf gives for it and the inode's next version.
func Stamp(epochOf func(ids.Ino) (ids.Epoch, error)) func(tx *store.Tx) error {
	return func(tx *store.Tx) error { return stampOwned(tx, epochOf) }
}

func stampOwned(tx *store.Tx, epochOf func(ids.Ino) (ids.Epoch, error)) error {
	if len(tx.Writes()) == 0 {
		return nil
	}
	var buf [8]ids.Ino
	inos := buf[:0]
	for _, w := range tx.Writes() {
		if replicated(w.Key) && !slices.Contains(inos, w.Ino()) {
			inos = append(inos, w.Ino())
		}
	}
	slices.Sort(inos)
	for _, ino := range inos {
		epoch, err := epochOf(ino)
		if err != nil {
			return err
		}
		if epoch == 0 {
			return fmt.Errorf("%w: zero epoch for %v", ErrBadChange, ino)
		}
		seen, switching, err := replEntry(tx, ino)
		if err != nil {
			return err
		}
		if switching {
			return fmt.Errorf("%w: %v", ErrTransferBusy, ino)
		}
		next := replState{epoch, seen.version + 1}
		if _, err := admit(ino, seen, next.epoch, next.version); err != nil {
			return err // never a duplicate: next.version > seen.version
		}
		if err := setReplState(tx, ino, next); err != nil {
			return err
		}
	}
	return nil
}

// ReplicaChange is one inode's part of an owner's change: the records it
// wrote and deleted, in order, stamped with the owner's epoch and the
// inode's version after the change.
type ReplicaChange struct {
	Ino     ids.Ino
	Epoch   ids.Epoch
	Version uint64
	Writes  []store.Write // records of Ino only, no 'E' or 'S'
}

func (c *ReplicaChange) validate() error {
	if c.Epoch == 0 || c.Version == 0 {
		return fmt.Errorf("%w: %v stamped %v/%d", ErrBadChange, c.Ino, c.Epoch, c.Version)
	}
	for _, w := range c.Writes {
		if !replicated(w.Key) || w.Ino() != c.Ino {
			return fmt.Errorf("%w: record %x in a change of %v%s", ErrBadChange, w.Key, c.Ino, store.LegacyHint(w.Key))
		}
	}
	return nil
}

// SplitByInode splits the writes of one committed operation (call it inside
// OnCommit: Update's returned values may be recycled buffers by the time it
// returns) into one ReplicaChange per inode, in ascending inode order, each
// keeping its writes' order. Epoch and Version come from the inode's 'E'
// stamp among the writes (zero if the store is not in owner mode, and then
// ApplyReplica refuses the change). 'S' records are dropped. The result is a
// copy: the caller owns it, the writes may be reused afterwards.
func SplitByInode(writes []store.Write) []ReplicaChange {
	var out []ReplicaChange
	size := 0
	for _, w := range writes {
		size += len(w.Key) + len(w.Value)
	}
	arena := make([]byte, 0, size)
	clone := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		n := len(arena)
		arena = append(arena, b...)
		return arena[n:len(arena):len(arena)]
	}
	part := func(ino ids.Ino) *ReplicaChange {
		i, found := slices.BinarySearchFunc(out, ino, func(c ReplicaChange, ino ids.Ino) int { return cmp.Compare(c.Ino, ino) })
		if !found {
			out = slices.Insert(out, i, ReplicaChange{Ino: ino})
		}
		return &out[i]
	}
	for _, w := range writes {
		switch {
		case len(w.Key) < 9 || w.Key[0] == store.RecServer:
		case w.Key[0] == store.RecRepl:
			if r, err := decodeRepl(w.Ino(), w.Value); err == nil && !w.Delete {
				c := part(w.Ino())
				c.Epoch, c.Version = r.epoch, r.version
			}
		default:
			c := part(w.Ino())
			c.Writes = append(c.Writes, store.Write{Key: clone(w.Key), Value: clone(w.Value), Delete: w.Delete})
		}
	}
	return out
}

// ApplyReplica applies changes from an owner in one transaction, synced
// before it returns. Each change must follow the replica's state of its
// inode (admit): a change already applied is skipped (retries and
// duplicates are harmless); if any inode's stored epoch is newer than the
// change's the whole batch is rejected with a *StaleEpochError, if any change
// does not follow with a *VersionGapError, and nothing is written. Changes of
// one inode in a batch apply in order. It does not call OnCommit and does
// not retain changes.
func (s *Replica) ApplyReplica(changes []ReplicaChange) error {
	for i := range changes {
		if err := changes[i].validate(); err != nil {
			return err
		}
	}
	wrote := false
	err := s.st.UpdateRaw(func(tx *store.Tx) error {
		wrote = false
		for i := range changes {
			c := &changes[i]
			seen, switching, err := replEntry(tx, c.Ino)
			if err != nil {
				return err
			}
			if switching && seen.epoch <= c.Epoch {
				// its records are being replaced: the owner sends the
				// state again once the switch is over (a deposed owner
				// is fenced off below, as ever)
				return &VersionGapError{Ino: c.Ino, Epoch: c.Epoch, Version: c.Version,
					SeenEpoch: seen.epoch, SeenVersion: seen.version}
			}
			apply, err := admit(c.Ino, seen, c.Epoch, c.Version)
			if err != nil {
				return err
			}
			if !apply {
				continue
			}
			for _, w := range c.Writes {
				if w.Delete {
					err = tx.Delete(w.Key)
				} else {
					err = tx.Set(w.Key, w.Value)
				}
				if err != nil {
					return err
				}
			}
			if err := tx.Set(tx.Key(store.RecRepl, c.Ino, nil), replState{c.Epoch, c.Version}.encode(make([]byte, 0, replSize))); err != nil {
				return err
			}
			wrote = true
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("metaserver: apply replica change: %w", err)
	}
	if wrote {
		return s.st.Sync()
	}
	return nil
}

// InodeSnapshot is everything a replica stores for one inode.
type InodeSnapshot struct {
	Ino     ids.Ino
	Epoch   ids.Epoch
	Version uint64
	Records []store.Write // in key order, no 'E'; none are deletes
}

func (s InodeSnapshot) state() replState { return replState{s.Epoch, s.Version} }

// ReplicaState returns an inode's stored epoch and version (zero if it was
// never changed under replication): the state the replica holds, possibly
// still being switched in from a transfer's staging (store_transfer.go),
// never a state it is still receiving.
func (s *Replica) ReplicaState(ino ids.Ino) (ids.Epoch, uint64, error) {
	var r replState
	err := s.st.View(func(tx *store.Tx) error {
		var err error
		r, err = heldState(tx, ino)
		return err
	})
	return r.epoch, r.version, err
}

// InodeState returns everything stored for ino, read in one transaction:
// its epoch, version and every record of every kind. An inode with nothing
// stored gives an empty snapshot (epoch and version 0), not an error.
// It holds the inode in memory: ErrSnapshotTooBig beyond
// MaxSnapshotRecords (servers move states with CopyInode, a page at a
// time). The caller owns the result.
func (s *Replica) InodeState(ino ids.Ino) (InodeSnapshot, error) {
	if err := s.settle(ino); err != nil {
		return InodeSnapshot{}, err
	}
	snap := InodeSnapshot{Ino: ino}
	err := s.st.View(func(tx *store.Tx) error {
		snap.Records = snap.Records[:0]
		r, switching, err := replEntry(tx, ino)
		if err != nil {
			return err
		}
		if switching {
			return fmt.Errorf("%w: %v is switching", ErrTransferBusy, ino)
		}
		snap.Epoch, snap.Version = r.epoch, r.version
		for _, p := range replPrefixes {
			err := tx.Scan(tx.Key(p, ino, nil), nil, false, true, func(k, v []byte) (bool, error) {
				if len(snap.Records) == MaxSnapshotRecords {
					return false, fmt.Errorf("%w: %v", ErrSnapshotTooBig, ino)
				}
				snap.Records = append(snap.Records, store.Write{Key: bytes.Clone(k), Value: bytes.Clone(v)})
				return true, nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return InodeSnapshot{}, err
	}
	return snap, nil
}

// Newest returns the snapshot with the greatest (Epoch, Version), the first
// such one on a tie; the zero snapshot if there are none. Within an epoch
// (Epoch, Version) names one state, and a later epoch's state includes every
// change acknowledged before it (the owner recovered it from a majority), so
// this is the state a new owner must continue from.
func Newest(snaps []InodeSnapshot) InodeSnapshot {
	var best InodeSnapshot
	for i, s := range snaps {
		if i == 0 || best.state().less(s.state()) {
			best = s
		}
	}
	return best
}

// ReplaceInode makes the replica's records of snap.Ino exactly snap's
// (records it holds beyond them are deleted) and stamps it (epoch,
// snap.Version), synced before it returns: CopyInode from the snapshot, so
// a crash meanwhile leaves the replica at its previous state, never between
// the two. Fenced as ApplyReplica: a *StaleEpochError if the replica has
// seen a newer epoch than epoch, and nothing to do if it already holds
// (epoch, version) at or beyond (epoch, snap.Version). ErrBadChange if
// snap.Epoch > epoch or a record is not snap.Ino's.
func (s *Replica) ReplaceInode(snap InodeSnapshot, epoch ids.Epoch) error {
	if epoch == 0 || snap.Epoch > epoch {
		return fmt.Errorf("%w: snapshot of %v at %v stamped %v", ErrBadChange, snap.Ino, snap.Epoch, epoch)
	}
	for _, w := range snap.Records {
		if !replicated(w.Key) || w.Ino() != snap.Ino || w.Delete {
			return fmt.Errorf("%w: record %x in a snapshot of %v", ErrBadChange, w.Key, snap.Ino)
		}
	}
	sorted := snap
	sorted.Records = slices.SortedFunc(slices.Values(snap.Records), func(a, b store.Write) int { return bytes.Compare(a.Key, b.Key) })
	_, err := CopyInode(context.Background(), snapshotSource{sorted}, s, snap.Ino, CopyOptions{Epoch: epoch})
	if err != nil {
		return fmt.Errorf("metaserver: replace %v: %w", snap.Ino, err)
	}
	return nil
}

// MaxEpoch returns the greatest epoch stamped on any inode (0 if none): a
// restarted server's ballots must exceed it.
func (s *Replica) MaxEpoch() (ids.Epoch, error) {
	var max ids.Epoch
	err := s.st.View(func(tx *store.Tx) error {
		return tx.Scan([]byte{store.RecRepl}, nil, false, true, func(k, v []byte) (bool, error) {
			r, err := decodeRepl(store.KeyIno(k), v)
			if err == nil && r.epoch > max {
				max = r.epoch
			}
			return err == nil, err
		})
	})
	return max, err
}

// Checksum is a SHA-256 over every replicated record, 'E' states included,
// in key order; 'S' and transfers' staging are excluded. Two replicas have equal checksums if and
// only if they hold the same replicated records (up to SHA-256 collisions).
// It reads the whole store in one transaction: an operator's check, not a
// hot path.
func (s *Replica) Checksum() ([32]byte, error) {
	h := sha256.New()
	var lb [2 * binary.MaxVarintLen64]byte
	err := s.st.View(func(tx *store.Tx) error {
		return tx.Scan(nil, nil, false, true, func(k, v []byte) (bool, error) {
			if k[0] == store.RecServer || k[0] == store.RecStage {
				return true, nil
			}
			b := binary.AppendUvarint(lb[:0], uint64(len(k)))
			h.Write(b)
			h.Write(k)
			b = binary.AppendUvarint(lb[:0], uint64(len(v)))
			h.Write(b)
			h.Write(v)
			return true, nil
		})
	})
	var sum [32]byte
	if err != nil {
		return sum, err
	}
	h.Sum(sum[:0])
	return sum, nil
}

// InodeDigest summarises one inode of a replica: its epoch, version and,
// if asked for, a hash of its records (the first 8 bytes of a SHA-256 over
// them in key order, 'E' excluded; 0 if not asked for).
type InodeDigest struct {
	Ino     ids.Ino
	Epoch   ids.Epoch
	Version uint64
	Hash    uint64
}

// DigestPage is the digests of every inode with a record in (After,
// Through], in inode order. Pages are read one transaction each: a replica
// walks its peer's store page by page while both keep changing, and the
// differences it misses are caught by the next round.
type DigestPage struct {
	After, Through ids.Ino
	Inodes         []InodeDigest
}

// Last reports whether the page reaches the end of the inode space.
func (p DigestPage) Last() bool { return p.Through == MaxIno }

// digestPrefixes are every kind an inode can have, 'E' included, in key order.
var digestPrefixes = [...]byte{store.RecAttr, store.RecCookie, store.RecEntry, store.RecRepl, store.RecSymlink, store.RecPage, store.RecDone, store.RecXattr}

// Digest returns the page of at most max inodes (0: 1024) after after,
// ending at the last inode it holds, or at MaxIno if no inode follows. Walk
// a store with after = the previous page's Through until Last.
//
// Without hashes it reads only the inodes' 'E' states: anti-entropy fetches
// by (epoch, version) alone, and hashing every stored byte of a replica each
// round cost a CPU's worth of time on a store of a few GiB. An inode with
// records but no state is then left out; it is at (0, 0), which no
// comparison fetches.
func (s *Replica) Digest(after ids.Ino, max int, hashes bool) (DigestPage, error) {
	if max <= 0 {
		max = 1024
	}
	if after == MaxIno {
		return DigestPage{After: after, Through: MaxIno}, nil
	}
	var page DigestPage
	err := s.st.View(func(tx *store.Tx) error {
		through := MaxIno
		var seen []ids.Ino
		for _, p := range digestKinds(hashes) {
			var inos []ids.Ino
			capped := false
			err := tx.Scan([]byte{p}, tx.Key(p, after+1, nil), false, false, func(k, _ []byte) (bool, error) {
				ino := store.KeyIno(k)
				if ino > through {
					return false, nil
				}
				if n := len(inos); n == 0 || inos[n-1] != ino {
					if n == max {
						capped = true
						return false, nil
					}
					inos = append(inos, ino)
				}
				return true, nil
			})
			if err != nil {
				return err
			}
			if capped {
				// unknown beyond this kind's last inode
				through = min(through, inos[len(inos)-1])
			}
			seen = append(seen, inos...)
		}
		seen = slices.DeleteFunc(seen, func(i ids.Ino) bool { return i > through })
		slices.Sort(seen)
		seen = slices.Compact(seen)
		if len(seen) > max {
			through = seen[max-1]
		}
		var err error
		page, err = digest(tx, after, through, hashes)
		return err
	})
	return page, err
}

// DigestRange returns the digests of every inode in (after, through]: the
// local side of a comparison with a peer's page (asked for with the same
// hashes).
func (s *Replica) DigestRange(after, through ids.Ino, hashes bool) (DigestPage, error) {
	var page DigestPage
	err := s.st.View(func(tx *store.Tx) error {
		var err error
		page, err = digest(tx, after, through, hashes)
		return err
	})
	return page, err
}

// digestKinds are the record kinds a digest reads.
func digestKinds(hashes bool) []byte {
	if hashes {
		return digestPrefixes[:]
	}
	return []byte{store.RecRepl}
}

func digest(tx *store.Tx, after, through ids.Ino, hashes bool) (DigestPage, error) {
	page := DigestPage{After: after, Through: through}
	if after >= through {
		return page, nil
	}
	type acc struct {
		d InodeDigest
		h hash.Hash
	}
	accs := map[ids.Ino]*acc{}
	var lb [2 * binary.MaxVarintLen64]byte
	for _, p := range digestKinds(hashes) {
		err := tx.Scan([]byte{p}, tx.Key(p, after+1, nil), false, true, func(k, v []byte) (bool, error) {
			ino := store.KeyIno(k)
			if ino > through {
				return false, nil
			}
			a := accs[ino]
			if a == nil {
				a = &acc{d: InodeDigest{Ino: ino}}
				if hashes {
					a.h = sha256.New()
				}
				accs[ino] = a
			}
			if p == store.RecRepl {
				r, err := decodeRepl(ino, v)
				a.d.Epoch, a.d.Version = r.epoch, r.version
				return err == nil, err
			}
			a.h.Write([]byte{p})
			b := binary.AppendUvarint(lb[:0], uint64(len(k)-9))
			a.h.Write(b)
			a.h.Write(k[9:])
			b = binary.AppendUvarint(lb[:0], uint64(len(v)))
			a.h.Write(b)
			a.h.Write(v)
			return true, nil
		})
		if err != nil {
			return page, err
		}
	}
	page.Inodes = make([]InodeDigest, 0, len(accs))
	var sum [sha256.Size]byte
	for _, a := range accs {
		if hashes {
			a.d.Hash = binary.BigEndian.Uint64(a.h.Sum(sum[:0]))
		}
		page.Inodes = append(page.Inodes, a.d)
	}
	slices.SortFunc(page.Inodes, func(a, b InodeDigest) int { return cmp.Compare(a.Ino, b.Ino) })
	return page, nil
}

// DiffDigests compares a replica's page with a peer's page of the same range
// (DigestRange(peer.After, peer.Through)). Fetch lists the inodes the peer
// holds at a newer (epoch, version), including those the replica lacks:
// copy their state from the peer (CopyInode, keeping the peer's epoch).
// Diverged lists inodes at the same (epoch, version) with different records,
// which replication never produces (records written outside it, such as each
// server's own root before its first replicated change): an operator's
// matter, or a new owner's recovery.
func DiffDigests(local, peer DigestPage) (fetch, diverged []ids.Ino, err error) {
	if local.After != peer.After || local.Through != peer.Through {
		return nil, nil, fmt.Errorf("metaserver: digest pages (%v, %v] and (%v, %v] differ in range",
			local.After, local.Through, peer.After, peer.Through)
	}
	l, p := local.Inodes, peer.Inodes
	for len(l) > 0 || len(p) > 0 {
		var ld, pd InodeDigest // zero: the side lacks the inode
		switch {
		case len(p) == 0 || len(l) > 0 && l[0].Ino < p[0].Ino:
			ld, l = l[0], l[1:]
			pd.Ino = ld.Ino
		case len(l) == 0 || p[0].Ino < l[0].Ino:
			pd, p = p[0], p[1:]
			ld.Ino = pd.Ino
		default:
			ld, pd, l, p = l[0], p[0], l[1:], p[1:]
		}
		ls, ps := replState{ld.Epoch, ld.Version}, replState{pd.Epoch, pd.Version}
		switch {
		case ls.less(ps):
			fetch = append(fetch, pd.Ino)
		case ls == ps && ld.Hash != pd.Hash:
			diverged = append(diverged, pd.Ino)
		}
	}
	return fetch, diverged, nil
}

// RestampInode moves a replica that holds exactly (epoch, version) of ino
// to (newEpoch, version) without touching its records: a new owner whose
// recovered state a replica already holds need not send it (within an
// epoch, a version names one state). It reports false, changing nothing,
// if the replica holds another state; a *StaleEpochError if it has seen an
// epoch newer than newEpoch. Version 0 names no state (each server's own
// root starts unstamped), so it is refused with ErrBadChange. Synced.
func (s *Replica) RestampInode(ino ids.Ino, epoch ids.Epoch, version uint64, newEpoch ids.Epoch) (bool, error) {
	if version == 0 || newEpoch == 0 || epoch > newEpoch {
		return false, fmt.Errorf("%w: restamp %v from %v/%d to %v", ErrBadChange, ino, epoch, version, newEpoch)
	}
	if err := s.settle(ino); err != nil {
		return false, fmt.Errorf("metaserver: restamp %v: %w", ino, err)
	}
	done, wrote := false, false
	err := s.st.UpdateRaw(func(tx *store.Tx) error {
		done, wrote = false, false
		seen, switching, err := replEntry(tx, ino)
		if err != nil {
			return err
		}
		switch {
		case switching:
			return nil // a transfer is switching it in: not quite held yet
		case seen.epoch > newEpoch:
			return &StaleEpochError{Ino: ino, Offered: newEpoch, Seen: seen.epoch}
		case seen == replState{newEpoch, version}:
			done = true
			return nil
		case seen != replState{epoch, version}:
			return nil
		}
		done, wrote = true, true
		return tx.Set(tx.Key(store.RecRepl, ino, nil), replState{newEpoch, version}.encode(make([]byte, 0, replSize)))
	})
	if err != nil {
		return false, fmt.Errorf("metaserver: restamp %v: %w", ino, err)
	}
	if wrote {
		return true, s.st.Sync()
	}
	return done, nil
}
