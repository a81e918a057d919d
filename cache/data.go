package cache

import (
	"bytes"
	"container/list"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/internal/pagemem"
	"github.com/leasefs/leasefs/wire"
)

// PageSize is the unit of cached file data.
const PageSize = 4096

// page is PageSize bytes of a file at index idx. A shorter page is the
// file's last: the file ends where it ends (an empty page marks an end on a
// page boundary). That is only true while the lock is held, like the rest.
type page struct {
	ino    ids.Ino
	idx    uint64
	data   []byte
	pooled bool // data is from the cache's page pool, to go back when the page goes
}

// newPage makes ino's page idx with a copy of src. A whole page's copy is
// in a pooled page (see package pagemem: fresh memory costs a fault per
// page); a file's short last page is on the heap, where it takes no more
// than its length.
func (c *Cache) newPage(ino ids.Ino, idx uint64, src []byte) *page {
	if len(src) != PageSize {
		return &page{ino: ino, idx: idx, data: bytes.Clone(src)}
	}
	if c.pool == nil {
		c.pool = pagemem.New(PageSize)
	}
	b := c.pool.Get()
	copy(b, src)
	return &page{ino: ino, idx: idx, data: b, pooled: true}
}

// freePage gives p's memory back; p is out of the LRU and its file's map,
// and ReadData copied out of it under the same lock, so nothing else holds
// it.
func (c *Cache) freePage(p *page) {
	if p.pooled {
		c.pool.Put(p.data)
	}
	p.data, p.pooled = nil, false
}

// removePage takes a page out of the LRU and frees it; the caller removes
// it from its file's map.
func (c *Cache) removePage(el *list.Element) {
	p := el.Value.(*page)
	c.dataBytes -= int64(len(p.data))
	c.lru.Remove(el)
	c.freePage(p)
}

// The data cache holds file pages under S or X, in one LRU across files
// bounded by bytes. A write this client buffers under its X lock goes into
// the pages (WriteData); any other change of a file's data drops its pages
// (DropData, BeginChange). Both bump a generation, so a read that raced
// with the change cannot put back what it fetched before it (PutData's gen).

// DataGen is the generation a reader takes before it asks the server; pass
// it to PutData.
func (c *Cache) DataGen() uint64 { return c.dataGen }

// SetDataBudget bounds the bytes of cached file data (0: cache none).
func (c *Cache) SetDataBudget(bytes int64) {
	c.dataMax = bytes
	c.shrinkData()
}

// PutData caches data of file version `version` read from the server at
// page-aligned off, fetched after DataGen returned gen. eof: the file ends
// at off+len(data). Ignored unless a lock covers the inode, nothing dropped
// its data since gen and no newer version is cached.
func (c *Cache) PutData(ino ids.Ino, off uint64, data []byte, eof bool, version, gen uint64) {
	e := c.inodes[ino]
	if e == nil {
		return
	}
	if version > e.seenVersion {
		e.seenVersion = version
		if e.dataVersion < version {
			c.clearPages(e) // older than what a read just returned
		}
	}
	if !c.mayCache(e, ino) || e.changing > 0 || e.dataDropped > gen || off%PageSize != 0 || c.dataMax <= 0 || version < e.seenVersion {
		return
	}
	e.dataVersion = version
	if e.pages == nil {
		e.pages = map[uint64]*list.Element{}
	}
	idx := off / PageSize
	for len(data) > 0 || eof {
		n := min(len(data), PageSize)
		if n < PageSize && !eof {
			break // a partial page that is not the end: not a page's content
		}
		// a copy: a page aliasing the reply would keep all of it alive
		// for as long as the page stays, whatever else the LRU evicted
		c.putPage(e, c.newPage(ino, idx, data[:n]))
		data = data[n:]
		idx++
		if n < PageSize {
			break // the end of the file
		}
	}
	c.shrinkData()
}

func (c *Cache) putPage(e *entry, p *page) {
	if old, ok := e.pages[p.idx]; ok {
		c.removePage(old)
	}
	e.pages[p.idx] = c.lru.PushFront(p)
	c.dataBytes += int64(len(p.data))
}

// ReadData copies into dest the bytes at off from cached pages (fewer at
// the end of the file) and returns how many, or false if a page is missing
// or no lock covers the inode.
func (c *Cache) ReadData(ino ids.Ino, off uint64, dest []byte) (int, bool) {
	e := c.inodes[ino]
	if e == nil || e.mode == wire.LockNone || len(e.pages) == 0 {
		return 0, false
	}
	n := 0
	for pos, end := off, off+uint64(len(dest)); pos < end; {
		el, ok := e.pages[pos/PageSize]
		if !ok {
			return 0, false
		}
		p := el.Value.(*page)
		in := pos % PageSize
		if in >= uint64(len(p.data)) {
			break // past the end of the file
		}
		k := copy(dest[n:], p.data[in:])
		n += k
		pos += uint64(k)
		c.lru.MoveToFront(el)
		if len(p.data) < PageSize && in+uint64(k) == uint64(len(p.data)) {
			break
		}
	}
	return n, true
}

// DataCurrent reports whether data of file version `version` fetched
// after DataGen returned gen is still what a read of ino returns: what
// PutData would cache, and nothing dropped since. For data a reader keeps
// outside the cache.
func (c *Cache) DataCurrent(ino ids.Ino, version, gen uint64) bool {
	e := c.inodes[ino]
	return e != nil && e.mode != wire.LockNone && e.changing == 0 && e.dataDropped <= gen && version >= e.seenVersion
}

// HasData reports whether the pages of [off, off+size) are cached (or the
// file ends before), so that a read of them needs no server.
func (c *Cache) HasData(ino ids.Ino, off, size uint64) bool {
	e := c.inodes[ino]
	if e == nil || e.mode == wire.LockNone || len(e.pages) == 0 {
		return false
	}
	for idx := off / PageSize; idx*PageSize < off+size; idx++ {
		el, ok := e.pages[idx]
		if !ok {
			return false
		}
		if len(el.Value.(*page).data) < PageSize {
			return true // the file's last page
		}
	}
	return true
}

// A client's writes put new pages into the cache only within the first
// half of the data budget of a file's bytes, the size up to which the
// client reads a file around its reads (client.readAround): a file that
// fits is read back soon and randomly (build outputs, a database); past
// that, a file written through (a copy, an archive, a stream) would push
// its own first pages out, and everything else, and caching each of its
// pages cost a quarter of a sequential write's time.
func (c *Cache) writeCacheSpan() uint64 { return uint64(c.dataMax / 2) }

// WriteData puts a write that this client buffered under its X lock into
// ino's cached pages, so that reading back what it wrote needs no server:
// pages the write covers whole (to the file's end, for the last) are
// cached if the write ends within writeCacheSpan, pages it covers in part
// are patched where cached. size is the file's size before the write.
// Reads in flight cache nothing: they fetched the file without the write.
func (c *Cache) WriteData(ino ids.Ino, off uint64, data []byte, size uint64) {
	c.writeData(ino, off, data, size, true)
}

// PatchData is WriteData that caches no new page: it only keeps the pages
// already cached right. For a client that reads its writes back as cheaply
// from where it stores them as from the cache.
func (c *Cache) PatchData(ino ids.Ino, off uint64, data []byte, size uint64) {
	c.writeData(ino, off, data, size, false)
}

func (c *Cache) writeData(ino ids.Ino, off uint64, data []byte, size uint64, fill bool) {
	e := c.inodes[ino]
	if e == nil {
		return
	}
	c.dataGen++
	e.dataDropped = c.dataGen
	e.blockMap = nil // the write's commit changes it
	if e.mode != wire.LockExclusive || e.changing > 0 || c.dataMax <= 0 {
		c.clearPages(e)
		return
	}
	end := off + uint64(len(data))
	newSize := max(size, end)
	// The page that ended the file (short, or empty on a page boundary)
	// no longer does: what lies between the old end and the write is a
	// hole, zeros.
	if el, ok := e.pages[size/PageSize]; ok && newSize > size {
		c.growPage(el.Value.(*page), newSize)
	}
	for idx := off / PageSize; idx*PageSize < end; idx++ {
		start := idx * PageSize
		lo, hi := max(off, start), min(end, start+PageSize)
		if el, ok := e.pages[idx]; ok {
			p := el.Value.(*page)
			c.growPage(p, newSize)
			copy(p.data[lo-start:], data[lo-off:hi-off])
			c.lru.MoveToFront(el)
		} else if fill && end <= c.writeCacheSpan() && lo == start && hi == min(start+PageSize, newSize) {
			if e.pages == nil {
				e.pages = map[uint64]*list.Element{}
			}
			// a copy of its own: pages sharing one buffer would keep all
			// of it alive while any of them stays, past the budget
			c.putPage(e, c.newPage(ino, idx, data[lo-off:hi-off]))
		}
	}
	c.shrinkData()
}

// growPage extends a file's last page, zero-filled, to where a file of
// size bytes has that page end.
func (c *Cache) growPage(p *page, size uint64) {
	want := min(PageSize, size-p.idx*PageSize)
	if grow := int(want) - len(p.data); grow > 0 {
		// (a pooled page is whole: only a heap page grows)
		p.data = append(p.data, make([]byte, grow)...)
		c.dataBytes += int64(grow)
	}
}

// OwnVersion records that the server gave ino version v for a change this
// client flushed: its pages, which have the change already (WriteData),
// are of that version, and a read returning it must not drop them.
func (c *Cache) OwnVersion(ino ids.Ino, v uint64) {
	e := c.inodes[ino]
	if e == nil || e.mode == wire.LockNone {
		return
	}
	e.seenVersion = max(e.seenVersion, v)
	e.dataVersion = max(e.dataVersion, v)
}

// DropData forgets ino's cached pages; a read in flight will not cache
// what it fetched.
func (c *Cache) DropData(ino ids.Ino) {
	e := c.inodes[ino]
	if e == nil {
		return
	}
	c.dropPages(e)
}

// BeginChange drops ino's pages and caches none until EndChange: the
// client is changing the file's data at the server.
func (c *Cache) BeginChange(ino ids.Ino) {
	e := c.get(ino)
	e.changing++
	c.dropPages(e)
}

// EndChange ends a change BeginChange began; reads that overlapped it
// cache nothing.
func (c *Cache) EndChange(ino ids.Ino) {
	e := c.inodes[ino]
	if e == nil {
		return
	}
	e.changing--
	c.dropPages(e)
}

func (c *Cache) dropPages(e *entry) {
	c.dataGen++
	e.dataDropped = c.dataGen
	c.clearPages(e)
}

// clearPages frees e's pages without voiding reads in flight.
func (c *Cache) clearPages(e *entry) {
	for _, el := range e.pages {
		c.removePage(el)
	}
	e.pages = nil
	e.blockMap = nil
}

// PutMap keeps m, what a lookup of file version `version` answered of
// ino's block map (fetched after DataGen returned gen), until the file's
// data is dropped or changed by this client: a read it covers then needs
// no lookup. Ignored where PutData would ignore data.
func (c *Cache) PutMap(ino ids.Ino, m any, version, gen uint64) {
	e := c.inodes[ino]
	if e == nil || !c.mayCache(e, ino) || e.changing > 0 || e.dataDropped > gen || version < e.seenVersion {
		return
	}
	if version > e.seenVersion {
		e.seenVersion = version
		c.clearPages(e)
		e.dataVersion = version
	}
	e.blockMap = m
}

// Map returns what PutMap kept of ino's block map, while a lock covers it.
func (c *Cache) Map(ino ids.Ino) (any, bool) {
	e := c.inodes[ino]
	if e == nil || e.mode == wire.LockNone || e.blockMap == nil {
		return nil, false
	}
	return e.blockMap, true
}

// shrinkData evicts least recently used pages down to the budget.
func (c *Cache) shrinkData() {
	for c.dataBytes > c.dataMax {
		el := c.lru.Back()
		if el == nil {
			return
		}
		p := el.Value.(*page)
		if e := c.inodes[p.ino]; e != nil {
			delete(e.pages, p.idx)
		}
		c.removePage(el)
	}
}

// DataBytes is the size of the cached file data.
func (c *Cache) DataBytes() int64 { return c.dataBytes }
