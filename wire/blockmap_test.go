package wire

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
)

func sampleCommit() ([]blockmap.Block, []blockmap.Extent) {
	blks := []blockmap.Block{
		{Unique: blockmap.Unique{1, 2, 3}, Size: 100, Sums: blocks.Sums{7}},
		{Unique: blockmap.Unique{9}, Size: blocks.ChunkSize + 1, Sums: blocks.Sums{1, 2}},
	}
	exts := []blockmap.Extent{
		{Off: 0, Len: 100, Block: blks[0].Unique},
		{Off: 1 << 30, Len: 5, Block: blks[1].Unique, BlockOff: 3},
	}
	return blks, exts
}

func samplePieces() []blockmap.Piece {
	return []blockmap.Piece{
		{Off: 10, Len: 90, Block: blocks.ID{Ino: 5, Unique: blockmap.Unique{1, 2, 3}}, BlockOff: 10, Size: 100, Sums: blocks.Sums{7}},
		{Off: 100, Len: 1 << 20, Hole: true},
		{Off: 100 + 1<<20, Len: 4, Block: blocks.ID{Ino: 5, Unique: blockmap.Unique{9}}, Size: blocks.ChunkSize + 1, Sums: blocks.Sums{1, 2}},
	}
}

func TestCommitRoundTrip(t *testing.T) {
	blks, exts := sampleCommit()
	req := &Request{Op: OpCommitBlocks, Ino: 5, Size: 1<<30 + 5, ReqID: 3, Data: AppendCommit(nil, blks, exts)}
	r, err := ParseRequest(req.Append(nil))
	if err != nil {
		t.Fatal(err)
	}
	gb, ge, err := ParseCommit(r.Data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gb, blks) || !reflect.DeepEqual(ge, exts) {
		t.Fatalf("round trip:\n in %+v %+v\nout %+v %+v", blks, exts, gb, ge)
	}
	if gb, ge, err := ParseCommit(AppendCommit(nil, nil, nil)); err != nil || gb != nil || ge != nil {
		t.Fatalf("empty commit: %v %v %v", gb, ge, err)
	}
}

func TestPiecesRoundTrip(t *testing.T) {
	in := samplePieces()
	rep := &Reply{Attr: &Attr{Ino: 5, Size: 1 << 21}, Data: AppendPieces(nil, in)}
	r, err := ParseReply(rep.Append(nil))
	if err != nil {
		t.Fatal(err)
	}
	out, err := ParsePieces(r.Data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip:\n in %+v\nout %+v", in, out)
	}
	if ps, err := ParsePieces(AppendPieces(nil, nil)); err != nil || ps != nil {
		t.Fatalf("no pieces: %v %v", ps, err)
	}
}

func TestBlockMapRejects(t *testing.T) {
	blks, exts := sampleCommit()
	good := AppendCommit(nil, blks, exts)
	many := make([]blockmap.Extent, MaxCommit+1)
	for i := range many {
		many[i] = blockmap.Extent{Off: uint64(i), Len: 1, Block: blks[0].Unique}
	}
	badBlock := blks[0]
	badBlock.Sums = nil
	commits := map[string][]byte{
		"empty":       nil,
		"version":     append([]byte{99}, good[1:]...),
		"truncated":   good[:len(good)-1],
		"trailing":    append(bytes.Clone(good), 0),
		"too many":    AppendCommit(nil, blks, many),
		"bad block":   AppendCommit(nil, []blockmap.Block{badBlock}, nil),
		"bad extent":  AppendCommit(nil, nil, []blockmap.Extent{{Off: 0, Len: 0}}),
		"lying count": append([]byte{blockMapVersion}, 0xff, 0xff, 0xff, 0x0f),
	}
	for name, b := range commits {
		if _, _, err := ParseCommit(b); err == nil {
			t.Errorf("commit %s: parsed", name)
		}
	}
	ps := samplePieces()
	gap := bytes.Clone(AppendPieces(nil, []blockmap.Piece{ps[0], ps[2]}))
	outside := ps[0]
	outside.BlockOff = 11
	sums := ps[2]
	sums.Sums = sums.Sums[:1]
	pieces := map[string][]byte{
		"empty":     nil,
		"version":   append([]byte{99}, AppendPieces(nil, ps)[1:]...),
		"truncated": AppendPieces(nil, ps)[:20],
		"gap":       gap,
		"outside":   AppendPieces(nil, []blockmap.Piece{outside}),
		"sums":      AppendPieces(nil, []blockmap.Piece{sums}),
		"zero":      AppendPieces(nil, []blockmap.Piece{{Off: 1, Hole: true}}),
		"too many":  AppendPieces(nil, make([]blockmap.Piece, MaxPieces+1)),
		"no block":  AppendPieces(nil, []blockmap.Piece{{Off: 0, Len: 1}}),
		"past max":  AppendPieces(nil, []blockmap.Piece{{Off: blockmap.MaxSize, Len: 2, Hole: true}}),
	}
	for name, b := range pieces {
		if _, err := ParsePieces(b); err == nil {
			t.Errorf("pieces %s: parsed", name)
		}
	}
}

func FuzzParseBlockMap(f *testing.F) {
	blks, exts := sampleCommit()
	f.Add(AppendCommit(nil, blks, exts))
	f.Add(AppendPieces(nil, samplePieces()))
	f.Fuzz(func(t *testing.T, b []byte) {
		if blks, exts, err := ParseCommit(b); err == nil {
			if _, _, err := ParseCommit(AppendCommit(nil, blks, exts)); err != nil {
				t.Fatalf("re-encoded commit does not parse: %v", err)
			}
		}
		if ps, err := ParsePieces(b); err == nil {
			if _, err := ParsePieces(AppendPieces(nil, ps)); err != nil {
				t.Fatalf("re-encoded pieces do not parse: %v", err)
			}
		}
	})
}
