package pagemem

import "testing"

func TestPoolReusesPages(t *testing.T) {
	p := New(4096)
	seen := map[*byte]bool{}
	var pages [][]byte
	for range 2 * SlabSize / 4096 {
		b := p.Get()
		if len(b) != 4096 || cap(b) != 4096 {
			t.Fatalf("page of len %d cap %d", len(b), cap(b))
		}
		if seen[&b[0]] {
			t.Fatal("a page handed out twice")
		}
		seen[&b[0]] = true
		b[0], b[4095] = 1, 2 // writable, whole
		pages = append(pages, b)
	}
	if p.Slabs() != 2 {
		t.Fatalf("%d slabs for two slabs' worth of pages", p.Slabs())
	}
	for _, b := range pages {
		p.Put(b[:10]) // a shortened page comes back whole
	}
	for range len(pages) {
		if b := p.Get(); !seen[&b[0]] || len(b) != 4096 {
			t.Fatal("a page not from the free list after every page came back")
		}
	}
	if p.Slabs() != 2 {
		t.Fatalf("%d slabs: pages given back were not reused", p.Slabs())
	}
}
