package replica

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
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
var replPrefixes = [...]byte{store.RecAttr, store.RecExtent, store.RecCookie, store.RecEntry, store.RecGarbage,
	store.RecSymlink, store.RecPage, store.RecDone, store.RecBlock, store.RecXattr}

// MaxIno is the largest inode number; a digest page through it is the last.
const MaxIno = ids.Ino(^uint64(0))

const (
	replFormat = 1
	// replSwitching marks an 'E' record whose state is being switched in
	// from a transfer's staging (transfer.go): the replica holds it,
	// partly still staged.
	replSwitching = 2
	replSize      = 1 + 8 + 8
)

var (
	// ErrStaleEpoch: a change or transfer carries an older epoch than the
	// replica has seen for the inode (errors.As gives *StaleEpochError).
	ErrStaleEpoch = errors.New("replica: stale epoch")
	// ErrVersionGap: the replica's state of the inode is not the one the
	// change was made from (it missed changes, or holds another owner's
	// unacknowledged ones); it needs the inode's state (CopyInode).
	// errors.As gives *VersionGapError.
	ErrVersionGap = errors.New("replica: replica needs the inode's state")
	// ErrBadChange: a malformed change or transfer (records of another
	// inode or of a local kind, zero epoch or version).
	ErrBadChange = errors.New("replica: malformed replica change")
)

// StaleEpochError names the inode whose stored epoch (Seen) is newer than
// the one offered. errors.Is(err, ErrStaleEpoch) matches it.
type StaleEpochError struct {
	Ino           ids.Ino
	Offered, Seen ids.Epoch
}

func (e *StaleEpochError) Error() string {
	return fmt.Sprintf("replica: stale epoch for %v: offered %v, seen %v", e.Ino, e.Offered, e.Seen)
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
	return fmt.Sprintf("replica: change %v/%d of %v does not follow the replica's %v/%d",
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
// inode whose stored state is seen: replicas (Apply) and the owner
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

// Change is one inode's part of an owner's change: the records it
// wrote and deleted, in order, stamped with the owner's epoch and the
// inode's version after the change.
type Change struct {
	Ino     ids.Ino
	Epoch   ids.Epoch
	Version uint64
	Writes  []store.Write // records of Ino only, no 'E' or 'S'
}

func (c *Change) validate() error {
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
// returns) into one Change per inode, in ascending inode order, each
// keeping its writes' order. Epoch and Version come from the inode's 'E'
// stamp among the writes (zero if the store is not in owner mode, and then
// Apply refuses the change). 'S' records are dropped. The result is a
// copy: the caller owns it, the writes may be reused afterwards.
func SplitByInode(writes []store.Write) []Change {
	var out []Change
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
	part := func(ino ids.Ino) *Change {
		i, found := slices.BinarySearchFunc(out, ino, func(c Change, ino ids.Ino) int { return cmp.Compare(c.Ino, ino) })
		if !found {
			out = slices.Insert(out, i, Change{Ino: ino})
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

// Apply applies changes from an owner in one transaction, synced
// before it returns. Each change must follow the replica's state of its
// inode (admit): a change already applied is skipped (retries and
// duplicates are harmless); if any inode's stored epoch is newer than the
// change's the whole batch is rejected with a *StaleEpochError, if any change
// does not follow with a *VersionGapError, and nothing is written. Changes of
// one inode in a batch apply in order. It does not call OnCommit and does
// not retain changes.
func (r *Replica) Apply(changes []Change) error {
	for i := range changes {
		if err := changes[i].validate(); err != nil {
			return err
		}
	}
	wrote := false
	err := r.st.UpdateRaw(func(tx *store.Tx) error {
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
		return fmt.Errorf("replica: apply replica change: %w", err)
	}
	if wrote {
		return r.st.Sync()
	}
	return nil
}

// State returns an inode's stored epoch and version (zero if it was
// never changed under replication): the state the replica holds, possibly
// still being switched in from a transfer's staging (transfer.go),
// never a state it is still receiving.
func (r *Replica) State(ino ids.Ino) (ids.Epoch, uint64, error) {
	var rs replState
	err := r.st.View(func(tx *store.Tx) error {
		var err error
		rs, err = heldState(tx, ino)
		return err
	})
	return rs.epoch, rs.version, err
}

// MaxEpoch returns the greatest epoch stamped on any inode (0 if none): a
// restarted server's ballots must exceed it.
func (r *Replica) MaxEpoch() (ids.Epoch, error) {
	var max ids.Epoch
	err := r.st.View(func(tx *store.Tx) error {
		return tx.Scan([]byte{store.RecRepl}, nil, false, true, func(k, v []byte) (bool, error) {
			rs, err := decodeRepl(store.KeyIno(k), v)
			if err == nil && rs.epoch > max {
				max = rs.epoch
			}
			return err == nil, err
		})
	})
	return max, err
}

// Restamp moves a replica that holds exactly (epoch, version) of ino
// to (newEpoch, version) without touching its records: a new owner whose
// recovered state a replica already holds need not send it (within an
// epoch, a version names one state). It reports false, changing nothing,
// if the replica holds another state; a *StaleEpochError if it has seen an
// epoch newer than newEpoch. Version 0 names no state (each server's own
// root starts unstamped), so it is refused with ErrBadChange. Synced.
func (r *Replica) Restamp(ino ids.Ino, epoch ids.Epoch, version uint64, newEpoch ids.Epoch) (bool, error) {
	if version == 0 || newEpoch == 0 || epoch > newEpoch {
		return false, fmt.Errorf("%w: restamp %v from %v/%d to %v", ErrBadChange, ino, epoch, version, newEpoch)
	}
	if err := r.settle(ino); err != nil {
		return false, fmt.Errorf("replica: restamp %v: %w", ino, err)
	}
	done, wrote := false, false
	err := r.st.UpdateRaw(func(tx *store.Tx) error {
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
		return false, fmt.Errorf("replica: restamp %v: %w", ino, err)
	}
	if wrote {
		return true, r.st.Sync()
	}
	return done, nil
}
