package wire

import (
	"errors"
	"fmt"
)

// Batches. A client that sends changes behind its caller (removals under a
// directory's X lock) sends those queued for one directory in one OpBatch
// request: one round trip and one server request instead of one each. The
// batch request's Parent is the directory (its owner serves it) and its
// Data the changes, each a whole request body; the reply's Data holds one
// reply per change, in order. Every change carries its ReqID, so a batch
// sent again after a NACK or a redirect applies none twice.

// MaxBatch bounds the requests of one batch.
const MaxBatch = 64

var ErrBadBatch = errors.New("wire: bad batch")

// AppendBatch encodes reqs as a batch's Data.
func AppendBatch(b []byte, reqs []*Request) []byte {
	e := enc{b}
	e.u32(uint32(len(reqs)))
	for _, r := range reqs {
		n := len(e.b)
		e.u32(0)
		e.b = r.Append(e.b)
		putLen(e.b[n:], len(e.b)-n-4)
	}
	return e.b
}

// ParseBatch decodes a batch's Data: 1 to MaxBatch changes (Op.Changes,
// with a ReqID) of one directory, none of them a batch. Their Data
// aliases b.
func ParseBatch(b []byte) ([]*Request, error) {
	d := dec{b: b}
	n := d.count(MaxBatch, 4)
	if d.err == nil && n == 0 {
		d.fail(fmt.Errorf("%w: empty", ErrBadBatch))
	}
	reqs := make([]*Request, 0, n)
	for range n {
		body := d.bytes(MaxData)
		if d.err != nil {
			break
		}
		r, err := ParseRequest(body)
		if err != nil {
			return nil, fmt.Errorf("%w: request %d: %w", ErrBadBatch, len(reqs), err)
		}
		switch {
		case !r.Op.Changes():
			return nil, fmt.Errorf("%w: %v is not a change", ErrBadBatch, r.Op)
		case r.ReqID == 0:
			return nil, fmt.Errorf("%w: %v without a request id", ErrBadBatch, r.Op)
		case len(reqs) > 0 && r.Home() != reqs[0].Home():
			return nil, fmt.Errorf("%w: changes of inodes %v and %v", ErrBadBatch, reqs[0].Home(), r.Home())
		}
		reqs = append(reqs, r)
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return reqs, nil
}

// AppendBatchReplies encodes the replies to a batch as its reply's Data.
func AppendBatchReplies(b []byte, reps []*Reply) []byte {
	e := enc{b}
	e.u32(uint32(len(reps)))
	for _, r := range reps {
		n := len(e.b)
		e.u32(0)
		e.b = r.Append(e.b)
		putLen(e.b[n:], len(e.b)-n-4)
	}
	return e.b
}

// ParseBatchReplies decodes a batch reply's Data, which must answer want
// requests.
func ParseBatchReplies(b []byte, want int) ([]*Reply, error) {
	d := dec{b: b}
	n := d.count(MaxBatch, 4)
	if d.err == nil && n != want {
		return nil, fmt.Errorf("%w: %d replies to %d requests", ErrBadBatch, n, want)
	}
	reps := make([]*Reply, 0, n)
	for range n {
		body := d.bytes(MaxData)
		if d.err != nil {
			break
		}
		r, err := ParseReply(body)
		if err != nil {
			return nil, fmt.Errorf("%w: reply %d: %w", ErrBadBatch, len(reps), err)
		}
		reps = append(reps, r)
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return reps, nil
}

func putLen(b []byte, n int) {
	b[0], b[1], b[2], b[3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
}
