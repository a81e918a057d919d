package transport

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAdminToken: the admin token is written next to the join token (0600),
// is derived from it, carries the same certificate pin, holds nothing of
// the secret, and parses back; a join token read as an admin token gives
// the derived one.
func TestAdminToken(t *testing.T) {
	dir := t.TempDir()
	id, _, err := LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, adminTokenFile)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v, mode %v", path, err, fi.Mode().Perm())
	}
	a, err := ReadAdminTokenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := id.TokenValue().Admin()
	if a != want || a.CertHash != id.CertHash() || a.Key == id.Secret {
		t.Fatalf("admin token %v, want %v derived, with the certificate pin", a, want)
	}
	if s := a.String(); strings.Contains(s, hex.EncodeToString(id.Secret[:])) || !strings.HasPrefix(s, "lfsadmin1-") {
		t.Fatalf("admin token %q", s)
	}
	if j, err := ReadAdminTokenFile(filepath.Join(dir, tokenFile)); err != nil || j != want {
		t.Fatalf("join token read as an admin token: %v %v", j, err)
	}
	// another secret, another key
	other := id.TokenValue()
	other.Secret[0] ^= 1
	if other.Admin().Key == want.Key {
		t.Fatal("two secrets derive one admin key")
	}
	good := a.String()
	for in, why := range map[string]string{
		"":                           "does not start",
		"lfsadmin2-" + good[10:]:     "does not start",
		good[:len(good)-1]:           "wrong length",
		good[:12] + "zz" + good[14:]: "certificate hash",
		good[:len(good)-2] + "zz":    "key",
	} {
		if _, err := ParseAdminToken(in); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("ParseAdminToken(%q) = %v, want an error about %q", in, err, why)
		}
	}
	// SaveIdentity writes it too
	dir2 := t.TempDir()
	if err := SaveIdentity(dir2, id); err != nil {
		t.Fatal(err)
	}
	if a2, err := ReadAdminTokenFile(filepath.Join(dir2, adminTokenFile)); err != nil || a2 != want {
		t.Fatalf("saved identity's admin token: %v %v", a2, err)
	}
}

// TestBlockKey: the block capability key is fixed by the secret, and is
// neither the secret nor the admin key.
func TestBlockKey(t *testing.T) {
	id, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	tok := id.TokenValue()
	k := tok.BlockKey()
	if k != tok.BlockKey() || k == tok.Secret || k == tok.Admin().Key {
		t.Fatalf("block key %x: not derived apart from the secret and the admin key", k)
	}
	other, _ := NewIdentity()
	if other.TokenValue().BlockKey() == k {
		t.Fatal("two clusters share a block key")
	}
}
