package integration

import (
	endian "encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// TestReadDirFromCache: a mount lists a directory it made, and changed
// since, from its cache without the server, the same as another mount lists
// it from the server; seeking within a listing works; and once another
// mount changed the directory, the first lists the change.
func TestReadDirFromCache(t *testing.T) {
	a, b := twoMounts(t)
	d := filepath.Join(a.dir, "d")
	must(t, os.Mkdir(d, 0o755))
	var want []string
	for i := range 300 {
		name := fmt.Sprintf("f%03d", i)
		if i%10 == 0 {
			must(t, os.Mkdir(filepath.Join(d, name), 0o755))
		} else {
			must(t, os.WriteFile(filepath.Join(d, name), nil, 0o644))
		}
		if i%7 == 3 {
			must(t, os.Remove(filepath.Join(d, name)))
			continue
		}
		want = append(want, name)
	}
	syncDir(t, d) // the creates and removals sent behind are at the server
	before := mountStatus(t, a.dir)
	got := names(t, d)
	if st := mountStatus(t, a.dir); st.Requests != before.Requests {
		t.Errorf("listing the directory it made took the mount %d server requests", st.Requests-before.Requests)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the mount lists %d names, want %d: %v", len(got), len(want), got)
	}
	// small reads: several READDIRs, and a seek back into the listing
	ents := dirents(t, d, -1)
	if len(ents) != len(want)+2 {
		t.Fatalf("getdents in small reads: %d entries, want %d", len(ents), len(want)+2)
	}
	from := ents[100]
	rest := dirents(t, d, from.off)
	if len(rest) != len(ents)-101 || rest[0].name != ents[101].name {
		t.Fatalf("after a seek to %s's offset: %d entries from %q, want %d from %q",
			from.name, len(rest), rest[0].name, len(ents)-101, ents[101].name)
	}
	for _, e := range ents {
		// f000, f010, ... are the directories
		if e.name != "." && e.name != ".." && (e.typ == syscall.DT_DIR) != (e.name[3] == '0') {
			t.Fatalf("%s has type %d", e.name, e.typ)
		}
	}

	if got := names(t, filepath.Join(b.dir, "d")); !slices.Equal(got, want) {
		t.Fatalf("the other mount lists %d names, want %d", len(got), len(want))
	}
	must(t, os.WriteFile(filepath.Join(b.dir, "d", "byb"), nil, 0o644))
	want = append(want, "byb")
	slices.Sort(want)
	if got := names(t, d); !slices.Equal(got, want) {
		t.Fatalf("after the other mount's create the mount lists %d names, want %d (byb: %v)",
			len(got), len(want), slices.Contains(got, "byb"))
	}
	// a seek to a name-order offset when the cache no longer holds the
	// listing: the place in the whole listing the server gives, by name
	pos := from.off &^ (1 << 62)
	if rest := dirents(t, d, from.off); len(rest) == 0 || rest[0].name != want[pos] {
		t.Fatalf("a seek to place %d once the cache lost the listing: %d entries, want them from %q", pos, len(rest), want[pos])
	}
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

type dirent struct {
	name string
	off  int64
	typ  uint8
}

// dirents lists dir with getdents64 in 512-byte reads (several READDIRs
// for a large directory), after seeking to off if off >= 0.
func dirents(t *testing.T, dir string, off int64) []dirent {
	t.Helper()
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	must(t, err)
	defer syscall.Close(fd)
	if off >= 0 {
		_, err := syscall.Seek(fd, off, 0)
		must(t, err)
	}
	var out []dirent
	buf := make([]byte, 512)
	for {
		n, err := syscall.Getdents(fd, buf)
		must(t, err)
		if n == 0 {
			return out
		}
		for b := buf[:n]; len(b) > 0; {
			reclen := endian.LittleEndian.Uint16(b[16:])
			name := b[19:reclen]
			if i := slices.Index(name, 0); i >= 0 {
				name = name[:i]
			}
			out = append(out, dirent{name: string(name), off: int64(endian.LittleEndian.Uint64(b[8:])), typ: b[18]})
			b = b[reclen:]
		}
	}
}
