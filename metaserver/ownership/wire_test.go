package ownership

import (
	"bytes"
	"testing"

	"github.com/leasefs/leasefs/metaserver/replica"
	"github.com/leasefs/leasefs/metaserver/store"
)

// FuzzTransferDecode: the transfer calls' decoders never panic, and what
// they accept encodes back to the same bytes (up to trailing bytes, which
// they ignore).
func FuzzTransferDecode(f *testing.F) {
	tx := &store.Tx{}
	key := tx.Key64(store.RecPage, 5, 3)
	recs := []store.Write{{Key: key, Value: []byte("chunk")}, {Key: tx.Key(store.RecAttr, 5, nil), Value: []byte{1, 2}}}
	tr := replica.Transfer{Ino: 5, ID: 7, Replaces: 3, Epoch: 9, SrcEpoch: 8, Version: 11}
	f.Add(encodeStage(tr, 2, recs, true))
	f.Add(encodeStatePage(replica.StatePage{Ino: 5, Epoch: 9, Version: 11, Records: recs})[1:])
	f.Add(encodeStateReq(5, key, transferPage))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if tr, seq, recs, last, err := decodeStage(b); err == nil {
			if got := encodeStage(tr, seq, recs, last); !bytes.HasPrefix(b, got) {
				t.Fatalf("stage %x re-encodes as %x", b, got)
			}
		}
		if p, err := decodeStatePage(5, &dec{b: b}); err == nil {
			if got := encodeStatePage(p)[1:]; !bytes.HasPrefix(b, got) {
				t.Fatalf("page %x re-encodes as %x", b, got)
			}
		}
		if ino, after, max, err := decodeStateReq(b); err == nil && max > transferPage {
			t.Fatalf("request for %v after %x asks %d bytes a page", ino, after, max)
		}
	})
}
