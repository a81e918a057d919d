package store

// Applied-request records ('R'). A change made for a client request
// records the request's id with an inode the change writes, in the same
// transaction, so the record replicates with the change. A client whose
// server died after the change reached a majority, but before the reply
// reached the client, resends the request to another server; that server
// finds the id and answers from the current state instead of making the
// change twice (an O_APPEND record written twice, a create that fails with
// EEXIST, an unlink with ENOENT).

import (
	"encoding/binary"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

// Origin names the client request a change is made for.
type Origin struct {
	Ino    ids.Ino // the inode the request's id is recorded with: one the change writes
	Client ids.ClientID
	Req    uint64 // the client's id for the request: the same in every resend
	// Oldest is the client's oldest change recorded with Ino in flight
	// when it made this one: the client's changes of Ino before it are
	// finished for the client.
	Oldest uint64
}

const (
	// doneKeep bounds the request ids kept per client and inode. All of
	// those at or past the client's oldest change of the inode in flight
	// are kept, up to this: a batch of creates sent behind puts 64 in
	// flight on one directory, and a resend of the whole batch after a
	// failover must find each one (else its create fails as EEXIST and
	// the client counts the file lost). Those before it are dropped: the
	// client is done with them, and a late copy of one is stale.
	doneKeep = 1024
	// doneTTL: a client's record of an inode is deleted at the next change
	// of the inode this long after the client's last change to it. A
	// resend comes within the client's failover, seconds.
	doneTTL = 10 * time.Minute
	// doneEntry is one kept id: request id, time of the change (ns). A
	// record is the greatest Oldest seen (8 bytes), then the entries.
	doneEntry  = 16
	doneHeader = 8
)

// For returns a view of the store whose changes record o (nothing for a
// zero Client). The view shares everything else with s.
func (s *Store) For(o Origin) *Store {
	v := *s
	v.origin = o
	return &v
}

// Applied reports whether a change for o was made (and so reached the
// replica this store is), and if not, whether it is stale: a later change
// of the client said o was no longer in flight, so the client has given up
// on this copy of it (it was answered, here or elsewhere) and it must not
// be made now.
func (s *Store) Applied(o Origin) (applied, stale bool, err error) {
	err = s.view(func(tx *Tx) error {
		applied, stale, err = tx.appliedStale(o)
		return err
	})
	return applied, stale, err
}

// applied reports whether the transaction finds a change for o made
// already (false for a zero Client): an operation that checks it in its
// own transaction is made once however often it is sent.
func (tx *Tx) applied(o Origin) (bool, error) {
	if o.Client == 0 {
		return false, nil
	}
	applied, _, err := tx.appliedStale(o)
	return applied, err
}

// appliedStale is Applied in the transaction.
func (tx *Tx) appliedStale(o Origin) (applied, stale bool, err error) {
	_, err = tx.get(tx.key64(RecDone, o.Ino, uint64(o.Client)), func(v []byte) error {
		if len(v) < doneHeader {
			return nil
		}
		oldest := binary.LittleEndian.Uint64(v)
		for v = v[doneHeader:]; len(v) >= doneEntry; v = v[doneEntry:] {
			if binary.LittleEndian.Uint64(v) == o.Req {
				applied = true
			}
		}
		stale = !applied && o.Req < oldest
		return nil
	})
	return applied, stale, err
}

// recordDone adds o.Req to the client's record of o.Ino (newest first,
// doneKeep at most). When the client has no record of the inode yet, it
// also deletes other clients' records of it older than doneTTL: that
// sweep iterates, and an iterator walks every version of a record the
// store still holds (a directory's, rewritten at each create), so it must
// not run at every change.
func (tx *Tx) recordDone(o Origin, now int64) error {
	key := tx.key64(RecDone, o.Ino, uint64(o.Client))
	val := make([]byte, doneHeader+doneEntry, doneHeader+doneEntry*16)
	binary.LittleEndian.PutUint64(val, o.Oldest)
	binary.LittleEndian.PutUint64(val[doneHeader:], o.Req)
	binary.LittleEndian.PutUint64(val[doneHeader+8:], uint64(now))
	found, err := tx.get(key, func(v []byte) error {
		if len(v) < doneHeader {
			return nil
		}
		oldest := max(o.Oldest, binary.LittleEndian.Uint64(v))
		binary.LittleEndian.PutUint64(val, oldest)
		for v = v[doneHeader:]; len(v) >= doneEntry && len(val) < doneHeader+doneEntry*doneKeep; v = v[doneEntry:] {
			if binary.LittleEndian.Uint64(v) >= oldest {
				val = append(val, v[:doneEntry]...)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !found {
		if err := tx.sweepDone(o, now); err != nil {
			return err
		}
	}
	return tx.set(key, val)
}

// sweepDone deletes other clients' records of o.Ino older than doneTTL.
func (tx *Tx) sweepDone(o Origin, now int64) error {
	var stale [][]byte
	err := tx.scan(tx.key(RecDone, o.Ino, nil), nil, false, true, func(k, v []byte) (bool, error) {
		if len(v) >= doneHeader+doneEntry && binary.BigEndian.Uint64(k[9:]) != uint64(o.Client) &&
			now-int64(binary.LittleEndian.Uint64(v[doneHeader+8:])) > int64(doneTTL) {
			stale = append(stale, tx.key(RecDone, o.Ino, k[9:]))
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, k := range stale {
		if err := tx.del(k); err != nil {
			return err
		}
	}
	return nil
}

// delDone deletes every client's record of ino (the inode is gone).
func (tx *Tx) delDone(ino ids.Ino) error {
	var keys [][]byte
	err := tx.scan(tx.key(RecDone, ino, nil), nil, false, false, func(k, _ []byte) (bool, error) {
		keys = append(keys, tx.key(RecDone, ino, k[9:]))
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := tx.del(k); err != nil {
			return err
		}
	}
	return nil
}
