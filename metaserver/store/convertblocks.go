package store

// Conversion of file data from pages ('P') to blocks (store format 4).
//
// A file converts in three steps, each a transaction or several, so that
// none exceeds badger's transaction size and a crash at any point resumes:
//
//  1. Stage: each MaxBlock window of the file that holds data is Put as a
//     new block, then its extent and block records are committed, one
//     window per transaction, while the file stays paged. Readers of a
//     paged file never look at those records (Read reads pages; the block
//     map operations answer ErrNotMapped), so a staged file reads as before.
//  2. Switch: one transaction marks the file block-mapped. From then on
//     its data is the staged map, and its pages are ignored (Read answers
//     ErrMapped): the switch is the one atomic step a reader sees.
//  3. Drop the pages, deleteBatch per transaction.
//
// A crash in 1 resumes after the last staged window (a block put but not
// committed is an orphan, which the collector removes); one after 2 is
// finished by the next run, which finds the block-mapped file's pages. Nothing else changes the store meanwhile: the server runs
// the conversion at start, before it serves. In a cluster each inode must
// be converted by its owner (only the owner changes an inode's records);
// this conversion is for a single server.

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// convertLogEvery spaces the conversion's progress lines.
const convertLogEvery = 10 * time.Second

// mapBatch is how many data-less files one transaction marks block-mapped.
const mapBatch = 1024

// ConvertPagesToBlocks moves every file's data from pages into blocks of
// bs (durable before they are referenced), marks every regular file
// block-mapped, and sets the store's format to 4. It returns the files
// whose data it moved and the bytes it put. A store of format 4 has
// nothing to convert. Interrupted (ctx, a crash), it leaves the store
// readable and a later call carries on; the blocks it put but did not
// commit are orphans the collector removes. All-zero pages become holes.
func (s *Store) ConvertPagesToBlocks(ctx context.Context, bs blocks.Store, log *slog.Logger) (files, bytes int, err error) {
	if log == nil {
		log = s.log
	}
	format, err := s.format()
	if err != nil || format == storeFormat {
		return 0, 0, err
	}
	c := converter{s: s, bs: bs, log: log, start: time.Now()}
	c.lastLog = c.start
	defer func() {
		if err != nil {
			err = fmt.Errorf("converting file data from pages to blocks (%d files, %d bytes done; running it again resumes): %w", c.files, c.bytes, err)
		}
	}()
	for ino := ids.Ino(0); ; ino++ {
		var ok bool
		if ino, ok, err = s.nextPaged(ino); err != nil || !ok {
			break
		}
		if err = c.convertFile(ctx, ino); err != nil {
			return c.files, c.bytes, err
		}
	}
	if err == nil {
		err = s.mapDataless(ctx)
	}
	if err == nil {
		err = s.kv.update(func(t kvTxn) error { return t.set(formatKey, []byte{storeFormat}) })
	}
	if err != nil {
		return c.files, c.bytes, err
	}
	log.Info("store upgraded: file data moved from pages to blocks", "files", c.files, "bytes", c.bytes,
		"took", time.Since(c.start).Round(time.Millisecond))
	return c.files, c.bytes, nil
}

// format reads the store's format record.
func (s *Store) format() (byte, error) {
	var format byte
	err := s.kv.view(func(t kvTxn) error {
		_, err := t.get(formatKey, func(v []byte) error {
			if len(v) != 1 {
				return fmt.Errorf("corrupt store format record (%d bytes)", len(v))
			}
			format = v[0]
			return nil
		})
		return err
	})
	return format, err
}

// nextPaged returns the first inode from from on that has a page, one seek.
func (s *Store) nextPaged(from ids.Ino) (ino ids.Ino, ok bool, err error) {
	err = s.view(func(tx *Tx) error {
		return tx.scan([]byte{RecPage}, tx.key(RecPage, from, nil), false, false, func(k, _ []byte) (bool, error) {
			ino, ok = KeyIno(k), true
			return false, nil
		})
	})
	return ino, ok, err
}

type converter struct {
	s            *Store
	bs           blocks.Store
	log          *slog.Logger
	start        time.Time
	lastLog      time.Time
	files, bytes int
	buf          []byte // one window of the file
}

// convertFile converts one file that has pages: stages its data, switches
// it to its block map and drops its pages, or only drops them if the
// switch is done already (or the inode is gone).
func (c *converter) convertFile(ctx context.Context, ino ids.Ino) error {
	var n inode
	var m *blockmap.Map
	found := true
	err := c.s.view(func(tx *Tx) error {
		in, err := tx.inode(ino)
		if err == errNotFound {
			found = false
			return nil
		}
		if err != nil {
			return err
		}
		if modeType(in.Mode) != syscall.S_IFREG {
			return wire.Errf(wire.CodeIO, "%v has pages but is not a regular file", ino)
		}
		n = *in
		if !n.mapped {
			m, err = tx.blockMap(ino) // what an interrupted run staged
		}
		return err
	})
	if err != nil {
		return err
	}
	if found && !n.mapped {
		if err := c.stage(ctx, &n, m); err != nil {
			return err
		}
		if err := c.s.switchToBlocks(ino); err != nil {
			return err
		}
		c.files++
		if err := c.s.convertHook(ino, "switch"); err != nil {
			return err
		}
	}
	return c.s.dropPages(ino)
}

// stage puts each window of n's data past what m holds as a block and
// commits its records, the file still paged.
func (c *converter) stage(ctx context.Context, n *inode, m *blockmap.Map) error {
	var from uint64
	if exts := m.Extents(); len(exts) > 0 {
		from = (exts[len(exts)-1].Off/blocks.MaxBlock + 1) * blocks.MaxBlock
	}
	if c.buf == nil {
		c.buf = make([]byte, blocks.MaxBlock)
	}
	for from < n.Size {
		if err := ctx.Err(); err != nil {
			return err
		}
		win, lo, exts, err := c.readWindow(n, from)
		if err != nil || exts == nil {
			return err // exts nil: no data left
		}
		from = win + blocks.MaxBlock
		if len(exts) == 0 {
			continue // all-zero pages only
		}
		data := c.buf[:exts[len(exts)-1].End()-lo]
		id := blocks.NewID(n.Ino)
		if err := c.bs.Put(ctx, id, data); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		b := blockmap.Block{Unique: id.Unique, Size: uint64(len(data)), Sums: blocks.Sum(data)}
		for i := range exts {
			exts[i].Block = b.Unique
		}
		if err := c.s.stageBlock(n.Ino, m, b, exts); err != nil {
			return err
		}
		c.bytes += len(data)
		if err := c.s.convertHook(n.Ino, "stage"); err != nil {
			return err
		}
		if time.Since(c.lastLog) >= convertLogEvery {
			c.lastLog = time.Now()
			c.log.Info("converting file data from pages to blocks", "files", c.files, "bytes", c.bytes,
				"elapsed", time.Since(c.start).Round(time.Second))
		}
	}
	return nil
}

// readWindow reads the MaxBlock window of n that holds its first page at
// or past from into c.buf, from lo (the first data byte) on, and returns
// the window's start and the extents of its data (without their block;
// BlockOff from lo). No page at or past from: nil extents. A page of
// zeros is a hole; so are the bytes past a page's stored length.
func (c *converter) readWindow(n *inode, from uint64) (win, lo uint64, exts []blockmap.Extent, err error) {
	err = c.s.view(func(tx *Tx) error {
		end := uint64(0)
		return tx.scan(tx.key(RecPage, n.Ino, nil), tx.key64(RecPage, n.Ino, from/PageSize), false, true, func(k, v []byte) (bool, error) {
			off := binary.BigEndian.Uint64(k[9:]) * PageSize
			if exts == nil {
				win = off / blocks.MaxBlock * blocks.MaxBlock
				exts = []blockmap.Extent{}
			}
			if off >= win+blocks.MaxBlock || off >= n.Size {
				return false, nil
			}
			v = v[:min(uint64(len(v)), n.Size-off)]
			if allZero(v) {
				return true, nil
			}
			if len(exts) == 0 {
				lo = off
			}
			copy(c.buf[off-lo:], v)
			if len(exts) > 0 && end == off {
				exts[len(exts)-1].Len += uint64(len(v))
			} else {
				if len(exts) > 0 {
					clear(c.buf[end-lo : off-lo]) // a hole inside the block
				}
				exts = append(exts, blockmap.Extent{Off: off, Len: uint64(len(v)), BlockOff: off - lo})
			}
			end = off + uint64(len(v))
			return true, nil
		})
	})
	return win, lo, exts, err
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// stageBlock commits the records of block b and its extents exts into
// ino's staged map m, the file still paged.
func (s *Store) stageBlock(ino ids.Ino, m *blockmap.Map, b blockmap.Block, exts []blockmap.Extent) error {
	c, err := m.Apply([]blockmap.Block{b}, exts)
	if err != nil {
		return wire.Errf(wire.CodeIO, "staging a block of %v: %v", ino, err)
	}
	if len(c.Removed) > 0 || len(c.Freed) > 0 {
		return wire.Errf(wire.CodeIO, "staging a block of %v overlaps what is staged", ino)
	}
	_, err = s.update(func(tx *Tx) error {
		n, err := tx.inode(ino)
		if err != nil {
			return err
		}
		if n.mapped {
			return wire.Errf(wire.CodeIO, "%v became block-mapped during its conversion", ino)
		}
		for _, es := range [][]blockmap.Extent{c.Added, c.Changed} {
			for _, e := range es {
				if err := tx.set(tx.key64(RecExtent, ino, e.Off), blockmap.AppendExtent(nil, e)); err != nil {
					return err
				}
			}
		}
		return tx.set(tx.blockKey(ino, b.Unique), blockmap.AppendBlock(nil, b))
	})
	return err
}

// switchToBlocks makes ino's staged map its data: the attribute record
// says block-mapped, and its pages are ignored from then on.
func (s *Store) switchToBlocks(ino ids.Ino) error {
	_, err := s.update(func(tx *Tx) error {
		n, err := tx.inode(ino)
		if err != nil || n.mapped {
			return err
		}
		m, err := tx.blockMap(ino)
		if err != nil {
			return err
		}
		if e := m.Extents(); len(e) > 0 && e[len(e)-1].End() > n.Size {
			return wire.Errf(wire.CodeIO, "staged map of %v ends at %d, past the size %d", ino, e[len(e)-1].End(), n.Size)
		}
		n.mapped, n.stored = true, m.StoredBytes()
		n.touch()
		return nil
	})
	return err
}

// dropPages deletes the pages of ino, which is block-mapped or gone,
// deleteBatch per transaction.
func (s *Store) dropPages(ino ids.Ino) error {
	var from []byte
	for {
		var last []byte
		done := false
		_, err := s.update(func(tx *Tx) error {
			n, err := tx.inode(ino)
			if err != nil && err != errNotFound {
				return err
			}
			if err == nil && !n.mapped {
				return wire.Errf(wire.CodeIO, "dropping the pages of %v, which is not block-mapped", ino)
			}
			// a size past every page: purgePages scans for them
			last, done, err = tx.purgePages(&inode{Attr: Attr{Ino: ino, Size: MaxFileSize}}, from)
			return err
		})
		if err != nil || done {
			return err
		}
		if err := s.convertHook(ino, "pages"); err != nil {
			return err
		}
		from = append(last[:len(last):len(last)], 0)
	}
}

// mapDataless marks block-mapped, mapBatch per transaction, every regular
// file still paged: none has a page left, so its map is empty.
func (s *Store) mapDataless(ctx context.Context) error {
	var after []byte
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		var inos []ids.Ino
		err := s.view(func(tx *Tx) error {
			return tx.scan([]byte{RecAttr}, after, false, true, func(k, v []byte) (bool, error) {
				after = append(append(after[:0], k...), 0)
				var in inode
				if err := in.decode(KeyIno(k), v); err != nil {
					return false, err
				}
				if modeType(in.Mode) == syscall.S_IFREG && !in.mapped {
					inos = append(inos, in.Ino)
				}
				return len(inos) < mapBatch, nil
			})
		})
		if err != nil || len(inos) == 0 {
			return err
		}
		_, err = s.update(func(tx *Tx) error {
			for _, ino := range inos {
				n, err := tx.inode(ino)
				if err == errNotFound {
					continue
				}
				if err != nil {
					return err
				}
				if pages, err := tx.hasPages(ino); err != nil || pages {
					return cmpErr(err, wire.Errf(wire.CodeIO, "%v still has pages", ino))
				}
				if n.mapped {
					continue
				}
				m, err := tx.blockMap(ino)
				if err != nil {
					return err
				}
				n.mapped, n.stored = true, m.StoredBytes()
				n.touch()
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
}

// convertHook is the tests' crash point after each committed step of a
// file's conversion ("stage", "switch", "pages"): an error stops the
// conversion there.
func (s *Store) convertHook(ino ids.Ino, step string) error {
	if s.convertStep == nil {
		return nil
	}
	return s.convertStep(ino, step)
}
