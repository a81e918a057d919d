package blocks

import (
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

func TestIDText(t *testing.T) {
	id := ID{Ino: ids.MakeIno(3, 0x1234), Unique: [16]byte{0xab, 15: 0x01}}
	const want = "0300000000001234/ab000000000000000000000000000001"
	if id.String() != want {
		t.Fatalf("String = %s", id.String())
	}
	got, err := ParseID(want)
	if err != nil || got != id {
		t.Fatalf("ParseID = %v, %v", got, err)
	}
	for _, bad := range []string{"", want[:48], want + "0", strings.ToUpper(want), strings.Replace(want, "/", "-", 1),
		"+300000000001234/ab000000000000000000000000000001", "0300000000001234/ab00000000000000000000000000000g"} {
		if _, err := ParseID(bad); err == nil {
			t.Errorf("ParseID(%q) took it", bad)
		}
	}
	if a, b := NewID(1), NewID(1); a == b {
		t.Fatal("two NewIDs alike")
	}
}

func FuzzParseID(f *testing.F) {
	f.Add("0300000000001234/ab000000000000000000000000000001")
	f.Add("ffffffffffffffff/ffffffffffffffffffffffffffffffff")
	f.Add("0000000000000000/00000000000000000000000000000000")
	f.Add("0300000000001234-ab000000000000000000000000000001")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseID(s)
		if err != nil {
			return
		}
		if id.String() != s {
			t.Fatalf("ParseID(%q) = %s: one id, two texts", s, id)
		}
	})
}

func FuzzParseCapability(f *testing.F) {
	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.Unix(1_800_000_000, 0)
	sg, _ := NewSigner(key, func() time.Time { return now })
	id := ID{Ino: 42, Unique: [16]byte{1, 2, 3}}
	f.Add(sg.Sign(Capability{Op: OpRead, ID: id, Expiry: now.Add(time.Minute)}))
	f.Add(sg.Sign(Capability{Op: OpWrite, ID: id, Expiry: now.Add(-time.Minute)}))
	f.Add("")
	f.Add(strings.Repeat("A", 88))
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCapability(s)
		if err != nil {
			if sg.Check(s, OpRead, id) == nil {
				t.Fatalf("Check took %q, which does not parse", s)
			}
			return
		}
		// only what the signer signed passes, and it signs one text
		if sg.Check(s, c.Op, c.ID) == nil && sg.Sign(c) != s {
			t.Fatalf("Check took %q, not what Sign makes of %+v", s, c)
		}
	})
}
