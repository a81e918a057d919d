package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/metaserver/store"
	"github.com/leasefs/leasefs/wire"
)

const (
	// MinPageBytes is the smallest page ReadStatePage reads: room for the
	// largest record (a chunk or an xattr value of 64 KiB) and its key.
	MinPageBytes = 128 << 10
	// maxPageRecords bounds one page's records, so that staging a page is
	// one transaction well within badger's limits even for directories.
	maxPageRecords = 4096
	// moveRecords and moveBytes bound one transaction of the switch.
	moveRecords = 1024
	moveBytes   = 1 << 20
	// StageIdle: a staging that received no page for this long may be
	// superseded by any transfer, and is garbage for SweepTransfers.
	StageIdle = 30 * time.Second
	// sameStateIdle: a staging idle for this long may be superseded by a
	// transfer of the same state (its sender failed and tries again).
	sameStateIdle = 2 * time.Second
	// copyAttempts bounds CopyInode's restarts when the source changes.
	copyAttempts = 4

	stageFormat     = 1
	stageHeaderSize = 1 + 8 + 8 + 8 + 4 + 1 + 8
	phaseStaging    = 1
	phaseSwitching  = 2
)

var (
	// ErrTransferBusy: another transfer of the inode is under way at the
	// receiver (or a switch is being finished); try again later.
	ErrTransferBusy = errors.New("replica: another transfer of the inode is under way")
	// ErrTransferLost: the receiver no longer stages this transfer (a newer
	// one superseded it, or it was abandoned); start a new one.
	ErrTransferLost = errors.New("replica: transfer superseded or abandoned at the receiver")
	// ErrTransferMoved: the source's state kept changing during the copy.
	ErrTransferMoved = errors.New("replica: inode kept changing during the transfer")
)

// StatePage is one page of an inode's records, in key order after the
// cursor it was asked for, read in one transaction at the inode's state
// (Epoch, Version).
type StatePage struct {
	Ino     ids.Ino
	Epoch   ids.Epoch
	Version uint64
	Records []store.Write // no 'E', no deletes
	Last    bool          // no record of the inode follows
}

// Transfer names one copy of an inode's state into a replica.
type Transfer struct {
	Ino ids.Ino
	// ID is the sender's, random, never 0. Replaces is the sender's
	// previous attempt of the same copy (0: none), which this one may
	// supersede even while it is active.
	ID, Replaces uint64
	// Epoch is stamped on the replica with Version: the source's epoch
	// SrcEpoch, or a new owner's (≥ SrcEpoch).
	Epoch    ids.Epoch
	SrcEpoch ids.Epoch
	Version  uint64
}

func (tr *Transfer) state() replState { return replState{tr.Epoch, tr.Version} }

// StateSource reads an inode's state a page at a time: a Store, or a peer.
type StateSource interface {
	// ReadStatePage returns the records of ino after the key after (nil:
	// from the first), about maxBytes of them. The caller owns the page.
	ReadStatePage(ctx context.Context, ino ids.Ino, after []byte, maxBytes int) (StatePage, error)
}

// StateSink installs an inode's state page by page: a Store, or a peer.
type StateSink interface {
	// StagePage stages page seq (0 begins the transfer) of tr; the last
	// page switches the replica to the staged state. done reports that the
	// transfer is over: the replica holds tr's state or a newer one of
	// tr.Epoch (then it may come before the last page), or it switched.
	// The sink does not retain records.
	StagePage(ctx context.Context, tr Transfer, seq uint32, records []store.Write, last bool) (done bool, err error)
}

var (
	_ StateSource = (*Replica)(nil)
	_ StateSink   = (*Replica)(nil)
)

// CopyOptions configures CopyInode.
type CopyOptions struct {
	// Epoch is stamped on the copy; 0 keeps the source's epoch.
	Epoch ids.Epoch
	// PageBytes bounds a page (at least MinPageBytes).
	PageBytes int
	// OnPage, if set, is called after each page is staged (a new owner
	// keeps the inode's lease in use).
	OnPage func()
}

// CopyResult says what CopyInode did.
type CopyResult struct {
	Epoch   ids.Epoch // the source's state that was copied
	Version uint64
	// Records, Bytes and Pages count what was sent in the last attempt
	// (the sink may have stopped it early: it held the state already).
	// Epoch 0 with no pages: nothing to install (the source never
	// replicated the inode and no epoch was given).
	Records  int
	Bytes    int64
	Pages    int
	Attempts int
}

// CopyInode copies ino's state from src to dst a page at a time, stamped
// with opts.Epoch (or the source's). Every page must come at the state of
// the first; otherwise it starts over, at most copyAttempts times
// (ErrTransferMoved). A source at a newer epoch than opts.Epoch gives a
// *StaleEpochError. Memory is bounded by one page.
func CopyInode(ctx context.Context, src StateSource, dst StateSink, ino ids.Ino, opts CopyOptions) (CopyResult, error) {
	var res CopyResult
	var prev uint64
	for res.Attempts < copyAttempts {
		res.Attempts++
		tr := Transfer{Ino: ino, ID: rand.Uint64() | 1, Replaces: prev}
		prev = tr.ID
		var after []byte
		moved := false
		res.Records, res.Bytes, res.Pages = 0, 0, 0
		for seq := uint32(0); ; seq++ {
			p, err := src.ReadStatePage(ctx, ino, after, opts.PageBytes)
			if err != nil {
				return res, err
			}
			if seq == 0 {
				res.Epoch, res.Version = p.Epoch, p.Version
				tr.SrcEpoch, tr.Version, tr.Epoch = p.Epoch, p.Version, opts.Epoch
				if tr.Epoch == 0 {
					tr.Epoch = p.Epoch
				}
				if tr.Epoch == 0 {
					return res, nil // never replicated anywhere we know of
				}
				if p.Epoch > tr.Epoch {
					return res, &StaleEpochError{Ino: ino, Offered: tr.Epoch, Seen: p.Epoch}
				}
			} else if p.Epoch != tr.SrcEpoch || p.Version != tr.Version {
				moved = true
				break
			}
			done, err := dst.StagePage(ctx, tr, seq, p.Records, p.Last)
			if err != nil {
				return res, err
			}
			res.Pages++
			for _, w := range p.Records {
				res.Records++
				res.Bytes += int64(len(w.Key) + len(w.Value))
			}
			if opts.OnPage != nil {
				opts.OnPage()
			}
			if done || p.Last {
				return res, nil
			}
			if len(p.Records) == 0 {
				return res, fmt.Errorf("replica: copy %v: empty page %d before the last", ino, seq)
			}
			after = p.Records[len(p.Records)-1].Key
		}
		if !moved {
			break
		}
	}
	return res, fmt.Errorf("%w: %v after %d attempts", ErrTransferMoved, ino, res.Attempts)
}

// ReadStatePage implements StateSource on this store: one transaction per
// page. A switch left unfinished (by a crash) is finished first, so a page
// never mixes two states.
func (r *Replica) ReadStatePage(ctx context.Context, ino ids.Ino, after []byte, maxBytes int) (StatePage, error) {
	if err := ctx.Err(); err != nil {
		return StatePage{}, err
	}
	if after != nil && (!replicated(after) || store.KeyIno(after) != ino) {
		return StatePage{}, fmt.Errorf("%w: page cursor %x for %v", ErrBadChange, after, ino)
	}
	maxBytes = max(maxBytes, MinPageBytes)
	if err := r.settle(ino); err != nil {
		return StatePage{}, err
	}
	page := StatePage{Ino: ino}
	err := r.st.View(func(tx *store.Tx) error {
		page.Records = page.Records[:0]
		rs, switching, err := replEntry(tx, ino)
		if err != nil {
			return err
		}
		if switching {
			return fmt.Errorf("%w: %v is switching", ErrTransferBusy, ino)
		}
		page.Epoch, page.Version = rs.epoch, rs.version
		size, full := 0, false
		for _, p := range replPrefixes {
			if after != nil && p < after[0] {
				continue
			}
			var start []byte
			if after != nil && p == after[0] {
				start = append(bytes.Clone(after), 0) // strictly after the cursor
			}
			err := tx.Scan(tx.Key(p, ino, nil), start, false, true, func(k, v []byte) (bool, error) {
				if len(page.Records) > 0 && (size+len(k)+len(v) > maxBytes || len(page.Records) == maxPageRecords) {
					full = true
					return false, nil
				}
				size += len(k) + len(v)
				page.Records = append(page.Records, store.Write{Key: bytes.Clone(k), Value: bytes.Clone(v)})
				return true, nil
			})
			if err != nil || full {
				return err
			}
		}
		page.Last = true
		return nil
	})
	if err != nil {
		return StatePage{}, fmt.Errorf("replica: read state of %v: %w", ino, err)
	}
	return page, nil
}

// stageHeader is a transfer's 'T' ino record.
type stageHeader struct {
	id      uint64
	epoch   ids.Epoch // to stamp, with version
	version uint64
	next    uint32 // the next page expected
	phase   byte
	active  int64 // unix ns of the last page staged
}

func (h *stageHeader) encode() []byte {
	b := make([]byte, 0, stageHeaderSize)
	b = append(b, stageFormat)
	b = binary.BigEndian.AppendUint64(b, h.id)
	b = binary.BigEndian.AppendUint64(b, uint64(h.epoch))
	b = binary.BigEndian.AppendUint64(b, h.version)
	b = binary.BigEndian.AppendUint32(b, h.next)
	b = append(b, h.phase)
	return binary.BigEndian.AppendUint64(b, uint64(h.active))
}

func decodeStageHeader(ino ids.Ino, v []byte) (stageHeader, error) {
	if len(v) != stageHeaderSize || v[0] != stageFormat {
		return stageHeader{}, wire.Errf(wire.CodeIO, "corrupt staging header of %v (%d bytes)", ino, len(v))
	}
	return stageHeader{id: binary.BigEndian.Uint64(v[1:]), epoch: ids.Epoch(binary.BigEndian.Uint64(v[9:])),
		version: binary.BigEndian.Uint64(v[17:]), next: binary.BigEndian.Uint32(v[25:]), phase: v[29],
		active: int64(binary.BigEndian.Uint64(v[30:]))}, nil
}

func readStageHeader(tx *store.Tx, ino ids.Ino) (stageHeader, bool, error) {
	var h stageHeader
	var derr error
	found, err := tx.Get(tx.Key(store.RecStage, ino, nil), func(v []byte) error {
		h, derr = decodeStageHeader(ino, v)
		return nil
	})
	if err == nil {
		err = derr
	}
	return h, found, err
}

// stageKey is where transfer id stages the record key (kind|ino|suffix).
func stageKey(tx *store.Tx, ino ids.Ino, id uint64, key []byte) []byte {
	suffix := make([]byte, 9, 9+len(key)-9)
	binary.BigEndian.PutUint64(suffix, id)
	suffix[8] = key[0]
	return tx.Key(store.RecStage, ino, append(suffix, key[9:]...))
}

// liveKey turns a staged record's key back into the record's key.
func liveKey(stageKey []byte) []byte {
	k := make([]byte, 0, len(stageKey)-8)
	k = append(k, stageKey[17])
	k = append(k, stageKey[1:9]...)
	return append(k, stageKey[18:]...)
}

func stageID(stageKey []byte) uint64 { return binary.BigEndian.Uint64(stageKey[9:17]) }

func (tr *Transfer) validate(records []store.Write) error {
	if tr.ID == 0 || tr.Epoch == 0 || tr.SrcEpoch > tr.Epoch {
		return fmt.Errorf("%w: transfer %x of %v from %v/%d stamped %v", ErrBadChange, tr.ID, tr.Ino, tr.SrcEpoch, tr.Version, tr.Epoch)
	}
	if len(records) > maxPageRecords {
		return fmt.Errorf("%w: page of %d records for %v", ErrBadChange, len(records), tr.Ino)
	}
	for _, w := range records {
		if !replicated(w.Key) || w.Ino() != tr.Ino || w.Delete {
			return fmt.Errorf("%w: record %x in a transfer of %v%s", ErrBadChange, w.Key, tr.Ino, store.LegacyHint(w.Key))
		}
	}
	return nil
}

// StagePage implements StateSink on this store. Page 0 begins the transfer:
// it is refused with a *StaleEpochError if the replica has seen an epoch
// newer than tr.Epoch, is done at once if the replica holds tr.Epoch at
// tr.Version or beyond, and is refused with ErrTransferBusy while another
// transfer of the inode is staged that tr may not supersede
// (Transfer.supersedes). A state that fits in one page is installed in one
// transaction. Later pages must follow in order (ErrTransferLost if the
// transfer is no longer the one staged). The last page switches (fenced
// again) and returns once the replica holds the state, synced.
func (r *Replica) StagePage(ctx context.Context, tr Transfer, seq uint32, records []store.Write, last bool) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := tr.validate(records); err != nil {
		return false, err
	}
	if seq == 0 {
		if err := r.settle(tr.Ino); err != nil {
			return false, err
		}
		if last {
			// the whole state in one page: installed at once, unless it
			// drops too many records for one transaction
			if done, ok, err := r.replaceWhole(tr, records); ok || err != nil {
				return done, err
			}
		}
	}
	done := false
	var superseded stageHeader
	now := time.Now().UnixNano()
	err := r.st.UpdateRaw(func(tx *store.Tx) error {
		var err error
		done, superseded, err = stagePageTx(tx, tr, seq, records, now)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("replica: stage %v page %d: %w", tr.Ino, seq, err)
	}
	if done {
		return true, nil
	}
	if superseded.id != 0 {
		r.logSuperseded(tr, superseded, now)
	}
	if seq == 0 {
		// the staging of transfers this one superseded
		if err := r.collectStaged(tr.Ino); err != nil {
			return false, err
		}
	}
	if !last {
		return false, nil
	}
	return true, r.switchTo(tr, seq)
}

// stagePageTx stages one page of tr in tx and moves the staging header on;
// done is a first page that found the state there already, superseded the
// staging it replaced.
func stagePageTx(tx *store.Tx, tr Transfer, seq uint32, records []store.Write, now int64) (done bool, superseded stageHeader, err error) {
	h, found, err := readStageHeader(tx, tr.Ino)
	if err != nil {
		return false, superseded, err
	}
	if seq == 0 && !(found && h.id == tr.ID) {
		if done, err = beginStaging(tx, tr); done || err != nil {
			return done, superseded, err
		}
		if found {
			if err := tr.supersedes(h, now); err != nil {
				return false, superseded, err
			}
			superseded = h
		}
		h = stageHeader{id: tr.ID, epoch: tr.Epoch, version: tr.Version, phase: phaseStaging}
	} else {
		switch {
		case !found || h.id != tr.ID || h.phase != phaseStaging:
			return false, superseded, fmt.Errorf("%w: %v page %d", ErrTransferLost, tr.Ino, seq)
		case seq+1 == h.next:
			return false, superseded, nil // a page sent again: staged already
		case seq != h.next:
			return false, superseded, fmt.Errorf("%w: %v page %d, expected %d", ErrTransferLost, tr.Ino, seq, h.next)
		}
	}
	for _, w := range records {
		if err := tx.Set(stageKey(tx, tr.Ino, tr.ID, w.Key), w.Value); err != nil {
			return false, superseded, err
		}
	}
	h.next, h.active = seq+1, now
	return false, superseded, tx.Set(tx.Key(store.RecStage, tr.Ino, nil), h.encode())
}

// beginStaging checks that a new transfer tr may start: not while the
// inode is switching, nor to an epoch older than the replica has seen;
// done if the replica holds tr's state or a newer one of the same owner.
func beginStaging(tx *store.Tx, tr Transfer) (done bool, err error) {
	seen, switching, err := replEntry(tx, tr.Ino)
	if err != nil {
		return false, err
	}
	switch {
	case switching:
		return false, fmt.Errorf("%w: %v is switching", ErrTransferBusy, tr.Ino)
	case seen.epoch > tr.Epoch:
		return false, &StaleEpochError{Ino: tr.Ino, Offered: tr.Epoch, Seen: seen.epoch}
	case seen.epoch == tr.Epoch && seen.version >= tr.Version:
		return true, nil // already there, in the same owner's line
	}
	return false, nil
}

// supersedes reports whether tr may replace the staging h (nil), or
// ErrTransferBusy. A newer state's transfer (a new owner's write-back)
// replaces it at once, as does the sender's own next attempt; one of the
// same state only once h has been idle for sameStateIdle (its sender
// failed; two live copies of one state would otherwise supersede each
// other in turn, and neither finish); an older one only once h is
// abandoned (StageIdle).
func (tr *Transfer) supersedes(h stageHeader, now int64) error {
	idle := time.Duration(now - h.active)
	staged := replState{h.epoch, h.version}
	switch {
	case h.phase == phaseSwitching:
		return fmt.Errorf("%w: %v is switching", ErrTransferBusy, tr.Ino)
	case h.id == tr.Replaces, staged.less(tr.state()), idle >= StageIdle:
		return nil
	case staged == tr.state() && idle >= sameStateIdle:
		return nil
	}
	return fmt.Errorf("%w: %v (transfer %x to %v/%d, last page %v ago)", ErrTransferBusy, tr.Ino, h.id, h.epoch, h.version,
		idle.Round(time.Millisecond))
}

func (r *Replica) logSuperseded(tr Transfer, h stageHeader, now int64) {
	r.log.Debug("transfer superseded", "ino", tr.Ino, "old", fmt.Sprintf("%x", h.id),
		"old_state", replState{h.epoch, h.version}, "new", fmt.Sprintf("%x", tr.ID), "new_state", tr.state(),
		"idle", time.Duration(now-h.active))
}

// replaceWhole installs tr's whole state, all in records, in one
// transaction, synced: atomic, so no staging. ok is false, with nothing
// done, if the replica holds more than moveRecords records beyond it (the
// caller stages it instead).
func (r *Replica) replaceWhole(tr Transfer, records []store.Write) (done, ok bool, err error) {
	keep := make(map[string]struct{}, len(records))
	for _, w := range records {
		keep[string(w.Key)] = struct{}{}
	}
	var superseded stageHeader
	now := time.Now().UnixNano()
	wrote := false
	err = r.st.UpdateRaw(func(tx *store.Tx) error {
		done, ok, wrote, superseded = false, true, false, stageHeader{}
		seen, switching, err := replEntry(tx, tr.Ino)
		if err != nil {
			return err
		}
		switch {
		case switching:
			return fmt.Errorf("%w: %v is switching", ErrTransferBusy, tr.Ino)
		case seen.epoch > tr.Epoch:
			return &StaleEpochError{Ino: tr.Ino, Offered: tr.Epoch, Seen: seen.epoch}
		case seen.epoch == tr.Epoch && seen.version >= tr.Version:
			done = true
			return nil
		}
		h, found, err := readStageHeader(tx, tr.Ino)
		if err != nil {
			return err
		}
		if found {
			if err := tr.supersedes(h, now); err != nil {
				return err
			}
			superseded = h
			if err := tx.Delete(tx.Key(store.RecStage, tr.Ino, nil)); err != nil {
				return err
			}
		}
		var extra [][]byte
		for _, p := range replPrefixes {
			err := tx.Scan(tx.Key(p, tr.Ino, nil), nil, false, false, func(k, _ []byte) (bool, error) {
				if _, kept := keep[string(k)]; !kept {
					if len(extra) == moveRecords {
						ok = false
						return false, nil
					}
					extra = append(extra, bytes.Clone(k))
				}
				return true, nil
			})
			if err != nil || !ok {
				return err
			}
		}
		for _, k := range extra {
			if err := tx.Delete(k); err != nil {
				return err
			}
		}
		for _, w := range records {
			if err := tx.Set(w.Key, w.Value); err != nil {
				return err
			}
		}
		wrote = true
		return tx.Set(tx.Key(store.RecRepl, tr.Ino, nil), tr.state().encode(make([]byte, 0, replSize)))
	})
	if err != nil {
		return false, true, fmt.Errorf("replica: replace %v: %w", tr.Ino, err)
	}
	if !ok {
		return false, false, nil
	}
	if superseded.id != 0 {
		r.logSuperseded(tr, superseded, now)
		if err := r.collectStaged(tr.Ino); err != nil {
			return false, true, err
		}
	}
	if wrote {
		return true, true, r.st.Sync()
	}
	return done, true, nil
}

// switchTo ends transfer tr after its last page seq: fenced once more, it
// stamps the state (flagged) and rolls the switch forward; or, if the
// replica moved beyond it meanwhile, drops the staging.
func (r *Replica) switchTo(tr Transfer, seq uint32) error {
	switched, err := r.commitSwitch(tr, seq)
	if err != nil || !switched {
		return err
	}
	return r.rollForward(tr.Ino, tr.ID)
}

// commitSwitch is the switch's commit point: the replica claims tr's state
// from here on, flagged until rolled forward (which syncs before the
// sender hears of it). It reports
// false if the replica holds tr's state or a newer one already (the
// staging is dropped; a *StaleEpochError if it has seen a newer epoch).
func (r *Replica) commitSwitch(tr Transfer, seq uint32) (bool, error) {
	// the staged records must be durable before 'E' claims them
	if err := r.st.Sync(); err != nil {
		return false, err
	}
	var stale error
	drop := false
	err := r.st.UpdateRaw(func(tx *store.Tx) error {
		stale, drop = nil, false
		h, found, err := readStageHeader(tx, tr.Ino)
		if err != nil {
			return err
		}
		if !found || h.id != tr.ID || h.phase != phaseStaging || h.next != seq+1 {
			return fmt.Errorf("%w: %v switch after page %d", ErrTransferLost, tr.Ino, seq)
		}
		seen, switching, err := replEntry(tx, tr.Ino)
		if err != nil {
			return err
		}
		switch {
		case switching:
			return fmt.Errorf("%w: %v is switching", ErrTransferBusy, tr.Ino)
		case seen.epoch > tr.Epoch:
			stale = &StaleEpochError{Ino: tr.Ino, Offered: tr.Epoch, Seen: seen.epoch}
			drop = true
		case seen.epoch == tr.Epoch && seen.version >= tr.Version:
			drop = true
		}
		if drop {
			return tx.Delete(tx.Key(store.RecStage, tr.Ino, nil))
		}
		h.phase = phaseSwitching
		if err := tx.Set(tx.Key(store.RecStage, tr.Ino, nil), h.encode()); err != nil {
			return err
		}
		return tx.Set(tx.Key(store.RecRepl, tr.Ino, nil), tr.state().encodeSwitching(nil))
	})
	if err != nil {
		return false, fmt.Errorf("replica: switch %v: %w", tr.Ino, err)
	}
	if drop {
		if err := r.collectStaged(tr.Ino); err != nil {
			return false, err
		}
		return false, stale
	}
	return true, nil
}

// errSwitchOver stops a roll-forward that another one finished.
var errSwitchOver = errors.New("replica: switch finished elsewhere")

// switching checks, inside a roll-forward's transaction, that transfer id
// of ino is still being switched.
func switching(tx *store.Tx, ino ids.Ino, id uint64) (stageHeader, error) {
	h, found, err := readStageHeader(tx, ino)
	if err != nil {
		return h, err
	}
	if !found || h.id != id || h.phase != phaseSwitching {
		return h, errSwitchOver
	}
	return h, nil
}

// rollForward makes ino's records those staged by transfer id, whose
// header is switching: it deletes the records not staged, copies the staged
// ones over, then clears the flag and the header in one transaction, and
// drops the staging. Every step is a bounded transaction that checks the
// header, so it can be redone after a crash, or run twice at once.
func (r *Replica) rollForward(ino ids.Ino, id uint64) error {
	err := r.rollDelete(ino, id)
	if err == nil {
		err = r.rollCopy(ino, id, 0)
	}
	if err == nil {
		err = r.st.UpdateRaw(func(tx *store.Tx) error {
			h, err := switching(tx, ino, id)
			if err != nil {
				return err
			}
			if err := tx.Delete(tx.Key(store.RecStage, ino, nil)); err != nil {
				return err
			}
			return tx.Set(tx.Key(store.RecRepl, ino, nil), replState{h.epoch, h.version}.encode(make([]byte, 0, replSize)))
		})
	}
	if err != nil && !errors.Is(err, errSwitchOver) {
		return fmt.Errorf("replica: switch %v: %w", ino, err)
	}
	if err := r.st.Sync(); err != nil {
		return err
	}
	return r.collectStaged(ino)
}

// rollDelete deletes ino's records that transfer id did not stage.
func (r *Replica) rollDelete(ino ids.Ino, id uint64) error {
	var cursor []byte // the last record looked at
	for {
		var dels [][]byte
		var last []byte
		end := false
		err := r.st.UpdateRaw(func(tx *store.Tx) error {
			dels, last, end = dels[:0], nil, false
			if _, err := switching(tx, ino, id); err != nil {
				return err
			}
			looked := 0
			for _, p := range replPrefixes {
				if cursor != nil && p < cursor[0] {
					continue
				}
				var start []byte
				if cursor != nil && p == cursor[0] {
					start = append(bytes.Clone(cursor), 0)
				}
				var serr error
				err := tx.Scan(tx.Key(p, ino, nil), start, false, false, func(k, _ []byte) (bool, error) {
					if looked == moveRecords {
						return false, nil
					}
					looked++
					last = append(last[:0], k...)
					staged, err := tx.Get(stageKey(tx, ino, id, k), nil)
					if err != nil {
						serr = err
						return false, err
					}
					if !staged {
						dels = append(dels, bytes.Clone(k))
					}
					return true, nil
				})
				if err == nil {
					err = serr
				}
				if err != nil {
					return err
				}
				if looked == moveRecords {
					break
				}
			}
			end = looked < moveRecords
			for _, k := range dels {
				if err := tx.Delete(k); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil || end {
			return err
		}
		cursor = bytes.Clone(last)
	}
}

// rollCopy copies transfer id's staged records over ino's records, in at
// most batches transactions if batches > 0 (tests: a crash midway).
func (r *Replica) rollCopy(ino ids.Ino, id uint64, batches int) error {
	var cursor []byte // the last staged key copied
	for batch := 1; ; batch++ {
		var sets []store.Write
		end := false
		err := r.st.UpdateRaw(func(tx *store.Tx) error {
			sets, end = sets[:0], false
			if _, err := switching(tx, ino, id); err != nil {
				return err
			}
			prefix := tx.Key64(store.RecStage, ino, id)
			var start []byte
			if cursor != nil {
				start = append(bytes.Clone(cursor), 0)
			}
			size := 0
			end = true
			err := tx.Scan(prefix, start, false, true, func(k, v []byte) (bool, error) {
				if len(sets) == moveRecords || len(sets) > 0 && size+len(k)+len(v) > moveBytes {
					end = false
					return false, nil
				}
				size += len(k) + len(v)
				sets = append(sets, store.Write{Key: bytes.Clone(k), Value: bytes.Clone(v)})
				return true, nil
			})
			if err != nil {
				return err
			}
			for _, w := range sets {
				if err := tx.Set(liveKey(w.Key), w.Value); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil || end || batch == batches {
			return err
		}
		cursor = sets[len(sets)-1].Key
	}
}

// collectStaged deletes ino's staged records that no staging transfer
// owns (superseded, abandoned, or switched), in bounded transactions.
func (r *Replica) collectStaged(ino ids.Ino) error {
	for {
		more := false
		err := r.st.UpdateRaw(func(tx *store.Tx) error {
			more = false
			h, found, err := readStageHeader(tx, ino)
			if err != nil {
				return err
			}
			var keep uint64
			if found {
				keep = h.id
			}
			var dels [][]byte
			err = tx.Scan(tx.Key(store.RecStage, ino, nil), nil, false, false, func(k, _ []byte) (bool, error) {
				if len(k) < 18 {
					return true, nil // the header
				}
				if keep != 0 && stageID(k) == keep {
					return true, nil
				}
				if len(dels) == moveRecords {
					more = true
					return false, nil
				}
				dels = append(dels, bytes.Clone(k))
				return true, nil
			})
			if err != nil {
				return err
			}
			for _, k := range dels {
				if err := tx.Delete(k); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("replica: drop staging of %v: %w", ino, err)
		}
		if !more {
			return nil
		}
	}
}

// settle finishes a switch of ino that was left unfinished (by a crash, or
// that another goroutine is finishing): after it, ino's records are the
// state its 'E' record claims.
func (r *Replica) settle(ino ids.Ino) error {
	var h stageHeader
	switching := false
	err := r.st.View(func(tx *store.Tx) error {
		var err error
		_, switching, err = replEntry(tx, ino)
		if err != nil || !switching {
			return err
		}
		var found bool
		h, found, err = readStageHeader(tx, ino)
		if err == nil && (!found || h.phase != phaseSwitching) {
			err = wire.Errf(wire.CodeIO, "%v is flagged switching without a switching transfer", ino)
		}
		return err
	})
	if err != nil || !switching {
		return err
	}
	return r.rollForward(ino, h.id)
}

// SweepTransfers finishes every switch left unfinished, and drops the
// staging of transfers idle for longer than idle (their senders died or
// gave up) and staged records no transfer owns. A cluster server calls it
// at start and then now and then.
func (r *Replica) SweepTransfers(idle time.Duration) error {
	now := time.Now().UnixNano()
	after := ids.Ino(0)
	first := true
	for {
		var ino ids.Ino
		found := false
		err := r.st.View(func(tx *store.Tx) error {
			start := []byte{store.RecStage}
			if !first {
				if after == MaxIno {
					return nil
				}
				start = tx.Key(store.RecStage, after+1, nil)
			}
			return tx.Scan([]byte{store.RecStage}, start, false, false, func(k, _ []byte) (bool, error) {
				ino, found = store.KeyIno(k), true
				return false, nil
			})
		})
		if err != nil || !found {
			return err
		}
		first, after = false, ino
		if err := r.settle(ino); err != nil {
			return err
		}
		err = r.st.UpdateRaw(func(tx *store.Tx) error {
			h, found, err := readStageHeader(tx, ino)
			if err != nil || !found || h.phase != phaseStaging || now-h.active < int64(idle) {
				return err
			}
			return tx.Delete(tx.Key(store.RecStage, ino, nil))
		})
		if err == nil {
			err = r.collectStaged(ino)
		}
		if err != nil {
			return err
		}
	}
}
