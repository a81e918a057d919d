package metaserver

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/blocks/blockmap"
	"github.com/leasefs/leasefs/internal/ids"
)

// fakeAdopter is a cluster as the collector sees it: the inodes this
// server owns, those other servers own, and whether this one is the
// collector.
type fakeAdopter struct {
	collector bool
	mine      map[ids.Ino]bool
	elsewhere map[ids.Ino]bool
	refuse    map[ids.Ino]bool // OwnIfFree fails (no majority answered)
	// recover is what the takeover's recovery brings this replica, which
	// lagged, of an inode
	recover map[ids.Ino]func()
	tries   []ids.Ino
}

func (f *fakeAdopter) Collector(context.Context) bool  { return f.collector }
func (f *fakeAdopter) OwnedElsewhere(ino ids.Ino) bool { return f.elsewhere[ino] }
func (f *fakeAdopter) owns(ino ids.Ino) bool           { return f.mine[ino] }

func (f *fakeAdopter) OwnIfFree(_ context.Context, ino ids.Ino) (bool, error) {
	f.tries = append(f.tries, ino)
	switch {
	case f.elsewhere[ino]:
		return false, nil
	case f.refuse[ino]:
		return false, errors.New("no majority")
	}
	if r := f.recover[ino]; r != nil {
		r()
	}
	f.mine[ino] = true
	return true, nil
}

// TestBlockGCAdopts: the collector takes over the inodes nobody owns
// that have due garbage or orphans, at most AdoptInodes a round, and
// collects them; it never takes one another server owns, and a server
// that is not the collector takes none. A block this server's replica
// did not know, but the takeover's recovery names, stays.
func TestBlockGCAdopts(t *testing.T) {
	e := newGCEnv(t)
	past := time.Now().Add(-time.Hour)
	free1, free2, theirs, orphaned, failing := e.create("free1"), e.create("free2"), e.create("theirs"), e.create("orphaned"), e.create("failing")
	garbageOf := map[ids.Ino][]blocks.ID{}
	var kept []blocks.ID
	for _, ino := range []ids.Ino{free1, free2, theirs} {
		for range 2 {
			garbageOf[ino] = append(garbageOf[ino], e.write(ino, 0, 100, past))
		}
		kept = append(kept, e.write(ino, 0, 100, past)) // what the map names now
	}
	orphans := map[ids.Ino]blocks.ID{}
	for _, ino := range []ids.Ino{orphaned, failing, theirs} {
		orphans[ino], _ = e.put(ino, 10)
		e.age(orphans[ino], past)
	}
	kept = append(kept, e.write(orphaned, 0, 100, past))
	for _, id := range kept {
		e.age(id, past)
	}
	// lagging: this replica has not seen the commit of its block yet,
	// which the takeover's recovery brings
	lagging := e.create("lagging")
	laggingID, laggingBlock := e.put(lagging, 10)
	e.age(laggingID, past)
	kept = append(kept, laggingID)
	a := &fakeAdopter{mine: map[ids.Ino]bool{}, elsewhere: map[ids.Ino]bool{theirs: true}, refuse: map[ids.Ino]bool{failing: true},
		recover: map[ids.Ino]func(){lagging: func() {
			ext := []blockmap.Extent{{Off: 0, Len: laggingBlock.Size, Block: laggingBlock.Unique}}
			if _, err := e.meta.CommitBlocks(lagging, []blockmap.Block{laggingBlock}, ext, laggingBlock.Size, past.UnixNano()); err != nil {
				t.Error(err)
			}
		}}}
	g := e.collector(BlockGCConfig{OrphanDelay: time.Minute, Owns: a.owns, Adopter: a, AdoptInodes: 1})
	exists := func(ids ...blocks.ID) bool {
		for _, id := range ids {
			if !e.exists(id) {
				return false
			}
		}
		return true
	}

	// not the collector: nothing nobody owns is touched
	g.round(context.Background())
	if len(a.tries) != 0 || !exists(garbageOf[free1]...) || !exists(orphans[orphaned]) {
		t.Fatalf("a server that is not the collector took over %v", a.tries)
	}

	// the collector: one inode a round, garbage first
	a.collector = true
	g.nextScan = g.cfg.Clock.Now() // the scan that queues the orphaned inodes
	g.round(context.Background())
	if len(a.tries) != 1 || a.tries[0] != free1 || exists(garbageOf[free1]...) || !exists(garbageOf[free2]...) {
		t.Fatalf("first round: tried %v; free1's garbage there %v, free2's %v", a.tries,
			exists(garbageOf[free1]...), exists(garbageOf[free2]...))
	}
	g.round(context.Background())
	if exists(garbageOf[free2]...) || !exists(orphans[orphaned]) {
		t.Fatalf("second round: tried %v", a.tries)
	}
	g.round(context.Background()) // the orphan queue: orphaned
	g.round(context.Background()) // failing, which cannot be had
	g.round(context.Background()) // lagging, whose block its recovery names
	if exists(orphans[orphaned]) || !exists(orphans[failing]) {
		t.Fatalf("after five rounds: tried %v; orphaned's orphan there %v, failing's %v", a.tries,
			exists(orphans[orphaned]), exists(orphans[failing]))
	}
	for _, ino := range a.tries {
		if ino == theirs {
			t.Fatal("the collector tried to take an inode another server owns")
		}
	}
	if !exists(garbageOf[theirs]...) || !exists(orphans[theirs]) || !exists(kept...) {
		t.Fatal("the collector deleted another owner's blocks or a referenced block")
	}
	if !a.mine[lagging] {
		t.Fatalf("the inode whose block this replica did not know was not taken over: tried %v", a.tries)
	}
	if st := g.Stats(); st.Adopted != 4 || st.Deleted != 4 || st.Orphans != 1 || st.Errors != 1 {
		t.Fatalf("stats %+v, want 4 adopted, 4 garbage and 1 orphan deleted, 1 error", st)
	}
}
