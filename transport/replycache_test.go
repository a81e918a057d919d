package transport

import (
	"errors"
	"testing"
)

func TestReplyCacheDedup(t *testing.T) {
	c := newReplyCache(4, 1<<20)
	e, run, err := c.begin(1)
	if !run || err != nil {
		t.Fatal("first begin must run")
	}
	dup, run, err := c.begin(1)
	if run || err != nil || dup != e {
		t.Fatal("in-flight duplicate must wait for the first execution")
	}
	select {
	case <-dup.done:
		t.Fatal("done before finish")
	default:
	}
	c.finish(1, e, []byte("r1"), false)
	<-dup.done
	if r, ok, _ := c.result(dup); !ok || string(r) != "r1" {
		t.Fatalf("result %q %v", r, ok)
	}
	dup, run, _ = c.begin(1)
	if run {
		t.Fatal("finished duplicate must not run")
	}
	if r, _, _ := c.result(dup); string(r) != "r1" {
		t.Fatalf("cached %q", r)
	}
}

func TestReplyCacheEviction(t *testing.T) {
	c := newReplyCache(4, 1<<20)
	for seq := uint64(1); seq <= 10; seq++ {
		e, run, err := c.begin(seq)
		if !run || err != nil {
			t.Fatalf("seq %d: run %v err %v", seq, run, err)
		}
		c.finish(seq, e, []byte{byte(seq)}, false)
	}
	if len(c.entries) != 4 || c.live() != 4 {
		t.Fatalf("%d entries, %d live, want 4", len(c.entries), c.live())
	}
	// evicted seqs are refused, never executed again
	for seq := uint64(1); seq <= 6; seq++ {
		if _, _, err := c.begin(seq); !errors.Is(err, ErrReplyEvicted) {
			t.Fatalf("seq %d: %v, want ErrReplyEvicted", seq, err)
		}
	}
	for seq := uint64(7); seq <= 10; seq++ {
		e, run, err := c.begin(seq)
		if run || err != nil {
			t.Fatalf("seq %d should be cached", seq)
		}
		if r, ok, _ := c.result(e); !ok || r[0] != byte(seq) {
			t.Fatalf("seq %d: %v %v", seq, r, ok)
		}
	}
	// in-flight entries are not evicted by finished ones
	inflight, _, _ := c.begin(11)
	for seq := uint64(12); seq <= 30; seq++ {
		e, _, _ := c.begin(seq)
		c.finish(seq, e, nil, false)
	}
	if e, run, err := c.begin(11); run || err != nil || e != inflight {
		t.Fatal("in-flight entry lost")
	}
	if len(c.order) > 64+2*4+1 {
		t.Fatalf("order grew to %d", len(c.order))
	}
}

func TestReplyCacheBytes(t *testing.T) {
	c := newReplyCache(100, 10)
	for seq := uint64(1); seq <= 5; seq++ {
		e, _, _ := c.begin(seq)
		c.finish(seq, e, []byte("1234"), false)
	}
	if c.bytes > 10 {
		t.Fatalf("%d bytes kept, bound 10", c.bytes)
	}
	// old bodies dropped: known seq, but no reply, and no second execution
	e, run, err := c.begin(1)
	if run || err != nil {
		t.Fatal("seq 1 must stay known")
	}
	if _, ok, _ := c.result(e); ok {
		t.Fatal("seq 1 body should be dropped")
	}
	e, _, _ = c.begin(5)
	if r, ok, _ := c.result(e); !ok || string(r) != "1234" {
		t.Fatal("newest reply must be kept")
	}
	// one reply larger than the whole budget is still delivered
	e, _, _ = c.begin(6)
	c.finish(6, e, make([]byte, 100), false)
	if r, ok, _ := c.result(e); !ok || len(r) != 100 {
		t.Fatal("newest large reply dropped")
	}
}
