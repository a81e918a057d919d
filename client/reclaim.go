package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// noVersion is a version no file has: a write sent with it as its
// WriteIfVersion is refused unless the server finds it applied already.
const noVersion = ^uint64(0)

// reclaimInterrupted sorts out the writes of a flush the server's NACK
// interrupted. Those answered are at the server; their ids must not go
// again (the server forgets the ids of changes the client went on from,
// and refuses a copy of one as stale). Each of the others may have been
// applied with its answer lost: sent with noVersion, one applied is
// answered from the server's record of it, one not applied is refused and
// changes nothing. It returns the writes not applied, and the version the
// file has if nobody else wrote it since: every write moves it on by one.
// (The flush numbered its writes as it sent them, not in file order.)
func (w *writeBack) reclaimInterrupted(ctx context.Context, sent *sentWrites) ([]*wire.Request, uint64, error) {
	version := sent.base
	var left []*wire.Request
	for i, r := range sent.reqs {
		if sent.answered[i] {
			version++
			continue
		}
		r.Flags |= wire.WriteIfVersion
		r.Version = noVersion
		for nacks := 0; ; nacks++ {
			_, err := w.c.send(ctx, r, sendOpts{failOnNack: true}) // (as reclaimFile's)
			switch {
			case errors.Is(err, errRecovered) && nacks < maxReclaimNacks:
				continue
			case err == nil:
				version++
			case wire.CodeOf(err) == wire.CodeStale:
				left = append(left, r)
			default:
				return nil, 0, err
			}
			break
		}
	}
	// In the order of their ids: each names the oldest change in flight,
	// and the server refuses a copy of one older than an oldest it saw.
	slices.SortFunc(left, func(a, b *wire.Request) int { return cmp.Compare(a.ReqID, b.ReqID) })
	return left, version, nil
}

// reclaim runs after a NACK, in the new session, for every dirty file that
// no flush is sending at the moment (a flush reclaims its own file).
func (w *writeBack) reclaim(ctx context.Context) {
	w.mu.Lock()
	files := make(map[ids.Ino]*dirtyFile, len(w.files))
	for ino, f := range w.files {
		files[ino] = f
	}
	w.mu.Unlock()
	reclaim := func(ctx context.Context, ino ids.Ino, f *dirtyFile) {
		w.reclaimFile(ctx, ino, f, nil)
		w.retire(ino, f)
		f.mu.unlock()
	}
	for ino, f := range files {
		if w.c.behind.busy(ino) {
			// a file created behind the caller, its create perhaps in
			// the very batch whose NACK this recovery answers: reclaim
			// once it reached the server, not waiting for it here
			go func() {
				ctx := context.Background()
				_ = w.c.behind.wait(ctx, ino)
				_ = f.mu.lock(ctx)
				reclaim(ctx, ino, f)
			}()
		} else if f.mu.tryLock() {
			reclaim(ctx, ino, f)
		}
	}
}

// reclaimFile writes f's buffered data back if the file's version is still
// the one it was based on (nobody else wrote it meanwhile); otherwise the
// data is lost and reported. sent, if set, is a flush the server's NACK
// interrupted (reclaimInterrupted); otherwise the writes are new. Called
// with f.mu held.
func (w *writeBack) reclaimFile(ctx context.Context, ino ids.Ino, f *dirtyFile, sent *sentWrites) {
	if !f.dirty() {
		return
	}
	var (
		reqs    []*wire.Request
		version = f.base
		err     error
	)
	if sent == nil {
		reqs = packWrites(ino, f.extents())
		defer releaseWrites(reqs)
	} else {
		reqs, version, err = w.reclaimInterrupted(ctx, sent)
	}
	nacks := 0
	for i := 0; i < len(reqs) && err == nil; {
		r := reqs[i]
		r.Flags |= wire.WriteIfVersion
		r.Version = version
		var rep *wire.Reply
		// Not waiting for changes sent behind (call): this may run
		// on their sender, after a NACK. Whoever reclaims the file
		// waited for its own changes behind first.
		rep, err = w.c.send(ctx, r, sendOpts{failOnNack: true})
		if errors.Is(err, errRecovered) && nacks < maxReclaimNacks {
			// NACKed again (in a cluster a failover can take a few
			// servers): the version check alone keeps the reclaim safe
			nacks++
			err = nil
			continue
		}
		if err != nil {
			break
		}
		version = rep.Attr.Version
		i++
	}
	if err == nil && f.attrs != nil {
		// An attribute change carries no version check of its own: it
		// goes after the writes passed theirs, or alone if the file's
		// version is still the one it was based on.
		if len(reqs) == 0 {
			var rep *wire.Reply
			if rep, err = w.c.send(ctx, &wire.Request{Op: wire.OpGetAttr, Ino: ino}, sendOpts{failOnNack: true}); err == nil &&
				(rep.Attr == nil || rep.Attr.Version != version) {
				err = fmt.Errorf("the file changed at the server meanwhile")
			}
		}
		if err == nil {
			_, err = w.c.send(ctx, f.attrs, sendOpts{failOnNack: true})
		}
	}
	if w.removedWhileDirty(ino, f, err) {
		return
	}
	if err == nil {
		w.c.Counters.ReclaimsOK.Add(1)
		w.c.log.Info("reclaimed buffered writes after recovery", "path", w.c.PathOf(ino), "ino", ino, "bytes", f.bytes)
		return
	}
	w.c.Counters.ReclaimsRefused.Add(1)
	w.c.Counters.DataLost.Add(1)
	w.lost(ino, err)
	w.c.log.Error("DATA LOST: buffered writes could not be reclaimed after the server failed this client; "+
		"the next fsync or close of the file returns EIO", "path", w.c.PathOf(ino), "ino", ino, "bytes", f.bytes, "err", err)
}
