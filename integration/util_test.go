package integration

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func goroot(t testing.TB) string {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}
