package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/mountsock"
	"github.com/leasefs/leasefs/internal/testnet"
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

// TestCreateWithData: files created behind their caller, written, given
// their mode and times and closed, as tar makes them, reach the server in
// one request each: the close takes the create, still held in its queue,
// along with the data and attributes. Another mount sees them whole.
func TestCreateWithData(t *testing.T) {
	a, b, d := behindMounts(t, startServer(t), "none")
	_, before := mountStats(t, a)
	const files = 100
	stamp := time.Date(2009, 11, 10, 23, 0, 0, 0, time.UTC)
	content := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, 1+i*97) }
	for i := range files {
		f, err := os.OpenFile(filepath.Join(d, fmt.Sprintf("f%03d", i)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		must(t, err)
		_, err = f.Write(content(i))
		must(t, err)
		must(t, f.Chmod(0o640))
		tv := syscall.NsecToTimeval(stamp.UnixNano())
		must(t, syscall.Futimes(int(f.Fd()), []syscall.Timeval{tv, tv}))
		must(t, f.Close())
	}
	_, after := mountStats(t, a)
	// (a file whose close came after the hold, on a busy machine, goes
	// in two requests)
	withData := after.CreatedWithData - before.CreatedWithData
	if withData < files*9/10 {
		t.Errorf("%d of %d creates went with their file's data", withData, files)
	}
	// a round trip per file with its create, two for the others, and a
	// few for inode numbers and renewals
	if n := after.Requests - before.Requests; n > 2*files-withData+files/10 {
		t.Errorf("the mount sent %d requests for %d files, %d of them created with their data", n, files, withData)
	}
	for i := range files {
		p := filepath.Join(b.dir, "d", fmt.Sprintf("f%03d", i))
		st, err := os.Stat(p)
		must(t, err)
		if st.Mode().Perm() != 0o640 || !st.ModTime().Equal(stamp) {
			t.Fatalf("%s on the other mount: mode %v mtime %v, want 0640 %v", p, st.Mode(), st.ModTime(), stamp)
		}
		wantFile(t, p, content(i))
	}
	if _, st := mountStats(t, a); st.DataLost != 0 {
		t.Fatalf("%d files reported lost; the mount's log:\n%s", st.DataLost, a.output())
	}
}

// TestCreateBehindNack: the server fails a mount that created a file behind
// its caller and wrote it. "open": the file stays open through the
// recovery; the mount reclaims what it wrote once the create is at the
// server. "closing": the close's batch, the create with the data, is on its
// way; the mount sends it again in its new session, the write applying only
// to the file as its create made it. Either way the close succeeds with the
// data at the server, or fails with the data reported lost: never a silent
// loss.
func TestCreateBehindNack(t *testing.T) {
	for _, closing := range []bool{false, true} {
		t.Run(map[bool]string{false: "open", true: "closing"}[closing], func(t *testing.T) {
			adminAddr := testnet.TCPAddr(t)
			s := startServer(t, "--admin", adminAddr, "--client-lease", "1s", "--delivery-timeout", "100ms")
			// m's packets take 100 ms: what it sent is still on its
			// way when the server fails m, so the NACK answers it
			m, other, d := behindMounts(t, s, "delay=100ms")
			id, _ := mountClient(t, m)
			f, err := os.OpenFile(filepath.Join(d, "f"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			must(t, err)
			_, err = f.Write([]byte("written before the NACK"))
			must(t, err)
			closed := make(chan error, 1)
			if closing {
				go func() { closed <- f.Close() }()
				time.Sleep(30 * time.Millisecond)
			}
			if closing {
				evictAndRecover(t, s, id, m)
			} else {
				// no process started until the close: its copy of f,
				// closed at exec, would flush f
				evict(t, s, id)
				waitFor(t, 10*time.Second, "the mount to recover", func() bool { return recoveries(t, m) > 0 })
				closed <- f.Close()
			}
			closeErr := <-closed
			_, st := mountStats(t, m)
			t.Logf("close: %v; created behind %d, with data %d, NACKs %d, recoveries %d, lost %d",
				closeErr, st.CreatedBehind, st.CreatedWithData, st.NacksReceived, st.Recoveries, st.DataLost)
			if want := map[bool]int64{false: 0, true: 1}[closing]; st.CreatedWithData != want || st.NacksReceived == 0 {
				t.Fatalf("%d creates went with their data (want %d), %d NACKs", st.CreatedWithData, want, st.NacksReceived)
			}
			switch {
			case closeErr == nil && st.DataLost == 0:
				wantFile(t, filepath.Join(other.dir, "d", "f"), []byte("written before the NACK"))
			case closeErr != nil && st.DataLost > 0:
				t.Logf("the write was refused after the NACK and reported: %v", closeErr)
			default:
				t.Fatalf("close: %v, files reported lost: %d; the mount's log:\n%s", closeErr, st.DataLost, m.output())
			}
		})
	}
}

// recoveries reads a mount's recovery count from its socket, starting no
// process.
func recoveries(t *testing.T, m *mount) int64 {
	t.Helper()
	rep, err := mountsock.Client(m.dir).Get("http://mount/status")
	must(t, err)
	defer rep.Body.Close()
	var st struct{ Stats struct{ Recoveries int64 } }
	must(t, json.NewDecoder(rep.Body).Decode(&st))
	return st.Stats.Recoveries
}
