// Package pagemem hands out fixed-size pages carved from large slabs.
//
// Why: a mount caches file data page by page, and fresh memory costs a
// page fault per 4 KiB on first touch; on a virtual machine a fault can
// cost more than copying the page. Pages go back to a free list, never to
// the system (which the Go heap does, to fault them in again later): the
// caller bounds how many are in use (the cache's data budget), and that
// bounds the slabs. The slabs are not advised MADV_HUGEPAGE: with the
// kernel's default defrag setting a huge page fault compacts memory
// first, which costs far more than the small faults it saves.
//
// A Pool is not safe for concurrent use; the cache uses it under its lock.
package pagemem

import (
	"golang.org/x/sys/unix"
)

// SlabSize is the size of one mapping: one huge page on x86-64.
const SlabSize = 2 << 20

// Pool hands out pages of one size.
type Pool struct {
	size  int
	free  [][]byte
	slabs int
}

// New returns a pool of pages of size bytes (a divisor of SlabSize).
func New(size int) *Pool {
	if size <= 0 || SlabSize%size != 0 {
		panic("pagemem: page size must divide the slab size")
	}
	return &Pool{size: size}
}

// Get returns a page of the pool's size (len and cap), holding whatever it
// held before: the caller overwrites or clears it.
func (p *Pool) Get() []byte {
	if len(p.free) == 0 {
		p.grow()
	}
	b := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return b
}

// Put returns a page Get handed out. The caller must hold no other
// reference to it.
func (p *Pool) Put(b []byte) {
	p.free = append(p.free, b[:p.size:p.size])
}

// Slabs is the number of slabs mapped, for memory accounting.
func (p *Pool) Slabs() int { return p.slabs }

// Free is the number of pages not handed out.
func (p *Pool) Free() int { return len(p.free) }

func (p *Pool) grow() {
	slab, err := unix.Mmap(-1, 0, SlabSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		// no address space or a limit: ordinary memory, as without the pool
		slab = make([]byte, SlabSize)
	}
	p.slabs++
	for off := SlabSize - p.size; off >= 0; off -= p.size {
		p.free = append(p.free, slab[off:off+p.size:off+p.size])
	}
}
