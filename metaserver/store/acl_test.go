package store

import (
	"testing"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/posixacl"
	"github.com/leasefs/leasefs/wire"
)

func aclOf(es ...posixacl.Entry) []byte { return posixacl.ACL(es).Encode() }

func ent(tag posixacl.Tag, perm uint16, id ...uint32) posixacl.Entry {
	e := posixacl.Entry{Tag: tag, Perm: perm, Id: 0xffffffff}
	if len(id) > 0 {
		e.Id = id[0]
	}
	return e
}

// nobodyRead grants user 65534 read.
var nobodyRead = aclOf(ent(posixacl.UserObj, 6), ent(posixacl.User, 4, 65534), ent(posixacl.GroupObj, 0),
	ent(posixacl.Mask, 4), ent(posixacl.Other, 0))

// TestStoreAccessACL: setting an access ACL sets the mode from it (and
// keeps one the mode says alone as the mode only), a chmod rewrites it,
// and what is not a valid ACL changes nothing.
func TestStoreAccessACL(t *testing.T) {
	s := newStore(t)
	f := must[Attr](t)(s.Create(ids.RootIno, "f", 0o600, 0, 0, 0, 1))

	wantCode(t, s.SetXattr(f.Ino, posixacl.AccessName, nobodyRead, 0, 5), wire.CodeOK)
	wantMode(t, s, f.Ino, 0o640) // the group class is the mask's
	wantXattr(t, s, f.Ino, posixacl.AccessName, nobodyRead)
	if a := must[Attr](t)(s.GetAttr(f.Ino)); a.Ctime != 5 {
		t.Fatalf("ctime %d after setting an ACL, want 5", a.Ctime)
	}

	// chmod: owner, mask and other follow the mode
	must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetMode, Mode: 0o750}, 6))
	wantXattr(t, s, f.Ino, posixacl.AccessName, aclOf(ent(posixacl.UserObj, 7), ent(posixacl.User, 4, 65534),
		ent(posixacl.GroupObj, 0), ent(posixacl.Mask, 5), ent(posixacl.Other, 0)))
	// a write that carries a chmod (buffered by a client) too
	must[Attr](t)(s.WriteSetAttr(f.Ino, SpanAt(0, []byte("x")), []byte("x"), SetAttrIn{Valid: wire.SetMode, Mode: 0o600}, 7))
	wantXattr(t, s, f.Ino, posixacl.AccessName, aclOf(ent(posixacl.UserObj, 6), ent(posixacl.User, 4, 65534),
		ent(posixacl.GroupObj, 0), ent(posixacl.Mask, 0), ent(posixacl.Other, 0)))

	// bad input: an error, and nothing changes
	before := must[[]byte](t)(s.GetXattr(f.Ino, posixacl.AccessName))
	for name, v := range map[string][]byte{
		"garbage":  []byte("garbage!"),
		"empty":    nil,
		"no mask":  aclOf(ent(posixacl.UserObj, 6), ent(posixacl.User, 4, 1), ent(posixacl.GroupObj, 0), ent(posixacl.Other, 0)),
		"unsorted": aclOf(ent(posixacl.GroupObj, 0), ent(posixacl.UserObj, 6), ent(posixacl.Other, 0)),
	} {
		if err := s.SetXattr(f.Ino, posixacl.AccessName, v, 0, 9); wire.CodeOf(err) != wire.CodeInvalid {
			t.Fatalf("%s ACL: %v, want invalid", name, err)
		}
	}
	wantMode(t, s, f.Ino, 0o600)
	wantXattr(t, s, f.Ino, posixacl.AccessName, before)

	// an ACL the mode says alone (cp -p restores modes so) is the mode
	trivial := aclOf(ent(posixacl.UserObj, 6), ent(posixacl.GroupObj, 4), ent(posixacl.Other, 4))
	wantCode(t, s.SetXattr(f.Ino, posixacl.AccessName, trivial, 0, 10), wire.CodeOK)
	wantMode(t, s, f.Ino, 0o644)
	wantXattr(t, s, f.Ino, posixacl.AccessName, nil)
	if names := must[[]string](t)(s.ListXattr(f.Ino)); len(names) != 0 {
		t.Fatalf("xattrs %q after a trivial ACL", names)
	}
	// removing an ACL that is not there is no error (as tmpfs, ext4)
	wantCode(t, s.RemoveXattr(f.Ino, posixacl.AccessName, 11), wire.CodeOK)
	wantCode(t, s.RemoveXattr(f.Ino, "user.absent", 11), wire.CodeNoData)

	// setgid goes when the kernel says the setter may not keep it, and
	// only for the access ACL
	must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetMode, Mode: 0o2660}, 12))
	wantCode(t, s.SetXattr(f.Ino, posixacl.AccessName, nobodyRead, 0, 13), wire.CodeOK)
	wantMode(t, s, f.Ino, 0o2640)
	wantCode(t, s.SetXattr(f.Ino, posixacl.AccessName, nobodyRead, wire.XattrKillSgid, 14), wire.CodeOK)
	wantMode(t, s, f.Ino, 0o640)
	wantCode(t, s.SetXattr(f.Ino, "user.x", nil, wire.XattrKillSgid, 15), wire.CodeInvalid)

	// a default ACL only on a directory; none on a symlink
	wantCode(t, s.SetXattr(f.Ino, posixacl.DefaultName, nobodyRead, 0, 16), wire.CodeAccess)
	l := must[Attr](t)(s.Symlink(ids.RootIno, "l", "f", 0, 0, 1))
	wantCode(t, s.SetXattr(l.Ino, posixacl.AccessName, nobodyRead, 0, 16), wire.CodeNotSupported)
}

// TestStoreInheritACL: what is made in a directory with a default ACL
// inherits it, masked by the mode it is made with and not by the umask; a
// directory takes it as its own default ACL; elsewhere the umask applies.
func TestStoreInheritACL(t *testing.T) {
	s := newStore(t)
	st := s.WithUmask(0o077)
	d := must[Attr](t)(st.Mkdir(ids.RootIno, "d", 0o777, 0, 0, 1))
	wantMode(t, s, d.Ino, 0o700) // no default ACL: the umask
	def := aclOf(ent(posixacl.UserObj, 7), ent(posixacl.User, 7, 65534), ent(posixacl.GroupObj, 5),
		ent(posixacl.Mask, 7), ent(posixacl.Other, 5))
	wantCode(t, s.SetXattr(d.Ino, posixacl.DefaultName, def, 0, 2), wire.CodeOK)
	wantMode(t, s, d.Ino, 0o700) // a default ACL leaves the mode

	f := must[Attr](t)(st.Create(d.Ino, "f", 0o666, 0, 0, 0, 3))
	wantMode(t, s, f.Ino, 0o664)
	wantXattr(t, s, f.Ino, posixacl.AccessName, aclOf(ent(posixacl.UserObj, 6), ent(posixacl.User, 7, 65534),
		ent(posixacl.GroupObj, 5), ent(posixacl.Mask, 6), ent(posixacl.Other, 4)))
	wantXattr(t, s, f.Ino, posixacl.DefaultName, nil)

	sub := must[Attr](t)(st.Mkdir(d.Ino, "s", 0o755, 0, 0, 4))
	wantMode(t, s, sub.Ino, 0o755)
	wantXattr(t, s, sub.Ino, posixacl.DefaultName, def)
	g := must[Attr](t)(st.CreateAs(must[ids.Ino](t)(s.AllocInos(1)), sub.Ino, "g", 0o640, 0, 0, 5))
	wantMode(t, s, g.Ino, 0o640)
	if _, err := s.GetXattr(g.Ino, posixacl.AccessName); err != nil {
		t.Fatalf("a file made behind its caller inherits no ACL: %v", err)
	}
	if has := must[bool](t)(s.HasDefaultACL(sub.Ino)); !has {
		t.Fatal("HasDefaultACL of an inheriting directory")
	}
	if has := must[bool](t)(s.HasDefaultACL(ids.RootIno)); has {
		t.Fatal("HasDefaultACL of the root")
	}

	l := must[Attr](t)(st.Symlink(d.Ino, "l", "f", 0, 0, 6))
	wantMode(t, s, l.Ino, 0o777)
	wantXattr(t, s, l.Ino, posixacl.AccessName, nil)
}
