package store

import (
	"fmt"
	"strings"
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// TestXattrLimits: a value past XATTR_SIZE_MAX and a name that would make
// the names list longer than listxattr can return are refused and change
// nothing; replacing the value of a name already listed still works, and
// so does a new name once another was removed.
func TestXattrLimits(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o644, 0, 0, 0, 1))
	wantCode(t, s.SetXattr(f.Ino, "user.big", make([]byte, XattrSizeMax+1), 0, 1), wire.CodeTooBig)
	must[any](t)(nil, s.SetXattr(f.Ino, "user.max", make([]byte, XattrSizeMax), 0, 1))
	must[any](t)(nil, s.RemoveXattr(f.Ino, "user.max", 1))

	// 255-byte names: 256 bytes each in the list, 256 of them fill it
	name := func(i int) string { return fmt.Sprintf("user.%03d.%s", i, strings.Repeat("n", 255-9)) }
	for i := range XattrListMax / 256 {
		must[any](t)(nil, s.SetXattr(f.Ino, name(i), []byte("v"), 0, 1))
	}
	wantCode(t, s.SetXattr(f.Ino, name(999), []byte("v"), 0, 1), wire.CodeNoSpace)
	wantCode(t, s.SetXattr(f.Ino, "user.x", []byte("v"), XattrCreate, 1), wire.CodeNoSpace)
	names := must[[]string](t)(s.ListXattr(f.Ino))
	size := 0
	for _, n := range names {
		size += len(n) + 1
	}
	if len(names) != XattrListMax/256 || size != XattrListMax {
		t.Fatalf("%d names of %d bytes after the refusals, want %d of %d", len(names), size, XattrListMax/256, XattrListMax)
	}
	must[any](t)(nil, s.SetXattr(f.Ino, name(0), []byte("replaced"), 0, 1))
	must[any](t)(nil, s.SetXattr(f.Ino, name(1), []byte("replaced"), XattrReplace, 1))
	must[any](t)(nil, s.RemoveXattr(f.Ino, name(2), 1))
	must[any](t)(nil, s.SetXattr(f.Ino, name(999), []byte("v"), 0, 1))
}
