package purity

import (
	"fmt"
	"strings"
	"testing"
)

// recorder collects what Check reports instead of failing the test.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Helper() {}

// TestCatchesImpurity tests the tester: every kind of impurity in
// testdata/impure is reported.
func TestCatchesImpurity(t *testing.T) {
	t.Chdir("testdata/impure")
	r := &recorder{TB: t}
	Check(r, Options{})
	all := strings.Join(r.errs, "\n")
	for _, want := range []string{"time.Now", "go statement", "channel type", "imports math/rand", "imports os", "global rand.Intn"} {
		if !strings.Contains(all, want) {
			t.Errorf("not reported: %s\ngot:\n%s", want, all)
		}
	}
}
