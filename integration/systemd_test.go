package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemdUnits checks the example units in docs/systemd: systemd
// accepts them (systemd-analyze verify, with ExecStart pointing at this
// build, and no warning either), and the server unit's command line is
// one leasefs takes (its flags parse: --help after them exits 0).
func TestSystemdUnits(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not installed")
	}
	units, err := filepath.Glob("../docs/systemd/*")
	must(t, err)
	if len(units) < 2 {
		t.Fatalf("units: %q", units)
	}
	dir := t.TempDir()
	var paths []string
	for _, u := range units {
		b, err := os.ReadFile(u)
		must(t, err)
		text := strings.ReplaceAll(string(b), "/usr/local/bin/leasefs", binary)
		p := filepath.Join(dir, filepath.Base(u))
		must(t, os.WriteFile(p, []byte(text), 0o644))
		paths = append(paths, p)
		for _, line := range strings.Split(text, "\n") {
			cmd, ok := strings.CutPrefix(line, "ExecStart=")
			if !ok {
				continue
			}
			f := strings.Fields(cmd)
			if out, err := exec.Command(f[0], append(f[1:], "--help")...).CombinedOutput(); err != nil {
				t.Errorf("%s: ExecStart's flags: %v\n%s", u, err, out)
			}
		}
	}
	out, err := exec.Command("systemd-analyze", append([]string{"verify"}, paths...)...).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}
