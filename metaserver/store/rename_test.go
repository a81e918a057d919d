package store

import (
	"slices"
	"syscall"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// renameFixture builds:
//
//	/a/            dir with file "f" (data "F"), empty dir "e", dir "full" (holds "x")
//	/b/            dir with file "g" (data "G"), empty dir "e2", dir "full2" (holds "y")
type renameFixture struct {
	s                     *Store
	a, b, f, e, full, g   Attr
	e2, full2, x, y, root Attr
}

func newRenameFixture(t *testing.T) *renameFixture {
	s := newStore(t)
	m := must[Attr](t)
	r := &renameFixture{s: s}
	r.a = m(s.Mkdir(ids.RootIno, "a", 0o755, 0, 0, 1))
	r.b = m(s.Mkdir(ids.RootIno, "b", 0o755, 0, 0, 1))
	r.f = m(s.Create(r.a.Ino, "f", reg|0o644, 0, 0, 0, 1))
	m(s.Write(r.f.Ino, 0, []byte("F"), 1))
	r.e = m(s.Mkdir(r.a.Ino, "e", 0o755, 0, 0, 1))
	r.full = m(s.Mkdir(r.a.Ino, "full", 0o755, 0, 0, 1))
	r.x = m(s.Create(r.full.Ino, "x", reg|0o644, 0, 0, 0, 1))
	r.g = m(s.Create(r.b.Ino, "g", reg|0o644, 0, 0, 0, 1))
	m(s.Write(r.g.Ino, 0, []byte("G"), 1))
	r.e2 = m(s.Mkdir(r.b.Ino, "e2", 0o755, 0, 0, 1))
	r.full2 = m(s.Mkdir(r.b.Ino, "full2", 0o755, 0, 0, 1))
	r.y = m(s.Create(r.full2.Ino, "y", reg|0o644, 0, 0, 0, 1))
	return r
}

func (r *renameFixture) nlink(t *testing.T, ino ids.Ino) uint32 {
	t.Helper()
	return must[Attr](t)(r.s.GetAttr(ino)).Nlink
}

func (r *renameFixture) lookup(t *testing.T, dir ids.Ino, name string) (ids.Ino, bool) {
	t.Helper()
	a, err := r.s.Lookup(dir, name)
	if wire.CodeOf(err) == wire.CodeNotFound {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return a.Ino, true
}

// names lists a directory's names, checking that each entry agrees with its
// lookup.
func (r *renameFixture) names(t *testing.T, dir ids.Ino) []string {
	t.Helper()
	var out []string
	for _, e := range must[[]DirEntry](t)(r.s.ReadDir(dir, 0, 0)) {
		a := must[Attr](t)(r.s.Lookup(dir, e.Name))
		if a.Ino != e.Ino || a.Mode&syscall.S_IFMT != e.Mode {
			t.Fatalf("entry %+v disagrees with %+v", e, a)
		}
		out = append(out, e.Name)
	}
	slices.Sort(out)
	return out
}

func TestStoreRenameErrors(t *testing.T) {
	r := newRenameFixture(t)
	s := r.s
	cases := []struct {
		name    string
		op      ids.Ino
		oldName string
		on      ids.Ino
		newName string
		flags   uint32
		code    wire.Code
	}{
		{"missing source", r.a.Ino, "nope", r.b.Ino, "z", 0, wire.CodeNotFound},
		{"file over dir", r.a.Ino, "f", r.b.Ino, "e2", 0, wire.CodeIsDir},
		{"dir over file", r.a.Ino, "e", r.b.Ino, "g", 0, wire.CodeNotDir},
		{"dir over non-empty dir", r.a.Ino, "e", r.b.Ino, "full2", 0, wire.CodeNotEmpty},
		{"noreplace over file", r.a.Ino, "f", r.b.Ino, "g", RenameNoReplace, wire.CodeExists},
		{"noreplace over dir", r.a.Ino, "e", r.b.Ino, "e2", RenameNoReplace, wire.CodeExists},
		{"exchange with missing", r.a.Ino, "f", r.b.Ino, "nope", RenameExchange, wire.CodeNotFound},
		{"both flags", r.a.Ino, "f", r.b.Ino, "z", RenameExchange | RenameNoReplace, wire.CodeInvalid},
		{"whiteout", r.a.Ino, "f", r.b.Ino, "z", RenameWhiteout, wire.CodeInvalid},
		{"into itself", ids.RootIno, "a", r.a.Ino, "z", 0, wire.CodeInvalid},
		{"into own subtree", ids.RootIno, "a", r.full.Ino, "z", 0, wire.CodeInvalid},
		{"exchange into own subtree", ids.RootIno, "a", r.full.Ino, "x", RenameExchange, wire.CodeInvalid},
		{"exchange ancestor", r.a.Ino, "full", ids.RootIno, "a", RenameExchange, wire.CodeInvalid},
		{"over own ancestor", r.full.Ino, "x", ids.RootIno, "a", 0, wire.CodeIsDir},
		{"dir over own parent", r.a.Ino, "e", ids.RootIno, "a", 0, wire.CodeNotEmpty},
		{"new parent missing", r.a.Ino, "f", 9999, "z", 0, wire.CodeNotFound},
		{"new parent is a file", r.a.Ino, "f", r.g.Ino, "z", 0, wire.CodeNotDir},
	}
	before := dump(t, s)
	for _, c := range cases {
		_, err := s.Rename(c.op, c.oldName, c.on, c.newName, c.flags, 5)
		if !isCode(err, c.code) {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
		}
	}
	if !slices.Equal(before, dump(t, s)) {
		t.Fatal("a failed rename changed the store")
	}
}

func isCode(err error, code wire.Code) bool { return wire.CodeOf(err) == code && err != nil }

func TestStoreRenameMatrix(t *testing.T) {
	t.Run("file within dir", func(t *testing.T) {
		r := newRenameFixture(t)
		rep := must[*Attr](t)(r.s.Rename(r.a.Ino, "f", r.a.Ino, "f2", 0, 7))
		if rep != nil {
			t.Fatal("replaced something")
		}
		if got := r.names(t, r.a.Ino); !slices.Equal(got, []string{"e", "f2", "full"}) {
			t.Fatalf("a: %v", got)
		}
		if a := must[Attr](t)(r.s.GetAttr(r.f.Ino)); a.Ctime != 7 || a.Nlink != 1 {
			t.Fatalf("moved file %+v", a)
		}
		if a := must[Attr](t)(r.s.GetAttr(r.a.Ino)); a.Mtime != 7 || a.Nlink != 4 {
			t.Fatalf("dir %+v", a)
		}
	})
	t.Run("file across dirs", func(t *testing.T) {
		r := newRenameFixture(t)
		must[*Attr](t)(r.s.Rename(r.a.Ino, "f", r.b.Ino, "f", 0, 7))
		if _, ok := r.lookup(t, r.a.Ino, "f"); ok {
			t.Fatal("old name still there")
		}
		if ino, _ := r.lookup(t, r.b.Ino, "f"); ino != r.f.Ino {
			t.Fatal("new name wrong")
		}
		if r.nlink(t, r.a.Ino) != 4 || r.nlink(t, r.b.Ino) != 4 {
			t.Fatal("dir nlink changed by a file move")
		}
		if got := string(must[[]byte](t)(r.s.Read(r.f.Ino, 0, 10))); got != "F" {
			t.Fatal("data")
		}
	})
	t.Run("file over file", func(t *testing.T) {
		r := newRenameFixture(t)
		rep := must[*Attr](t)(r.s.Rename(r.a.Ino, "f", r.b.Ino, "g", 0, 7))
		if rep == nil || rep.Ino != r.g.Ino || rep.Nlink != 0 || rep.Ctime != 7 {
			t.Fatalf("replaced %+v", rep)
		}
		if ino, _ := r.lookup(t, r.b.Ino, "g"); ino != r.f.Ino {
			t.Fatal("target does not name the source")
		}
		// the replaced file is an orphan until purged
		if got := string(must[[]byte](t)(r.s.Read(r.g.Ino, 0, 10))); got != "G" {
			t.Fatal("orphan data")
		}
		must[any](t)(nil, r.s.Purge(r.g.Ino))
		if _, err := r.s.GetAttr(r.g.Ino); wire.CodeOf(err) != wire.CodeNotFound {
			t.Fatal("purged")
		}
	})
	t.Run("file over hard link of another file", func(t *testing.T) {
		r := newRenameFixture(t)
		must[Attr](t)(r.s.Link(r.g.Ino, r.a.Ino, "glink", 2))
		rep := must[*Attr](t)(r.s.Rename(r.a.Ino, "f", r.a.Ino, "glink", 0, 7))
		if rep == nil || rep.Ino != r.g.Ino || rep.Nlink != 1 {
			t.Fatalf("replaced %+v", rep)
		}
	})
	t.Run("hard links of the same file", func(t *testing.T) {
		r := newRenameFixture(t)
		must[Attr](t)(r.s.Link(r.f.Ino, r.b.Ino, "flink", 2))
		before := dump(t, r.s)
		rep := must[*Attr](t)(r.s.Rename(r.a.Ino, "f", r.b.Ino, "flink", 0, 7))
		if rep != nil || !slices.Equal(before, dump(t, r.s)) {
			t.Fatal("rename between links of one file did something")
		}
	})
	t.Run("onto itself", func(t *testing.T) {
		r := newRenameFixture(t)
		before := dump(t, r.s)
		must[*Attr](t)(r.s.Rename(r.a.Ino, "f", r.a.Ino, "f", 0, 7))
		must[*Attr](t)(r.s.Rename(r.a.Ino, "e", r.a.Ino, "e", RenameExchange, 7))
		if !slices.Equal(before, dump(t, r.s)) {
			t.Fatal("rename onto itself did something")
		}
	})
	t.Run("dir across dirs", func(t *testing.T) {
		r := newRenameFixture(t)
		must[*Attr](t)(r.s.Rename(r.a.Ino, "full", r.b.Ino, "moved", 0, 7))
		if r.nlink(t, r.a.Ino) != 3 || r.nlink(t, r.b.Ino) != 5 || r.nlink(t, r.full.Ino) != 2 {
			t.Fatal("nlink after dir move")
		}
		if ino, _ := r.lookup(t, r.b.Ino, "moved"); ino != r.full.Ino {
			t.Fatal("moved dir")
		}
		if ino, _ := r.lookup(t, r.full.Ino, "x"); ino != r.x.Ino {
			t.Fatal("moved dir lost its content")
		}
		// its parent pointer moved too: it may now go under a, but a not under it
		must[*Attr](t)(r.s.Rename(ids.RootIno, "a", r.full.Ino, "a", 0, 8))
		_, err := r.s.Rename(ids.RootIno, "b", r.a.Ino, "b", 0, 9)
		if wire.CodeOf(err) != wire.CodeInvalid {
			t.Fatalf("b into its own subtree: %v", err)
		}
	})
	t.Run("empty dir over empty dir across", func(t *testing.T) {
		r := newRenameFixture(t)
		must[any](t)(nil, r.s.SetXattr(r.e2.Ino, "user.k", []byte("v"), 0, 1))
		rep := must[*Attr](t)(r.s.Rename(r.a.Ino, "full", r.b.Ino, "e2", 0, 7))
		if rep == nil || rep.Ino != r.e2.Ino || rep.Nlink != 0 {
			t.Fatalf("replaced %+v", rep)
		}
		if _, err := r.s.GetAttr(r.e2.Ino); wire.CodeOf(err) != wire.CodeNotFound {
			t.Fatal("replaced dir still exists")
		}
		if n := countRecords(t, r.s, RecXattr, r.e2.Ino); n != 0 {
			t.Fatal("replaced dir's xattrs left")
		}
		// a lost a subdir; b lost e2 and gained full
		if r.nlink(t, r.a.Ino) != 3 || r.nlink(t, r.b.Ino) != 4 {
			t.Fatalf("nlink a=%d b=%d", r.nlink(t, r.a.Ino), r.nlink(t, r.b.Ino))
		}
		if got := r.names(t, r.b.Ino); !slices.Equal(got, []string{"e2", "full2", "g"}) {
			t.Fatalf("b: %v", got)
		}
	})
	t.Run("dir over empty dir same parent", func(t *testing.T) {
		r := newRenameFixture(t)
		must[*Attr](t)(r.s.Rename(r.a.Ino, "full", r.a.Ino, "e", 0, 7))
		if r.nlink(t, r.a.Ino) != 3 {
			t.Fatalf("nlink a=%d", r.nlink(t, r.a.Ino))
		}
		if got := r.names(t, r.a.Ino); !slices.Equal(got, []string{"e", "f"}) {
			t.Fatalf("a: %v", got)
		}
	})
	t.Run("exchange files across", func(t *testing.T) {
		r := newRenameFixture(t)
		rep := must[*Attr](t)(r.s.Rename(r.a.Ino, "f", r.b.Ino, "g", RenameExchange, 7))
		if rep != nil {
			t.Fatal("exchange replaced")
		}
		if ino, _ := r.lookup(t, r.a.Ino, "f"); ino != r.g.Ino {
			t.Fatal("a/f")
		}
		if ino, _ := r.lookup(t, r.b.Ino, "g"); ino != r.f.Ino {
			t.Fatal("b/g")
		}
		for _, i := range []ids.Ino{r.f.Ino, r.g.Ino} {
			if a := must[Attr](t)(r.s.GetAttr(i)); a.Nlink != 1 || a.Ctime != 7 {
				t.Fatalf("%+v", a)
			}
		}
	})
	t.Run("exchange dir and file across", func(t *testing.T) {
		r := newRenameFixture(t)
		must[*Attr](t)(r.s.Rename(r.a.Ino, "full", r.b.Ino, "g", RenameExchange, 7))
		if ino, _ := r.lookup(t, r.a.Ino, "full"); ino != r.g.Ino {
			t.Fatal("a/full")
		}
		if ino, _ := r.lookup(t, r.b.Ino, "g"); ino != r.full.Ino {
			t.Fatal("b/g")
		}
		if r.nlink(t, r.a.Ino) != 3 || r.nlink(t, r.b.Ino) != 5 {
			t.Fatalf("nlink a=%d b=%d", r.nlink(t, r.a.Ino), r.nlink(t, r.b.Ino))
		}
		if got := r.names(t, r.a.Ino); !slices.Equal(got, []string{"e", "f", "full"}) {
			t.Fatalf("a: %v", got)
		}
		// full's parent is b now: b cannot move under it, a can
		_, err := r.s.Rename(ids.RootIno, "b", r.full.Ino, "b", 0, 8)
		if wire.CodeOf(err) != wire.CodeInvalid {
			t.Fatalf("b under its own child: %v", err)
		}
		must[*Attr](t)(r.s.Rename(ids.RootIno, "a", r.full.Ino, "a", 0, 8))
	})
	t.Run("exchange dirs across", func(t *testing.T) {
		r := newRenameFixture(t)
		must[*Attr](t)(r.s.Rename(r.a.Ino, "full", r.b.Ino, "full2", RenameExchange, 7))
		if r.nlink(t, r.a.Ino) != 4 || r.nlink(t, r.b.Ino) != 4 {
			t.Fatal("nlink changed by a dir-dir exchange")
		}
		if ino, _ := r.lookup(t, r.a.Ino, "full"); ino != r.full2.Ino {
			t.Fatal("a/full")
		}
	})
	t.Run("exchange keeps cookies", func(t *testing.T) {
		r := newRenameFixture(t)
		before := must[[]DirEntry](t)(r.s.ReadDir(r.a.Ino, 0, 0))
		must[*Attr](t)(r.s.Rename(r.a.Ino, "f", r.a.Ino, "e", RenameExchange, 7))
		after := must[[]DirEntry](t)(r.s.ReadDir(r.a.Ino, 0, 0))
		if len(before) != len(after) {
			t.Fatal("entry count")
		}
		for i := range before {
			if before[i].Name != after[i].Name || before[i].Off != after[i].Off {
				t.Fatalf("cookie order changed: %v vs %v", before, after)
			}
		}
		if after[0].Ino != r.e.Ino || after[0].Mode != syscall.S_IFDIR {
			t.Fatalf("f now %+v", after[0])
		}
	})
	t.Run("noreplace to free name", func(t *testing.T) {
		r := newRenameFixture(t)
		must[*Attr](t)(r.s.Rename(r.a.Ino, "e", r.b.Ino, "new", RenameNoReplace, 7))
		if r.nlink(t, r.a.Ino) != 3 || r.nlink(t, r.b.Ino) != 5 {
			t.Fatal("nlink")
		}
	})
	t.Run("symlink over file", func(t *testing.T) {
		r := newRenameFixture(t)
		l := must[Attr](t)(r.s.Symlink(r.a.Ino, "l", "target", 0, 0, 1))
		must[*Attr](t)(r.s.Rename(r.a.Ino, "l", r.b.Ino, "g", 0, 7))
		if a := must[Attr](t)(r.s.Lookup(r.b.Ino, "g")); a.Ino != l.Ino || a.Mode&syscall.S_IFMT != syscall.S_IFLNK {
			t.Fatalf("%+v", a)
		}
	})
}
