package transport

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestLoadOrCreateIdentity(t *testing.T) {
	dir := t.TempDir()
	id, created, err := LoadOrCreateIdentity(dir)
	if err != nil || !created {
		t.Fatalf("create: %v, created %v", err, created)
	}
	for _, name := range []string{identityFile, tokenFile} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s has mode %v, want 0600", name, fi.Mode().Perm())
		}
	}
	id2, created, err := LoadOrCreateIdentity(dir)
	if err != nil || created {
		t.Fatalf("load: %v, created %v", err, created)
	}
	if id2.Token() != id.Token() || id2.Secret != id.Secret {
		t.Fatal("reloaded identity differs")
	}
	tok, err := ReadTokenFile(filepath.Join(dir, tokenFile))
	if err != nil {
		t.Fatal(err)
	}
	if tok != id.TokenValue() || tok.String() != id.Token() {
		t.Fatalf("token file %v, want %v", tok, id.Token())
	}
	if !strings.HasPrefix(id.Token(), "lfs1-") || len(id.Token()) != 5+64+1+64 {
		t.Fatalf("token format: %q", id.Token())
	}
	// copying the identity to another server's directory
	dir2 := t.TempDir()
	if err := SaveIdentity(dir2, id); err != nil {
		t.Fatal(err)
	}
	id3, created, err := LoadOrCreateIdentity(dir2)
	if err != nil || created || id3.Token() != id.Token() {
		t.Fatalf("saved identity: %v created %v", err, created)
	}
	// a damaged identity file is an error, not a silent new identity
	if err := os.WriteFile(filepath.Join(dir, identityFile), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateIdentity(dir); err == nil {
		t.Fatal("damaged identity accepted")
	}
}

func TestParseToken(t *testing.T) {
	id := identity(t)
	good := id.Token()
	tok, err := ParseToken("  " + good + "\n")
	if err != nil || tok != id.TokenValue() {
		t.Fatalf("good token: %v", err)
	}
	bad := map[string]string{
		"":                                "empty",
		"lfs2-" + good[5:]:                "lfs1-",
		good[:len(good)-1]:                "wrong length",
		good + "0":                        "wrong length",
		good[:10] + "zz" + good[12:]:      "certificate hash",
		good[:len(good)-2] + "zz":         "secret",
		strings.Replace(good, "-", "", 2): "lfs1-",
	}
	for in, want := range bad {
		_, err := ParseToken(in)
		if err == nil || !strings.HasPrefix(err.Error(), "transport: token: ") || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseToken(%q) = %v, want error about %q", in, err, want)
		}
	}
	if _, err := ReadTokenFile(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("missing token file accepted")
	}
}

// TestIdentityRestartWritesNothing: loading an identity whose token files
// are right writes nothing (before, every start rewrote both, and a server
// on a full disk could not start).
func TestIdentityRestartWritesNothing(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := LoadOrCreateIdentity(dir); err != nil {
		t.Fatal(err)
	}
	inode := func(name string) uint64 {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(dir, name), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	tok, admin := inode(tokenFile), inode(adminTokenFile)
	// read-only: a write would fail
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(dir, 0o700)
	if os.Geteuid() == 0 {
		// root writes anyway: the files are not replaced, at least
		if _, _, err := LoadOrCreateIdentity(dir); err != nil {
			t.Fatal(err)
		}
	} else if _, _, err := LoadOrCreateIdentity(dir); err != nil {
		t.Fatalf("loading an identity in a directory it cannot write: %v", err)
	}
	if inode(tokenFile) != tok || inode(adminTokenFile) != admin {
		t.Fatal("a restart rewrote the token files")
	}
	// a changed token file is rewritten
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, tokenFile), []byte("stale\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	id, _, err := LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, tokenFile)); string(b) != id.Token()+"\n" {
		t.Fatalf("token file %q after a load", b)
	}
}
