package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/testnet"
	adminapi "github.com/leasefs/leasefs/metaserver/admin"
)

// lockedFiles is how many files TestStatusPage10k makes a mount hold
// data locks on.
const lockedFiles = 10_000

// TestStatusPage10k: a mount holds 10,000 data locks, another waits for a
// flock the first holds; the status page, rendered in headless Chromium,
// shows the lock summary, the clients with the most locks, the contended
// inode, one page of the lock list and the trends of the traffic that
// made them, and stays under 150 KB. The screenshot goes to the test's
// directory (and to /work/wt/statuspage-10k.png where that exists).
func TestStatusPage10k(t *testing.T) {
	bin := chromium(t)
	s := startServer(t, "--admin", testnet.TCPAddr(t))
	a, b := startMount(t, s), startMount(t, s)
	idA, _ := mountClient(t, a)
	idB, _ := mountClient(t, b)

	start := time.Now()
	dir := filepath.Join(a.dir, "many")
	must(t, os.Mkdir(dir, 0o755))
	for i := range lockedFiles {
		must(t, os.WriteFile(filepath.Join(dir, itoa(i)), []byte("x"), 0o644))
	}
	t.Logf("created %d files in %v", lockedFiles, time.Since(start))
	// b reads some: a's locks on them are revoked down to S, and both hold them
	for i := range 500 {
		if _, err := os.ReadFile(filepath.Join(b.dir, "many", itoa(i*7))); err != nil {
			t.Fatal(err)
		}
	}

	// b waits for a's flock: a contended inode with a waiter
	name := filepath.Join(a.dir, "lock")
	fa, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o644)
	must(t, err)
	defer fa.Close()
	must(t, syscall.Flock(int(fa.Fd()), syscall.LOCK_EX))
	fb, err := os.OpenFile(filepath.Join(b.dir, "lock"), os.O_RDWR, 0)
	must(t, err)
	defer fb.Close()
	got := make(chan error, 1)
	go func() { got <- syscall.Flock(int(fb.Fd()), syscall.LOCK_EX) }()
	defer func() {
		_ = syscall.Flock(int(fa.Fd()), syscall.LOCK_UN)
		if err := <-got; err != nil {
			t.Errorf("b's flock: %v", err)
		}
	}()
	var lockIno uint64
	if st, err := fa.Stat(); err == nil {
		lockIno = st.Sys().(*syscall.Stat_t).Ino
	}

	var sum adminapi.LockSummary
	deadline := time.Now().Add(20 * time.Second)
	for {
		must(t, json.Unmarshal(s.adminCall(t, "GET", "/api/locks/summary"), &sum))
		if sum.Kinds[0].Held >= lockedFiles && sum.Kinds[1].Waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("want 10,000 data locks and b's flock waiting: %+v", sum.Kinds)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("locks: %d (%d held, %d waiting) on %d inodes", sum.Locks, sum.Held, sum.Waiting, sum.Inodes)
	var tr adminapi.Trends
	waitFor(t, 10*time.Second, "trends of the creates", func() bool {
		must(t, json.Unmarshal(s.adminCall(t, "GET", "/api/trends"), &tr))
		busy := false
		for _, x := range tr.Samples {
			busy = busy || (x.RequestsPerSec > 10 && x.BytesInPerSec > 0 && x.BytesOutPerSec > 0 && x.LatencyP99 > 0 && x.RevocationsPerSec > 0)
		}
		return busy
	})

	// the CLI pages through all of them (more than one API page)
	if out := admin(t, append(s.adminArgs(), "locks")...); strings.Count(out, "\n") != 1+sum.Locks ||
		!row(out, itoa(int(lockIno)), "flock", "write", idB, "waiting") {
		t.Errorf("leasefs admin locks printed %d lines, want a header and %d locks", strings.Count(out, "\n"), sum.Locks)
	}
	start = time.Now()
	page := string(s.adminCall(t, "GET", "/"))
	t.Logf("status page at %d locks: %d bytes, served in %v", sum.Locks, len(page), time.Since(start))
	if len(page) >= 150_000 {
		t.Errorf("status page of %d bytes at %d locks, want under 150 KB", len(page), sum.Locks)
	}

	tmp := t.TempDir()
	flags := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--user-data-dir=" + filepath.Join(tmp, "profile"), "--window-size=1280,2000"}
	link := regexp.MustCompile(`http://\S+/login\?once=[0-9a-f]+`).FindString(admin(t, append(s.adminArgs(), "page")...))
	if link == "" {
		t.Fatal("leasefs admin page printed no link")
	}
	dom := run(t, tmp, bin, append(flags, "--dump-dom", link)...)
	for _, want := range []string{
		itoa(sum.Locks) + " locks: ", "by 2 clients",
		"<td>" + idA + "</td>", "<td>" + idB + "</td>", a.dir, // top clients, with their mountpoints
		`id="contended">` /* the flock's inode, 1 waiter, first */, "<td>ino:" + itoa(int(lockIno)) + "</td><td>/lock</td><td>1</td>",
		"rows 1–100 of " + itoa(sum.Locks), `rel="next"`, // one page of locks
		`<svg class="spark"`, "<polyline", "Latency p99", "Bytes out",
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered status page lacks %q", want)
		}
	}
	if !regexp.MustCompile(`\(50 of 50\d with a waiter`).MatchString(dom) { // 500 files, their directories, the flock's
		t.Errorf("the page does not show the 50 most contended of about 500 inodes")
	}
	if n := strings.Count(dom, "<td>data</td>"); n < 100 || n > 101 { // 100 rows, and the kinds table
		t.Errorf("%d data lock rows on the page, want one page of 100", n)
	}
	shot := filepath.Join(tmp, "status-10k.png")
	run(t, tmp, bin, append(flags, "--screenshot="+shot, "http://"+s.adminAddr()+"/")...)
	st, err := os.Stat(shot)
	if err != nil || st.Size() < 1000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, st.Size())
	if dir := os.Getenv("LEASEFS_SCREENSHOT_DIR"); dir != "" { // docs/status-page-10k.png came from here
		if png, err := os.ReadFile(shot); err == nil {
			must(t, os.WriteFile(filepath.Join(dir, "status-page-10k.png"), png, 0o644))
		}
	}
}

// chromium returns the headless browser's path, or skips the test.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("chromium not installed (.ci/run installs it)")
	return ""
}
