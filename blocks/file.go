package blocks

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

const (
	// storeIDFile holds the store's id, so that a mount can tell that a
	// path on its host is the very directory the server writes.
	storeIDFile = ".leasefs-blocks"
	// tmpDir holds blocks being written; they are renamed into place.
	tmpDir = ".tmp"
	// staleTemp is how old a temp file must be before a store opening
	// removes it: younger ones may be another process's Put in progress.
	staleTemp = time.Minute
	// putRetries bounds the retries of a Put whose inode directory a
	// concurrent Delete removed.
	putRetries = 3
)

// FileStore keeps blocks as files in a directory:
// DIR/<2 hex of a hash of the inode>/<inode, 16 hex>/<unique, 32 hex>, so
// that no directory grows huge and one inode's blocks are one directory.
// Several processes on the host (the server and local mounts) may use one
// directory at once.
type FileStore struct {
	dir      string
	id       string
	keepFree atomic.Int64 // SetKeepFree
}

var _ Store = (*FileStore)(nil)

// OpenFileStore opens the block store in dir, creating it (and its store
// id) if needed, and removes temp files a crash left behind.
func OpenFileStore(dir string) (*FileStore, error) {
	if err := os.MkdirAll(filepath.Join(dir, tmpDir), 0o700); err != nil {
		return nil, fmt.Errorf("blocks: open %s: %w", dir, err)
	}
	id, err := readStoreID(dir)
	if errors.Is(err, fs.ErrNotExist) {
		id, err = createStoreID(dir)
	}
	if err != nil {
		return nil, err
	}
	s := &FileStore{dir: dir, id: id}
	if _, err := s.RemoveStaleTemps(staleTemp); err != nil {
		return nil, err
	}
	return s, nil
}

// OpenFileStoreIfSame opens the existing block store in dir if its store
// id is id: a mount told that the server's blocks are at file:DIR uses
// this to check that DIR on its host is the same directory, not a
// different one at the same path. Otherwise the error is ErrOtherStore.
func OpenFileStoreIfSame(dir, id string) (*FileStore, error) {
	got, err := readStoreID(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOtherStore, err)
	}
	if got != id {
		return nil, fmt.Errorf("blocks: %s holds store %s, not %s: %w", dir, got, id, ErrOtherStore)
	}
	return &FileStore{dir: dir, id: id}, nil
}

// StoreID is the store's random id, fixed when the directory was created.
func (s *FileStore) StoreID() string { return s.id }

func readStoreID(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, storeIDFile))
	if err != nil {
		return "", fmt.Errorf("blocks: store id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if len(id) != 32 || !lowerHex(id) {
		return "", fmt.Errorf("blocks: store id in %s: malformed %q", dir, id)
	}
	return id, nil
}

// createStoreID writes a new store id, durably, unless another process
// got there first, in which case that one is the id.
func createStoreID(dir string) (string, error) {
	var b [16]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	tmp, err := writeTemp(filepath.Join(dir, tmpDir), []byte(id+"\n"))
	if err != nil {
		return "", fmt.Errorf("blocks: store id: %w", err)
	}
	defer os.Remove(tmp)
	// link, unlike rename, never replaces an id another process wrote.
	err = os.Link(tmp, filepath.Join(dir, storeIDFile))
	if errors.Is(err, fs.ErrExist) {
		return readStoreID(dir)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return "", fmt.Errorf("blocks: store id: %w", err)
	}
	return id, nil
}

// RemoveStaleTemps removes the temp files of Puts that started more than
// age ago, which a writer that died mid-Put left (a mount killed while it
// put a block), and returns how many it removed.
func (s *FileStore) RemoveStaleTemps(age time.Duration) (int, error) {
	d := filepath.Join(s.dir, tmpDir)
	ents, err := os.ReadDir(d)
	if err != nil {
		return 0, fmt.Errorf("blocks: open %s: %w", s.dir, err)
	}
	n := 0
	for _, e := range ents {
		info, err := e.Info()
		if err == nil && time.Since(info.ModTime()) > age && os.Remove(filepath.Join(d, e.Name())) == nil {
			n++
		}
	}
	return n, nil
}

// fanout spreads inodes over 256 directories; inode numbers carry their
// server in the top byte and a counter below, so they are hashed first.
func fanout(ino ids.Ino) string {
	return fmt.Sprintf("%02x", uint64(ino)*0x9e3779b97f4a7c15>>56)
}

func (s *FileStore) inoDir(ino ids.Ino) string {
	return filepath.Join(s.dir, fanout(ino), fmt.Sprintf("%016x", uint64(ino)))
}

func (s *FileStore) path(id ID) string {
	return filepath.Join(s.inoDir(id.Ino), hex.EncodeToString(id.Unique[:]))
}

// Put writes the block to a temp file, syncs it, renames it into place and
// syncs the directories it entered, so that the name appears only for a
// whole, durable block. On ENOSPC nothing is left behind.
func (s *FileStore) Put(ctx context.Context, id ID, data []byte) error {
	if len(data) > MaxBlock {
		return fmt.Errorf("blocks: put %s: %d bytes: %w", id, len(data), ErrTooBig)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.checkKeepFree(int64(len(data))); err != nil {
		return fmt.Errorf("blocks: put %s: %w", id, err)
	}
	tmp, err := writeTemp(filepath.Join(s.dir, tmpDir), data)
	if err != nil {
		return fmt.Errorf("blocks: put %s: %w", id, err)
	}
	var made []string
	for try := 0; ; try++ {
		var m []string
		m, err = s.mkdirs(id.Ino)
		made = append(made, m...)
		if err == nil {
			err = os.Rename(tmp, s.path(id))
		}
		// a Delete of the inode's last block may remove its directory
		// between our mkdir and rename: make it again. The directories'
		// syncs wait until after the rename to keep that window short.
		if err == nil || !errors.Is(err, fs.ErrNotExist) || try == putRetries {
			break
		}
	}
	if err == nil {
		err = syncDirs(append(made, s.inoDir(id.Ino)))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("blocks: put %s: %w", id, err)
	}
	return nil
}

// mkdirs makes the inode's directory and returns the parents that gained
// an entry, which the caller syncs so that a durable block is never in a
// directory that is not. A directory another process just made, and is
// syncing, is taken as it is: our sync of it after the rename commits the
// journal that holds its creation too (ext4, xfs).
func (s *FileStore) mkdirs(ino ids.Ino) (made []string, err error) {
	fan := filepath.Join(s.dir, fanout(ino))
	d := s.inoDir(ino)
	if _, err := os.Stat(d); err == nil {
		return nil, nil
	}
	for _, step := range [][2]string{{s.dir, fan}, {fan, d}} {
		err := os.Mkdir(step[1], 0o700)
		switch {
		case err == nil:
			made = append(made, step[0])
		case !errors.Is(err, fs.ErrExist):
			return made, err
		}
	}
	return made, nil
}

// writeTemp writes data to a new file in dir and syncs it; on error it
// removes the file.
func writeTemp(dir string, data []byte) (string, error) {
	f, err := os.CreateTemp(dir, "put-*")
	if err != nil {
		return "", err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

func syncDirs(dirs []string) error {
	for _, d := range dirs {
		if err := syncDir(d); err != nil {
			return err
		}
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// ReadAt reads from the block file.
func (s *FileStore) ReadAt(ctx context.Context, id ID, p []byte, off int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	f, err := os.Open(s.path(id))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("blocks: read %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("blocks: read %s: %w", id, err)
	}
	defer f.Close()
	n, err := f.ReadAt(p, off)
	if err != nil && err != io.EOF {
		return n, fmt.Errorf("blocks: read %s: %w", id, err)
	}
	return n, err
}

// Delete removes the block file, and the inode's directory once empty.
func (s *FileStore) Delete(ctx context.Context, id ID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := os.Remove(s.path(id))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blocks: delete %s: %w", id, err)
	}
	// fails while other blocks (or none of ours) are there; that is fine
	os.Remove(s.inoDir(id.Ino))
	return nil
}

// List reads the inode's directory, or all of them.
func (s *FileStore) List(ctx context.Context, ino ids.Ino, fn func(ID, int64, time.Time) error) error {
	if ino != AllInodes {
		return s.listIno(ctx, ino, s.inoDir(ino), fn)
	}
	fans, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("blocks: list: %w", err)
	}
	for _, fan := range fans {
		if len(fan.Name()) != 2 || !lowerHex(fan.Name()) || !fan.IsDir() {
			continue // the store id, the temp directory
		}
		inos, err := os.ReadDir(filepath.Join(s.dir, fan.Name()))
		if err != nil {
			return fmt.Errorf("blocks: list: %w", err)
		}
		for _, e := range inos {
			ino, err := parseInoHex(e.Name())
			if err != nil {
				continue // not ours
			}
			if err := s.listIno(ctx, ino, filepath.Join(s.dir, fan.Name(), e.Name()), fn); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *FileStore) listIno(ctx context.Context, ino ids.Ino, dir string, fn func(ID, int64, time.Time) error) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("blocks: list: %w", err)
	}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := e.Name()
		id := ID{Ino: ino}
		if len(name) != 32 || !lowerHex(name) {
			continue
		}
		hex.Decode(id.Unique[:], []byte(name))
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted since the directory was read
		}
		if err != nil {
			return fmt.Errorf("blocks: list: %w", err)
		}
		if err := fn(id, info.Size(), info.ModTime()); err != nil {
			return err
		}
	}
	return nil
}

// Usage counts the blocks (a walk of the whole store: callers that ask
// often cache it) and asks statfs for the free space.
func (s *FileStore) Usage(ctx context.Context) (Usage, error) {
	u, err := countBlocks(ctx, s)
	if err != nil {
		return Usage{}, err
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.dir, &st); err != nil {
		return Usage{}, fmt.Errorf("blocks: statfs %s: %w", s.dir, err)
	}
	u.Free = int64(st.Bavail) * st.Bsize
	return u, nil
}

// SetKeepFree makes Puts fail with ENOSPC where they would leave less
// than n bytes free on the store's file system: the room another writer
// there (the server's metadata store) must keep. Concurrent Puts may
// each pass the check; the other writer's own reserve covers that.
func (s *FileStore) SetKeepFree(n int64) { s.keepFree.Store(n) }

func (s *FileStore) checkKeepFree(n int64) error {
	keep := s.keepFree.Load()
	if keep <= 0 {
		return nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.dir, &st); err != nil {
		return err
	}
	// the block's last file system block, partly filled, counts whole
	if free := int64(st.Bavail) * st.Bsize; free-n-int64(st.Bsize) < keep {
		return fmt.Errorf("%d bytes free, %d to keep for the metadata store: %w", free, keep, syscall.ENOSPC)
	}
	return nil
}
