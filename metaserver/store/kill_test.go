package store

import (
	"bytes"
	"syscall"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

func wantMode(t *testing.T, s *Store, ino ids.Ino, want uint32) {
	t.Helper()
	a := must[Attr](t)(s.GetAttr(ino))
	if a.Mode&^syscall.S_IFMT != want {
		t.Fatalf("mode %#o, want %#o", a.Mode&^syscall.S_IFMT, want)
	}
}

func wantXattr(t *testing.T, s *Store, ino ids.Ino, name string, want []byte) {
	t.Helper()
	v, err := s.GetXattr(ino, name)
	if want == nil {
		wantCode(t, err, wire.CodeNoData)
		return
	}
	if err != nil || !bytes.Equal(v, want) {
		t.Fatalf("%s: %x %v, want %x", name, v, err, want)
	}
}

// TestStoreKillSuidgid: wire.SetKillSuidgid clears setuid, and setgid
// with group execute, from the mode it finds; a write drops file
// capabilities.
func TestStoreKillSuidgid(t *testing.T) {
	s := newStore(t)
	for mode, want := range map[uint32]uint32{0o4755: 0o755, 0o2775: 0o775, 0o2765: 0o2765, 0o6777: 0o777, 0o1777: 0o1777} {
		f := must[Attr](t)(s.Create(ids.RootIno, "f", mode, 0, 0, 0, 1))
		must[Attr](t)(s.WriteSetAttr(f.Ino, SpanAt(0, []byte("x")), []byte("x"), SetAttrIn{Valid: wire.SetKillSuidgid}, 2))
		wantMode(t, s, f.Ino, want)
		must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetMode, Mode: mode}, 3))
		must[Attr](t)(s.Append(f.Ino, []byte("x"), SetAttrIn{Valid: wire.SetKillSuidgid}, 4))
		wantMode(t, s, f.Ino, want)
		// and any write drops file capabilities
		wantCode(t, s.SetXattr(f.Ino, capabilityXattr, []byte{1, 0, 0, 2}, 0, 5), wire.CodeOK)
		must[Attr](t)(s.WriteSetAttr(f.Ino, SpanAt(0, []byte("x")), []byte("x"), SetAttrIn{}, 6))
		wantXattr(t, s, f.Ino, capabilityXattr, nil)
		_, _, err := s.Unlink(ids.RootIno, "f", 5, func(ids.Ino) bool { return true })
		wantCode(t, err, wire.CodeOK)
	}
}
