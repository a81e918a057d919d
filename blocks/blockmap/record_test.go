package blockmap

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/internal/codec"
)

func TestRecords(t *testing.T) {
	e := Extent{Off: 1 << 40, Len: blocks.MaxBlock - 7, Block: Unique{1, 2, 3, 15: 16}, BlockOff: 7}
	rec := AppendExtent([]byte("key"), e)
	if len(rec) != 3+ExtentRecordLen || ExtentRecordLen != 33 {
		t.Errorf("extent record: %d bytes", len(rec)-3)
	}
	if got, err := ParseExtent(rec[3:]); err != nil || got != e {
		t.Errorf("ParseExtent = %v, %v", got, err)
	}
	b := Block{Unique: Unique{9, 15: 1}, Size: blocks.MaxBlock, Sums: blocks.Sum(make([]byte, blocks.MaxBlock))}
	brec := AppendBlock(nil, b)
	if len(brec) != BlockRecordLen(b.Size) || len(brec) != 281 {
		t.Errorf("block record of a 4 MiB block: %d bytes, BlockRecordLen %d", len(brec), BlockRecordLen(b.Size))
	}
	t.Logf("records: %d bytes per extent, %d per 4 MiB block, %d per 4 KiB block",
		ExtentRecordLen, len(brec), BlockRecordLen(4096))
	if got, err := ParseBlock(brec); err != nil || got.Unique != b.Unique || got.Size != b.Size || !slices.Equal(got.Sums, b.Sums) {
		t.Errorf("ParseBlock = %v, %v", got, err)
	}

	for name, c := range map[string]struct {
		rec  []byte
		want error
	}{
		"extent version":      {append([]byte{2}, rec[4:]...), codec.ErrVersion},
		"extent short":        {rec[3 : len(rec)-1], codec.ErrShort},
		"extent trailing":     {append(rec[3:len(rec):len(rec)], 0), codec.ErrTrailing},
		"extent empty":        {AppendExtent(nil, Extent{Off: 5, Block: e.Block}), ErrCorrupt},
		"extent past block":   {AppendExtent(nil, Extent{Off: 5, Len: blocks.MaxBlock, BlockOff: 1}), ErrCorrupt},
		"extent past MaxSize": {AppendExtent(nil, Extent{Off: MaxSize, Len: 1}), ErrCorrupt},
		"block version":       {append([]byte{0}, brec[1:]...), codec.ErrVersion},
		"block sums":          {AppendBlock(nil, Block{Size: 100, Sums: blocks.Sums{1, 2}}), ErrCorrupt},
		"block empty":         {AppendBlock(nil, Block{}), ErrCorrupt},
		"block too large":     {AppendBlock(nil, Block{Size: blocks.MaxBlock + 1, Sums: make(blocks.Sums, maxSums+1)}), codec.ErrTooLarge},
		"block count lies":    {brec[:len(brec)-4], codec.ErrTooLarge},
	} {
		var err error
		if name[:5] == "block" {
			_, err = ParseBlock(c.rec)
		} else {
			_, err = ParseExtent(c.rec)
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", name, err, c.want)
		}
	}
}

func FuzzParseExtent(f *testing.F) {
	f.Add(AppendExtent(nil, Extent{Off: 4096, Len: 4096, Block: Unique{1}, BlockOff: 0}))
	f.Add(AppendExtent(nil, Extent{Off: MaxSize - 1, Len: 1, Block: Unique{15: 9}, BlockOff: blocks.MaxBlock - 1}))
	f.Add([]byte{extentVersion})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := ParseExtent(b)
		if err != nil {
			return
		}
		if again := AppendExtent(nil, e); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", again, b)
		}
	})
}

func FuzzParseBlock(f *testing.F) {
	f.Add(AppendBlock(nil, Block{Unique: Unique{1}, Size: 4096, Sums: blocks.Sums{7}}))
	f.Add(AppendBlock(nil, Block{Unique: Unique{2}, Size: blocks.MaxBlock, Sums: make(blocks.Sums, maxSums)}))
	f.Add([]byte{blockVersion, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		blk, err := ParseBlock(b)
		if err != nil {
			return
		}
		if again := AppendBlock(nil, blk); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", again, b)
		}
		if _, err := Load(1, []Block{blk}, []Extent{{Off: 0, Len: blk.Size, Block: blk.Unique}}); err != nil {
			t.Fatalf("a parsed block does not load: %v", err)
		}
	})
}
