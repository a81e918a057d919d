package version

import (
	"runtime"
	"strings"
	"testing"
)

// A test binary records no VCS data: the version is "devel" and the
// string still says which Go and platform built it.
func TestGet(t *testing.T) {
	i := Get()
	if i.Version == "" || i.Go != runtime.Version() || i.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Fatalf("version info %+v", i)
	}
	s := i.String()
	if !strings.HasPrefix(s, i.Version+" ") || !strings.Contains(s, runtime.Version()) {
		t.Fatalf("version string %q", s)
	}
}

func TestStringWithCommit(t *testing.T) {
	i := Info{Version: "v1.2.3", Commit: "0123456789ab+modified", CommitTime: "2026-12-07T20:35:00Z", Go: "go1.26.8", Platform: "linux/amd64"}
	want := "v1.2.3 (commit 0123456789ab+modified, 2026-12-07T20:35:00Z) go1.26.8 linux/amd64"
	if got := i.String(); got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}
