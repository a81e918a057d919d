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
// id), an object store directly with URLs the inodes' owners presign,
// else the server's HTTPS endpoint with capabilities from the owners.
type connBlocks struct {
	announced wire.BlockStore // what the session open said
	store     blocks.Store    // nil: the server has no block store
	path      string          // "local DIR", "s3 direct ENDPOINT", "remote URL" or "none"
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
	if rs, ok := nb.store.(interface{ Close() }); ok {
		rs.Close()
	}
}

// openBlocks picks the fastest path to the block store bs of the server
// the client reached at serverAddr: a directory the mount sees too is
// opened, an object store is reached directly with presigned URLs, and
// another host's directory through the server's endpoint (as is any store
// with --blocks-remote).
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
	if bs.Kind == "s3" && !c.cfg.BlocksRemote {
		nb.store = blocks.NewURLStore(c.blockURL, func(op blocks.Op, id blocks.ID) { c.caps.forget(capKey{op, id, true}) })
		nb.path = "s3 direct " + bs.Endpoint
		return nb
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
	return c.blockAccess(ctx, capKey{op, id, false})
}

// blockURL asks the owner of id's inode for a presigned URL for op on id
// in its object store, under the same lock as a capability.
func (c *Client) blockURL(ctx context.Context, op blocks.Op, id blocks.ID) (string, error) {
	return c.blockAccess(ctx, capKey{op, id, true})
}

// urlMargin is how long before a presigned URL's end the client stops
// using it: the time a request takes to reach the object store.
const urlMargin = 250 * time.Millisecond

func (c *Client) blockAccess(ctx context.Context, k capKey) (string, error) {
	if cp, ok := c.caps.get(k, c.clk.Now()); ok {
		return cp, nil
	}
	sent := c.clk.Now()
	cp, err := c.askCapability(ctx, k)
	if err != nil {
		return "", err
	}
	// the server signed it valid for τ from when it answered: half of
	// that from before we asked is well inside it
	until := sent.Add(time.Duration(c.Session().Tau) / 2)
	if k.url {
		// but a URL lasts whole seconds from the second it was
		// signed in: maybe less
		end, _ := blocks.URLExpiry(cp)
		if left := time.Until(end) - urlMargin; left < until.Sub(c.clk.Now()) {
			until = c.clk.Now().Add(left)
		}
	}
	c.caps.put(k, cp, sent, until)
	return cp, nil
}

// askCapability asks the owner of k's block's inode for a capability or
// a presigned URL.
func (c *Client) askCapability(ctx context.Context, k capKey) (string, error) {
	req := &wire.Request{Op: wire.OpBlockAccess, Ino: k.id.Ino, Data: wire.AppendUniques(nil, [][16]byte{k.id.Unique})}
	if k.op == blocks.OpWrite {
		req.Flags = wire.BlockWrite
	}
	what := "capability"
	if k.url {
		req.Flags |= wire.BlockURL
		what = "presigned URL"
	}
	rep, err := c.Call(ctx, req)
	if err != nil {
		return "", fmt.Errorf("client: %s %s for block %s: %w", k.op, what, k.id, err)
	}
	if len(rep.Names) != 1 {
		return "", fmt.Errorf("client: %s %s for block %s: %d in the reply", k.op, what, k.id, len(rep.Names))
	}
	return rep.Names[0], nil
}

// Blocks returns the home server's block store as this client reaches it
// and which path that is ("local DIR", "s3 direct ENDPOINT", "remote
// URL", "none"). The store is nil when the server has none.
func (c *Client) Blocks() (blocks.Store, string) {
	home := c.homeConn()
	c.mu.Lock()
	defer c.mu.Unlock()
	if home.blocks == nil {
		return nil, "none"
	}
	return home.blocks.store, home.blocks.path
}

// capCache keeps the capabilities and URLs the owners signed, each until
// half its validity is gone: a sequential reader asks for the same
// block's capability once, not for every range it fetches of it.
type capCache struct {
	mu sync.Mutex
	m  map[capKey]capEntry
}

type capKey struct {
	op  blocks.Op
	id  blocks.ID
	url bool // a presigned URL, not a capability
}

type capEntry struct {
	cap   string
	until clock.Time
}

// capCacheMax bounds the capabilities kept: past it, the expired go.
const capCacheMax = 4096

func (cc *capCache) get(k capKey, now clock.Time) (string, bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	e, ok := cc.m[k]
	if !ok || !now.Before(e.until) {
		return "", false
	}
	return e.cap, true
}

func (cc *capCache) put(k capKey, cp string, now, until clock.Time) {
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
	if now.Before(until) {
		cc.m[k] = capEntry{cp, until}
	}
}

// forget drops what the cache keeps for k: the store refused it.
func (cc *capCache) forget(k capKey) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	delete(cc.m, k)
}
