package integration

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// behindMounts starts a mount whose packets the faults delay and a plain
// one on s, and makes directory d through the first: it holds d's X lock
// and knows its entries, so what it changes there goes behind the caller.
func behindMounts(t *testing.T, s *server, faults string) (a, b *mount, d string) {
	t.Helper()
	a, b = startMount(t, s, "--faults", faults), startMount(t, s)
	d = filepath.Join(a.dir, "d")
	must(t, os.Mkdir(d, 0o755))
	return a, b, d
}

// TestCreateBehind: under a directory's X lock a mount creates files
// without waiting for the server, and whatever could see a file sees it
// with what was written to it: another mount's listing and reads, a name
// removed and created again at once, a tree untarred through the mount.
func TestCreateBehind(t *testing.T) {
	// a's packets take 0-20 ms, so that what a sends behind can be
	// overtaken by what it sends after
	a, b, d := behindMounts(t, startServer(t), "jitter=20ms,reorder=0.2")
	_, before := mountStats(t, a)
	const files = 200
	for i := range files {
		p := filepath.Join(d, fmt.Sprintf("f%03d", i))
		if i%2 == 0 {
			must(t, os.WriteFile(p, bytes.Repeat([]byte{byte(i)}, i*100), 0o640))
		} else {
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			must(t, err)
			must(t, f.Close())
		}
	}
	_, after := mountStats(t, a)
	if n := after.CreatedBehind - before.CreatedBehind; n < files {
		t.Errorf("%d creates of %d in a directory the mount made went behind", n, files)
	}
	names, err := os.ReadDir(filepath.Join(b.dir, "d"))
	must(t, err)
	if len(names) != files {
		t.Fatalf("the other mount lists %d files, want %d", len(names), files)
	}
	for i := range files {
		p := filepath.Join(b.dir, "d", fmt.Sprintf("f%03d", i))
		st, err := os.Stat(p)
		must(t, err)
		want, mode := int64(i*100), os.FileMode(0o640)
		if i%2 == 1 {
			want, mode = 0, 0o600
		}
		if st.Size() != want || st.Mode().Perm() != mode {
			t.Fatalf("%s on the other mount: size %d mode %v, want %d %v", p, st.Size(), st.Mode(), want, mode)
		}
		if i%2 == 0 {
			wantFile(t, p, bytes.Repeat([]byte{byte(i)}, i*100))
		}
	}

	// made, removed and made again at once, all behind; then read by b
	// (whose lookup takes the directory's lock from a: a sends first)
	e := filepath.Join(a.dir, "e")
	must(t, os.Mkdir(e, 0o755))
	p := filepath.Join(e, "again")
	must(t, os.WriteFile(p, []byte("old"), 0o644))
	must(t, os.Remove(p))
	must(t, os.WriteFile(p, []byte("new"), 0o644))
	wantFile(t, filepath.Join(b.dir, "e", "again"), []byte("new"))
	// and the inode numbers the server handed out are its own: a file
	// created behind and one created by b differ
	must(t, os.WriteFile(filepath.Join(b.dir, "e", "byb"), []byte("b"), 0o644))
	sa, err := os.Stat(filepath.Join(b.dir, "e", "again"))
	must(t, err)
	sb, err := os.Stat(filepath.Join(b.dir, "e", "byb"))
	must(t, err)
	if ia, ib := sa.Sys().(*syscall.Stat_t).Ino, sb.Sys().(*syscall.Stat_t).Ino; ia == ib {
		t.Fatalf("two files with inode %d", ia)
	}
	if _, st := mountStats(t, a); st.DataLost != 0 {
		t.Fatalf("%d files reported lost; the mount's log:\n%s", st.DataLost, a.output())
	}
}

// TestCreateBehindNack: a file created behind its caller and written, not
// yet closed, when the server fails the mount: after the recovery the
// mount reclaims what it wrote once the create is at the server, and the
// close succeeds with the data there (or, were it refused, fails: never a
// silent loss).
func TestCreateBehindNack(t *testing.T) {
	adminAddr := freeTCPAddr(t)
	s := startServer(t, "--admin", adminAddr, "--client-lease", "1s", "--delivery-timeout", "100ms")
	// m's packets take 100 ms: the create is still on its way when the
	// server fails m, so the NACK answers the very request carrying it
	m, other, d := behindMounts(t, s, "delay=100ms")
	id, _ := mountClient(t, m)
	f, err := os.OpenFile(filepath.Join(d, "f"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	must(t, err)
	_, err = f.Write([]byte("written before the NACK"))
	must(t, err)
	evictAndRecover(t, adminAddr, id, m)
	closeErr := f.Close()
	_, st := mountStats(t, m)
	t.Logf("close: %v; created behind %d, recoveries %d, lost %d", closeErr, st.CreatedBehind, st.Recoveries, st.DataLost)
	switch {
	case closeErr == nil && st.DataLost == 0:
		wantFile(t, filepath.Join(other.dir, "d", "f"), []byte("written before the NACK"))
	case closeErr != nil && st.DataLost > 0:
		t.Logf("the write was refused after the NACK and reported: %v", closeErr)
	default:
		t.Fatalf("close: %v, files reported lost: %d; the mount's log:\n%s", closeErr, st.DataLost, m.output())
	}
}
