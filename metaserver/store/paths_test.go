package store

import (
	"errors"
	"syscall"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
)

// TestPathOf: directories by their parents, files by a scan, one name of a
// hard-linked file and its count, and the scan's bound.
func TestPathOf(t *testing.T) {
	s := newStore(t)
	now := int64(1)
	mk := func(parent ids.Ino, name string, mode uint32) Attr {
		t.Helper()
		var a Attr
		var err error
		if mode&syscall.S_IFMT == syscall.S_IFDIR {
			a, err = s.Mkdir(parent, name, mode, 0, 0, now)
		} else {
			a, err = s.Create(parent, name, mode, 0, 0, 0, now)
		}
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	a := mk(ids.RootIno, "a", syscall.S_IFDIR|0o755)
	b := mk(a.Ino, "b", syscall.S_IFDIR|0o755)
	for i := range 50 {
		mk(b.Ino, "filler"+string(rune('a'+i%26))+string(rune('a'+i/26)), syscall.S_IFREG|0o644)
	}
	f := mk(b.Ino, "zz", syscall.S_IFREG|0o644) // scanned after the fillers
	for _, c := range []struct {
		ino  ids.Ino
		want string
	}{{ids.RootIno, "/"}, {a.Ino, "/a"}, {b.Ino, "/a/b"}, {f.Ino, "/a/b/zz"}} {
		if p, err := s.PathOf(c.ino, 1000); err != nil || p.Path != c.want || p.Links == 0 {
			t.Errorf("PathOf(%v) = %+v, %v; want %q", c.ino, p, err, c.want)
		}
	}
	if _, err := s.PathOf(f.Ino, 10); !errors.Is(err, ErrPathUnknown) {
		t.Errorf("past the scan's bound: %v, want ErrPathUnknown", err)
	}
	if _, err := s.Link(f.Ino, ids.RootIno, "g", now); err != nil {
		t.Fatal(err)
	}
	if p, err := s.PathOf(f.Ino, 1000); err != nil || (p.Path != "/a/b/zz" && p.Path != "/g") || p.Links != 2 {
		t.Errorf("hard-linked: %+v, %v", p, err)
	}
	all := s.PathsOf([]ids.Ino{f.Ino, b.Ino, ids.RootIno, 999999}, 1000)
	if len(all) != 3 || all[b.Ino].Path != "/a/b" || all[ids.RootIno].Path != "/" {
		t.Errorf("PathsOf: %+v", all)
	}
	if at, err := s.InodeAt("/a/b/zz"); err != nil || at.Ino != f.Ino {
		t.Errorf("InodeAt: %v, %v", at.Ino, err)
	}
}
