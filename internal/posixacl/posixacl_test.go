package posixacl

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/leasefs/leasefs/internal/purity"
)

func acl(es ...Entry) ACL { return ACL(es) }

func e(t Tag, perm uint16, id ...uint32) Entry {
	en := Entry{Tag: t, Perm: perm, Id: undefinedID}
	if len(id) > 0 {
		en.Id = id[0]
	}
	return en
}

// minimal is the ACL a mode of 0640 stands for.
var minimal = acl(e(UserObj, 6), e(GroupObj, 4), e(Other, 0))

// named grants user 65534 read, with a mask.
var named = acl(e(UserObj, 6), e(User, 4, 65534), e(GroupObj, 0), e(Mask, 4), e(Other, 0))

func TestParseRoundTrip(t *testing.T) {
	for _, a := range []ACL{minimal, named,
		acl(e(UserObj, 7), e(User, 1, 5), e(User, 2, 6), e(GroupObj, 5), e(Group, 7, 1), e(Mask, 7), e(Other, 1))} {
		got, err := Parse(a.Encode())
		if err != nil {
			t.Fatalf("%v: %v", a, err)
		}
		if !reflect.DeepEqual(got, a) {
			t.Fatalf("round trip: %v -> %v", a, got)
		}
	}
	// ids of the unnamed entries are normalised, as the kernel ignores them
	b := minimal.Encode()
	b[4+4] = 7
	got, err := Parse(b)
	if err != nil || !bytes.Equal(got.Encode(), minimal.Encode()) {
		t.Fatalf("id of user_obj not ignored: %v %v", got, err)
	}
}

func TestParseRejects(t *testing.T) {
	withVersion := func(v byte) []byte { b := minimal.Encode(); b[0] = v; return b }
	cases := map[string][]byte{
		"empty":          nil,
		"short header":   {2, 0},
		"no entries":     {2, 0, 0, 0},
		"partial entry":  append(minimal.Encode(), 1, 0),
		"version 1":      withVersion(1),
		"garbage":        []byte("garbage!"),
		"bad perm":       acl(e(UserObj, 8), e(GroupObj, 4), e(Other, 0)).Encode(),
		"bad tag":        acl(e(UserObj, 6), e(GroupObj, 4), e(0x40, 0)).Encode(),
		"no user_obj":    acl(e(GroupObj, 4), e(Other, 0)).Encode(),
		"no group_obj":   acl(e(UserObj, 6), e(Other, 0)).Encode(),
		"no other":       acl(e(UserObj, 6), e(GroupObj, 4)).Encode(),
		"no mask":        acl(e(UserObj, 6), e(User, 4, 1), e(GroupObj, 4), e(Other, 0)).Encode(),
		"unsorted":       acl(e(GroupObj, 4), e(UserObj, 6), e(Other, 0)).Encode(),
		"unsorted ids":   acl(e(UserObj, 6), e(User, 4, 9), e(User, 4, 3), e(GroupObj, 4), e(Mask, 4), e(Other, 0)).Encode(),
		"repeated id":    acl(e(UserObj, 6), e(User, 4, 3), e(User, 4, 3), e(GroupObj, 4), e(Mask, 4), e(Other, 0)).Encode(),
		"two user_obj":   acl(e(UserObj, 6), e(UserObj, 6), e(GroupObj, 4), e(Other, 0)).Encode(),
		"two masks":      acl(e(UserObj, 6), e(GroupObj, 4), e(Mask, 4), e(Mask, 4), e(Other, 0)).Encode(),
		"mask after all": acl(e(UserObj, 6), e(GroupObj, 4), e(Other, 0), e(Mask, 4)).Encode(),
	}
	for name, b := range cases {
		if a, err := Parse(b); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Parse = %v, %v; want ErrInvalid", name, a, err)
		}
	}
}

func TestMode(t *testing.T) {
	if perm, equiv := minimal.Mode(); perm != 0o640 || !equiv {
		t.Fatalf("minimal: %#o %v", perm, equiv)
	}
	// the group class is the mask's
	if perm, equiv := named.Mode(); perm != 0o640 || equiv {
		t.Fatalf("named: %#o %v", perm, equiv)
	}
	// a mask alone makes an ACL more than a mode (getfacl shows it)
	withMask := acl(e(UserObj, 7), e(GroupObj, 5), e(Mask, 1), e(Other, 4))
	if perm, equiv := withMask.Mode(); perm != 0o714 || equiv {
		t.Fatalf("mask only: %#o %v", perm, equiv)
	}
}

func TestChmod(t *testing.T) {
	got := named.Chmod(0o751)
	want := acl(e(UserObj, 7), e(User, 4, 65534), e(GroupObj, 0), e(Mask, 5), e(Other, 1))
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("chmod 751 of named: %v, want %v", got, want)
	}
	if named[3].Perm != 4 {
		t.Fatal("Chmod changed its receiver")
	}
	// without a mask the owning group takes the group bits
	if got := minimal.Chmod(0o057); !reflect.DeepEqual(got, acl(e(UserObj, 0), e(GroupObj, 5), e(Other, 7))) {
		t.Fatalf("chmod 057 of minimal: %v", got)
	}
	if perm, _ := named.Chmod(0o604).Mode(); perm != 0o604 {
		t.Fatalf("mode after chmod 604: %#o", perm)
	}
}

func TestInherit(t *testing.T) {
	def := acl(e(UserObj, 7), e(User, 7, 65534), e(GroupObj, 5), e(Mask, 7), e(Other, 5))
	// a file made 0666: no execute anywhere, and the mask takes the
	// group bits
	mode, access, dflt := Inherit(def, 0o100666, false)
	if mode != 0o100664 || dflt != nil {
		t.Fatalf("file: mode %#o default %v", mode, dflt)
	}
	wantAccess := acl(e(UserObj, 6), e(User, 7, 65534), e(GroupObj, 5), e(Mask, 6), e(Other, 4))
	if !reflect.DeepEqual(access, wantAccess) {
		t.Fatalf("file: access %v, want %v", access, wantAccess)
	}
	// a directory made 0750 keeps the default ACL as its own
	mode, access, dflt = Inherit(def, 0o40750, true)
	if mode != 0o40750 || !reflect.DeepEqual(dflt, def) || access == nil || access[3].Perm != 5 || access[4].Perm != 0 {
		t.Fatalf("dir: mode %#o access %v default %v", mode, access, dflt)
	}
	// a minimal default ACL gives a mode and no access ACL; the setuid
	// and type bits stay
	mode, access, _ = Inherit(acl(e(UserObj, 6), e(GroupObj, 0), e(Other, 0)), 0o104777, false)
	if mode != 0o104600 || access != nil {
		t.Fatalf("minimal default: mode %#o access %v", mode, access)
	}
	if def[0].Perm != 7 {
		t.Fatal("Inherit changed the default ACL")
	}
}

func FuzzParse(f *testing.F) {
	f.Add(minimal.Encode())
	f.Add(named.Encode())
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := Parse(b)
		if err != nil {
			return
		}
		// what parses is valid, survives encoding, and every use of it
		// gives a valid ACL
		b2 := a.Encode()
		a2, err := Parse(b2)
		if err != nil || !reflect.DeepEqual(a, a2) {
			t.Fatalf("re-parse: %v %v", a2, err)
		}
		for _, m := range []uint32{0, 0o777, 0o640, 0o7000} {
			if err := a.Chmod(m).check(); err != nil {
				t.Fatalf("chmod %#o: %v", m, err)
			}
			if perm, _ := a.Chmod(m).Mode(); perm != m&0o777 {
				t.Fatalf("chmod %#o gives mode %#o", m, perm)
			}
			_, acc, _ := Inherit(a, m, true)
			if acc != nil {
				if err := acc.check(); err != nil {
					t.Fatalf("inherit %#o: %v", m, err)
				}
			}
		}
	})
}

// TestPure keeps this package pure (STYLE.md): no clock, goroutines,
// locks or I/O.
func TestPure(t *testing.T) { purity.Check(t, purity.Options{}) }
