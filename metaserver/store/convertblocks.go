package store

// Conversion of file data from pages ('P') to blocks.
//
// A file converts in three steps, so that no transaction exceeds badger's
// size limit and a crash at any point leaves every file whole:
//
//  1. Stage: each MaxBlock window of the file that holds data is Put as a
//     new block. At start (ConvertPagesToBlocks) each window but the last
//     then has its extent and block records committed, one window per
//     transaction, while the file stays paged: readers of a paged file
//     never look at those records (Read reads pages; the block map
//     operations answer ErrNotMapped), so a staged file reads as before,
//     and a crash resumes after the last staged window. Inside a request
//     (ConvertFile) nothing is staged: its records all go in the switch.
//  2. Switch: one transaction checks that the file is as it was read (its
//     Version), commits the records not staged, marks the file
//     block-mapped and deletes its pages, up to deleteBatch of them. From
//     then on its data is the map, and its pages are ignored (Read answers
//     ErrMapped): the switch is the one atomic step a reader sees.
//  3. Drop the pages left, deleteBatch per transaction.
//
// A block put but not committed is an orphan, which the collector removes.
// At start nothing else changes the store: the server runs the conversion
// before it serves, and a crash after a switch is finished by the next
// run, which finds the block-mapped file's pages. Inside a request the
// caller keeps the file's other changes out (its X lock, the server's
// write mutex); the Version check catches one that gets in anyway. In a
// cluster each inode must be converted by its owner (only the owner
// changes an inode's records): the start conversion is for a single
// server, and a cluster converts files as they are written.

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

// onlineMaxPages bounds the files ConvertFile converts: their records all
// go in the switch's transaction, which must stay within badger's limits
// (at most 64 blocks, and 512 extents per block for a file of every
// other page).
const onlineMaxPages = 64 * blocks.MaxBlock / PageSize

// ErrTooBigToConvert is ConvertFile's answer for a file of more than
// onlineMaxPages pages: only a store of a cluster holds one (a single
// server converts them at start), and its data stays in pages.
var ErrTooBigToConvert = wire.Errf(wire.CodeTooBig, "file too big to move from pages to blocks inside a request")

// ConvertPagesToBlocks moves the data of every file larger than
// wire.InlineMax from pages into blocks of bs (durable before they are
// referenced), and sets the store's format to 4: no file over InlineMax
// keeps its data in pages. Smaller files, and files with no data, stay as
// they are. It returns the files whose data it moved and the bytes it put.
// A store of format 4 has nothing to convert. Interrupted (ctx, a crash),
// it leaves the store readable and a later call carries on; the blocks it
// put but did not commit are orphans the collector removes. All-zero pages
// become holes. Nothing else may change the store meanwhile.
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
		err = s.kv.update(func(t kvTxn) error { return t.set(formatKey, []byte{storeFormat}) })
	}
	if err != nil {
		return c.files, c.bytes, err
	}
	level := slog.LevelInfo
	if c.files == 0 {
		level = slog.LevelDebug // a new store, or one whose files are all small
	}
	log.Log(ctx, level, "store upgraded: data of files over the inline size moved from pages to blocks", "files", c.files, "bytes", c.bytes,
		"inline_max", wire.InlineMax, "took", time.Since(c.start).Round(time.Millisecond))
	return c.files, c.bytes, nil
}

// ConvertFile moves the data of ino, a regular file whose data is in
// pages, into blocks of bs, whatever its size: a write is about to make it
// larger than wire.InlineMax, or to commit blocks to it. The caller keeps
// the file's other changes out meanwhile (its X lock and the server's
// write mutex); one that gets in anyway fails the conversion with
// CodeAgain. It reports whether it converted: a block-mapped file, and a
// file with no page (which becomes block-mapped at its first commit), are
// left as they are. ErrTooBigToConvert for a file of more than
// onlineMaxPages pages.
func (s *Store) ConvertFile(ctx context.Context, bs blocks.Store, ino ids.Ino) (bool, error) {
	var pages int
	n, m, err := s.pagedInode(ino, func(tx *Tx) error {
		return tx.scan(tx.key(RecPage, ino, nil), nil, false, false, func([]byte, []byte) (bool, error) {
			pages++
			return pages <= onlineMaxPages, nil
		})
	})
	switch {
	case err != nil:
		return false, err
	case n == nil:
		return false, errNotFound
	case n.mapped || pages == 0:
		return false, nil
	case pages > onlineMaxPages:
		return false, ErrTooBigToConvert
	}
	c := converter{s: s, bs: bs, log: s.log, online: true}
	return true, c.convert(ctx, n, m)
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
	online       bool // ConvertFile: no window staged, no progress logged
	start        time.Time
	lastLog      time.Time
	files, bytes int
	buf          []byte // one window of the file
}

// pagedInode loads ino and, if its data is in pages, what an interrupted
// conversion staged of its map, in one view that also runs more (nil:
// nothing more). n is nil for an inode that is gone.
func (s *Store) pagedInode(ino ids.Ino, more func(tx *Tx) error) (n *inode, m *blockmap.Map, err error) {
	err = s.view(func(tx *Tx) error {
		in, err := tx.inode(ino)
		if err == errNotFound {
			n = nil
			return nil
		}
		if err != nil {
			return err
		}
		if modeType(in.Mode) != syscall.S_IFREG {
			return wire.Errf(wire.CodeIO, "%v has pages but is not a regular file", ino)
		}
		n = new(inode)
		*n = *in
		if n.mapped {
			return nil
		}
		if m, err = tx.blockMap(ino); err != nil || more == nil {
			return err
		}
		return more(tx)
	})
	return n, m, err
}

// convertFile converts one file that has pages and more than
// wire.InlineMax bytes, or only drops its pages if it is block-mapped
// already (or gone); a smaller file stays in pages.
func (c *converter) convertFile(ctx context.Context, ino ids.Ino) error {
	n, m, err := c.s.pagedInode(ino, nil)
	switch {
	case err != nil:
		return err
	case n == nil || n.mapped:
		return c.s.dropPages(ino)
	case n.Size <= wire.InlineMax:
		return nil
	}
	return c.convert(ctx, n, m)
}

// convert moves paged file n's data into blocks: it puts each window of
// its data past what m (the staged map) holds as a block, stages all but
// the last (at start only), switches the file to its map, and drops its
// pages.
func (c *converter) convert(ctx context.Context, n *inode, m *blockmap.Map) error {
	var from uint64
	if exts := m.Extents(); len(exts) > 0 {
		from = (exts[len(exts)-1].Off/blocks.MaxBlock + 1) * blocks.MaxBlock
	}
	if c.buf == nil {
		c.buf = make([]byte, min(blocks.MaxBlock, n.Size))
	}
	var blks []blockmap.Block // put, for the switch to commit
	var exts []blockmap.Extent
	for from < n.Size {
		if err := ctx.Err(); err != nil {
			return err
		}
		win, lo, wexts, more, err := c.readWindow(n, from)
		if err != nil {
			return err
		}
		from = win + blocks.MaxBlock
		if len(wexts) > 0 { // none: no data left, or all-zero pages only
			b, err := c.put(ctx, n.Ino, c.buf[:wexts[len(wexts)-1].End()-lo], wexts)
			if err != nil {
				return err
			}
			if more && !c.online {
				if err := c.stage(n.Ino, m, b, wexts); err != nil {
					return err
				}
			} else {
				blks, exts = append(blks, b), append(exts, wexts...)
			}
		}
		if !more {
			break
		}
	}
	done, err := c.s.switchToBlocks(n, m, blks, exts)
	if err != nil {
		return err
	}
	c.files++
	if err := c.s.convertHook(n.Ino, "switch"); err != nil {
		return err
	}
	if done {
		return nil
	}
	return c.s.dropPages(n.Ino)
}

// put puts data, the bytes of extents exts of ino, as a new block, and
// sets it as their block.
func (c *converter) put(ctx context.Context, ino ids.Ino, data []byte, exts []blockmap.Extent) (blockmap.Block, error) {
	id := blocks.NewID(ino)
	if err := c.bs.Put(ctx, id, data); err != nil {
		return blockmap.Block{}, err
	}
	if err := ctx.Err(); err != nil {
		return blockmap.Block{}, err
	}
	b := blockmap.Block{Unique: id.Unique, Size: uint64(len(data)), Sums: blocks.Sum(data)}
	for i := range exts {
		exts[i].Block = b.Unique
	}
	c.bytes += len(data)
	return b, nil
}

// stage commits the records of block b and its extents exts into ino's
// staged map m, and says how far the conversion got now and then.
func (c *converter) stage(ino ids.Ino, m *blockmap.Map, b blockmap.Block, exts []blockmap.Extent) error {
	if err := c.s.stageBlock(ino, m, b, exts); err != nil {
		return err
	}
	if err := c.s.convertHook(ino, "stage"); err != nil {
		return err
	}
	if time.Since(c.lastLog) >= convertLogEvery {
		c.lastLog = time.Now()
		c.log.Info("converting file data from pages to blocks", "files", c.files, "bytes", c.bytes,
			"elapsed", time.Since(c.start).Round(time.Second))
	}
	return nil
}

// readWindow reads the MaxBlock window of n that holds its first page at
// or past from into c.buf, from lo (the first data byte) on, and returns
// the window's start, the extents of its data (without their block;
// BlockOff from lo; none if the window is all zeros or there is no page
// at or past from), and whether a page lies past the window. A page of
// zeros is a hole; so are the bytes past a page's stored length.
func (c *converter) readWindow(n *inode, from uint64) (win, lo uint64, exts []blockmap.Extent, more bool, err error) {
	err = c.s.view(func(tx *Tx) error {
		end, first := uint64(0), true
		return tx.scan(tx.key(RecPage, n.Ino, nil), tx.key64(RecPage, n.Ino, from/PageSize), false, true, func(k, v []byte) (bool, error) {
			off := binary.BigEndian.Uint64(k[9:]) * PageSize
			if first {
				win, first = off/blocks.MaxBlock*blocks.MaxBlock, false
			}
			if off >= n.Size {
				return false, nil
			}
			if off >= win+blocks.MaxBlock {
				more = true
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
	return win, lo, exts, more, err
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
	c, err := stageChange(ino, m, []blockmap.Block{b}, exts)
	if err != nil {
		return err
	}
	_, err = s.update(func(tx *Tx) error {
		n, err := tx.inode(ino)
		if err != nil {
			return err
		}
		if n.mapped {
			return wire.Errf(wire.CodeIO, "%v became block-mapped during its conversion", ino)
		}
		return tx.putRecords(ino, &c)
	})
	return err
}

// stageChange applies blocks put by the conversion to the staged map m:
// they add to it and replace nothing.
func stageChange(ino ids.Ino, m *blockmap.Map, blks []blockmap.Block, exts []blockmap.Extent) (blockmap.Change, error) {
	if len(blks) == 0 {
		return blockmap.Change{}, nil
	}
	c, err := m.Apply(blks, exts)
	if err != nil {
		return c, wire.Errf(wire.CodeIO, "staging blocks of %v: %v", ino, err)
	}
	if len(c.Removed) > 0 || len(c.Freed) > 0 {
		return c, wire.Errf(wire.CodeIO, "staging blocks of %v overlaps what is staged", ino)
	}
	return c, nil
}

// switchToBlocks makes the file that was (as the conversion read it)
// block-mapped: its map is the staged map m and blks, which back exts. It fails with
// CodeAgain if the file changed since (its Version), and deletes up to
// deleteBatch of its pages; done reports none are left.
func (s *Store) switchToBlocks(was *inode, m *blockmap.Map, blks []blockmap.Block, exts []blockmap.Extent) (done bool, err error) {
	ino := was.Ino
	c, err := stageChange(ino, m, blks, exts)
	if err != nil {
		return false, err
	}
	_, err = s.update(func(tx *Tx) error {
		n, err := tx.inode(ino)
		if err != nil {
			return err
		}
		if n.mapped || n.Version != was.Version {
			return wire.Errf(wire.CodeAgain, "%v changed during its conversion from pages to blocks", ino)
		}
		if e := m.Extents(); len(e) > 0 && e[len(e)-1].End() > n.Size {
			return wire.Errf(wire.CodeIO, "staged map of %v ends at %d, past the size %d", ino, e[len(e)-1].End(), n.Size)
		}
		if err := tx.persistChange(n, m, &c, 0); err != nil {
			return err
		}
		n.touch()
		// pages never lie past Size: a small file's are deleted by key
		_, done, err = tx.purgePages(n, nil)
		return err
	})
	return done, err
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

// convertHook is the tests' crash point after each committed step of a
// file's conversion ("stage", "switch", "pages"): an error stops the
// conversion there.
func (s *Store) convertHook(ino ids.Ino, step string) error {
	if s.convertStep == nil {
		return nil
	}
	return s.convertStep(ino, step)
}
