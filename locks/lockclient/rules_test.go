package lockclient

import "testing"

// TestReordered: whatever order grants and revocations of one inode
// arrive in, the client applies only what their numbers allow.
func TestReordered(t *testing.T) {
	var r Rules
	var in Inode
	if ok, newest := r.Granted(&in, 3); !ok || !newest {
		t.Fatal("first grant refused")
	}
	// a late revocation of an older grant: overtaken, not applied
	if r.Revoked(&in, 2) {
		t.Fatal("a revocation older than the grant applied")
	}
	if r.Ack(&in, 2) != 2 {
		t.Fatal("not acknowledged with its own number")
	}
	if !r.Revoked(&in, 5) {
		t.Fatal("a newer revocation did not apply")
	}
	// the grant it overtook arrives late
	if ok, _ := r.Granted(&in, 4); ok {
		t.Fatal("a grant older than an applied revocation accepted")
	}
	if ok, newest := r.Granted(&in, 6); !ok || !newest || in.Grant() != 6 {
		t.Fatal("a newer grant refused")
	}
	if ok, newest := r.Granted(&in, 6); !ok || !newest {
		t.Fatal("a duplicate of the newest grant refused")
	}
}

func TestUnsafeIgnoreSeq(t *testing.T) {
	r := Rules{Unsafe: Unsafe{IgnoreSeq: true}}
	var in Inode
	r.Granted(&in, 3)
	if !r.Revoked(&in, 2) || r.Ack(&in, 2) != 3 {
		t.Fatal("ignore-seq still orders")
	}
	if ok, _ := r.Granted(&in, 1); !ok {
		t.Fatal("ignore-seq refused a grant")
	}
}
