// Package mountsock names the unix socket on which a mount serves its
// status and admin requests, so that the CLI and the tests find it from the
// mountpoint alone.
//
// The socket is $TMPDIR/leasefs-<first 16 hex digits of the SHA-256 of the
// absolute mountpoint>.sock, mode 0600, removed on exit. The mountpoint is
// not resolved through symlinks, so that asking a hung mount for its
// status never touches the mount itself.
package mountsock

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"os"
	"path/filepath"
)

// Path is where the mount at mountpoint serves its status.
func Path(mountpoint string) string {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		abs = mountpoint
	}
	sum := sha256.Sum256([]byte(filepath.Clean(abs)))
	return filepath.Join(os.TempDir(), "leasefs-"+hex.EncodeToString(sum[:8])+".sock")
}

// Client is an HTTP client whose every request goes to the socket of the
// mount at mountpoint, whatever the URL's host.
func Client(mountpoint string) *http.Client {
	path := Path(mountpoint)
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}}}
}
