package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSubdir: mount --subdir mounts one directory of the file system as
// the root; what another mount changes there shows at once (the kernel's
// caches of the root are dropped as any directory's), the root's parent is
// the root, and a path that is no directory is a clear refusal.
func TestSubdir(t *testing.T) {
	s := startServer(t)
	a := startMount(t, s)
	must(t, os.MkdirAll(filepath.Join(a.dir, "proj", "src"), 0o755))
	must(t, os.WriteFile(filepath.Join(a.dir, "proj", "src", "f"), []byte("from a"), 0o644))
	must(t, os.WriteFile(filepath.Join(a.dir, "outside"), []byte("x"), 0o644))
	b := startMount(t, s, "--subdir", "/proj")

	if got, err := os.ReadFile(filepath.Join(b.dir, "src", "f")); err != nil || string(got) != "from a" {
		t.Fatalf("b reads src/f: %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(b.dir, "outside")); !os.IsNotExist(err) {
		t.Fatalf("b sees a file outside its subdirectory: %v", err)
	}
	if ents, err := os.ReadDir(filepath.Join(b.dir, "..", filepath.Base(b.dir), "src")); err != nil || len(ents) != 1 {
		t.Fatalf("b lists src: %v %v", ents, err)
	}
	must(t, os.WriteFile(filepath.Join(b.dir, "new"), []byte("from b"), 0o644))
	must(t, b.sync())
	if got, err := os.ReadFile(filepath.Join(a.dir, "proj", "new")); err != nil || string(got) != "from b" {
		t.Fatalf("a reads proj/new: %q, %v", got, err)
	}
	// a's changes to the mounted directory itself reach b's kernel,
	// which cached the root's attributes under b's lock
	for range 2 {
		if _, err := os.Stat(b.dir); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.WriteFile(filepath.Join(a.dir, "proj", "later"), nil, 0o644))
	must(t, os.Chmod(filepath.Join(a.dir, "proj"), 0o750))
	must(t, a.sync())
	if _, err := os.Stat(filepath.Join(b.dir, "later")); err != nil {
		t.Fatalf("b does not see a's new file: %v", err)
	}
	if st, err := os.Stat(b.dir); err != nil || st.Mode().Perm() != 0o750 {
		t.Fatalf("b's root: %v, %v; want mode 0750 as a set it", st.Mode(), err)
	}

	for _, bad := range []struct{ path, want string }{
		{"/missing", "--subdir /missing: missing"}, {"/proj/src/f", "f is not a directory"}, {"/proj/../outside", "no .."},
	} {
		p := startProc(t, "subdir-refused", "mount", "--server", s.addr, "--token-file", s.tokenFile, "--subdir", bad.path, t.TempDir())
		if !exitWithin(p, 20*time.Second) {
			t.Fatalf("--subdir %s: did not exit", bad.path)
		}
		if out := p.output(); exitCode(p) == 0 || !strings.Contains(out, bad.want) {
			t.Errorf("--subdir %s: exit %d, want %q:\n%s", bad.path, exitCode(p), bad.want, out)
		}
	}
}
