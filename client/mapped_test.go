package client

import (
	"bytes"
	"slices"
	"testing"
)

func TestChangedWords(t *testing.T) {
	base := make([]byte, 40)
	for _, c := range []struct {
		off     uint64
		changed []int // bytes of data that differ from base
		want    [][2]int
	}{
		{0, nil, nil},
		{0, []int{0}, [][2]int{{0, 8}}},
		// a store that leaves a byte as it was still writes its word
		{0, []int{0, 5}, [][2]int{{0, 8}}},
		{0, []int{7, 8}, [][2]int{{0, 16}}},
		{0, []int{3, 20}, [][2]int{{0, 8}, {16, 24}}},
		{0, []int{39}, [][2]int{{32, 40}}},
		// data at an offset that is not a word's: words of the file
		{5, []int{0}, [][2]int{{0, 3}}},
		{5, []int{3}, [][2]int{{3, 11}}},
		{5, []int{2, 3}, [][2]int{{0, 11}}},
		{5, []int{36}, [][2]int{{35, 40}}},
	} {
		data := bytes.Clone(base)
		for _, i := range c.changed {
			data[i] = 1
		}
		if got := changedWords(c.off, data, base); !slices.Equal(got, c.want) {
			t.Errorf("off %d, changed %v: %v, want %v", c.off, c.changed, got, c.want)
		}
	}
}

func TestOverlayExtents(t *testing.T) {
	exts := []extent{{off: 10, data: []byte("abc")}, {off: 20, data: []byte("xyz")}}
	for _, c := range []struct {
		off  uint64
		buf  string
		n    int
		want string
	}{
		{0, "................", 16, "..........abc..."},
		// past what was read: the gap is a hole
		{0, "..........................", 5, ".....\x00\x00\x00\x00\x00abc\x00\x00\x00\x00\x00\x00\x00xyz"},
		{11, "....", 4, "bc.."},
		{21, "....", 0, "yz"},
		{30, "....", 2, ".."},
	} {
		buf := []byte(c.buf)
		n := overlayExtents(exts, c.off, buf, c.n)
		if got := string(buf[:n]); got != c.want {
			t.Errorf("off %d n %d: %q, want %q", c.off, c.n, got, c.want)
		}
	}
}
