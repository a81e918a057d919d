package client

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/leasefs/leasefs/blocks"
	"github.com/leasefs/leasefs/internal/clock"
	"github.com/leasefs/leasefs/wire"
)

// connBlocks is how the client reaches one server's block store: the
// directory itself when the mount's host sees the same one (same store
// id), else the server's HTTPS endpoint with capabilities from the
// inodes' owners.
type connBlocks struct {
	announced wire.BlockStore // what the session open said
	store     blocks.Store    // nil: the server has no block store
	path      string          // "local DIR", "remote URL" or "none"
}

// setBlocks sets up cn's block store from its session's announcement,
// keeping the one it has if the announcement did not change. Called
// without c.mu held (opening a directory is file system work).
func (c *Client) setBlocks(cn *conn, bs wire.BlockStore) {
	c.mu.Lock()
	cur := cn.blocks
	c.mu.Unlock()
	if cur != nil && sameStore(cur.announced, bs) {
		if fs, ok := cur.store.(*blocks.FileStore); ok {
			fs.SetKeepFree(int64(bs.KeepFree)) // the server's room changes as its store grows
		}
		return
	}
	nb := c.openBlocks(cn.addr, bs)
	c.mu.Lock()
	old := cn.blocks
	cn.blocks = nb
	c.mu.Unlock()
	old.close()
	c.log.Info("block store", "server", cn.addr, "path", nb.path)
}

// sameStore reports whether two announcements name the same store the
// same way (the room to keep free aside).
func sameStore(a, b wire.BlockStore) bool {
	a.KeepFree, b.KeepFree = 0, 0
	return a == b
}

// close closes a remote store's idle connections (nil: nothing to close).
func (nb *connBlocks) close() {
	if nb == nil {
		return
	}
	if rs, ok := nb.store.(*blocks.RemoteStore); ok {
		rs.Close()
	}
}

// openBlocks picks the fastest path to the block store bs of the server
// the client reached at serverAddr: a directory the mount sees too is
// opened, any other store (another host's directory, an object store) is
// reached through the server's endpoint.
func (c *Client) openBlocks(serverAddr string, bs wire.BlockStore) *connBlocks {
	nb := &connBlocks{announced: bs, path: "none"}
	if bs.Kind == "" {
		return nb
	}
	if bs.Kind == "file" && !c.cfg.BlocksRemote {
		fs, err := blocks.OpenFileStoreIfSame(bs.Dir, bs.StoreID)
		if err == nil {
			fs.SetKeepFree(int64(bs.KeepFree))
			nb.store, nb.path = fs, "local "+bs.Dir
			return nb
		}
		c.log.Debug("block store: not the server's directory here, using its endpoint", "dir", bs.Dir, "err", err)
	}
	url := "https://" + blocksAddr(serverAddr, bs.Addr)
	nb.store = blocks.NewRemoteStore(url, c.cfg.Token.CertHash, c.blockCapability)
	nb.path = "remote " + url
	return nb
}

// blocksAddr is the block endpoint's HOST:PORT: its own host if the server
// named one, else the host the client reached the server at (a server
// listening on every address cannot know which of them the client sees).
func blocksAddr(serverAddr, announced string) string {
	host, port, err := net.SplitHostPort(announced)
	if err != nil || host != "" {
		return announced
	}
	if h, _, err := net.SplitHostPort(serverAddr); err == nil {
		host = h
	}
	return net.JoinHostPort(host, port)
}

// blockCapability asks the owner of id's inode for a capability for op on
// id; the server grants it only while this client holds the file's lock
// in the mode op needs (S or X to read, X to write).
func (c *Client) blockCapability(ctx context.Context, op blocks.Op, id blocks.ID) (string, error) {
	if cp, ok := c.caps.get(op, id, c.clk.Now()); ok {
		return cp, nil
	}
	sent := c.clk.Now()
	cp, err := c.askCapability(ctx, op, id)
	if err == nil {
		// the server signed it valid for τ from when it answered: half
		// of that from before we asked is well inside it
		c.caps.put(op, id, cp, sent, sent.Add(time.Duration(c.Session().Tau)/2))
	}
	return cp, err
}

// askCapability asks the owner of id's inode for a capability for op.
func (c *Client) askCapability(ctx context.Context, op blocks.Op, id blocks.ID) (string, error) {
	req := &wire.Request{Op: wire.OpBlockAccess, Ino: id.Ino, Data: wire.AppendUniques(nil, [][16]byte{id.Unique})}
	if op == blocks.OpWrite {
		req.Flags = wire.BlockWrite
	}
	rep, err := c.Call(ctx, req)
	if err != nil {
		return "", fmt.Errorf("client: %s capability for block %s: %w", op, id, err)
	}
	if len(rep.Names) != 1 {
		return "", fmt.Errorf("client: %s capability for block %s: %d in the reply", op, id, len(rep.Names))
	}
	return rep.Names[0], nil
}

// Blocks returns the home server's block store as this client reaches it
// and which path that is ("local DIR", "remote URL", "none"). The store
// is nil when the server has none.
func (c *Client) Blocks() (blocks.Store, string) {
	home := c.homeConn()
	c.mu.Lock()
	defer c.mu.Unlock()
	if home.blocks == nil {
		return nil, "none"
	}
	return home.blocks.store, home.blocks.path
}

// capCache keeps the capabilities the owners signed, each until half its
// validity is gone: a sequential reader asks for the same block's
// capability once, not for every range it fetches of it.
type capCache struct {
	mu sync.Mutex
	m  map[capKey]capEntry
}

type capKey struct {
	op blocks.Op
	id blocks.ID
}

type capEntry struct {
	cap   string
	until clock.Time
}

// capCacheMax bounds the capabilities kept: past it, the expired go.
const capCacheMax = 4096

func (cc *capCache) get(op blocks.Op, id blocks.ID, now clock.Time) (string, bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	e, ok := cc.m[capKey{op, id}]
	if !ok || !now.Before(e.until) {
		return "", false
	}
	return e.cap, true
}

func (cc *capCache) put(op blocks.Op, id blocks.ID, cp string, now, until clock.Time) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.m == nil {
		cc.m = map[capKey]capEntry{}
	}
	if len(cc.m) >= capCacheMax {
		for k, e := range cc.m {
			if !now.Before(e.until) {
				delete(cc.m, k)
			}
		}
		if len(cc.m) >= capCacheMax {
			clear(cc.m)
		}
	}
	cc.m[capKey{op, id}] = capEntry{cp, until}
}
