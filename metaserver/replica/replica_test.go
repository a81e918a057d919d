package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/wire"
)

// replNode is one server's real badger store. It is the owner of every inode
// while epoch is set; every store runs in owner mode, so that a node can
// become the owner without reopening (replicas only call Apply and
// ReplaceInode, which owner mode does not affect).
type replNode struct {
	s     *testStore
	epoch ids.Epoch
	log   [][]Change // one entry per committed operation, split
}

var errNotOwner = errors.New("test: not the owner")

func newReplNode(t testing.TB, id ids.ServerID) *replNode {
	t.Helper()
	n := &replNode{}
	n.s = openTestStore(t, t.TempDir(), store.Options{
		ServerID: id,
		Stamp: Stamp(func(ids.Ino) (ids.Epoch, error) {
			if n.epoch == 0 {
				return 0, errNotOwner
			}
			return n.epoch, nil
		}),
		OnCommit: func(ws []store.Write) { n.log = append(n.log, SplitByInode(ws)) },
	})
	t.Cleanup(func() { n.s.Close() })
	n.log = nil // the root's creation: local, unstamped
	return n
}

// replCluster opens three stores; the first owns everything at epoch 1.
func replCluster(t *testing.T) (a, b, c *replNode) {
	a, b, c = newReplNode(t, 1), newReplNode(t, 2), newReplNode(t, 3)
	a.epoch = 1
	return a, b, c
}

// take returns the operations committed since the last take.
func (n *replNode) take() [][]Change {
	l := n.log
	n.log = nil
	return l
}

// ship applies operations to replicas in order.
func ship(t *testing.T, ops [][]Change, to ...*replNode) {
	t.Helper()
	for _, r := range to {
		for _, op := range ops {
			if err := r.s.Apply(op); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func checksum(t testing.TB, s *testStore) [32]byte {
	t.Helper()
	sum, err := s.Checksum()
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

func sameChecksums(t *testing.T, nodes ...*replNode) {
	t.Helper()
	want := checksum(t, nodes[0].s)
	for i, n := range nodes[1:] {
		if got := checksum(t, n.s); got != want {
			t.Fatalf("store %d's checksum differs from store 0's:\n%v\n%v", i+1, dump(t, nodes[0].s), dump(t, n.s))
		}
	}
}

func stateOf(t *testing.T, s *testStore, ino ids.Ino) replState {
	t.Helper()
	e, v, err := s.State(ino)
	if err != nil {
		t.Fatal(err)
	}
	return replState{e, v}
}

func TestReplReplicate(t *testing.T) {
	a, b, c := replCluster(t)
	d := must[store.Attr](t)(a.s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 1))
	f := must[store.Attr](t)(a.s.Create(d.Ino, "f", reg|0o644, 0, 0, 0, 1))
	must[store.Attr](t)(a.s.Write(f.Ino, 10, []byte("hello"), 2))
	must[store.Attr](t)(a.s.Write(f.Ino, 12, []byte("LP"), 2)) // partial chunk: pooled buffer
	must[store.Attr](t)(a.s.Symlink(d.Ino, "l", "f", 0, 0, 3))
	must[any](t)(nil, a.s.SetXattr(f.Ino, "user.k", []byte("v"), 0, 1))
	must[store.Attr](t)(a.s.Link(f.Ino, ids.RootIno, "hard", 4))
	ops := a.take()
	if len(ops) != 7 {
		t.Fatalf("%d operations committed", len(ops))
	}
	// every part is stamped with the owner's epoch and its inode's next version
	versions := map[ids.Ino]uint64{}
	for _, op := range ops {
		for _, ch := range op {
			if ch.Epoch != 1 || ch.Version != versions[ch.Ino]+1 {
				t.Fatalf("%v stamped %v/%d after version %d", ch.Ino, ch.Epoch, ch.Version, versions[ch.Ino])
			}
			versions[ch.Ino] = ch.Version
			for _, w := range ch.Writes {
				if w.Ino() != ch.Ino || w.Key[0] == store.RecRepl {
					t.Fatalf("change of %v carries %v", ch.Ino, w)
				}
			}
		}
	}
	ship(t, ops, b, c)
	sameChecksums(t, a, b, c)
	for _, r := range []*replNode{b, c} {
		if got := must[[]byte](t)(r.s.Read(f.Ino, 0, 100)); string(got) != "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00heLPo" {
			t.Fatalf("replica reads %q", got)
		}
		if got := must[store.Attr](t)(r.s.Lookup(ids.RootIno, "hard")); got.Ino != f.Ino || got.Nlink != 2 {
			t.Fatalf("replica looks up %+v", got)
		}
		if got := must[string](t)(r.s.Readlink(must[store.Attr](t)(r.s.Lookup(d.Ino, "l")).Ino)); got != "f" {
			t.Fatalf("replica's symlink reads %q", got)
		}
		if got := must[[]byte](t)(r.s.GetXattr(f.Ino, "user.k")); string(got) != "v" {
			t.Fatalf("replica's xattr is %q", got)
		}
		if got := stateOf(t, r.s, f.Ino); got != (replState{1, versions[f.Ino]}) {
			t.Fatalf("replica holds %v at %v, want version %d", f.Ino, got, versions[f.Ino])
		}
	}
	ep, err := b.s.MaxEpoch()
	if err != nil || ep != 1 {
		t.Fatalf("MaxEpoch = %v, %v", ep, err)
	}
}

// TestReplStaleEpoch: an owner whose epoch was superseded can change nothing,
// neither on a replica nor in its own store.
func TestReplStaleEpoch(t *testing.T) {
	a, b, c := replCluster(t)
	a.epoch = 2
	f := must[store.Attr](t)(a.s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	ship(t, a.take(), b, c)

	// c believes it still owns at epoch 1: its own store refuses
	c.epoch = 1
	before := checksum(t, c.s)
	_, err := c.s.Write(f.Ino, 0, []byte("stale"), 2)
	var se *StaleEpochError
	if !errors.As(err, &se) || !errors.Is(err, ErrStaleEpoch) || se.Ino != f.Ino || se.Offered != 1 || se.Seen != 2 {
		t.Fatalf("stale owner's own write: %v", err)
	}
	if checksum(t, c.s) != before || len(c.log) != 0 {
		t.Fatal("stale owner's store changed")
	}

	// a stale owner that missed everything (d) changes its own store, but
	// no replica takes it; the batch is rejected whole even though its
	// other part (a new inode, listed first here) is admissible alone
	d := newReplNode(t, 4)
	d.epoch = 1
	g := must[store.Attr](t)(d.s.Create(ids.RootIno, "g", reg|0o644, 0, 0, 0, 1))
	op := d.take()[0]
	if len(op) != 2 || op[0].Ino != ids.RootIno || op[1].Ino != g.Ino {
		t.Fatalf("create split into %v", op)
	}
	slices.Reverse(op)
	before = checksum(t, b.s)
	err = b.s.Apply(op)
	if !errors.As(err, &se) || se.Ino != ids.RootIno || se.Offered != 1 || se.Seen != 2 {
		t.Fatalf("stale change applied: %v", err)
	}
	if checksum(t, b.s) != before {
		t.Fatal("rejected batch changed the replica")
	}
	if _, err := b.s.GetAttr(g.Ino); !errors.Is(err, wire.Err(wire.CodeNotFound)) {
		t.Fatalf("stale owner's new inode reached the replica: %v", err)
	}
	// and a transfer of its state is refused too
	if _, err := CopyInode(context.Background(), d.s, b.s, ids.RootIno, CopyOptions{Epoch: 1}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("stale transfer: %v", err)
	}
	if checksum(t, b.s) != before {
		t.Fatal("stale transfer changed the replica")
	}
}

// TestReplDuplicate: retries and duplicates are harmless; a change that does
// not follow the replica's state is refused.
func TestReplDuplicate(t *testing.T) {
	a, b, _ := replCluster(t)
	f := must[store.Attr](t)(a.s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	for i := range 4 {
		must[store.Attr](t)(a.s.Write(f.Ino, uint64(i), []byte{'a' + byte(i)}, 2))
	}
	ops := a.take()
	ship(t, ops[:2], b)
	ship(t, ops[:2], b) // retried
	ship(t, ops[1:2], b)
	before := checksum(t, b.s)

	// ops[3] without ops[2]: a gap
	err := b.s.Apply(ops[3])
	var ge *VersionGapError
	if !errors.As(err, &ge) || !errors.Is(err, ErrVersionGap) || ge.Ino != f.Ino ||
		ge.Epoch != 1 || ge.Version != ops[3][0].Version || ge.SeenVersion != ops[3][0].Version-2 {
		t.Fatalf("change after a gap: %v", err)
	}
	if checksum(t, b.s) != before {
		t.Fatal("refused change changed the replica")
	}
	// several changes of one inode in one batch apply in order, even
	// repeated
	batch := slices.Concat(ops[2], ops[3], ops[2], ops[3])
	must[any](t)(nil, b.s.Apply(batch))
	must[any](t)(nil, b.s.Apply(batch))
	ship(t, ops, b) // the whole history again
	sameChecksums(t, a, b)
	if got := must[[]byte](t)(b.s.Read(f.Ino, 0, 10)); string(got) != "abcd" {
		t.Fatalf("replica reads %q", got)
	}
}

// TestReplMultiInode: create and rename across directories change several
// inodes, each stamped with its own version, applied all or nothing.
func TestReplMultiInode(t *testing.T) {
	a, b, c := replCluster(t)
	d := must[store.Attr](t)(a.s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 1))
	e := must[store.Attr](t)(a.s.Mkdir(ids.RootIno, "e", 0o755, 0, 0, 1))
	ship(t, a.take(), b, c)
	f := must[store.Attr](t)(a.s.Create(d.Ino, "f", reg|0o644, 0, 0, 0, 2))
	x := must[store.Attr](t)(a.s.Create(e.Ino, "x", reg|0o644, 0, 0, 0, 2))
	create := a.take()
	if inos := changeInos(create[0]); !slices.Equal(inos, []ids.Ino{d.Ino, f.Ino}) {
		t.Fatalf("create changed %v", inos)
	}
	ship(t, create, b, c)
	must[store.Attr](t)(a.s.Write(f.Ino, 0, []byte("data"), 3))
	must[*store.Attr](t)(a.s.Rename(d.Ino, "f", e.Ino, "x", 0, 4)) // replaces x
	ops := a.take()
	rename := ops[1]
	if inos := changeInos(rename); !slices.Equal(inos, []ids.Ino{d.Ino, e.Ino, f.Ino, x.Ino}) {
		t.Fatalf("rename changed %v", inos)
	}
	for _, ch := range rename {
		if want := stateOf(t, b.s, ch.Ino).version + 1; ch.Ino != f.Ino && ch.Version != want {
			t.Fatalf("%v stamped version %d, want %d", ch.Ino, ch.Version, want)
		}
	}

	// c saw a newer owner of e (epoch 5): the rename is refused whole
	if st := stateOf(t, c.s, e.Ino); !must[bool](t)(c.s.Restamp(e.Ino, st.epoch, st.version, 5)) {
		t.Fatalf("restamp of %v at %v refused", e.Ino, st)
	}
	ship(t, ops[:1], c)
	before := checksum(t, c.s)
	var se *StaleEpochError
	if err := c.s.Apply(rename); !errors.As(err, &se) || se.Ino != e.Ino || se.Seen != 5 {
		t.Fatalf("rename over a newer epoch: %v", err)
	}
	if checksum(t, c.s) != before {
		t.Fatal("refused rename changed the replica")
	}
	must[store.Attr](t)(c.s.Lookup(d.Ino, "f"))

	ship(t, ops, b)
	sameChecksums(t, a, b)
	if got := must[store.Attr](t)(b.s.Lookup(e.Ino, "x")); got.Ino != f.Ino {
		t.Fatalf("replica's e/x is %v", got.Ino)
	}
	wantCode(t, must2err(b.s.Lookup(d.Ino, "f")), wire.CodeNotFound)
	if got := must[store.Attr](t)(b.s.GetAttr(x.Ino)); got.Nlink != 0 {
		t.Fatalf("replaced inode has nlink %d", got.Nlink)
	}
	if ents := must[[]store.DirEntry](t)(b.s.ReadDir(e.Ino, 0, 0)); len(ents) != 1 || ents[0].Name != "x" {
		t.Fatalf("replica lists e as %v", ents)
	}
}

func changeInos(op []Change) []ids.Ino {
	var out []ids.Ino
	for _, ch := range op {
		out = append(out, ch.Ino)
	}
	return out
}

func must2err[T any](_ T, err error) error { return err }

// allInos lists every inode any of the stores holds a record of.
func allInos(t *testing.T, stores ...*testStore) []ids.Ino {
	t.Helper()
	var out []ids.Ino
	for _, s := range stores {
		for after := ids.Ino(0); after != MaxIno; {
			page := must[DigestPage](t)(s.Digest(after, 3, true))
			for _, d := range page.Inodes {
				out = append(out, d.Ino)
			}
			after = page.Through
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// recoverAll makes owner the owner of every inode at epoch: it reads every
// inode's state from the majority, takes the newest and writes it back
// under its epoch (a restamp where a replica holds it, a copy elsewhere),
// as DESIGN.md's new owner does (ownership's recovery).
func recoverAll(t *testing.T, owner *replNode, epoch ids.Epoch, majority ...*replNode) map[ids.Ino]replState {
	t.Helper()
	var stores []*testStore
	for _, n := range majority {
		stores = append(stores, n.s)
	}
	chosen := map[ids.Ino]replState{}
	for _, ino := range allInos(t, stores...) {
		var best replState
		var bestAt *testStore
		held := map[*testStore]replState{}
		for _, s := range stores {
			held[s] = stateOf(t, s, ino)
			if bestAt == nil || best.less(held[s]) {
				best, bestAt = held[s], s
			}
		}
		chosen[ino] = best
		for _, s := range stores {
			if held[s] == best && best.version > 0 {
				if !must[bool](t)(s.Restamp(ino, best.epoch, best.version, epoch)) {
					t.Fatalf("restamp of %v at %v refused", ino, best)
				}
				continue
			}
			must[CopyResult](t)(CopyInode(context.Background(), bestAt, s, ino, CopyOptions{Epoch: epoch}))
		}
	}
	owner.epoch = epoch
	return chosen
}

// TestReplRecovery: a new owner recovers from a majority whose members
// diverged, in both directions, and they converge, deletions included.
func TestReplRecovery(t *testing.T) {
	a, b, c := replCluster(t)
	d := must[store.Attr](t)(a.s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 1))
	f := must[store.Attr](t)(a.s.Create(d.Ino, "f", reg|0o644, 0, 0, 0, 1))
	g := must[store.Attr](t)(a.s.Create(d.Ino, "g", reg|0o644, 0, 0, 0, 1))
	data := bytes.Repeat([]byte("0123456789abcdef"), 3*store.PageSize/16)
	must[store.Attr](t)(a.s.Write(f.Ino, 0, data, 2))
	must[store.Attr](t)(a.s.Write(g.Ino, 0, []byte("g"), 2))
	must[any](t)(nil, a.s.SetXattr(g.Ino, "user.g", []byte("1"), 0, 1))
	ship(t, a.take(), b, c)
	// acknowledged by a and b only: c misses an unlink, a purge and a truncation
	must[store.Attr](t)(unlinked(a.s.Unlink(d.Ino, "g", 3, nil)))
	must[any](t)(nil, a.s.Purge(g.Ino))
	must[store.Attr](t)(a.s.SetAttr(f.Ino, store.SetAttrIn{Valid: wire.SetSize, Size: 10}, 4))
	ship(t, a.take(), b)
	if n := countRecords(t, c.s, store.RecPage, f.Ino); n != 3 {
		t.Fatalf("c holds %d chunks of f before recovery", n)
	}

	// a dies; b takes over at epoch 2 with b and c as its majority
	wantB := map[ids.Ino]replState{}
	for _, ino := range allInos(t, b.s, c.s) {
		wantB[ino] = stateOf(t, b.s, ino)
	}
	chosen := recoverAll(t, b, 2, b, c)
	for ino, st := range chosen {
		if st != wantB[ino] {
			t.Fatalf("recovery of %v chose %v, b holds %v", ino, st, wantB[ino])
		}
		if got := stateOf(t, c.s, ino); got != (replState{2, wantB[ino].version}) {
			t.Fatalf("c holds %v at %v after recovery", ino, got)
		}
	}
	sameChecksums(t, b, c)
	wantCode(t, must2err(c.s.Lookup(d.Ino, "g")), wire.CodeNotFound)
	wantCode(t, must2err(c.s.GetAttr(g.Ino)), wire.CodeNotFound)
	for _, p := range []byte{store.RecAttr, store.RecXattr, store.RecPage} {
		if n := countRecords(t, c.s, p, g.Ino); n != 0 {
			t.Fatalf("purged g keeps %d %c records on c", n, p)
		}
	}
	if n := countRecords(t, c.s, store.RecPage, f.Ino); n != 1 {
		t.Fatalf("c holds %d chunks of the truncated f", n)
	}
	if got := must[[]byte](t)(c.s.Read(f.Ino, 0, 1<<20)); !bytes.Equal(got, data[:10]) {
		t.Fatalf("c reads %q", got)
	}

	// the deposed owner a still changes its own store; nobody takes it
	// (twice: its version of f passes the new owner's, its epoch does not)
	must[store.Attr](t)(a.s.Write(f.Ino, 0, []byte("lost"), 5))
	must[store.Attr](t)(a.s.Write(f.Ino, 0, []byte("LOST"), 5))
	for _, op := range a.take() {
		for _, r := range []*replNode{b, c} {
			if err := r.s.Apply(op); !errors.Is(err, ErrStaleEpoch) {
				t.Fatalf("deposed owner's change: %v", err)
			}
		}
	}

	// b's next change is acknowledged by b alone and reaches c, not b's
	// successor's other replica... here c, taking over at epoch 3 with
	// a as the other member: the newest of a and c is c's
	must[store.Attr](t)(b.s.Write(f.Ino, 0, []byte("new"), 6))
	ship(t, b.take(), c)
	b.epoch = 0
	cf := stateOf(t, c.s, f.Ino)
	if af := stateOf(t, a.s, f.Ino); af.version <= cf.version {
		t.Fatalf("a holds f at %v, c at %v", af, cf)
	}
	chosen = recoverAll(t, c, 3, c, a)
	if got := chosen[f.Ino]; got != cf {
		t.Fatalf("recovery of f chose %v, c holds %v", got, cf)
	}
	sameChecksums(t, a, c)
	if got := must[[]byte](t)(a.s.Read(f.Ino, 0, 100)); string(got) != "new3456789" {
		t.Fatalf("a reads %q after recovery", got)
	}
	// the new owner continues; b, which missed the recovery, must be sent
	// the inode's state first
	must[store.Attr](t)(c.s.Write(f.Ino, 0, []byte("N"), 7))
	op := c.take()[0]
	ship(t, [][]Change{op}, a)
	if err := b.s.Apply(op); !errors.Is(err, ErrVersionGap) {
		t.Fatalf("change over another epoch's state: %v", err)
	}
	must[CopyResult](t)(CopyInode(context.Background(), c.s, b.s, f.Ino, CopyOptions{Epoch: 3}))
	must[any](t)(nil, b.s.Apply(op)) // now a duplicate
	if got := must[[]byte](t)(b.s.Read(f.Ino, 0, 100)); string(got) != "New3456789" {
		t.Fatalf("b reads %q", got)
	}
	sameChecksums(t, a, c)

	// an owner that has not recovered an inode cannot change it
	a.epoch = 9
	_, err := a.s.Write(f.Ino, 0, []byte("x"), 8)
	if !errors.Is(err, ErrVersionGap) {
		t.Fatalf("unrecovered owner's write: %v", err)
	}
}

// TestReplAntiEntropy: comparing digests page by page finds exactly the
// inodes a replica lacks.
func TestReplAntiEntropy(t *testing.T) {
	a, b, _ := replCluster(t)
	var files []store.Attr
	for i := range 12 {
		files = append(files, must[store.Attr](t)(a.s.Create(ids.RootIno, fmt.Sprint("f", i), reg|0o644, 0, 0, 0, 1)))
	}
	ship(t, a.take(), b)
	sameChecksums(t, a, b)
	must[store.Attr](t)(a.s.Write(files[3].Ino, 0, []byte("three"), 2))
	must[any](t)(nil, a.s.SetXattr(files[7].Ino, "user.x", nil, 0, 1))
	must[store.Attr](t)(unlinked(a.s.Unlink(ids.RootIno, "f9", 3, nil)))
	must[any](t)(nil, a.s.Purge(files[9].Ino))
	a.take() // b misses them all

	want := []ids.Ino{ids.RootIno, files[3].Ino, files[7].Ino, files[9].Ino}
	var fetch, diverged []ids.Ino
	for _, hashes := range []bool{false, true} { // servers' rounds go without
		var pages int
		var seen []ids.Ino
		fetch, diverged, pages, seen = antiEntropy(t, b.s, a.s, 4, hashes)
		if !slices.Equal(fetch, want) || len(diverged) != 0 {
			t.Fatalf("hashes %v: fetch %v diverged %v, want fetch %v", hashes, fetch, diverged, want)
		}
		if pages < 4 || len(seen) != 13 {
			t.Fatalf("hashes %v: %d pages listed %d inodes", hashes, pages, len(seen))
		}
	}
	for _, ino := range fetch {
		must[CopyResult](t)(CopyInode(context.Background(), a.s, b.s, ino, CopyOptions{}))
	}
	sameChecksums(t, a, b)
	for _, pair := range [][2]*testStore{{a.s, b.s}, {b.s, a.s}} {
		for _, max := range []int{1, 5} {
			if fetch, diverged, pages, _ := antiEntropy(t, pair[0], pair[1], max, true); len(fetch)+len(diverged) != 0 || max == 1 && pages != 13 {
				t.Fatalf("converged stores differ: fetch %v diverged %v (%d pages)", fetch, diverged, pages)
			}
		}
	}
	if got := must[[]byte](t)(b.s.Read(files[3].Ino, 0, 10)); string(got) != "three" {
		t.Fatalf("b reads %q", got)
	}

	// two stores that never replicated: each made its own root
	x, y := newReplNode(t, 5), newReplNode(t, 6)
	fetch, diverged, _, _ = antiEntropy(t, x.s, y.s, 0, true)
	if len(fetch) != 0 || !slices.Equal(diverged, []ids.Ino{ids.RootIno}) {
		t.Fatalf("fresh stores: fetch %v diverged %v", fetch, diverged)
	}
}

// antiEntropy walks peer's digest in pages of max inodes and compares each
// with local's digest of the same range, with or without hashes.
func antiEntropy(t *testing.T, local, peer *testStore, max int, hashes bool) (fetch, diverged []ids.Ino, pages int, seen []ids.Ino) {
	t.Helper()
	for after := ids.Ino(0); ; {
		p := must[DigestPage](t)(peer.Digest(after, max, hashes))
		if p.After != after || (max > 0 && len(p.Inodes) > max) {
			t.Fatalf("page after %v: %+v", after, p)
		}
		l := must[DigestPage](t)(local.DigestRange(p.After, p.Through, hashes))
		f, d, err := DiffDigests(l, p)
		if err != nil {
			t.Fatal(err)
		}
		fetch, diverged = append(fetch, f...), append(diverged, d...)
		for _, d := range p.Inodes {
			if len(seen) > 0 && d.Ino <= seen[len(seen)-1] || d.Ino <= p.After || d.Ino > p.Through {
				t.Fatalf("page (%v, %v] lists %v after %v", p.After, p.Through, d.Ino, seen)
			}
			seen = append(seen, d.Ino)
		}
		pages++
		if p.Last() {
			return fetch, diverged, pages, seen
		}
		after = p.Through
	}
}

// TestReplLargeFile: a file of several pages replicates, is copied whole
// and shrinks.
func TestReplLargeFile(t *testing.T) {
	a, b, c := replCluster(t)
	f := must[store.Attr](t)(a.s.Create(ids.RootIno, "big", reg|0o644, 0, 0, 0, 1))
	data := make([]byte, 5*store.PageSize+100)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	must[store.Attr](t)(a.s.Write(f.Ino, 0, data, 2))
	must[store.Attr](t)(a.s.Write(f.Ino, 3*store.PageSize+7, []byte("patch"), 3)) // read-modify-write
	copy(data[3*store.PageSize+7:], "patch")
	ship(t, a.take(), b)
	sameChecksums(t, a, b)
	if got := must[[]byte](t)(b.s.Read(f.Ino, 0, len(data)+10)); !bytes.Equal(got, data) {
		t.Fatal("replica reads different data")
	}
	page := must[StatePage](t)(b.s.ReadStatePage(context.Background(), f.Ino, nil, 0))
	if len(page.Records) != 7 || page.Epoch != 1 || page.Version != 3 || !page.Last {
		t.Fatalf("state of %d records at %v/%d (last %v)", len(page.Records), page.Epoch, page.Version, page.Last)
	}
	// c never saw the file: its state is enough to read it
	must[CopyResult](t)(CopyInode(context.Background(), b.s, c.s, f.Ino, CopyOptions{}))
	if got := must[[]byte](t)(c.s.Read(f.Ino, 0, len(data))); !bytes.Equal(got, data) {
		t.Fatal("copy reads different data")
	}
	must[store.Attr](t)(a.s.SetAttr(f.Ino, store.SetAttrIn{Valid: wire.SetSize, Size: store.PageSize + 10}, 4))
	ship(t, a.take(), b)
	must[CopyResult](t)(CopyInode(context.Background(), a.s, c.s, f.Ino, CopyOptions{Epoch: 1}))
	for _, n := range []*replNode{a, b, c} {
		if k := countRecords(t, n.s, store.RecPage, f.Ino); k != 2 {
			t.Fatalf("%d chunks after truncation", k)
		}
		if got := must[[]byte](t)(n.s.Read(f.Ino, 0, len(data))); !bytes.Equal(got, data[:store.PageSize+10]) {
			t.Fatal("truncated file reads different data")
		}
	}
	sameChecksums(t, a, b)
}

func TestReplBadChange(t *testing.T) {
	a, b, _ := replCluster(t)
	f := must[store.Attr](t)(a.s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	op := a.take()[0]
	ch := op[1]
	for name, bad := range map[string]Change{
		"zero version":  {Ino: ch.Ino, Epoch: 1, Writes: ch.Writes},
		"zero epoch":    {Ino: ch.Ino, Version: 1, Writes: ch.Writes},
		"other inode":   {Ino: ids.RootIno, Epoch: 1, Version: 1, Writes: ch.Writes},
		"server record": {Ino: ch.Ino, Epoch: 1, Version: 1, Writes: []store.Write{{Key: (&store.Tx{}).Key(store.RecServer, ids.MakeIno(2, 0), nil), Value: []byte("x")}}},
		"state record":  {Ino: ch.Ino, Epoch: 1, Version: 1, Writes: []store.Write{{Key: (&store.Tx{}).Key(store.RecRepl, ch.Ino, nil), Value: []byte("x")}}},
	} {
		if err := b.s.Apply([]Change{bad}); !errors.Is(err, ErrBadChange) {
			t.Errorf("%s: %v", name, err)
		}
	}
	page := must[StatePage](t)(a.s.ReadStatePage(context.Background(), f.Ino, nil, 0))
	good := Transfer{Ino: f.Ino, ID: 1, Epoch: page.Epoch, SrcEpoch: page.Epoch, Version: page.Version}
	zeroEpoch, otherIno, newerSource := good, good, good
	zeroEpoch.Epoch, zeroEpoch.SrcEpoch = 0, 0
	otherIno.Ino = ids.RootIno
	newerSource.SrcEpoch = page.Epoch + 1
	for name, tr := range map[string]Transfer{"stamped with epoch 0": zeroEpoch, "of another inode": otherIno,
		"of a newer epoch than stamped": newerSource} {
		if _, err := b.s.StagePage(context.Background(), tr, 0, page.Records, true); !errors.Is(err, ErrBadChange) {
			t.Errorf("transfer %s: %v", name, err)
		}
	}
	// an owner with no epoch for an inode changes nothing
	a.epoch = 0
	if _, err := a.s.Write(f.Ino, 0, []byte("x"), 1); !errors.Is(err, errNotOwner) {
		t.Errorf("write without ownership: %v", err)
	}
}

// TestReplRestart: stamps are records like any other, kept across a restart.
func TestReplRestart(t *testing.T) {
	dir := t.TempDir()
	epoch := ids.Epoch(7)
	owned := func(ids.Ino) (ids.Epoch, error) { return epoch, nil }
	s := openTestStore(t, dir, store.Options{Stamp: Stamp(owned)})
	f := must[store.Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	must[store.Attr](t)(s.Write(f.Ino, 0, []byte("x"), 1))
	sum := checksum(t, s)
	must[any](t)(nil, s.Close())
	s = openTestStore(t, dir, store.Options{Stamp: Stamp(owned)})
	defer s.Close()
	if got := stateOf(t, s, f.Ino); got != (replState{7, 2}) {
		t.Fatalf("after restart f is at %v", got)
	}
	if ep := must[ids.Epoch](t)(s.MaxEpoch()); ep != 7 {
		t.Fatalf("MaxEpoch %v", ep)
	}
	if checksum(t, s) != sum {
		t.Fatal("checksum changed across a restart")
	}
}

// Run: go test ./metaserver -run '^$' -bench Apply -benchmem
//
// Every apply is one synced transaction, so the disk's flush time dominates.
// baseline is the same records through Apply and Sync, without fencing.
func BenchmarkApplyReplica(b *testing.B) {
	attr := attrRecord(b)
	for _, bc := range []struct {
		name  string
		inos  int
		chunk int
	}{{"attr", 1, 0}, {"attr+4KiB", 1, 4 << 10}, {"attr+64KiB", 1, store.PageSize}, {"3inodes", 3, 0}} {
		for _, baseline := range []bool{true, false} {
			name := bc.name + "/replica"
			if baseline {
				name = bc.name + "/baseline"
			}
			b.Run(name, func(b *testing.B) {
				s := newStore(b)
				chunk := make([]byte, bc.chunk)
				changes := make([]Change, bc.inos)
				tx := &store.Tx{}
				for i := range changes {
					ino := ids.MakeIno(2, uint64(i+1))
					changes[i] = Change{Ino: ino, Epoch: 1,
						Writes: []store.Write{{Key: tx.Key(store.RecAttr, ino, nil), Value: attr}}}
					if bc.chunk > 0 {
						changes[i].Writes = append(changes[i].Writes, store.Write{Key: tx.Key64(store.RecPage, ino, 0), Value: chunk})
					}
				}
				b.SetBytes(int64(bc.inos * (len(attr) + bc.chunk)))
				b.ReportAllocs()
				if baseline {
					var writes []store.Write
					for _, c := range changes {
						writes = append(writes, c.Writes...)
					}
					for b.Loop() {
						if err := s.Store.Apply(writes); err != nil {
							b.Fatal(err)
						}
						if err := s.Sync(); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				for v := uint64(1); b.Loop(); v++ {
					for i := range changes {
						changes[i].Version = v
					}
					if err := s.Apply(changes); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// attrRecord is a new file's attribute record.
func attrRecord(t testing.TB) []byte {
	s := newStore(t)
	f := must[store.Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	var rec []byte
	err := s.View(func(tx *store.Tx) error {
		_, err := tx.Get(tx.Key(store.RecAttr, f.Ino, nil), func(v []byte) error { rec = bytes.Clone(v); return nil })
		return err
	})
	if err != nil || rec == nil {
		t.Fatalf("attribute record of %v: %v", f.Ino, err)
	}
	return rec
}

// TestReplConcurrentChanges: one client's concurrent changes of one inode
// (writes and attribute changes, as a flush sends them) on a replicated
// store all commit. A change that reached the replicas can no longer be
// retried, so a local conflict after replication would fail it (and make
// the server unavailable to its client).
func TestReplConcurrentChanges(t *testing.T) {
	var uncommitted atomic.Int32
	s := openTestStore(t, t.TempDir(), store.Options{
		Stamp: Stamp(func(ids.Ino) (ids.Epoch, error) { return 1, nil }),
		Replicate: func([]store.Write) error {
			time.Sleep(time.Millisecond) // the replicas' round trip
			return nil
		},
		Uncommitted: func([]store.Write) { uncommitted.Add(1) },
	})
	t.Cleanup(func() { s.Close() })
	f := must[store.Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := s.For(store.Origin{Ino: f.Ino, Client: 7, Req: uint64(i + 1), Oldest: 1})
			var err error
			if i%2 == 0 {
				_, err = st.Write(f.Ino, uint64(i)*10, []byte("data"), int64(i))
			} else {
				_, err = st.SetAttr(f.Ino, store.SetAttrIn{Valid: wire.SetMtime, Mtime: int64(i)}, int64(i))
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent change: %v (%d uncommitted)", err, uncommitted.Load())
		}
	}
}

// BenchmarkDigest walks a replica of 1,000 files of 256 KiB (the
// states only, as servers' anti-entropy rounds do, and with every record
// hashed).
func BenchmarkDigest(b *testing.B) {
	n := newReplNode(b, 1)
	n.epoch = 1
	data := make([]byte, 256<<10)
	for i := range data {
		data[i] = byte(i*7 + i>>8)
	}
	for i := range 1000 {
		f, err := n.s.Create(ids.RootIno, fmt.Sprint("f", i), reg|0o644, 0, 0, 0, 1)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := n.s.Write(f.Ino, 0, data, 2); err != nil {
			b.Fatal(err)
		}
		n.take()
	}
	for _, hashes := range []bool{false, true} {
		b.Run(fmt.Sprintf("hashes=%v", hashes), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				inodes := 0
				for after := ids.Ino(0); ; {
					p, err := n.s.Digest(after, 1024, hashes)
					if err != nil {
						b.Fatal(err)
					}
					inodes += len(p.Inodes)
					if p.Last() {
						break
					}
					after = p.Through
				}
				if inodes != 1001 {
					b.Fatalf("%d inodes", inodes)
				}
			}
		})
	}
}
