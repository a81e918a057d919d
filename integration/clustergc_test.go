package integration

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestClusterGCDeadOwner: on a 3-server cluster sharing a block
// directory, a file written through server 1 is removed and server 1 is
// killed before the file's blocks are due for collection. Nobody owns the
// file's inode any more (the mounts of server 1 are gone, so no request
// makes a server take it); the cluster's collector, a surviving server,
// takes it over and its blocks leave the directory within the garbage
// delay and a few rounds. The file that stays (server 1's too) reads back
// intact through a surviving server, every block of it still there.
func TestClusterGCDeadOwner(t *testing.T) {
	c := startCluster(t, 3, clusterTimings()...)
	a := c.mount(t, []int{0})
	stays := randomBytes(6 << 20)
	must(t, os.WriteFile(filepath.Join(a.dir, "stays"), stays, 0o644))
	before := blockFiles(t, c.blocksDir)
	gone := filepath.Join(a.dir, "gone")
	run(t, "", "dd", "if=/dev/urandom", "of="+gone, "bs=1M", "count=16", "conv=fsync", "status=none")
	with := len(blockFiles(t, c.blocksDir))
	if with < len(before)+2 {
		t.Fatalf("16 MiB written as %d blocks", with-len(before))
	}
	a.unmount(t)
	r := c.mount(t, []int{0})
	rm := time.Now() // before the removal: its garbage is due no sooner than the delay after
	must(t, os.Remove(filepath.Join(r.dir, "gone")))
	r.unmount(t)
	c.servers[0].kill()
	// the server's garbage delay: τ(1+δ) and a margin of 10 s
	delay := time.Duration(float64(clusterClient)*1.05) + 10*time.Second
	if since := time.Since(rm); since >= delay {
		t.Fatalf("server 1 killed %v after the rm, not before the garbage was due (%v)", since, delay)
	}
	bound := delay + 30*time.Second
	waitFor(t, bound, "the removed file's blocks collected", func() bool {
		return len(blockFiles(t, c.blocksDir)) == len(before)
	})
	t.Logf("%d blocks of a file removed through server 1, which then died, collected %v after the rm (garbage delay %v, bound %v)",
		with-len(before), time.Since(rm).Round(time.Millisecond), delay, bound)
	b := c.mount(t, []int{1})
	wantSame(t, filepath.Join(b.dir, "stays"), stays)
	after := map[string]bool{}
	for _, p := range blockFiles(t, c.blocksDir) {
		after[p] = true
	}
	for _, p := range before {
		if !after[p] {
			t.Fatalf("block %s of the file that stays was deleted", p)
		}
	}
}
