package cyclo

import (
	"go/token"
	"os"
	"path/filepath"
	"testing"
)

// The repository's bounds: no function over
// cyclomatic complexity 30, no file over 1,000 lines, tests aside.
const (
	maxComplexity = 30
	maxLines      = 1000
)

// TestRepository walks the module and lists every function and file over
// the bounds.
func TestRepository(t *testing.T) {
	root := moduleRoot(t)
	files, err := Walk(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 50 {
		t.Fatalf("found %d Go files under %s: not the module", len(files), root)
	}
	for _, f := range files {
		rel, _ := filepath.Rel(root, f.Path)
		if f.Lines > maxLines {
			t.Errorf("%s: %d lines (at most %d)", rel, f.Lines, maxLines)
		}
		for _, fn := range f.Funcs {
			if fn.Complexity > maxComplexity {
				t.Errorf("%s:%d: %s: cyclomatic complexity %d (at most %d)", rel, fn.Pos.Line, fn.Name, fn.Complexity, maxComplexity)
			}
		}
	}
}

func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// TestComplexity: the count is gocyclo's.
func TestComplexity(t *testing.T) {
	const src = `package p

func none() {}

func each(xs []int, m map[int]bool, ch chan int) int {
	n := 0
	for _, x := range xs { // +1
		if x > 0 && m[x] || x == -1 { // +3
			n++
		}
	}
	for i := 0; i < 3; i++ { // +1
	}
	switch n {
	case 1, 2: // +1
	case 3: // +1
	default:
	}
	select {
	case v := <-ch: // +1
		n += v
	default:
	}
	f := func() bool { return n > 1 && n < 9 } // +1
	_ = f
	return n
}

type T[K any] struct{}

func (t *T[K]) method() {
	if true { // +1
	}
}
`
	f, err := ParseFile(token.NewFileSet(), "p.go", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"none": 1, "each": 10, "(T).method": 2}
	if len(f.Funcs) != len(want) {
		t.Fatalf("functions %v", f.Funcs)
	}
	for _, fn := range f.Funcs {
		if want[fn.Name] != fn.Complexity {
			t.Errorf("%s: complexity %d, want %d", fn.Name, fn.Complexity, want[fn.Name])
		}
	}
	if f.Lines != 34 {
		t.Errorf("%d lines, want 34", f.Lines)
	}
}
