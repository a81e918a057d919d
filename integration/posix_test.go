package integration

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/hanwen/go-fuse/v2/posixtest"
)

// posixSkips lists posixtest cases leasefs does not run, with the reason.
var posixSkips = map[string]string{
	"FcntlFlockLocksFile": "fcntl locks are released when the handle that took them closes, not when the process " +
		"closes any other descriptor of the file (go-fuse's fs API does not pass FLUSH's lock owner)",
}

func TestPosix(t *testing.T) {
	s := startServer(t)
	runPosix(t, startMount(t, s).dir)
}

// TestPosixCluster runs the suite on a mount of a three-server cluster:
// every change goes through ownership and replication.
func TestPosixCluster(t *testing.T) {
	c := startCluster(t, 3, clusterTimings()...)
	runPosix(t, c.mount(t, []int{0, 1, 2}).dir)
}

func runPosix(t *testing.T, root string) {
	names := make([]string, 0, len(posixtest.All))
	for name := range posixtest.All {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			if why, ok := posixSkips[name]; ok {
				t.Skip(why)
			}
			dir := filepath.Join(root, name)
			must(t, os.Mkdir(dir, 0o755))
			posixtest.All[name](t, dir)
		})
	}
}
