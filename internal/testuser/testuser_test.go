package testuser

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestDo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	dir, err := os.MkdirTemp("", "testuser") // t.TempDir's parent is 0700
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	var uid, euid int
	var werr error
	if err := Do(Nobody, Nobody, func() {
		uid, euid = syscall.Getuid(), syscall.Geteuid()
		werr = os.WriteFile(filepath.Join(dir, "f"), nil, 0o600)
	}); err != nil {
		t.Fatal(err)
	}
	if uid != Nobody || euid != Nobody || werr != nil {
		t.Fatalf("in Do: uid %d euid %d, write: %v", uid, euid, werr)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, "f"), &st); err != nil || st.Uid != Nobody {
		t.Fatalf("file made in Do: owner %d, %v", st.Uid, err)
	}
	if os.Geteuid() != 0 {
		t.Fatal("the process changed user")
	}
}
