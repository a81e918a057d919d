package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// toolsScenario drives a mount with everyday tools and checks each result.
// It is shared by the plain tools test and the lossy-network test.
func toolsScenario(t *testing.T, mnt string, bigMiB int) {
	src := filepath.Join(goroot(t), "src", "encoding") // a real source tree, ~2 MB in ~150 files
	t.Run("cp-diff", func(t *testing.T) {
		run(t, "", "cp", "-r", src, filepath.Join(mnt, "tree"))
		run(t, "", "diff", "-r", src, filepath.Join(mnt, "tree"))
	})
	t.Run("tar", func(t *testing.T) {
		tarball := filepath.Join(t.TempDir(), "t.tar")
		run(t, mnt, "tar", "cf", tarball, "tree")
		run(t, mnt, "mkdir", "untar")
		run(t, filepath.Join(mnt, "untar"), "tar", "xf", tarball)
		run(t, "", "diff", "-r", src, filepath.Join(mnt, "untar", "tree"))
		run(t, mnt, "tar", "cf", "inside.tar", "tree")
		out := run(t, mnt, "tar", "tf", "inside.tar")
		if !strings.Contains(out, "tree/") {
			t.Fatalf("tar listing lacks tree/: %.200s", out)
		}
	})
	t.Run("git", func(t *testing.T) {
		repo := filepath.Join(mnt, "repo")
		run(t, "", "mkdir", repo)
		run(t, repo, "git", "init", "-q")
		run(t, repo, "cp", "-r", filepath.Join(src, "json"), ".")
		run(t, repo, "git", "add", ".")
		run(t, repo, "git", "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "first")
		if out := run(t, repo, "git", "log", "--oneline"); !strings.Contains(out, "first") {
			t.Fatalf("git log: %s", out)
		}
		if out := run(t, repo, "git", "status", "--porcelain"); strings.TrimSpace(out) != "" {
			t.Fatalf("git status not clean: %s", out)
		}
		run(t, repo, "git", "fsck", "--no-progress")
	})
	t.Run("dd-sha256", func(t *testing.T) {
		local := filepath.Join(t.TempDir(), "big")
		run(t, "", "dd", "if=/dev/urandom", "of="+local, "bs=1M", "count="+itoa(bigMiB), "status=none")
		run(t, "", "dd", "if="+local, "of="+filepath.Join(mnt, "big"), "bs=1M", "conv=fsync", "status=none")
		want := strings.Fields(run(t, "", "sha256sum", local))[0]
		got := strings.Fields(run(t, "", "sha256sum", filepath.Join(mnt, "big")))[0]
		if got != want {
			t.Fatalf("sha256 %s != %s", got, want)
		}
		run(t, "", "rm", filepath.Join(mnt, "big"))
	})
	t.Run("mv-ln-chmod-touch-truncate-stat", func(t *testing.T) {
		run(t, mnt, "mkdir", "-p", "a/b", "c")
		must(t, os.WriteFile(filepath.Join(mnt, "a/b/f"), []byte("hello\n"), 0o644))
		run(t, mnt, "mv", "a/b/f", "c/g")
		if exists(filepath.Join(mnt, "a/b/f")) || !exists(filepath.Join(mnt, "c/g")) {
			t.Fatal("mv across directories did not move")
		}
		run(t, mnt, "ln", "c/g", "c/hard")
		run(t, mnt, "ln", "-s", "g", "c/soft")
		if b, _ := os.ReadFile(filepath.Join(mnt, "c/soft")); string(b) != "hello\n" {
			t.Fatalf("symlink reads %q", b)
		}
		if out := run(t, mnt, "stat", "-c", "%h", "c/g"); strings.TrimSpace(out) != "2" {
			t.Fatalf("link count %s", out)
		}
		run(t, mnt, "chmod", "600", "c/g")
		if out := run(t, mnt, "stat", "-c", "%a", "c/g"); strings.TrimSpace(out) != "600" {
			t.Fatalf("mode %s", out)
		}
		run(t, mnt, "touch", "-d", "2001-02-03 04:05:06 UTC", "c/g")
		if out := run(t, mnt, "stat", "-c", "%Y", "c/g"); strings.TrimSpace(out) != "981173106" {
			t.Fatalf("mtime %s", out)
		}
		run(t, mnt, "truncate", "-s", "3", "c/g")
		if b, _ := os.ReadFile(filepath.Join(mnt, "c/hard")); string(b) != "hel" {
			t.Fatalf("after truncate: %q", b)
		}
		run(t, mnt, "truncate", "-s", "5G", "c/sparse")
		if out := run(t, mnt, "stat", "-c", "%s", "c/sparse"); strings.TrimSpace(out) != "5368709120" {
			t.Fatalf("sparse size %s", out)
		}
	})
	t.Run("find-du-rm", func(t *testing.T) {
		want := strings.Count(run(t, src, "find", "."), "\n")
		got := strings.Count(run(t, filepath.Join(mnt, "tree"), "find", "."), "\n")
		if got != want {
			t.Fatalf("find: %d entries, want %d", got, want)
		}
		if out := run(t, mnt, "du", "-s", "tree"); !strings.HasSuffix(strings.TrimSpace(out), "tree") {
			t.Fatalf("du: %s", out)
		}
		run(t, mnt, "rm", "-rf", "tree", "untar")
		if exists(filepath.Join(mnt, "tree")) {
			t.Fatal("rm -rf left the tree")
		}
	})
}

func TestTools(t *testing.T) {
	s := startServer(t)
	m := startMount(t, s)
	toolsScenario(t, m.dir, 1024)
}
