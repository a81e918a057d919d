package store

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

func applied(t *testing.T, s *Store, o Origin) bool {
	t.Helper()
	ok, _, err := s.Applied(o)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// A change records its request; a failed change or a read does not; the
// record replicates with the inode it names and goes when the inode does.
func TestStoreAppliedRequests(t *testing.T) {
	s := newStore(t)
	now := time.Now().UnixNano()
	const client = ids.ClientID(7)
	mk := Origin{Ino: ids.RootIno, Client: client, Req: 1}
	d, err := s.For(mk).Mkdir(ids.RootIno, "d", 0o755, 0, 0, now)
	if err != nil {
		t.Fatal(err)
	}
	if !applied(t, s, mk) {
		t.Fatal("mkdir's request not recorded")
	}
	if applied(t, s, Origin{Ino: ids.RootIno, Client: client, Req: 2}) || applied(t, s, Origin{Ino: ids.RootIno, Client: 8, Req: 1}) {
		t.Fatal("another request or client reported applied")
	}
	// a change that fails records nothing
	again := Origin{Ino: ids.RootIno, Client: client, Req: 2}
	_, err = s.For(again).Mkdir(ids.RootIno, "d", 0o755, 0, 0, now)
	wantCode(t, err, wire.CodeExists)
	if applied(t, s, again) {
		t.Fatal("failed mkdir recorded")
	}
	// the record is one of the inode's records (so it replicates with
	// them: replica.TestReplicatedKinds)
	if countRecords(t, s, RecDone, ids.RootIno) == 0 {
		t.Fatal("root lacks its applied-request record")
	}
	// Many requests of one client in flight on one inode at once (a
	// batch of creates sent behind): every one is kept, well past 16.
	const batch = 100
	for i := range uint64(batch) {
		o := Origin{Ino: d.Ino, Client: client, Req: 100 + i, Oldest: 100}
		if err := s.For(o).SetXattr(d.Ino, "user.n", []byte{byte(i)}, 0, 1); err != nil {
			t.Fatal(err)
		}
	}
	for i := range uint64(batch) {
		if !applied(t, s, Origin{Ino: d.Ino, Client: client, Req: 100 + i}) {
			t.Fatalf("request %d of %d in flight together not kept", 100+i, batch)
		}
	}
	// Once the client says it is done with them, they go: a late copy
	// of one is stale.
	o := Origin{Ino: d.Ino, Client: client, Req: 100 + batch, Oldest: 100 + batch}
	if err := s.For(o).SetXattr(d.Ino, "user.n", nil, 0, 1); err != nil {
		t.Fatal(err)
	}
	if ok, stale, err := s.Applied(Origin{Ino: d.Ino, Client: client, Req: 100 + batch - 1}); ok || !stale || err != nil {
		t.Fatalf("a finished request after its client moved on: applied %v, stale %v, %v", ok, stale, err)
	}
	if n := doneRecordLen(t, s, d.Ino, client); n != 1 {
		t.Fatalf("record keeps %d ids, want 1 (the others are finished)", n)
	}
	// A client that never moves on (Oldest stays 0) keeps the newest
	// doneKeep.
	for i := range uint64(doneKeep + 4) {
		o := Origin{Ino: ids.RootIno, Client: 9, Req: 1 + i}
		if _, err := s.Update(func(tx *Tx) error { return tx.recordDone(o, now) }); err != nil {
			t.Fatal(err)
		}
	}
	if n := doneRecordLen(t, s, ids.RootIno, 9); n != doneKeep {
		t.Fatalf("record keeps %d ids, want at most %d", n, doneKeep)
	}
	if applied(t, s, Origin{Ino: ids.RootIno, Client: 9, Req: 4}) || !applied(t, s, Origin{Ino: ids.RootIno, Client: 9, Req: 5}) {
		t.Fatal("not the newest kept")
	}
	// rmdir deletes the directory's records
	rm := Origin{Ino: ids.RootIno, Client: client, Req: 3}
	if err := s.For(rm).Rmdir(ids.RootIno, "d", now); err != nil {
		t.Fatal(err)
	}
	if applied(t, s, o) {
		t.Fatal("removed directory's records survive")
	}
	if !applied(t, s, rm) {
		t.Fatal("rmdir's request not recorded")
	}
}

// Another client's record older than doneTTL goes when a client with no
// record of the inode changes it; a recent one stays.
func TestStoreAppliedRequestsExpire(t *testing.T) {
	s := newStore(t)
	old := Origin{Ino: ids.RootIno, Client: 1, Req: 1}
	recent := Origin{Ino: ids.RootIno, Client: 2, Req: 1}
	now := time.Now()
	for _, c := range []struct {
		o  Origin
		at time.Time
	}{{old, now.Add(-doneTTL - time.Minute)}, {recent, now.Add(-time.Minute)}} {
		_, err := s.Update(func(tx *Tx) error { return tx.recordDone(c.o, c.at.UnixNano()) })
		if err != nil {
			t.Fatal(err)
		}
	}
	if !applied(t, s, old) || !applied(t, s, recent) {
		t.Fatal("records not written")
	}
	if _, err := s.For(Origin{Ino: ids.RootIno, Client: 3, Req: 1}).Create(ids.RootIno, "f", 0o644, 0, 0, 0, now.UnixNano()); err != nil {
		t.Fatal(err)
	}
	if applied(t, s, old) {
		t.Fatal("record older than doneTTL survives a change")
	}
	if !applied(t, s, recent) {
		t.Fatal("recent record deleted")
	}
	// the value is newest first
	var first uint64
	if _, err := s.Update(func(tx *Tx) error {
		_, err := tx.get(tx.key64(RecDone, ids.RootIno, 3), func(v []byte) error {
			first = binary.LittleEndian.Uint64(v[doneHeader:])
			return nil
		})
		return err
	}); err != nil || first != 1 {
		t.Fatalf("client 3's record: first id %d, %v", first, err)
	}
}

// A change older than the oldest one a later change of the same client
// had in flight is stale (the client is done with it): not applied, and
// reported as such; newer unknown changes are not.
func TestStoreAppliedStale(t *testing.T) {
	s := newStore(t)
	const client = ids.ClientID(9)
	o := Origin{Ino: ids.RootIno, Client: client, Req: 5, Oldest: 4}
	if _, err := s.For(o).Mkdir(ids.RootIno, "d", 0o755, 0, 0, time.Now().UnixNano()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		req            uint64
		applied, stale bool
	}{{5, true, false}, {3, false, true}, {4, false, false}, {6, false, false}} {
		applied, stale, err := s.Applied(Origin{Ino: ids.RootIno, Client: client, Req: c.req})
		if err != nil || applied != c.applied || stale != c.stale {
			t.Errorf("request %d: applied %v stale %v (%v), want %v %v", c.req, applied, stale, err, c.applied, c.stale)
		}
	}
	// another client's requests are not affected
	if _, stale, _ := s.Applied(Origin{Ino: ids.RootIno, Client: client + 1, Req: 1}); stale {
		t.Error("another client's request reported stale")
	}
}

// doneRecordLen is how many request ids client's record of ino keeps.
func doneRecordLen(t *testing.T, s *Store, ino ids.Ino, client ids.ClientID) int {
	t.Helper()
	n := 0
	err := s.view(func(tx *Tx) error {
		_, err := tx.get(tx.key64(RecDone, ino, uint64(client)), func(v []byte) error {
			n = (len(v) - doneHeader) / doneEntry
			return nil
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
