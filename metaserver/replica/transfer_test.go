package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/wire"
)

// ownedStore opens a real badger store in dir whose every inode is owned
// at *epoch (0: owned by nobody, as a replica).
func ownedStore(t *testing.T, dir string, id ids.ServerID, epoch *ids.Epoch) *testStore {
	t.Helper()
	return openTestStore(t, dir, store.Options{ServerID: id, NoOrphanPurge: true,
		Stamp: Stamp(func(ids.Ino) (ids.Epoch, error) {
			if *epoch == 0 {
				return 0, errNotOwner
			}
			return *epoch, nil
		})})
}

func randBytes(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// writeFile writes data at 0 in pieces of at most 4 MiB (what one client
// write carries).
func writeFile(t testing.TB, s *testStore, ino ids.Ino, data []byte) {
	t.Helper()
	for off := 0; off < len(data); off += 4 << 20 {
		if _, err := s.Write(ino, uint64(off), data[off:min(off+4<<20, len(data))], 1); err != nil {
			t.Fatal(err)
		}
	}
}

// inodeDigest is ino's state and the hash of its records in s.
func inodeDigest(t testing.TB, s *testStore, ino ids.Ino) InodeDigest {
	t.Helper()
	page := must[DigestPage](t)(s.DigestRange(ino-1, ino, true))
	if len(page.Inodes) == 0 {
		return InodeDigest{Ino: ino}
	}
	return page.Inodes[0]
}

// staged counts every staging record (headers included).
func staged(t testing.TB, s *testStore) int {
	t.Helper()
	n := 0
	err := s.View(func(tx *store.Tx) error {
		return tx.Iterate([]byte{store.RecStage}, func(k, v []byte) (bool, error) { n++; return true, nil })
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// pages reads ino's state from s in pages of about size bytes.
func pages(t testing.TB, s *testStore, ino ids.Ino, size int) []StatePage {
	t.Helper()
	var out []StatePage
	var after []byte
	for {
		p := must[StatePage](t)(s.ReadStatePage(context.Background(), ino, after, size))
		out = append(out, p)
		if p.Last {
			return out
		}
		after = p.Records[len(p.Records)-1].Key
	}
}

func transferOf(p StatePage, id uint64, epoch ids.Epoch) Transfer {
	return Transfer{Ino: p.Ino, ID: id, Epoch: epoch, SrcEpoch: p.Epoch, Version: p.Version}
}

// TestTransferPaged: a file and a directory copied a page at a time make
// the receiver's records exactly the source's, records it held beyond them
// deleted, stamped with the source's epoch or a new owner's; nothing stays
// staged.
func TestTransferPaged(t *testing.T) {
	var epA, epB ids.Epoch = 1, 0
	a := ownedStore(t, t.TempDir(), 1, &epA)
	b := ownedStore(t, t.TempDir(), 2, &epB)
	defer a.Close()
	defer b.Close()

	f := must[store.Attr](t)(a.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	d := must[store.Attr](t)(a.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 1))
	old := randBytes(1, 480*store.PageSize)
	writeFile(t, a, f.Ino, old)
	must[any](t)(nil, a.SetXattr(f.Ino, "user.gone", []byte("x"), 0, 1))
	for i := range 3000 {
		must[store.Attr](t)(a.Create(d.Ino, fmt.Sprintf("entry-%05d", i), reg|0o644, 0, 0, 0, 1))
	}
	// b holds that state; then a changes it: b's records beyond the new
	// state must go
	for _, ino := range []ids.Ino{f.Ino, d.Ino} {
		must[CopyResult](t)(CopyInode(context.Background(), a, b, ino, CopyOptions{}))
	}
	data := randBytes(2, 320*store.PageSize+5)
	must[store.Attr](t)(a.SetAttr(f.Ino, store.SetAttrIn{Valid: wire.SetSize, Size: 0}, 2))
	writeFile(t, a, f.Ino, data)
	must[any](t)(nil, a.RemoveXattr(f.Ino, "user.gone", 1))
	must[any](t)(nil, a.SetXattr(f.Ino, "user.k", bytes.Repeat([]byte("v"), 60<<10), 0, 1))
	for i := range 3000 {
		if i%3 == 0 {
			must[store.Attr](t)(unlinked(a.Unlink(d.Ino, fmt.Sprintf("entry-%05d", i), 2, nil)))
		}
	}

	for _, ino := range []ids.Ino{f.Ino, d.Ino} {
		got := must[CopyResult](t)(CopyInode(context.Background(), a, b, ino, CopyOptions{PageBytes: MinPageBytes}))
		want := inodeDigest(t, a, ino)
		if got.Pages < 2 || got.Attempts != 1 || got.Epoch != want.Epoch || got.Version != want.Version {
			t.Fatalf("copy of %v: %+v, source at %v/%d", ino, got, want.Epoch, want.Version)
		}
		if have := inodeDigest(t, b, ino); have != want {
			t.Fatalf("%v after the copy: %+v, want %+v", ino, have, want)
		}
		t.Logf("%v: %d records, %d bytes in %d pages", ino, got.Records, got.Bytes, got.Pages)
	}
	if got := must[[]byte](t)(b.Read(f.Ino, 0, len(old))); !bytes.Equal(got, data) {
		t.Fatalf("b reads %d bytes, want the new %d", len(got), len(data))
	}
	if _, err := b.GetXattr(f.Ino, "user.gone"); wire.CodeOf(err) != wire.CodeNoData {
		t.Fatalf("deleted xattr on b: %v", err)
	}
	if ents := must[[]store.DirEntry](t)(b.ReadDir(d.Ino, 0, 10000)); len(ents) != 2000 {
		t.Fatalf("b lists %d entries, want 2000", len(ents))
	}
	if n := staged(t, b); n != 0 {
		t.Fatalf("%d staging records left", n)
	}

	// the directory emptied: its state fits one page, but b drops more
	// records than one transaction takes, so it is staged all the same
	for i := range 3000 {
		if i%3 != 0 {
			must[store.Attr](t)(unlinked(a.Unlink(d.Ino, fmt.Sprintf("entry-%05d", i), 3, nil)))
		}
	}
	before := inodeDigest(t, b, d.Ino)
	p := pages(t, a, d.Ino, testPage)[0]
	if _, ok, err := b.replaceWhole(transferOf(p, 51, p.Epoch), p.Records); ok || err != nil || inodeDigest(t, b, d.Ino) != before {
		t.Fatalf("one-transaction replace of a state dropping %d records: ok %v, %v", 4000, ok, err)
	}
	got := must[CopyResult](t)(CopyInode(context.Background(), a, b, d.Ino, CopyOptions{}))
	if have, want := inodeDigest(t, b, d.Ino), inodeDigest(t, a, d.Ino); got.Pages != 1 || have != want {
		t.Fatalf("emptied directory in %d pages: %+v, want %+v", got.Pages, have, want)
	}
	if n := countRecords(t, b, store.RecEntry, d.Ino) + countRecords(t, b, store.RecCookie, d.Ino); n != 0 {
		t.Fatalf("b still lists %d records of the emptied directory", n)
	}

	// a new owner's copy: same records, its epoch; again: nothing to do
	for range 2 {
		must[CopyResult](t)(CopyInode(context.Background(), a, b, f.Ino, CopyOptions{Epoch: 5, PageBytes: MinPageBytes}))
		want := inodeDigest(t, a, f.Ino)
		want.Epoch = 5
		if have := inodeDigest(t, b, f.Ino); have != want {
			t.Fatalf("stamped copy: %+v, want %+v", have, want)
		}
	}
	// fenced: b has seen epoch 5, a's state is of epoch 1
	if _, err := CopyInode(context.Background(), a, b, d.Ino, CopyOptions{Epoch: 1}); err != nil {
		t.Fatalf("d is still at epoch 1 on b: %v", err)
	}
	if _, err := CopyInode(context.Background(), a, b, f.Ino, CopyOptions{}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("copy of epoch 1 onto epoch 5: %v", err)
	}
	// a source at a newer epoch than the one to stamp
	if _, err := CopyInode(context.Background(), b, a, f.Ino, CopyOptions{Epoch: 3}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("copy of an epoch-5 state stamped 3: %v", err)
	}
}

// movingSource changes the source's file after the first page it serves,
// times times.
type movingSource struct {
	s     *testStore
	ino   ids.Ino
	times int
	n     int
}

func (m *movingSource) ReadStatePage(ctx context.Context, ino ids.Ino, after []byte, max int) (StatePage, error) {
	p, err := m.s.ReadStatePage(ctx, ino, after, max)
	if err == nil && after == nil && m.n < m.times {
		m.n++
		_, err = m.s.Write(m.ino, 0, []byte(fmt.Sprintf("change %d", m.n)), 3)
	}
	return p, err
}

// TestTransferSourceMoves: pages must all come from one state of the
// source; CopyInode starts over when it moves, and gives up if it keeps
// moving.
func TestTransferSourceMoves(t *testing.T) {
	var epA, epB ids.Epoch = 1, 0
	a := ownedStore(t, t.TempDir(), 1, &epA)
	b := ownedStore(t, t.TempDir(), 2, &epB)
	defer a.Close()
	defer b.Close()
	f := must[store.Attr](t)(a.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	writeFile(t, a, f.Ino, randBytes(3, 160*store.PageSize))

	src := &movingSource{s: a, ino: f.Ino, times: 1}
	got := must[CopyResult](t)(CopyInode(context.Background(), src, b, f.Ino, CopyOptions{PageBytes: MinPageBytes}))
	if got.Attempts != 2 {
		t.Fatalf("%d attempts, want 2 (the first page of the first came before a change)", got.Attempts)
	}
	if have, want := inodeDigest(t, b, f.Ino), inodeDigest(t, a, f.Ino); have != want {
		t.Fatalf("after the copy: %+v, want %+v", have, want)
	}
	if n := staged(t, b); n != 0 {
		t.Fatalf("%d staging records left by the abandoned attempt", n)
	}
	// b lags by a change; the source never stops changing
	must[store.Attr](t)(a.Write(f.Ino, 5, []byte("lag"), 3))
	before := inodeDigest(t, b, f.Ino)
	src = &movingSource{s: a, ino: f.Ino, times: 100}
	if _, err := CopyInode(context.Background(), src, b, f.Ino, CopyOptions{PageBytes: MinPageBytes}); !errors.Is(err, ErrTransferMoved) {
		t.Fatalf("a source that never stops changing: %v", err)
	}
	if have := inodeDigest(t, b, f.Ino); have != before {
		t.Fatalf("the replica changed although no copy finished: %+v, was %+v", have, before)
	}
}

// crashPair is a source a at epoch 1 with a file, and a replica b (in its
// own directory, so that it can be closed and reopened) holding an older
// state of the file at epoch 2 (stamped by a new owner), so that b's
// fencing is visible.
type crashPair struct {
	a, b     *testStore
	bdir     string
	epB      ids.Epoch
	ino      ids.Ino
	old, new []byte
	oldState InodeDigest
}

func newCrashPair(t *testing.T) *crashPair {
	epA := ids.Epoch(1)
	cp := &crashPair{bdir: t.TempDir()}
	cp.a = ownedStore(t, t.TempDir(), 1, &epA)
	t.Cleanup(func() { cp.a.Close() })
	cp.b = ownedStore(t, cp.bdir, 2, &cp.epB)
	t.Cleanup(func() { cp.b.Close() })
	f := must[store.Attr](t)(cp.a.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	cp.ino = f.Ino
	cp.old = randBytes(4, 192*store.PageSize)
	writeFile(t, cp.a, f.Ino, cp.old)
	must[CopyResult](t)(CopyInode(context.Background(), cp.a, cp.b, f.Ino, CopyOptions{Epoch: 2}))
	cp.oldState = inodeDigest(t, cp.b, f.Ino)
	// the source moves on under a later owner of epoch 3 (it recovered
	// from a's side of the cluster: a restamp); b lagged
	e, v := must2(cp.a.State(f.Ino))
	if ok := must[bool](t)(cp.a.Restamp(f.Ino, e, v, 3)); !ok {
		t.Fatal("restamp refused")
	}
	epA = 3
	cp.new = randBytes(5, 320*store.PageSize+9)
	must[store.Attr](t)(cp.a.SetAttr(f.Ino, store.SetAttrIn{Valid: wire.SetSize, Size: 0}, 2))
	writeFile(t, cp.a, f.Ino, cp.new)
	return cp
}

// reopen closes b as a crash would leave it (badger closed, nothing else
// done) and opens it again.
func (cp *crashPair) reopen(t *testing.T) {
	must[any](t)(nil, cp.b.Close())
	cp.b = ownedStore(t, cp.bdir, 2, &cp.epB)
}

// holdsOld checks that b claims and holds the old state, and still fences
// off epoch 1.
func (cp *crashPair) holdsOld(t *testing.T) {
	t.Helper()
	if got := inodeDigest(t, cp.b, cp.ino); got != cp.oldState {
		t.Fatalf("b holds %+v, want its old state %+v", got, cp.oldState)
	}
	if got := must[[]byte](t)(cp.b.Read(cp.ino, 0, len(cp.new))); !bytes.Equal(got, cp.old) {
		t.Fatalf("b reads %d bytes, not its old state", len(got))
	}
	stale := StatePage{Ino: cp.ino, Epoch: 1, Version: 99}
	if _, err := cp.b.StagePage(context.Background(), transferOf(stale, 77, 1), 0, nil, true); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("transfer of epoch 1 onto epoch 2: %v", err)
	}
}

// finish copies a's state to b and checks b holds it, with nothing staged.
func (cp *crashPair) finish(t *testing.T) {
	t.Helper()
	must[CopyResult](t)(CopyInode(context.Background(), cp.a, cp.b, cp.ino, CopyOptions{PageBytes: MinPageBytes}))
	cp.holdsNew(t)
	if n := staged(t, cp.b); n != 0 {
		t.Fatalf("%d staging records left", n)
	}
}

func (cp *crashPair) holdsNew(t *testing.T) {
	t.Helper()
	if have, want := inodeDigest(t, cp.b, cp.ino), inodeDigest(t, cp.a, cp.ino); have != want {
		t.Fatalf("b holds %+v, want %+v", have, want)
	}
	if got := must[[]byte](t)(cp.b.Read(cp.ino, 0, len(cp.new)+10)); !bytes.Equal(got, cp.new) {
		t.Fatalf("b reads %d bytes, not the new state", len(got))
	}
	stale := StatePage{Ino: cp.ino, Epoch: 2, Version: 99}
	if _, err := cp.b.StagePage(context.Background(), transferOf(stale, 78, 2), 0, nil, true); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("transfer of epoch 2 onto epoch 3: %v", err)
	}
}

// stageSome stages the first n pages of a's state into b as transfer id.
func (cp *crashPair) stageSome(t *testing.T, id uint64, n int) []StatePage {
	t.Helper()
	ps := pages(t, cp.a, cp.ino, MinPageBytes)
	if len(ps) < n+1 {
		t.Fatalf("only %d pages", len(ps))
	}
	for i, p := range ps[:n] {
		if done := must[bool](t)(cp.b.StagePage(context.Background(), transferOf(ps[0], id, 3), uint32(i), p.Records, false)); done {
			t.Fatalf("page %d: done", i)
		}
	}
	return ps
}

// TestTransferCrashStaging: a replica that crashes after some pages were
// staged still claims and holds its old state, still fences, and the next
// transfer completes and leaves no staging behind.
func TestTransferCrashStaging(t *testing.T) {
	cp := newCrashPair(t)
	ps := cp.stageSome(t, 11, 3)
	cp.holdsOld(t) // claimed while staging
	if staged(t, cp.b) == 0 {
		t.Fatal("nothing staged")
	}
	cp.reopen(t)
	cp.holdsOld(t)
	// the interrupted transfer goes on after the restart (its header is
	// durable), or a later one replaces it; here it goes on
	tr := transferOf(ps[0], 11, 3)
	for i := 3; i < len(ps); i++ {
		must[bool](t)(cp.b.StagePage(context.Background(), tr, uint32(i), ps[i].Records, i == len(ps)-1))
	}
	cp.holdsNew(t)
	if n := staged(t, cp.b); n != 0 {
		t.Fatalf("%d staging records left", n)
	}

	// crash again mid-transfer; the sender gives up; a transfer of an
	// older state is refused while the staged one looks alive, and
	// sweeping drops it once idle
	cp = newCrashPair(t)
	cp.stageSome(t, 12, 2)
	cp.reopen(t)
	older := Transfer{Ino: cp.ino, ID: 13, Epoch: 2, SrcEpoch: 2, Version: cp.oldState.Version + 1}
	if _, err := cp.b.StagePage(context.Background(), older, 0, nil, false); !errors.Is(err, ErrTransferBusy) {
		t.Fatalf("transfer of an older state while a newer one is staged: %v", err)
	}
	must[any](t)(nil, cp.b.SweepTransfers(time.Hour))
	if staged(t, cp.b) == 0 {
		t.Fatal("an active staging was swept")
	}
	must[any](t)(nil, cp.b.SweepTransfers(0))
	if n := staged(t, cp.b); n != 0 {
		t.Fatalf("%d staging records left after the sweep", n)
	}
	cp.holdsOld(t)
	cp.finish(t)
}

// TestTransferCrashSwitch: a crash after the switch committed, at any
// point of its roll-forward, leaves a replica that claims the new state,
// refuses changes to it, and holds it once settled: by the sweep a server
// runs at start, or first thing in any path that reads or stamps the
// inode's records (a peer's page read, a transfer's first page, a
// recovery's restamp).
func TestTransferCrashSwitch(t *testing.T) {
	for _, stop := range []string{"committed", "deleted", "copied-some"} {
		t.Run(stop, func(t *testing.T) {
			cp := newCrashPair(t)
			ps := cp.stageSome(t, 21, 0)
			tr := transferOf(ps[0], 21, 3)
			for i, p := range ps {
				must[bool](t)(cp.b.StagePage(context.Background(), tr, uint32(i), p.Records, false))
			}
			if ok := must[bool](t)(cp.b.commitSwitch(tr, uint32(len(ps)-1))); !ok {
				t.Fatal("switch not committed")
			}
			switch stop {
			case "deleted":
				must[any](t)(nil, cp.b.rollDelete(cp.ino, tr.ID))
			case "copied-some":
				must[any](t)(nil, cp.b.rollDelete(cp.ino, tr.ID))
				must[any](t)(nil, cp.b.rollCopy(cp.ino, tr.ID, 1))
			}
			cp.reopen(t)
			// claimed at once, refused changes and restamps until settled
			want := inodeDigest(t, cp.a, cp.ino)
			if e, v := must2(cp.b.State(cp.ino)); e != 3 || v != want.Version {
				t.Fatalf("b claims %v/%d, want 3/%d", e, v, want.Version)
			}
			change := []Change{{Ino: cp.ino, Epoch: 3, Version: want.Version + 1}}
			if err := cp.b.Apply(change); !errors.Is(err, ErrVersionGap) {
				t.Fatalf("change while switching: %v", err)
			}
			switch stop {
			case "committed":
				must[any](t)(nil, cp.b.SweepTransfers(time.Hour)) // a server at start
			case "deleted":
				p := must[StatePage](t)(cp.b.ReadStatePage(context.Background(), cp.ino, nil, 0)) // a peer
				if p.Epoch != 3 || p.Version != want.Version {
					t.Fatalf("page at %v/%d", p.Epoch, p.Version)
				}
			default: // a transfer of the same state, from another sender
				again := transferOf(pages(t, cp.a, cp.ino, MinPageBytes)[0], 22, 3)
				if !must[bool](t)(cp.b.StagePage(context.Background(), again, 0, nil, false)) {
					t.Fatal("the state b holds, sent again, not done at once")
				}
			}
			cp.holdsNew(t)
			if n := staged(t, cp.b); n != 0 {
				t.Fatalf("%d staging records left", n)
			}
			if ok := must[bool](t)(cp.b.Restamp(cp.ino, 3, want.Version, 4)); !ok {
				t.Fatal("restamp after the switch refused")
			}
		})
	}
}

// ageStaging moves ino's staging header's last page back by d, as if no
// page came for that long.
func ageStaging(t *testing.T, s *testStore, ino ids.Ino, d time.Duration) {
	t.Helper()
	err := s.UpdateRaw(func(tx *store.Tx) error {
		h, found, err := readStageHeader(tx, ino)
		if err != nil || !found {
			return fmt.Errorf("no staging of %v: %v", ino, err)
		}
		h.active -= int64(d)
		return tx.Set(tx.Key(store.RecStage, ino, nil), h.encode())
	})
	if err != nil {
		t.Fatal(err)
	}
}

// testPage is the page servers send (ownership's transferPage).
const testPage = 1 << 20

func must2[A, B any](a A, b B, err error) (A, B) {
	if err != nil {
		panic(err)
	}
	return a, b
}

// TestTransferFencing: a replica that sees a newer epoch while a transfer
// is staged refuses the switch, keeps what it held and drops the staging;
// a newer epoch's transfer supersedes an active one, and the superseded
// sender learns it at its next page.
func TestTransferFencing(t *testing.T) {
	cp := newCrashPair(t)
	ps := cp.stageSome(t, 31, 2)
	// b learns of epoch 4 (a newer owner restamped its state)
	if ok := must[bool](t)(cp.b.Restamp(cp.ino, cp.oldState.Epoch, cp.oldState.Version, 4)); !ok {
		t.Fatal("restamp refused")
	}
	tr := transferOf(ps[0], 31, 3)
	var err error
	for i := 2; i < len(ps) && err == nil; i++ {
		_, err = cp.b.StagePage(context.Background(), tr, uint32(i), ps[i].Records, i == len(ps)-1)
	}
	var stale *StaleEpochError
	if !errors.As(err, &stale) || stale.Seen != 4 || stale.Offered != 3 {
		t.Fatalf("switch of epoch 3 onto epoch 4: %v", err)
	}
	want := cp.oldState
	want.Epoch = 4
	if got := inodeDigest(t, cp.b, cp.ino); got != want {
		t.Fatalf("b holds %+v after the refused switch, want %+v", got, want)
	}
	if n := staged(t, cp.b); n != 0 {
		t.Fatalf("%d staging records left", n)
	}
	// An active transfer is superseded by its sender's next attempt or
	// by a newer state's at once, by the same state's once idle for a
	// while, by an older state's once abandoned; a superseded sender
	// learns it at its next page.
	old := transferOf(ps[0], 41, 4)
	must[bool](t)(cp.b.StagePage(context.Background(), old, 0, ps[0].Records, false))
	older := transferOf(ps[0], 42, 4)
	older.Version--
	same := transferOf(ps[0], 44, 4)
	for _, tr := range []Transfer{older, same} {
		if _, err := cp.b.StagePage(context.Background(), tr, 0, ps[0].Records, false); !errors.Is(err, ErrTransferBusy) {
			t.Fatalf("transfer of %v/%d while one of 4/%d is active: %v", tr.Epoch, tr.Version, old.Version, err)
		}
	}
	ageStaging(t, cp.b, cp.ino, sameStateIdle)
	if _, err := cp.b.StagePage(context.Background(), older, 0, ps[0].Records, false); !errors.Is(err, ErrTransferBusy) {
		t.Fatalf("transfer of an older state while the staged one is idle but not abandoned: %v", err)
	}
	must[bool](t)(cp.b.StagePage(context.Background(), same, 0, ps[0].Records, false))
	if _, err := cp.b.StagePage(context.Background(), old, 1, ps[1].Records, false); !errors.Is(err, ErrTransferLost) {
		t.Fatalf("page of a transfer superseded by the same state: %v", err)
	}
	ageStaging(t, cp.b, cp.ino, StageIdle)
	must[bool](t)(cp.b.StagePage(context.Background(), older, 0, ps[0].Records, false))
	retry := transferOf(ps[0], 45, 4)
	retry.Replaces = older.ID
	must[bool](t)(cp.b.StagePage(context.Background(), retry, 0, ps[0].Records, false))
	newer := transferOf(ps[0], 43, 5)
	must[bool](t)(cp.b.StagePage(context.Background(), newer, 0, ps[0].Records, false))
	if _, err := cp.b.StagePage(context.Background(), retry, 1, ps[1].Records, false); !errors.Is(err, ErrTransferLost) {
		t.Fatalf("page of a transfer superseded by a newer epoch: %v", err)
	}
	for i := 1; i < len(ps); i++ {
		must[bool](t)(cp.b.StagePage(context.Background(), newer, uint32(i), ps[i].Records, i == len(ps)-1))
	}
	want = inodeDigest(t, cp.a, cp.ino)
	want.Epoch = 5
	if got := inodeDigest(t, cp.b, cp.ino); got != want {
		t.Fatalf("b holds %+v, want %+v", got, want)
	}
	if n := staged(t, cp.b); n != 0 {
		t.Fatalf("%d staging records left (the superseded transfer's page 0)", n)
	}
}

// heapSampler records the peak live heap (as of each GC) while it runs,
// with GC made frequent so that the live heap is seen often.
type heapSampler struct {
	stop chan struct{}
	done sync.WaitGroup
	peak atomic.Uint64
	base uint64
	gc   int
}

func liveHeap() uint64 {
	s := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

func startHeapSampler() *heapSampler {
	h := &heapSampler{stop: make(chan struct{})}
	h.gc = debug.SetGCPercent(10)
	runtime.GC()
	h.base = liveHeap()
	h.done.Add(1)
	go func() {
		defer h.done.Done()
		for {
			if v := liveHeap(); v > h.peak.Load() {
				h.peak.Store(v)
			}
			select {
			case <-h.stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return h
}

// extra stops the sampler and returns the peak live heap above the base.
func (h *heapSampler) extra() uint64 {
	close(h.stop)
	h.done.Wait()
	debug.SetGCPercent(h.gc)
	if p := h.peak.Load(); p > h.base {
		return p - h.base
	}
	return 0
}

// TestTransferLarge: a 64 MiB file and a directory of 20,000 entries copied
// between two real stores with the cluster's page size; logs the time and
// the peak extra live heap, which must stay far below the inode's size.
func TestTransferLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 64 MiB")
	}
	var epA, epB ids.Epoch = 1, 0
	a := ownedStore(t, t.TempDir(), 1, &epA)
	b := ownedStore(t, t.TempDir(), 2, &epB)
	defer a.Close()
	defer b.Close()
	f := must[store.Attr](t)(a.Create(ids.RootIno, "big", reg|0o644, 0, 0, 0, 1))
	data := randBytes(6, 64<<20)
	writeFile(t, a, f.Ino, data)
	d := must[store.Attr](t)(a.Mkdir(ids.RootIno, "dir", 0o755, 0, 0, 1))
	for i := range 20000 {
		must[store.Attr](t)(a.Create(d.Ino, fmt.Sprintf("entry-with-a-longish-name-%06d", i), reg|0o644, 0, 0, 0, 1))
	}
	data = nil
	for _, c := range []struct {
		name string
		ino  ids.Ino
	}{{"64 MiB file", f.Ino}, {"20,000-entry directory", d.Ino}} {
		h := startHeapSampler()
		start := time.Now()
		got := must[CopyResult](t)(CopyInode(context.Background(), a, b, c.ino, CopyOptions{PageBytes: testPage}))
		took := time.Since(start)
		extra := h.extra()
		if have, want := inodeDigest(t, b, c.ino), inodeDigest(t, a, c.ino); have != want {
			t.Fatalf("%s: %+v, want %+v", c.name, have, want)
		}
		t.Logf("%s: %d records, %.1f MiB in %d pages, %v (store to store); peak extra live heap %.1f MiB",
			c.name, got.Records, float64(got.Bytes)/(1<<20), got.Pages, took.Round(time.Millisecond), float64(extra)/(1<<20))
		if extra > 24<<20 {
			t.Errorf("%s: %.1f MiB of extra heap: not bounded by the page size", c.name, float64(extra)/(1<<20))
		}
	}
}
