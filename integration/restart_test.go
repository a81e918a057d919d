package integration

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
)

// TestRestart: every fsynced byte survives SIGKILL of the server.
func TestRestart(t *testing.T) {
	s := startServer(t)
	m := startMount(t, s)
	files := map[string][]byte{}
	must(t, os.MkdirAll(filepath.Join(m.dir, "d/e"), 0o755))
	for i, size := range []int{0, 1, 4095, 65536, 65537, 3<<20 + 17} {
		data := make([]byte, size)
		_, _ = rand.Read(data)
		name := filepath.Join("d/e", "f"+itoa(i))
		f, err := os.Create(filepath.Join(m.dir, name))
		must(t, err)
		_, err = f.Write(data)
		must(t, err)
		must(t, f.Sync())
		must(t, f.Close())
		files[name] = data
	}
	must(t, os.Symlink("e/f1", filepath.Join(m.dir, "d/link")))
	d, err := os.Open(filepath.Join(m.dir, "d"))
	must(t, err)
	must(t, d.Sync())
	d.Close()

	s.restart(t)
	m.unmount(t)
	m2 := startMount(t, s)
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(m2.dir, name))
		if err != nil {
			t.Fatalf("%s after restart: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s after restart: %d bytes differ from the %d written", name, len(got), len(want))
		}
	}
	if target, err := os.Readlink(filepath.Join(m2.dir, "d/link")); err != nil || target != "e/f1" {
		t.Fatalf("symlink after restart: %q %v", target, err)
	}
}
