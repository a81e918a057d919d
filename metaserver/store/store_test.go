package store

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func openTestStore(t testing.TB, dir string, opts Options) *Store {
	t.Helper()
	if opts.ServerID == 0 {
		opts.ServerID = 1
	}
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newStore opens a real badger store in a temporary directory.
func newStore(t testing.TB) *Store {
	s := openTestStore(t, t.TempDir(), Options{})
	t.Cleanup(func() { s.Close() })
	return s
}

func wantCode(t testing.TB, err error, code wire.Code) {
	t.Helper()
	if code == wire.CodeOK {
		if err != nil {
			t.Fatalf("unexpected error %v", err)
		}
		return
	}
	if !errors.Is(err, wire.Err(code)) {
		t.Fatalf("got error %v, want %v", err, code)
	}
}

func must[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

const reg = syscall.S_IFREG

// dump lists every record except the server counter, for comparing stores.
func dump(t testing.TB, s *Store) []string {
	t.Helper()
	var out []string
	err := s.view(func(tx *Tx) error {
		return tx.Iterate(nil, func(k, v []byte) (bool, error) {
			if k[0] != RecServer {
				out = append(out, fmt.Sprintf("%x=%x", k, v))
			}
			return true, nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// countRecords counts the records of one kind of one inode.
func countRecords(t testing.TB, s *Store, prefix byte, ino ids.Ino) int {
	t.Helper()
	n := 0
	err := s.view(func(tx *Tx) error {
		return tx.Iterate(tx.key(prefix, ino, nil), func(k, v []byte) (bool, error) { n++; return true, nil })
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestStoreRoot(t *testing.T) {
	s := openTestStore(t, t.TempDir(), Options{RootUid: 1000, RootGid: 100})
	defer s.Close()
	a := must[Attr](t)(s.GetAttr(ids.RootIno))
	if a.Mode != syscall.S_IFDIR|0o755 || a.Nlink != 2 || a.Uid != 1000 || a.Gid != 100 || a.Ino != ids.RootIno {
		t.Fatalf("root %+v", a)
	}
	if _, err := Open(t.TempDir(), Options{}); err == nil {
		t.Fatal("server id 0 accepted")
	}
}

func TestStoreCreateLookup(t *testing.T) {
	s := newStore(t)
	a := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o640, 7, 8, 0, 100))
	if a.Mode != reg|0o640 || a.Uid != 7 || a.Gid != 8 || a.Nlink != 1 || a.Size != 0 || a.Mtime != 100 {
		t.Fatalf("created %+v", a)
	}
	if a.Ino>>56 != 1 {
		t.Fatalf("ino %v not from server 1", a.Ino)
	}
	if b := must[Attr](t)(s.Lookup(ids.RootIno, "f")); b != a {
		t.Fatalf("lookup %+v, created %+v", b, a)
	}
	root := must[Attr](t)(s.GetAttr(ids.RootIno))
	if root.Mtime != 100 || root.Ctime != 100 || root.Nlink != 2 {
		t.Fatalf("root after create %+v", root)
	}
	// no type bits means regular; fifo and device nodes keep theirs
	b := must[Attr](t)(s.Create(ids.RootIno, "plain", 0o600, 0, 0, 0, 1))
	if b.Mode != reg|0o600 {
		t.Fatalf("mode %o", b.Mode)
	}
	c := must[Attr](t)(s.Create(ids.RootIno, "dev", syscall.S_IFCHR|0o600, 0, 0, 0x0501, 1))
	if c.Rdev != 0x0501 || c.Mode&syscall.S_IFMT != syscall.S_IFCHR {
		t.Fatalf("dev %+v", c)
	}
	if b.Ino == a.Ino || c.Ino == b.Ino {
		t.Fatal("inode numbers reused")
	}

	_, err := s.Create(ids.RootIno, "f", reg|0o600, 0, 0, 0, 1)
	wantCode(t, err, wire.CodeExists)
	_, err = s.Create(ids.RootIno, "d", syscall.S_IFDIR|0o600, 0, 0, 0, 1)
	wantCode(t, err, wire.CodeInvalid)
	_, err = s.Lookup(ids.RootIno, "missing")
	wantCode(t, err, wire.CodeNotFound)
	_, err = s.Lookup(a.Ino, "x")
	wantCode(t, err, wire.CodeNotDir)
	_, err = s.Create(a.Ino, "x", reg, 0, 0, 0, 1)
	wantCode(t, err, wire.CodeNotDir)
	_, err = s.Lookup(12345, "x")
	wantCode(t, err, wire.CodeNotFound)
	_, err = s.GetAttr(12345)
	wantCode(t, err, wire.CodeNotFound)
}

func TestStoreNames(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "target", reg|0o644, 0, 0, 0, 1))
	d := must[Attr](t)(s.Mkdir(ids.RootIno, "dir", 0o755, 0, 0, 1))
	bad := []struct {
		name string
		code wire.Code
	}{
		{"", wire.CodeInvalid}, {".", wire.CodeInvalid}, {"..", wire.CodeInvalid},
		{"a/b", wire.CodeInvalid}, {"/", wire.CodeInvalid}, {"a\x00b", wire.CodeInvalid},
		{strings.Repeat("x", 256), wire.CodeNameTooLong},
	}
	for _, c := range bad {
		ops := map[string]error{}
		_, ops["lookup"] = s.Lookup(ids.RootIno, c.name)
		_, ops["create"] = s.Create(ids.RootIno, c.name, reg|0o644, 0, 0, 0, 1)
		_, ops["mkdir"] = s.Mkdir(ids.RootIno, c.name, 0o755, 0, 0, 1)
		_, ops["symlink"] = s.Symlink(ids.RootIno, c.name, "t", 0, 0, 1)
		_, ops["link"] = s.Link(f.Ino, ids.RootIno, c.name, 1)
		_, ops["rename-new"] = s.Rename(ids.RootIno, "target", ids.RootIno, c.name, 0, 1)
		_, ops["rename-old"] = s.Rename(ids.RootIno, c.name, ids.RootIno, "other", 0, 1)
		_, _, ops["unlink"] = s.Unlink(ids.RootIno, c.name, 1, nil)
		ops["rmdir"] = s.Rmdir(ids.RootIno, c.name, 1)
		for op, err := range ops {
			if !errors.Is(err, wire.Err(c.code)) {
				t.Errorf("%s %q: %v, want %v", op, c.name, err, c.code)
			}
		}
	}
	// parent not a directory
	ops := map[string]error{}
	_, ops["lookup"] = s.Lookup(f.Ino, "x")
	_, ops["create"] = s.Create(f.Ino, "x", reg|0o644, 0, 0, 0, 1)
	_, ops["mkdir"] = s.Mkdir(f.Ino, "x", 0o755, 0, 0, 1)
	_, ops["symlink"] = s.Symlink(f.Ino, "x", "t", 0, 0, 1)
	_, ops["link"] = s.Link(f.Ino, f.Ino, "x", 1)
	_, ops["rename-new"] = s.Rename(ids.RootIno, "target", f.Ino, "x", 0, 1)
	_, ops["rename-old"] = s.Rename(f.Ino, "x", ids.RootIno, "y", 0, 1)
	_, _, ops["unlink"] = s.Unlink(f.Ino, "x", 1, nil)
	ops["rmdir"] = s.Rmdir(f.Ino, "x", 1)
	for op, err := range ops {
		wantCode(t, err, wire.CodeNotDir)
		_ = op
	}
	// names that look odd but are valid
	for _, name := range []string{strings.Repeat("y", 255), "...", "ünï", " ", "a\\b", "-"} {
		a := must[Attr](t)(s.Create(d.Ino, name, reg|0o644, 0, 0, 0, 1))
		if b := must[Attr](t)(s.Lookup(d.Ino, name)); b.Ino != a.Ino {
			t.Fatalf("lookup %q", name)
		}
		must[*Attr](t)(s.Rename(d.Ino, name, d.Ino, name+"2"[:min(1, 255-len(name))], 0, 1))
	}
}

func TestStoreMkdirRmdir(t *testing.T) {
	s := newStore(t)
	d := must[Attr](t)(s.Mkdir(ids.RootIno, "d", 0o750, 3, 4, 10))
	if d.Mode != syscall.S_IFDIR|0o750 || d.Nlink != 2 || d.Uid != 3 {
		t.Fatalf("mkdir %+v", d)
	}
	if r := must[Attr](t)(s.GetAttr(ids.RootIno)); r.Nlink != 3 {
		t.Fatalf("root nlink %d after mkdir", r.Nlink)
	}
	sub := must[Attr](t)(s.Mkdir(d.Ino, "sub", 0o755, 0, 0, 11))
	if a := must[Attr](t)(s.GetAttr(d.Ino)); a.Nlink != 3 || a.Mtime != 11 {
		t.Fatalf("d %+v", a)
	}
	must[Attr](t)(s.Create(sub.Ino, "f", reg|0o644, 0, 0, 0, 12))
	_, err := s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 1)
	wantCode(t, err, wire.CodeExists)

	wantCode(t, s.Rmdir(ids.RootIno, "d", 13), wire.CodeNotEmpty)
	wantCode(t, s.Rmdir(d.Ino, "sub", 13), wire.CodeNotEmpty)
	wantCode(t, s.Rmdir(sub.Ino, "f", 13), wire.CodeNotDir)
	wantCode(t, s.Rmdir(ids.RootIno, "nope", 13), wire.CodeNotFound)
	_, _, err = s.Unlink(d.Ino, "sub", 13, nil)
	wantCode(t, err, wire.CodeIsDir)
	must[Attr](t)(unlinked(s.Unlink(sub.Ino, "f", 13, nil)))
	must[any](t)(nil, s.SetXattr(sub.Ino, "user.x", []byte("v"), 0, 1))
	wantCode(t, s.Rmdir(d.Ino, "sub", 14), wire.CodeOK)
	if a := must[Attr](t)(s.GetAttr(d.Ino)); a.Nlink != 2 || a.Mtime != 14 {
		t.Fatalf("d after rmdir %+v", a)
	}
	_, err = s.GetAttr(sub.Ino)
	wantCode(t, err, wire.CodeNotFound)
	if n := countRecords(t, s, RecXattr, sub.Ino); n != 0 {
		t.Fatalf("%d xattrs left of removed dir", n)
	}
	wantCode(t, s.Rmdir(ids.RootIno, "d", 15), wire.CodeOK)
	if r := must[Attr](t)(s.GetAttr(ids.RootIno)); r.Nlink != 2 {
		t.Fatalf("root nlink %d", r.Nlink)
	}
	ents := must[[]DirEntry](t)(s.ReadDir(ids.RootIno, 0, 0))
	if len(ents) != 0 {
		t.Fatalf("root not empty: %v", ents)
	}
}

func TestStoreSetgidDir(t *testing.T) {
	s := newStore(t)
	d := must[Attr](t)(s.Mkdir(ids.RootIno, "g", syscall.S_ISGID|0o775, 0, 50, 1))
	f := must[Attr](t)(s.Create(d.Ino, "f", reg|0o644, 1000, 1000, 0, 1))
	sub := must[Attr](t)(s.Mkdir(d.Ino, "sub", 0o755, 1000, 1000, 1))
	if f.Gid != 50 || sub.Gid != 50 || sub.Mode&syscall.S_ISGID == 0 || f.Mode&syscall.S_ISGID != 0 {
		t.Fatalf("setgid inheritance: file %+v dir %+v", f, sub)
	}
}

func TestStoreSymlink(t *testing.T) {
	s := newStore(t)
	a := must[Attr](t)(s.Symlink(ids.RootIno, "l", "../some/where", 5, 6, 1))
	if a.Mode != syscall.S_IFLNK|0o777 || a.Size != uint64(len("../some/where")) || a.Uid != 5 {
		t.Fatalf("symlink %+v", a)
	}
	if got := must[string](t)(s.Readlink(a.Ino)); got != "../some/where" {
		t.Fatalf("readlink %q", got)
	}
	long := strings.Repeat("p/", 2048) // 4096 bytes: PATH_MAX is fine
	b := must[Attr](t)(s.Symlink(ids.RootIno, "long", long, 0, 0, 1))
	if got := must[string](t)(s.Readlink(b.Ino)); got != long {
		t.Fatal("long target changed")
	}
	_, err := s.Symlink(ids.RootIno, "toolong", long+"x", 0, 0, 1)
	wantCode(t, err, wire.CodeNameTooLong)
	_, err = s.Symlink(ids.RootIno, "empty", "", 0, 0, 1)
	wantCode(t, err, wire.CodeNotFound)
	_, err = s.Symlink(ids.RootIno, "l", "x", 0, 0, 1)
	wantCode(t, err, wire.CodeExists)
	_, err = s.Readlink(ids.RootIno)
	wantCode(t, err, wire.CodeInvalid)
	_, err = s.Read(a.Ino, 0, 10)
	wantCode(t, err, wire.CodeInvalid)
	removed := must[Attr](t)(unlinked(s.Unlink(ids.RootIno, "l", 2, nil)))
	must[any](t)(nil, s.Purge(removed.Ino))
	if n := countRecords(t, s, RecSymlink, a.Ino); n != 0 {
		t.Fatal("symlink target left after purge")
	}
}

func TestStoreLinkUnlinkPurge(t *testing.T) {
	s := newStore(t)
	d := must[Attr](t)(s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 1))
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	must[Attr](t)(s.Write(f.Ino, 0, bytes.Repeat([]byte("z"), 3*PageSize), 2))
	must[any](t)(nil, s.SetXattr(f.Ino, "user.a", []byte("1"), 0, 1))

	l := must[Attr](t)(s.Link(f.Ino, d.Ino, "g", 3))
	if l.Nlink != 2 || l.Ctime != 3 || l.Ino != f.Ino {
		t.Fatalf("link %+v", l)
	}
	if a := must[Attr](t)(s.Lookup(d.Ino, "g")); a.Ino != f.Ino {
		t.Fatal("link lookup")
	}
	_, err := s.Link(d.Ino, ids.RootIno, "dl", 3)
	wantCode(t, err, wire.CodePerm)
	_, err = s.Link(f.Ino, ids.RootIno, "d", 3)
	wantCode(t, err, wire.CodeExists)
	_, err = s.Link(f.Ino, f.Ino, "x", 3)
	wantCode(t, err, wire.CodeNotDir)
	_, err = s.Link(999, ids.RootIno, "x", 3)
	wantCode(t, err, wire.CodeNotFound)

	r := must[Attr](t)(unlinked(s.Unlink(ids.RootIno, "f", 4, nil)))
	if r.Nlink != 1 {
		t.Fatalf("unlink one of two links: %+v", r)
	}
	must[any](t)(nil, s.Purge(f.Ino)) // linked: nothing happens
	if got := must[[]byte](t)(s.Read(f.Ino, 0, 10)); string(got) != "zzzzzzzzzz" {
		t.Fatal("purge of a linked inode removed data")
	}
	_, _, err = s.Unlink(ids.RootIno, "f", 4, nil)
	wantCode(t, err, wire.CodeNotFound)

	r = must[Attr](t)(unlinked(s.Unlink(d.Ino, "g", 5, nil)))
	if r.Nlink != 0 || r.Ctime != 5 {
		t.Fatalf("last unlink %+v", r)
	}
	// an orphan: still readable, not linkable, until purged
	if a := must[Attr](t)(s.GetAttr(f.Ino)); a.Nlink != 0 || a.Size != 3*PageSize {
		t.Fatalf("orphan %+v", a)
	}
	must[Attr](t)(s.Write(f.Ino, 0, []byte("y"), 6))
	if got := must[[]byte](t)(s.Read(f.Ino, 0, 2)); string(got) != "yz" {
		t.Fatalf("orphan read %q", got)
	}
	_, err = s.Link(f.Ino, ids.RootIno, "back", 6)
	wantCode(t, err, wire.CodeNotFound)
	must[any](t)(nil, s.Purge(f.Ino))
	_, err = s.GetAttr(f.Ino)
	wantCode(t, err, wire.CodeNotFound)
	for _, p := range []byte{RecPage, RecXattr, RecAttr} {
		if n := countRecords(t, s, p, f.Ino); n != 0 {
			t.Fatalf("%d %c records left after purge", n, p)
		}
	}
	wantCode(t, s.Purge(f.Ino), wire.CodeNotFound)
}

func TestStoreSetAttr(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	a := must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetMode | wire.SetUid | wire.SetGid,
		Mode: syscall.S_IFDIR | 0o4711, Uid: 9, Gid: 10}, 5))
	if a.Mode != reg|0o4711 || a.Uid != 9 || a.Gid != 10 || a.Ctime != 5 || a.Mtime != 1 {
		t.Fatalf("chmod/chown %+v", a)
	}
	a = must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetAtime | wire.SetMtime, Atime: 111, Mtime: 222}, 6))
	if a.Atime != 111 || a.Mtime != 222 || a.Ctime != 6 {
		t.Fatalf("utimens %+v", a)
	}
	a = must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetAtime | wire.SetAtimeNow | wire.SetMtimeNow | wire.SetCtime, Atime: 1, Ctime: 333}, 7))
	if a.Atime != 7 || a.Mtime != 7 || a.Ctime != 333 {
		t.Fatalf("utimens now %+v", a)
	}
	v := a.Version
	a = must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: 5 * PageSize}, 8))
	if a.Size != 5*PageSize || a.Version != v+1 || a.Mtime != 8 || a.Blocks != 5*PageSize/512 {
		t.Fatalf("extend %+v", a)
	}
	if got := must[[]byte](t)(s.Read(f.Ino, 0, 100)); !bytes.Equal(got, make([]byte, 100)) {
		t.Fatal("extension not zero")
	}
	a = must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: 5 * PageSize}, 9))
	if a.Version != v+1 || a.Mtime != 8 {
		t.Fatalf("same size changed version or mtime: %+v", a)
	}
	d := must[Attr](t)(s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 1))
	_, err := s.SetAttr(d.Ino, SetAttrIn{Valid: wire.SetSize}, 9)
	wantCode(t, err, wire.CodeIsDir)
	l := must[Attr](t)(s.Symlink(ids.RootIno, "l", "t", 0, 0, 1))
	_, err = s.SetAttr(l.Ino, SetAttrIn{Valid: wire.SetSize}, 9)
	wantCode(t, err, wire.CodeInvalid)
	_, err = s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: MaxFileSize + 1}, 9)
	wantCode(t, err, wire.CodeTooBig)
	_, err = s.SetAttr(777, SetAttrIn{Valid: wire.SetMode}, 9)
	wantCode(t, err, wire.CodeNotFound)
}

// TestStoreWriteSetAttr: a write carrying mode, owner and times makes them
// after the write, in its transaction; a size change it refuses whole.
func TestStoreWriteSetAttr(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o600, 0, 0, 0, 1))
	in := SetAttrIn{Valid: wire.SetMode | wire.SetUid | wire.SetMtime | wire.SetCtime, Mode: 0o644, Uid: 7, Mtime: 222, Ctime: 333}
	a := must[Attr](t)(s.WriteSetAttr(f.Ino, SpanAt(0, []byte("hello")), []byte("hello"), in, 5))
	if a.Size != 5 || a.Version != f.Version+1 || a.Mode != reg|0o644 || a.Uid != 7 || a.Mtime != 222 || a.Ctime != 333 {
		t.Fatalf("write with attributes: %+v", a)
	}
	if got := must[Attr](t)(s.GetAttr(f.Ino)); got != a {
		t.Fatalf("stored %+v, replied %+v", got, a)
	}
	// no data: the attributes alone, the version unchanged
	a = must[Attr](t)(s.WriteSetAttr(f.Ino, nil, nil, SetAttrIn{Valid: wire.SetGid, Gid: 9}, 6))
	if a.Gid != 9 || a.Size != 5 || a.Version != f.Version+1 || a.Ctime != 6 {
		t.Fatalf("empty write with attributes: %+v", a)
	}
	_, err := s.WriteSetAttr(f.Ino, SpanAt(0, []byte("x")), []byte("x"), SetAttrIn{Valid: wire.SetSize | wire.SetMode, Size: 0}, 7)
	wantCode(t, err, wire.CodeInvalid)
	if got := must[[]byte](t)(s.Read(f.Ino, 0, 100)); string(got) != "hello" {
		t.Fatalf("a refused write changed the data: %q", got)
	}
}

// TestStoreAppend: an append writes at the file's end as its transaction
// finds it, with its attributes; one that would pass the largest file
// changes nothing.
func TestStoreAppend(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "log", reg|0o600, 0, 0, 0, 1))
	for i, line := range []string{"one\n", "two\n", "three\n"} {
		a := must[Attr](t)(s.Append(f.Ino, []byte(line), SetAttrIn{}, int64(2+i)))
		if a.Version != f.Version+uint64(i)+1 || a.Mtime != int64(2+i) {
			t.Fatalf("append %d: %+v", i, a)
		}
	}
	a := must[Attr](t)(s.Append(f.Ino, []byte("four\n"), SetAttrIn{Valid: wire.SetMode, Mode: 0o640}, 9))
	if got := must[[]byte](t)(s.Read(f.Ino, 0, 100)); string(got) != "one\ntwo\nthree\nfour\n" || a.Size != uint64(len(got)) || a.Mode != reg|0o640 {
		t.Fatalf("after four appends: %q, %+v", got, a)
	}
	must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: MaxFileSize - 2}, 10))
	_, err := s.Append(f.Ino, []byte("abc"), SetAttrIn{}, 11)
	wantCode(t, err, wire.CodeTooBig)
	if got := must[Attr](t)(s.GetAttr(f.Ino)); got.Size != MaxFileSize-2 {
		t.Fatalf("a refused append changed the size to %d", got.Size)
	}
}

// TestStoreWriteSpans: a vectored write gives the file a plain write of
// each span would, over stored bytes, holes and the end of the file, with
// several spans in one chunk and spans across chunks; malformed spans and
// writes touching too many chunks change nothing.
func TestStoreWriteSpans(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	r := rand.New(rand.NewPCG(7, 8))
	var model []byte
	for round := range 200 {
		var spans []wire.Span
		var data []byte
		off := uint64(r.IntN(3 * PageSize))
		for range 1 + r.IntN(12) {
			n := 1 + r.IntN(PageSize/2)
			if r.IntN(3) == 0 {
				n = 1 + r.IntN(64)
			}
			spans = append(spans, wire.Span{Off: off, Len: uint32(n)})
			for range n {
				data = append(data, byte(r.Uint32()))
			}
			off += uint64(n) + uint64(r.IntN(3)*r.IntN(PageSize/4))
		}
		a := must[Attr](t)(s.WriteSetAttr(f.Ino, spans, data, SetAttrIn{}, int64(round+2)))
		rest := data
		for _, sp := range spans {
			end := sp.Off + uint64(sp.Len)
			if uint64(len(model)) < end {
				model = append(model, make([]byte, end-uint64(len(model)))...)
			}
			copy(model[sp.Off:end], rest[:sp.Len])
			rest = rest[sp.Len:]
		}
		if a.Size != uint64(len(model)) {
			t.Fatalf("round %d: size %d, want %d", round, a.Size, len(model))
		}
		if got := must[[]byte](t)(s.Read(f.Ino, 0, len(model)+10)); !bytes.Equal(got, model) {
			t.Fatalf("round %d: the file differs from its model (spans %v)", round, spans)
		}
	}
	before := must[Attr](t)(s.GetAttr(f.Ino))
	_, err := s.WriteSetAttr(f.Ino, []wire.Span{{Off: 0, Len: 4}}, []byte("abc"), SetAttrIn{}, 1000)
	wantCode(t, err, wire.CodeInvalid)
	var far []wire.Span
	for i := range maxWritePages + 1 {
		far = append(far, wire.Span{Off: uint64(i) * PageSize, Len: 1})
	}
	_, err = s.WriteSetAttr(f.Ino, far, make([]byte, len(far)), SetAttrIn{}, 1000)
	wantCode(t, err, wire.CodeTooBig)
	if after := must[Attr](t)(s.GetAttr(f.Ino)); after != before {
		t.Fatalf("refused writes changed the file: %+v, was %+v", after, before)
	}
	if got := must[[]byte](t)(s.Read(f.Ino, 0, len(model)+10)); !bytes.Equal(got, model) {
		t.Fatal("refused writes changed the data")
	}
}

func TestStoreTruncate(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	data := make([]byte, 3*PageSize+100)
	for i := range data {
		data[i] = byte(i%251) + 1
	}
	must[Attr](t)(s.Write(f.Ino, 0, data, 2))
	for _, size := range []uint64{3*PageSize + 50, 2*PageSize + 7, PageSize, 10, 0} {
		must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: size}, 3))
		got := must[[]byte](t)(s.Read(f.Ino, 0, len(data)))
		if !bytes.Equal(got, data[:size]) {
			t.Fatalf("after truncate to %d: read %d bytes, differ", size, len(got))
		}
		// extend again: what was cut reads as zeros
		must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: uint64(len(data))}, 3))
		got = must[[]byte](t)(s.Read(f.Ino, 0, len(data)))
		want := append(slices.Clone(data[:size]), make([]byte, uint64(len(data))-size)...)
		if !bytes.Equal(got, want) {
			t.Fatalf("truncate to %d then extend: stale data", size)
		}
		must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: size}, 3))
		if n, want := countRecords(t, s, RecPage, f.Ino), int((size+PageSize-1)/PageSize); n != want {
			t.Fatalf("size %d: %d chunks, want %d", size, n, want)
		}
		data = data[:size]
		data = append(data, make([]byte, 3*PageSize+100-len(data))...)
		for i := int(size); i < len(data); i++ {
			data[i] = byte(i%13) + 1
		}
		must[Attr](t)(s.Write(f.Ino, 0, data, 4))
	}
}

// TestStoreTruncateMany shrinks a file with more chunks than one transaction
// may delete.
func TestStoreTruncateMany(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	n := deleteBatch*2 + 100
	for i := range n {
		must[Attr](t)(s.Write(f.Ino, uint64(i)*PageSize+PageSize-1, []byte{byte(i) | 1}, 2))
	}
	if got := countRecords(t, s, RecPage, f.Ino); got != n {
		t.Fatalf("%d pages, want %d", got, n)
	}
	var ops int
	s.onCommit = func([]Write) { ops++ }
	a := must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: PageSize + 5}, 3))
	s.onCommit = nil
	if a.Size != PageSize+5 || ops != 3 {
		t.Fatalf("size %d after %d transactions", a.Size, ops)
	}
	if got := countRecords(t, s, RecPage, f.Ino); got != 2 {
		t.Fatalf("%d pages left", got)
	}
	got := must[[]byte](t)(s.Read(f.Ino, PageSize-1, 100))
	if !bytes.Equal(got, []byte{1, 0, 0, 0, 0, 0}) {
		t.Fatalf("tail %v", got)
	}
	// purge of a file with many pages
	for i := range n {
		must[Attr](t)(s.Write(f.Ino, uint64(i)*PageSize, []byte{1}, 2))
	}
	must[Attr](t)(unlinked(s.Unlink(ids.RootIno, "f", 4, nil)))
	must[any](t)(nil, s.Purge(f.Ino))
	if got := countRecords(t, s, RecPage, f.Ino); got != 0 {
		t.Fatalf("%d pages left after purge", got)
	}
}

func TestStoreReadWrite(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	model := []byte{}
	rng := rand.New(rand.NewPCG(1, 2))
	write := func(off uint64, n int) {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(rng.IntN(255) + 1)
		}
		a := must[Attr](t)(s.Write(f.Ino, off, data, 5))
		if end := int(off) + n; end > len(model) {
			model = append(model, make([]byte, end-len(model))...)
		}
		copy(model[off:], data)
		if a.Size != uint64(len(model)) || a.Mtime != 5 {
			t.Fatalf("write %d at %d: size %d, want %d", n, off, a.Size, len(model))
		}
	}
	check := func() {
		got := must[[]byte](t)(s.Read(f.Ino, 0, len(model)+100))
		if !bytes.Equal(got, model) {
			t.Fatalf("content differs (%d vs %d bytes)", len(got), len(model))
		}
	}
	write(0, 10)
	write(5, 10)                    // overlap within a chunk
	write(PageSize-3, 10)           // across a chunk boundary, with a hole before
	write(3*PageSize, 2*PageSize)   // whole chunks after a hole
	write(3*PageSize+1, 2*PageSize) // misaligned over existing chunks
	write(10*PageSize+17, 1)        // far hole
	check()
	for range 200 {
		off := uint64(rng.IntN(12 * PageSize))
		write(off, rng.IntN(3*PageSize)+1)
	}
	check()
	// reads at every alignment
	for range 200 {
		off := rng.IntN(len(model) + 10)
		n := rng.IntN(3 * PageSize)
		got := must[[]byte](t)(s.Read(f.Ino, uint64(off), n))
		want := []byte{}
		if off < len(model) {
			want = model[off:min(off+n, len(model))]
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("read %d at %d differs", n, off)
		}
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = 0xee // ReadAt must overwrite stale buffer contents
		}
		k := must[int](t)(s.ReadAt(f.Ino, uint64(off), buf))
		if !bytes.Equal(buf[:k], want) {
			t.Fatalf("ReadAt %d at %d differs", n, off)
		}
	}
	// A reused buffer (the server's reads use pooled ones) holds stale
	// bytes: holes, whole pages and the rest of a short page, must still
	// read as zeros.
	g := must[Attr](t)(s.Create(ids.RootIno, "g", reg|0o644, 0, 0, 0, 1))
	must[Attr](t)(s.Write(g.Ino, 3*PageSize+5, []byte("x"), 2))
	must[Attr](t)(s.Write(g.Ino, 5*PageSize-1, []byte("y"), 2))
	want := make([]byte, 5*PageSize)
	want[3*PageSize+5], want[5*PageSize-1] = 'x', 'y'
	stale := func(m int) []byte { return bytes.Repeat([]byte{0xee}, m+5) }
	if got, _, err := s.ReadWithAttr(g.Ino, 0, len(want)+10, stale); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("a read into a used buffer differs (%v)", err)
	}
	v := must[Attr](t)(s.GetAttr(f.Ino)).Version
	if a := must[Attr](t)(s.Write(f.Ino, 0, nil, 99)); a.Version != v || a.Mtime == 99 {
		t.Fatal("empty write changed the file")
	}
	d := must[Attr](t)(s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 1))
	_, err := s.Write(d.Ino, 0, []byte("x"), 1)
	wantCode(t, err, wire.CodeIsDir)
	_, err = s.Read(d.Ino, 0, 1)
	wantCode(t, err, wire.CodeIsDir)
	_, err = s.Write(f.Ino, MaxFileSize, []byte("x"), 1)
	wantCode(t, err, wire.CodeTooBig)
	_, err = s.Write(f.Ino, ^uint64(0)-1, []byte("xyz"), 1)
	wantCode(t, err, wire.CodeTooBig)
	_, err = s.Write(4242, 0, []byte("x"), 1)
	wantCode(t, err, wire.CodeNotFound)
}

// TestStoreWholeChunkNoRead checks that a write of whole chunks does not read
// them first and that an append into a fresh chunk reads nothing either.
func TestStoreWholeChunkNoRead(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	must[Attr](t)(s.Write(f.Ino, 0, make([]byte, 2*PageSize), 1))
	var reads []string
	s.kv = countingKV{s.kv, &reads}
	must[Attr](t)(s.Write(f.Ino, 0, bytes.Repeat([]byte{1}, 2*PageSize), 2)) // overwrite
	must[Attr](t)(s.Write(f.Ino, 2*PageSize, []byte{1, 2, 3}, 3))            // append, fresh chunk
	for _, r := range reads {
		if r[0] == RecPage {
			t.Fatalf("chunk read during whole-chunk write: %x", r)
		}
	}
	must[Attr](t)(s.Write(f.Ino, 2*PageSize+1, []byte{9}, 4)) // partial: must read
	if !slices.ContainsFunc(reads, func(r string) bool { return r[0] == RecPage }) {
		t.Fatal("partial write did not read its chunk")
	}
	if got := must[[]byte](t)(s.Read(f.Ino, 2*PageSize-1, 10)); !bytes.Equal(got, []byte{1, 1, 9, 3}) {
		t.Fatalf("got %v", got)
	}
}

type countingKV struct {
	kvStore
	reads *[]string
}

func (c countingKV) update(fn func(kvTxn) error) error {
	return c.kvStore.update(func(t kvTxn) error { return fn(countingTxn{t, c.reads}) })
}

type countingTxn struct {
	kvTxn
	reads *[]string
}

func (c countingTxn) get(key []byte, fn func([]byte) error) (bool, error) {
	*c.reads = append(*c.reads, string(key))
	return c.kvTxn.get(key, fn)
}

func TestStoreSparseBig(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "big", reg|0o644, 0, 0, 0, 1))
	const off = 5 << 30
	a := must[Attr](t)(s.Write(f.Ino, off, []byte{42}, 2))
	if a.Size != off+1 {
		t.Fatalf("size %d", a.Size)
	}
	if got := must[[]byte](t)(s.Read(f.Ino, off-3, 10)); !bytes.Equal(got, []byte{0, 0, 0, 42}) {
		t.Fatalf("around the byte: %v", got)
	}
	if got := must[[]byte](t)(s.Read(f.Ino, 1<<32, 1<<20)); !bytes.Equal(got, make([]byte, 1<<20)) {
		t.Fatal("hole past 4 GiB not zero")
	}
	if n := countRecords(t, s, RecPage, f.Ino); n != 1 {
		t.Fatalf("%d chunks for a sparse file", n)
	}
	// also past 4 GiB with real data across a chunk boundary
	must[Attr](t)(s.Write(f.Ino, 1<<32+PageSize-2, []byte("abcd"), 3))
	if got := must[[]byte](t)(s.Read(f.Ino, 1<<32+PageSize-2, 4)); string(got) != "abcd" {
		t.Fatalf("got %q", got)
	}
	must[any](t)(nil, s.Sync())
	lsm, vlog := s.Size()
	if lsm+vlog > 8<<20 {
		t.Fatalf("store of a sparse 5 GiB file takes %d+%d bytes", lsm, vlog)
	}
	a = must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize, Size: 1 << 32}, 4))
	if a.Size != 1<<32 || countRecords(t, s, RecPage, f.Ino) != 0 {
		t.Fatal("truncate below the data left chunks")
	}
}

func TestStoreXattr(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	_, err := s.GetXattr(f.Ino, "user.a")
	wantCode(t, err, wire.CodeNoData)
	wantCode(t, s.SetXattr(f.Ino, "user.a", []byte("1"), XattrReplace, 1), wire.CodeNoData)
	wantCode(t, s.SetXattr(f.Ino, "user.a", []byte("1"), XattrCreate, 1), wire.CodeOK)
	wantCode(t, s.SetXattr(f.Ino, "user.a", []byte("2"), XattrCreate, 1), wire.CodeExists)
	wantCode(t, s.SetXattr(f.Ino, "user.a", []byte("3"), XattrReplace, 1), wire.CodeOK)
	wantCode(t, s.SetXattr(f.Ino, "user.b", nil, 0, 1), wire.CodeOK)
	wantCode(t, s.SetXattr(f.Ino, "user.c", make([]byte, XattrSizeMax), 0, 1), wire.CodeOK)
	wantCode(t, s.SetXattr(f.Ino, "user.d", make([]byte, XattrSizeMax+1), 0, 1), wire.CodeTooBig)
	wantCode(t, s.SetXattr(f.Ino, "user.e", nil, XattrCreate|XattrReplace, 1), wire.CodeInvalid)
	wantCode(t, s.SetXattr(f.Ino, "", nil, 0, 1), wire.CodeRange)
	wantCode(t, s.SetXattr(f.Ino, strings.Repeat("n", 256), nil, 0, 1), wire.CodeRange)
	wantCode(t, s.SetXattr(999, "user.a", nil, 0, 1), wire.CodeNotFound)
	if v := must[[]byte](t)(s.GetXattr(f.Ino, "user.a")); string(v) != "3" {
		t.Fatalf("value %q", v)
	}
	if v := must[[]byte](t)(s.GetXattr(f.Ino, "user.b")); v == nil || len(v) != 0 {
		t.Fatalf("empty value %v", v)
	}
	names := must[[]string](t)(s.ListXattr(f.Ino))
	if !slices.Equal(names, []string{"user.a", "user.b", "user.c"}) {
		t.Fatalf("list %v", names)
	}
	wantCode(t, s.RemoveXattr(f.Ino, "user.a", 1), wire.CodeOK)
	wantCode(t, s.RemoveXattr(f.Ino, "user.a", 1), wire.CodeNoData)
	names = must[[]string](t)(s.ListXattr(f.Ino))
	if !slices.Equal(names, []string{"user.b", "user.c"}) {
		t.Fatalf("list %v", names)
	}
	// a directory's xattrs are its own, not its children's
	d := must[Attr](t)(s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 1))
	if n := must[[]string](t)(s.ListXattr(d.Ino)); len(n) != 0 {
		t.Fatalf("dir xattrs %v", n)
	}
	_, err = s.ListXattr(999)
	wantCode(t, err, wire.CodeNotFound)
}

func TestStoreReadDir(t *testing.T) {
	s := newStore(t)
	d := must[Attr](t)(s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 1))
	var want []string
	for i := range 50 {
		name := fmt.Sprintf("f%02d", i)
		if i%7 == 0 {
			must[Attr](t)(s.Mkdir(d.Ino, name, 0o755, 0, 0, 1))
		} else {
			must[Attr](t)(s.Create(d.Ino, name, reg|0o644, 0, 0, 0, 1))
		}
		want = append(want, name)
	}
	var got []string
	var after uint64
	for {
		ents := must[[]DirEntry](t)(s.ReadDir(d.Ino, after, 7))
		if len(ents) == 0 {
			break
		}
		if len(ents) > 7 {
			t.Fatalf("%d entries, max 7", len(ents))
		}
		for _, e := range ents {
			if e.Off <= after {
				t.Fatalf("cookie %d not after %d", e.Off, after)
			}
			after = e.Off
			a := must[Attr](t)(s.Lookup(d.Ino, e.Name))
			if a.Ino != e.Ino || a.Mode&syscall.S_IFMT != e.Mode {
				t.Fatalf("entry %+v, attr %+v", e, a)
			}
			got = append(got, e.Name)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("listing %v", got)
	}
	if e := must[[]DirEntry](t)(s.ReadDir(d.Ino, ^uint64(0), 10)); len(e) != 0 {
		t.Fatal("entries after the last cookie")
	}
	f := must[Attr](t)(s.Lookup(d.Ino, "f01"))
	_, err := s.ReadDir(f.Ino, 0, 10)
	wantCode(t, err, wire.CodeNotDir)
	_, err = s.ReadDir(999, 0, 10)
	wantCode(t, err, wire.CodeNotFound)
}

// TestStoreReadDirStable lists a directory page by page while entries are
// created, removed and renamed between pages: every entry that exists for
// the whole listing is returned exactly once, and no name twice.
func TestStoreReadDirStable(t *testing.T) {
	s := newStore(t)
	d := must[Attr](t)(s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 1))
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 20 {
		live := map[string]bool{}
		for i := range 40 {
			name := fmt.Sprintf("r%d-%d", round, i)
			must[Attr](t)(s.Create(d.Ino, name, reg|0o644, 0, 0, 0, 1))
			live[name] = true
		}
		stable := map[string]bool{} // never touched during the listing
		for n := range live {
			stable[n] = true
		}
		seen := map[string]int{}
		var after uint64
		next := 0
		for {
			ents := must[[]DirEntry](t)(s.ReadDir(d.Ino, after, 3))
			if len(ents) == 0 {
				break
			}
			for _, e := range ents {
				seen[e.Name]++
				after = e.Off
			}
			// mutate between pages
			for range 2 {
				names := slices.Sorted(func(yield func(string) bool) {
					for n := range live {
						if !yield(n) {
							return
						}
					}
				})
				switch rng.IntN(4) {
				case 0:
					name := fmt.Sprintf("new%d-%d", round, next)
					next++
					must[Attr](t)(s.Create(d.Ino, name, reg|0o644, 0, 0, 0, 1))
					live[name] = true
				case 1:
					if len(names) > 0 {
						n := names[rng.IntN(len(names))]
						must[Attr](t)(unlinked(s.Unlink(d.Ino, n, 1, nil)))
						delete(live, n)
						delete(stable, n)
					}
				case 2:
					if len(names) > 0 {
						n := names[rng.IntN(len(names))]
						nn := fmt.Sprintf("mv%d-%d", round, next)
						next++
						must[*Attr](t)(s.Rename(d.Ino, n, d.Ino, nn, 0, 1))
						delete(live, n)
						delete(stable, n)
						live[nn] = true
					}
				case 3:
					if len(names) > 1 { // rename over another entry
						a, b := names[rng.IntN(len(names))], names[rng.IntN(len(names))]
						if a != b {
							must[*Attr](t)(s.Rename(d.Ino, a, d.Ino, b, 0, 1))
							delete(live, a)
							delete(stable, a)
							delete(stable, b)
						}
					}
				}
			}
		}
		for n := range stable {
			if seen[n] != 1 {
				t.Fatalf("round %d: stable entry %s seen %d times", round, n, seen[n])
			}
		}
		for n, c := range seen {
			if c > 1 {
				t.Fatalf("round %d: %s listed %d times", round, n, c)
			}
		}
		for n := range live {
			must[Attr](t)(unlinked(s.Unlink(d.Ino, n, 1, nil)))
		}
	}
}

func TestStoreRestart(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir, Options{})
	d := must[Attr](t)(s.Mkdir(ids.RootIno, "d", 0o700, 1, 2, 1))
	f := must[Attr](t)(s.Create(d.Ino, "f", reg|0o600, 1, 2, 0, 1))
	data := bytes.Repeat([]byte("0123456789abcdef"), 20000)
	must[Attr](t)(s.Write(f.Ino, 7, data, 2))
	must[Attr](t)(s.Symlink(ids.RootIno, "l", "d/f", 0, 0, 3))
	must[Attr](t)(s.Link(f.Ino, ids.RootIno, "hard", 4))
	must[any](t)(nil, s.SetXattr(f.Ino, "user.k", []byte("v"), 0, 1))
	orphan := must[Attr](t)(s.Create(ids.RootIno, "orphan", reg|0o600, 0, 0, 0, 1))
	must[Attr](t)(s.Write(orphan.Ino, 0, []byte("x"), 1))
	must[Attr](t)(unlinked(s.Unlink(ids.RootIno, "orphan", 1, nil))) // open, say, when the server stopped
	before := dump(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openTestStore(t, dir, Options{})
	defer s.Close()
	_, err := s.GetAttr(orphan.Ino)
	wantCode(t, err, wire.CodeNotFound) // purged at open: nothing is open after a restart
	after := dump(t, s)
	var withoutOrphan []string
	for _, r := range before {
		if !strings.Contains(r[:18], fmt.Sprintf("%016x", uint64(orphan.Ino))) {
			withoutOrphan = append(withoutOrphan, r)
		}
	}
	if !slices.Equal(after, withoutOrphan) {
		t.Fatalf("records changed across restart:\n%v\n%v", withoutOrphan, after)
	}
	got := must[[]byte](t)(s.Read(f.Ino, 7, len(data)))
	if !bytes.Equal(got, data) {
		t.Fatal("data changed across restart")
	}
	if l := must[Attr](t)(s.Lookup(ids.RootIno, "l")); must[string](t)(s.Readlink(l.Ino)) != "d/f" {
		t.Fatal("symlink")
	}
	// new inodes do not reuse numbers handed out before
	g := must[Attr](t)(s.Create(ids.RootIno, "g", reg|0o600, 0, 0, 0, 5))
	if g.Ino <= orphan.Ino {
		t.Fatalf("new ino %v not above %v", g.Ino, orphan.Ino)
	}
	if a := must[Attr](t)(s.GetAttr(f.Ino)); a.Nlink != 2 || a.Size != uint64(7+len(data)) {
		t.Fatalf("attr %+v", a)
	}
}

func TestStoreDataDirLock(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir, Options{})
	_, err := Open(dir, Options{ServerID: 1, Logger: quiet})
	if !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second open: %v", err)
	}
	want := fmt.Sprintf("data directory %s is in use by another leasefs server (pid %d)", dir, os.Getpid())
	if err.Error() != want {
		t.Fatalf("message %q, want %q", err, want)
	}

	// from another process
	cmd := exec.Command(os.Args[0], "-test.run=^TestStoreLockHelper$")
	cmd.Env = append(os.Environ(), "LEASEFS_STORE_LOCK_DIR="+dir)
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "in use by another leasefs server (pid "+fmt.Sprint(os.Getpid())+")") {
		t.Fatalf("child process: %s", out)
	}

	s.Close()
	s2 := openTestStore(t, dir, Options{}) // released on close
	s2.Close()
}

// TestStoreLockHelper runs in the child process of TestStoreDataDirLock.
func TestStoreLockHelper(t *testing.T) {
	dir := os.Getenv("LEASEFS_STORE_LOCK_DIR")
	if dir == "" {
		t.Skip("helper process only")
	}
	_, err := Open(dir, Options{ServerID: 1, Logger: quiet})
	fmt.Println(err)
}

// TestStoreWritesReplay checks that the writes an operation reports are all
// it wrote: replaying them into an empty store reproduces every record. It
// also checks that multi-inode operations only write records of the inodes
// they involve.
func TestStoreWritesReplay(t *testing.T) {
	var log [][]Write
	record := func(ws []Write) {
		cp := make([]Write, len(ws))
		for i, w := range ws {
			cp[i] = Write{Key: slices.Clone(w.Key), Value: slices.Clone(w.Value), Delete: w.Delete}
		}
		log = append(log, cp)
	}
	s := openTestStore(t, "", Options{InMemory: true, OnCommit: record})
	defer s.Close()
	d := must[Attr](t)(s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 1))
	e := must[Attr](t)(s.Mkdir(ids.RootIno, "e", 0o755, 0, 0, 1))
	f := must[Attr](t)(s.Create(d.Ino, "f", reg|0o644, 0, 0, 0, 1))
	must[Attr](t)(s.Link(f.Ino, e.Ino, "g", 3))
	log = nil
	must[*Attr](t)(s.Rename(d.Ino, "f", e.Ino, "h", 0, 4))
	if len(log) != 1 {
		t.Fatalf("rename committed %d times", len(log))
	}
	for _, w := range log[0] {
		if i := w.Ino(); i != d.Ino && i != e.Ino && i != f.Ino {
			t.Fatalf("rename wrote a record of uninvolved %v: %v", i, w)
		}
	}
	log = nil
	must[*Attr](t)(s.Rename(e.Ino, "g", e.Ino, "h", 0, 5)) // hard links of the same file: no-op
	if len(log) != 0 {
		t.Fatalf("no-op rename wrote %v", log)
	}

	// replay a whole history into a fresh store
	log = nil
	src := openTestStore(t, "", Options{InMemory: true, OnCommit: record})
	defer src.Close()
	runHistory(t, src)
	dst := openTestStore(t, "", Options{InMemory: true})
	defer dst.Close()
	for _, ws := range log {
		must[any](t)(nil, dst.Apply(ws))
	}
	// the roots differ only by their creation time
	a, b := dropRoot(dump(t, src)), dropRoot(dump(t, dst))
	if !slices.Equal(a, b) {
		t.Fatalf("replayed store differs:\n%v\n%v", a, b)
	}
	if len(a) < 10 {
		t.Fatalf("history left only %d records", len(a))
	}
}

func dropRoot(recs []string) []string {
	root := fmt.Sprintf("%02x%016x=", RecAttr, uint64(ids.RootIno))
	return slices.DeleteFunc(slices.Clone(recs), func(r string) bool { return strings.HasPrefix(r, root) })
}

// runHistory runs a mix of every kind of update.
func runHistory(t *testing.T, s *Store) {
	d := must[Attr](t)(s.Mkdir(ids.RootIno, "d", 0o755, 0, 0, 1))
	e := must[Attr](t)(s.Mkdir(ids.RootIno, "e", 0o755, 0, 0, 1))
	f := must[Attr](t)(s.Create(d.Ino, "f", reg|0o644, 0, 0, 0, 1))
	g := must[Attr](t)(s.Create(d.Ino, "g", reg|0o644, 0, 0, 0, 1))
	must[Attr](t)(s.Write(f.Ino, 100, bytes.Repeat([]byte("q"), 2*PageSize), 2))
	must[Attr](t)(s.Write(f.Ino, 5, []byte("partial"), 2))
	must[Attr](t)(s.Write(g.Ino, 5, []byte("gone"), 2))
	must[any](t)(nil, s.SetXattr(f.Ino, "user.x", []byte("1"), 0, 1))
	must[any](t)(nil, s.SetXattr(e.Ino, "user.y", []byte("2"), 0, 1))
	must[Attr](t)(s.Link(f.Ino, e.Ino, "hard", 3))
	must[*Attr](t)(s.Rename(d.Ino, "f", e.Ino, "h", 0, 4))
	must[*Attr](t)(s.Rename(d.Ino, "g", e.Ino, "h2", 0, 4))
	must[*Attr](t)(s.Rename(e.Ino, "h2", e.Ino, "h", RenameExchange, 4))
	must[*Attr](t)(s.Rename(e.Ino, "h2", e.Ino, "h", 0, 4)) // replaces g
	must[any](t)(nil, s.Purge(g.Ino))
	must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize | wire.SetMode, Size: 1000, Mode: 0o600}, 6))
	must[Attr](t)(s.Symlink(e.Ino, "l", "h", 0, 0, 7))
	must[Attr](t)(s.Symlink(e.Ino, "l2", "h", 0, 0, 7))
	must[Attr](t)(unlinked(s.Unlink(e.Ino, "l2", 7, nil)))
	must[Attr](t)(s.Mkdir(d.Ino, "sub", 0o755, 0, 0, 8))
	must[*Attr](t)(s.Rename(d.Ino, "sub", e.Ino, "sub", 0, 8))
	must[any](t)(nil, s.Rmdir(ids.RootIno, "d", 8))
	must[any](t)(nil, s.RemoveXattr(e.Ino, "user.y", 1))
}

// TestStoreConcurrent runs creates and writes from several goroutines on the
// same directory and file: conflicting transactions are retried, none lost.
func TestStoreConcurrent(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "shared", reg|0o644, 0, 0, 0, 1))
	const workers, per = 4, 100
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				if _, err := s.Create(ids.RootIno, fmt.Sprintf("w%d-%d", w, i), reg|0o644, 0, 0, 0, 1); err != nil {
					errs <- err
					return
				}
				// each worker owns one byte of every 4-byte slot
				if _, err := s.Write(f.Ino, uint64(i*workers+w), []byte{byte(w + 1)}, 1); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ents := must[[]DirEntry](t)(s.ReadDir(ids.RootIno, 0, 10000))
	if len(ents) != workers*per+1 {
		t.Fatalf("%d entries", len(ents))
	}
	got := must[[]byte](t)(s.Read(f.Ino, 0, workers*per))
	for i, b := range got {
		if b != byte(i%workers+1) {
			t.Fatalf("byte %d is %d", i, b)
		}
	}
	if a := must[Attr](t)(s.GetAttr(f.Ino)); a.Version != workers*per {
		t.Fatalf("version %d, want %d", a.Version, workers*per)
	}
}

func TestStoreStatFs(t *testing.T) {
	s := newStore(t)
	st := must[StatFs](t)(s.StatFs())
	if st.Blocks == 0 || st.Bfree > st.Blocks || st.Bavail > st.Bfree || st.NameLen != 255 || st.Bsize == 0 || st.Ffree == 0 || st.Ffree > st.Files {
		t.Fatalf("statfs %+v", st)
	}
	must[Attr](t)(s.Create(ids.RootIno, "f", reg, 0, 0, 0, 1))
	if st2 := must[StatFs](t)(s.StatFs()); st2.Ffree >= st.Ffree {
		t.Fatalf("ffree %d after a create, was %d", st2.Ffree, st.Ffree)
	}
}

// TestStoreSurvivesKill writes without Sync in a child process, kills it with
// SIGKILL and reopens: SyncWrites is off, but what the kernel has survives.
func TestStoreSurvivesKill(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestStoreKillHelper$")
	cmd.Env = append(os.Environ(), "LEASEFS_STORE_KILL_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var ino uint64
	if _, err := fmt.Fscan(out, &ino); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper: %v", err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()

	s := openTestStore(t, dir, Options{})
	defer s.Close()
	a := must[Attr](t)(s.Lookup(ids.RootIno, "killed"))
	if uint64(a.Ino) != ino || a.Size != 3*PageSize+1 {
		t.Fatalf("after kill: %+v (ino %d)", a, ino)
	}
	got := must[[]byte](t)(s.Read(a.Ino, 0, int(a.Size)))
	if !bytes.Equal(got, killData()) {
		t.Fatal("data lost or changed by the kill")
	}
}

func killData() []byte {
	b := make([]byte, 3*PageSize+1)
	for i := range b {
		b[i] = byte(i * 31)
	}
	return b
}

// TestStoreKillHelper runs in the child process of TestStoreSurvivesKill.
func TestStoreKillHelper(t *testing.T) {
	dir := os.Getenv("LEASEFS_STORE_KILL_DIR")
	if dir == "" {
		t.Skip("helper process only")
	}
	s := openTestStore(t, dir, Options{})
	a := must[Attr](t)(s.Create(ids.RootIno, "killed", reg|0o644, 0, 0, 0, 1))
	data := killData()
	must[Attr](t)(s.Write(a.Ino, 0, data[:100], 2))
	must[Attr](t)(s.Write(a.Ino, 100, data[100:], 2))
	fmt.Println(uint64(a.Ino))
	time.Sleep(time.Minute) // until SIGKILL; bounded in case the parent is gone
}

// unlinked drops Unlink's purged result, for must.
func unlinked(a Attr, _ bool, err error) (Attr, error) { return a, err }

// TestStoreUnlinkPurges: an unlink the caller lets purge takes the inode's
// records with it in one transaction; a big file's rest is left to Purge,
// and an open file stays an orphan.
func TestStoreUnlinkPurges(t *testing.T) {
	s := newStore(t)
	all := func(ids.Ino) bool { return true }
	count := func(ino ids.Ino) (n int) {
		for _, p := range []byte{RecAttr, RecPage, RecXattr, RecDone} {
			n += countRecords(t, s, p, ino)
		}
		return n
	}

	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	must[Attr](t)(s.Write(f.Ino, 0, bytes.Repeat([]byte("d"), 3*PageSize+1), 2))
	must[any](t)(nil, s.SetXattr(f.Ino, "user.k", []byte("v"), 0, 1))
	a, purged, err := s.Unlink(ids.RootIno, "f", 3, all)
	if err != nil || !purged || a.Nlink != 0 {
		t.Fatalf("unlink: %+v purged %v err %v", a, purged, err)
	}
	if n := count(f.Ino); n != 0 {
		t.Fatalf("%d records of a purged inode left", n)
	}

	big := must[Attr](t)(s.Create(ids.RootIno, "big", reg|0o644, 0, 0, 0, 1))
	for i := range deleteBatch + 10 {
		must[Attr](t)(s.Write(big.Ino, uint64(i)*PageSize, []byte{1}, 2))
	}
	if _, purged, err := s.Unlink(ids.RootIno, "big", 3, all); err != nil || purged {
		t.Fatalf("unlink of %d pages: purged %v err %v", deleteBatch+10, purged, err)
	}
	if n := countRecords(t, s, RecPage, big.Ino); n != 10 {
		t.Fatalf("%d pages left after the unlink, want 10", n)
	}
	must[any](t)(nil, s.Purge(big.Ino))
	if n := count(big.Ino); n != 0 {
		t.Fatalf("%d records left after Purge", n)
	}

	open := must[Attr](t)(s.Create(ids.RootIno, "open", reg|0o644, 0, 0, 0, 1))
	must[Attr](t)(s.Write(open.Ino, 0, []byte("still readable"), 2))
	if _, purged, err := s.Unlink(ids.RootIno, "open", 3, func(ids.Ino) bool { return false }); err != nil || purged {
		t.Fatalf("unlink of an open file: purged %v err %v", purged, err)
	}
	if got := must[[]byte](t)(s.Read(open.Ino, 0, 100)); string(got) != "still readable" {
		t.Fatalf("open orphan reads %q", got)
	}
}

// TestStoreCreateAs: a file made with a number AllocInos handed out gets
// that number and the given times; a number not handed out, one in use
// and another server's are refused, and nothing changes.
func TestStoreCreateAs(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir, Options{})
	first, err := s.AllocInos(3)
	must[any](t)(nil, err)
	a := must[Attr](t)(s.CreateAs(first+1, ids.RootIno, "f", 0o644, 7, 8, 1234))
	if a.Ino != first+1 || a.Mode != syscall.S_IFREG|0o644 || a.Uid != 7 || a.Gid != 8 || a.Mtime != 1234 || a.Ctime != 1234 {
		t.Fatalf("made %+v", a)
	}
	if got := must[Attr](t)(s.Lookup(ids.RootIno, "f")); got.Ino != first+1 {
		t.Fatalf("f is %v", got.Ino)
	}
	next, err := s.AllocInos(1)
	must[any](t)(nil, err)
	for _, c := range []struct {
		why string
		ino ids.Ino
	}{
		{"in use", first + 1},
		{"not handed out", next + 1},
		{"another server's", ids.MakeIno(2, uint64(first+2)&(1<<56-1))},
		{"zero counter", ids.MakeIno(1, 0)},
	} {
		_, err := s.CreateAs(c.ino, ids.RootIno, "g", 0o644, 0, 0, 1)
		wantCode(t, err, wire.CodeInvalid)
		if _, err := s.Lookup(ids.RootIno, "g"); !errors.Is(err, wire.Err(wire.CodeNotFound)) {
			t.Fatalf("%s: g after the refused create: %v", c.why, err)
		}
	}
	_, err = s.CreateAs(first, ids.RootIno, "d", syscall.S_IFDIR|0o755, 0, 0, 1)
	wantCode(t, err, wire.CodeInvalid)
	// numbers handed out before a restart are never handed out again
	must[any](t)(nil, s.Close())
	s = openTestStore(t, dir, Options{})
	defer s.Close()
	after, err := s.AllocInos(1)
	must[any](t)(nil, err)
	if after <= next {
		t.Fatalf("after a restart AllocInos handed out %v again (last was %v)", after, next)
	}
	must[Attr](t)(s.CreateAs(first+2, ids.RootIno, "h", 0o600, 0, 0, 5))
}

// TestStoreAttrChange: every change of an inode's attribute record counts
// once in its Change, which the attributes an operation returns carry; a
// read counts nothing. Clients order replies by it.
func TestStoreAttrChange(t *testing.T) {
	s := newStore(t)
	change := func(ino ids.Ino) uint64 { return must[Attr](t)(s.GetAttr(ino)).Change }
	root := change(ids.RootIno)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	if f.Change != 1 || change(f.Ino) != 1 {
		t.Fatalf("new file: Change %d, stored %d, want 1", f.Change, change(f.Ino))
	}
	if got := change(ids.RootIno); got != root+1 {
		t.Fatalf("a create in the root (entry, times): Change %d -> %d, want one more", root, got)
	}
	steps := []struct {
		name string
		do   func() (Attr, error)
	}{
		{"chmod", func() (Attr, error) { return s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetMode, Mode: 0o600}, 2) }},
		{"write", func() (Attr, error) { return s.Write(f.Ino, 0, []byte("x"), 3) }},
		{"link", func() (Attr, error) { return s.Link(f.Ino, ids.RootIno, "g", 4) }},
		{"truncate", func() (Attr, error) { return s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetSize}, 5) }},
	}
	want := f.Change
	for _, st := range steps {
		a := must[Attr](t)(st.do())
		want++
		if a.Change != want || change(f.Ino) != want {
			t.Fatalf("%s: returned Change %d, stored %d, want %d", st.name, a.Change, change(f.Ino), want)
		}
	}
	must[[]byte](t)(s.Read(f.Ino, 0, 10))
	root = change(ids.RootIno)
	must[*Attr](t)(s.Rename(ids.RootIno, "g", ids.RootIno, "h", 0, 6))
	if change(f.Ino) != want+1 || change(ids.RootIno) != root+1 {
		t.Fatalf("rename in one directory: file %d, want %d; directory %d, want %d",
			change(f.Ino), want+1, change(ids.RootIno), root+1)
	}

	// a record written before Change existed reads as 0
	in := inode{Attr: Attr{Ino: 9, Mode: reg | 0o644, Nlink: 1, Size: 3, Version: 2, Change: 5}, nextCookie: 4}
	v1 := in.encode(nil)
	v1 = v1[:len(v1)-8]
	v1[0] = inodeFormatV1
	var old inode
	must[struct{}](t)(struct{}{}, old.decode(9, v1))
	if old.Change != 0 || old.Size != 3 || old.Version != 2 || old.nextCookie != 4 {
		t.Fatalf("format 1 record read as %+v", old)
	}
	if err := old.decode(9, append(v1, 0)); err == nil {
		t.Fatal("a record of neither format's size read")
	}
}

// TestStoreSize: the size reported is what the files take, so that the
// sparse file's bound above can fail.
func TestStoreSize(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for i := range 8 {
		must[Attr](t)(s.Write(f.Ino, uint64(i)<<20, data, int64(2+i)))
	}
	must[any](t)(nil, s.Sync())
	lsm, vlog := s.Size()
	if lsm+vlog < 8<<20 || lsm+vlog > 64<<20 {
		t.Fatalf("8 MiB written, the store reports %d+%d bytes", lsm, vlog)
	}
}
