package paxosnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/leasefs/leasefs/lease/paxos"
)

// BootFile is the name of the boot counter file in a server's data
// directory.
const BootFile = "paxos-boot"

// ErrBootExhausted: the boot counter reached paxos.MaxBoot; ballots could no
// longer be told apart from an earlier boot's.
var ErrBootExhausted = errors.New("paxosnode: boot counter exhausted")

// readBoot returns the boot counter stored in dir, 0 if there is none.
func readBoot(dir string) (uint16, error) {
	b, err := os.ReadFile(filepath.Join(dir, BootFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("paxosnode: read boot counter: %w", err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 16)
	if err != nil {
		// never start over from zero: ballots of an earlier boot could repeat
		return 0, fmt.Errorf("paxosnode: boot counter %s corrupt: %w", filepath.Join(dir, BootFile), err)
	}
	return uint16(v), nil
}

// nextBoot increments the boot counter in dir and makes the new value
// durable (file and directory synced) before returning it, so that no two
// starts of this server share a boot counter, hence ballots (DESIGN.md:
// "ballots increase across restarts").
func nextBoot(dir string) (uint16, error) {
	cur, err := readBoot(dir)
	if err != nil {
		return 0, err
	}
	if cur >= paxos.MaxBoot {
		return 0, fmt.Errorf("%w: %d in %s", ErrBootExhausted, cur, dir)
	}
	boot := cur + 1
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, fmt.Errorf("paxosnode: boot counter: %w", err)
	}
	tmp := filepath.Join(dir, BootFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, fmt.Errorf("paxosnode: boot counter: %w", err)
	}
	_, err = fmt.Fprintf(f, "%d\n", boot)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, BootFile))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		os.Remove(tmp)
		return 0, fmt.Errorf("paxosnode: write boot counter: %w", err)
	}
	return boot, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
