package store

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dgraph-io/badger/v4"

	"github.com/leasefs/leasefs/internal/ids"
	"github.com/leasefs/leasefs/wire"
)

// legacyStore turns s into a store as a leasefs before formats wrote it:
// no format record, each file's data in 64 KiB 'K' chunks.
func legacyStore(t *testing.T, s *Store, files map[ids.Ino][]byte) {
	t.Helper()
	err := s.kv.update(func(tx kvTxn) error {
		if err := tx.del(formatKey); err != nil {
			return err
		}
		var pages [][]byte
		if err := tx.scan([]byte{RecPage}, nil, false, false, func(k, _ []byte) (bool, error) {
			pages = append(pages, bytes.Clone(k))
			return true, nil
		}); err != nil {
			return err
		}
		for _, k := range pages {
			if err := tx.del(k); err != nil {
				return err
			}
		}
		for ino, data := range files {
			for off := 0; off < len(data); off += legacyChunkSize {
				key := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64([]byte{recLegacyChunk}, uint64(ino)), uint64(off/legacyChunkSize))
				if err := tx.set(key, data[off:min(off+legacyChunkSize, len(data))]); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestStoreFormatUpgrade: a store of 64 KiB chunks opens with every byte
// where it was, now in pages, and the chunks gone; more chunks than one
// conversion transaction takes.
func TestStoreFormatUpgrade(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir, Options{})
	r := rand.New(rand.NewPCG(1, 2))
	files := map[ids.Ino][]byte{}
	for i, size := range []int{1, PageSize + 3, legacyChunkSize, 3*legacyChunkSize + 100, (legacyBatch + 10) * legacyChunkSize} {
		f := must[Attr](t)(s.Create(ids.RootIno, "f"+string(rune('a'+i)), reg|0o600, 0, 0, 0, 1))
		data := make([]byte, size)
		for j := range data {
			data[j] = byte(r.Uint32())
		}
		for off := 0; off < size; off += 4 << 20 {
			must[Attr](t)(s.Write(f.Ino, uint64(off), data[off:min(off+4<<20, size)], 2))
		}
		files[f.Ino] = data
	}
	legacyStore(t, s, files)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openTestStore(t, dir, Options{})
	defer s.Close()
	for ino, data := range files {
		if got := must[[]byte](t)(s.Read(ino, 0, len(data)+10)); !bytes.Equal(got, data) {
			t.Fatalf("%v: %d bytes differ after the upgrade", ino, len(data))
		}
		if n, want := countRecords(t, s, RecPage, ino), (len(data)+PageSize-1)/PageSize; n != want {
			t.Fatalf("%v: %d pages, want %d", ino, n, want)
		}
		if n := countRecords(t, s, recLegacyChunk, ino); n != 0 {
			t.Fatalf("%v: %d chunks left", ino, n)
		}
	}
	// the next open finds the format record and converts nothing
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTestStore(t, dir, Options{})
	for ino, data := range files {
		if got := must[[]byte](t)(s.Read(ino, 0, len(data))); !bytes.Equal(got, data) {
			t.Fatalf("%v: %d bytes differ after a second open", ino, len(data))
		}
	}
}

// TestStoreFormatNewer: a store of a format this build does not know is
// refused, and left as it was.
func TestStoreFormatNewer(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir, Options{})
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o600, 0, 0, 0, 1))
	must[Attr](t)(s.Write(f.Ino, 0, []byte("kept"), 2))
	if err := s.kv.update(func(tx kvTxn) error { return tx.set(formatKey, []byte{storeFormat + 1}) }); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := Open(dir, Options{ServerID: 1, Logger: quiet})
	if err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("open of a newer format: %v", err)
	}
	// as it was: put our format back by hand, and the file reads
	db, err := badger.Open(badger.DefaultOptions(filepath.Join(dir, "db")).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := (badgerKV{db: db}).update(func(tx kvTxn) error { return tx.set(formatKey, []byte{storeFormat}) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTestStore(t, dir, Options{})
	defer s.Close()
	if got := must[[]byte](t)(s.Read(f.Ino, 0, 10)); string(got) != "kept" {
		t.Fatalf("read %q after a refused open", got)
	}
}

// TestStoreFormat2: a store of format 2, whose attribute records have no
// change count, opens as format 3 (pagesFormat) without converting them: they read with
// Change 0 and take the new form at their inode's next change.
func TestStoreFormat2(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir, Options{})
	f := must[Attr](t)(s.Create(ids.RootIno, "f", reg|0o600, 0, 0, 0, 1))
	err := s.kv.update(func(tx kvTxn) error {
		in := inode{Attr: f}
		v := in.encode(nil)
		v = v[:len(v)-8] // as format 2 wrote it
		v[0] = inodeFormatV1
		if err := tx.set(binary.BigEndian.AppendUint64([]byte{RecAttr}, uint64(f.Ino)), v); err != nil {
			return err
		}
		return tx.set(formatKey, []byte{2})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTestStore(t, dir, Options{})
	defer s.Close()
	if a := must[Attr](t)(s.GetAttr(f.Ino)); a.Change != 0 || a.Mode != reg|0o600 {
		t.Fatalf("a format 2 record read as %+v", a)
	}
	if a := must[Attr](t)(s.SetAttr(f.Ino, SetAttrIn{Valid: wire.SetMode, Mode: 0o640}, 2)); a.Change != 1 {
		t.Fatalf("first change of a format 2 record: Change %d, want 1", a.Change)
	}
	var format []byte
	err = s.kv.view(func(tx kvTxn) error {
		_, err := tx.get(formatKey, func(v []byte) error { format = bytes.Clone(v); return nil })
		return err
	})
	if err != nil || !bytes.Equal(format, []byte{pagesFormat}) {
		t.Fatalf("format record %v %v, want %d", format, err, pagesFormat)
	}
}
