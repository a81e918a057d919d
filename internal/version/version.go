// Package version says which build of leasefs is running, from the build
// information the Go toolchain embeds: what `leasefs version` prints,
// servers and mounts log at start and show in their status.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
)

// Info is one build's identity.
type Info struct {
	// Version is the module's version (vX.Y.Z, or a pseudo-version), or
	// "devel" for a build from a checkout.
	Version string `json:"version"`
	// Commit is the VCS revision built, shortened, with "+modified" when
	// the tree had uncommitted changes; empty when not recorded (go run,
	// go test, a tree outside git).
	Commit string `json:"commit,omitempty"`
	// CommitTime is the commit's time, RFC 3339, when recorded.
	CommitTime string `json:"commit_time,omitempty"`
	Go         string `json:"go"`
	Platform   string `json:"platform"`
}

// String is the one-line form: "devel (commit 694a127+modified, 2026-12-07T20:35:00Z) go1.26.8 linux/amd64".
func (i Info) String() string {
	var b strings.Builder
	b.WriteString(i.Version)
	if i.Commit != "" {
		fmt.Fprintf(&b, " (commit %s", i.Commit)
		if i.CommitTime != "" {
			fmt.Fprintf(&b, ", %s", i.CommitTime)
		}
		b.WriteString(")")
	}
	fmt.Fprintf(&b, " %s %s", i.Go, i.Platform)
	return b.String()
}

// Get returns this build's Info.
var Get = sync.OnceValue(func() Info {
	i := Info{Version: "devel", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return i
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		i.Version = v
	}
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			i.Commit = s.Value[:min(len(s.Value), 12)]
		case "vcs.time":
			i.CommitTime = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if i.Commit != "" && strings.Contains(i.Version, i.Commit) {
		// a pseudo-version the toolchain made of the commit: no release
		i.Version = "devel"
	}
	if modified && i.Commit != "" {
		i.Commit += "+modified"
	}
	return i
})
