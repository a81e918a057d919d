package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/leasefs/leasefs/internal/ids"
)

// Batches. A client that sends changes behind its caller (removals and
// creates under a directory's X lock) sends those queued for one directory
// in one OpBatch request: one round trip and one server request instead of
// one each; a new file's data may follow its create in the batch. The
// batch request's Parent is the directory (its owner serves it) and its
// Data the changes, each a whole request body; the reply's Data holds one
// reply per change, in order. Every change carries its ReqID, so a batch
// sent again after a NACK or a redirect applies none twice.

// MaxBatch bounds the requests of one batch.
const MaxBatch = 64

var ErrBadBatch = errors.New("wire: bad batch")

// AppendBatch encodes reqs as a batch's Data.
func AppendBatch(b []byte, reqs []*Request) []byte { return appendFramed(b, reqs) }

// ParseBatch decodes a batch's Data: 1 to MaxBatch changes (Op.Changes,
// with a ReqID) of one directory, or of a file created in it earlier in the
// batch (CreateIno: its data, sent with its create), none of them a batch.
// Their Data aliases b.
func ParseBatch(b []byte) ([]*Request, error) {
	reqs, err := parseFramed(b, "request", ParseRequest)
	if err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrBadBatch)
	}
	created := func(ino ids.Ino, before []*Request) bool {
		return slices.ContainsFunc(before, func(r *Request) bool {
			return r.Op == OpCreate && r.Flags&CreateIno != 0 && r.Ino == ino
		})
	}
	for i, r := range reqs {
		switch {
		case !r.Op.Changes():
			return nil, fmt.Errorf("%w: %v is not a change", ErrBadBatch, r.Op)
		case r.ReqID == 0:
			return nil, fmt.Errorf("%w: %v without a request id", ErrBadBatch, r.Op)
		case r.Home() != reqs[0].Home() && !created(r.Home(), reqs[:i]):
			return nil, fmt.Errorf("%w: changes of inodes %v and %v", ErrBadBatch, reqs[0].Home(), r.Home())
		}
	}
	return reqs, nil
}

// AppendBatchReplies encodes the replies to a batch as its reply's Data.
func AppendBatchReplies(b []byte, reps []*Reply) []byte { return appendFramed(b, reps) }

// ParseBatchReplies decodes a batch reply's Data, which must answer want
// requests.
func ParseBatchReplies(b []byte, want int) ([]*Reply, error) {
	reps, err := parseFramed(b, "reply", ParseReply)
	if err == nil && len(reps) != want {
		return nil, fmt.Errorf("%w: %d replies to %d requests", ErrBadBatch, len(reps), want)
	}
	return reps, err
}

// appendFramed encodes a count, then each message as a length-prefixed body.
func appendFramed[M interface{ Append([]byte) []byte }](b []byte, msgs []M) []byte {
	e := newEnc(b)
	e.U32(uint32(len(msgs)))
	for _, m := range msgs {
		n := len(e.B)
		e.U32(0)
		e.B = m.Append(e.B)
		binary.LittleEndian.PutUint32(e.B[n:], uint32(len(e.B)-n-4))
	}
	return e.B
}

// parseFramed decodes what appendFramed encoded: at most MaxBatch messages.
func parseFramed[M any](b []byte, what string, parse func([]byte) (M, error)) ([]M, error) {
	d := newDec(b)
	n := d.Count(MaxBatch, 4)
	out := make([]M, 0, n)
	for range n {
		body := d.Bytes(MaxData)
		if d.Err() != nil {
			break
		}
		m, err := parse(body)
		if err != nil {
			return nil, fmt.Errorf("%w: %s %d: %w", ErrBadBatch, what, len(out), err)
		}
		out = append(out, m)
	}
	if err := d.End(); err != nil {
		return nil, err
	}
	return out, nil
}
