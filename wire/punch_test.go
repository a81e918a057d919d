package wire

import "testing"

func TestPunchRequest(t *testing.T) {
	req := &Request{Op: OpPunch, Ino: 7, Off: 5 << 30, Size: 1<<40 + 3, Flags: PunchZeroRange | PunchKeepSize, ReqID: 9}
	r, err := ParseRequest(req.Append(nil))
	if err != nil || r.Op != OpPunch || r.Ino != 7 || r.Off != req.Off || r.Size != req.Size || r.Flags != req.Flags {
		t.Fatalf("round trip: %+v, %v", r, err)
	}
	if OpPunch.String() != "punch" || !OpPunch.Owned() || !OpPunch.Changes() || req.OriginIno() != 7 {
		t.Fatal("OpPunch: an owned change of its inode, named punch")
	}
}
