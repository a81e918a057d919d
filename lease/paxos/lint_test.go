package paxos

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPure keeps the core pure (STYLE.md): no wall clock, sleeping,
// goroutines, channels, randomness or I/O in non-test files.
func TestPure(t *testing.T) {
	files, _ := filepath.Glob("*.go")
	if len(files) < 2 {
		t.Fatalf("found only %v", files)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range af.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			switch {
			case p == "os" || p == "net" || strings.HasPrefix(p, "net/") || p == "math/rand" || p == "math/rand/v2" || p == "sync" || strings.HasPrefix(p, "os/"):
				t.Errorf("%s: imports %s", fset.Position(im.Pos()), p)
			}
		}
		ast.Inspect(af, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: go statement", fset.Position(n.Pos()))
			case *ast.ChanType:
				t.Errorf("%s: channel type", fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "time" && (n.Sel.Name == "Now" || n.Sel.Name == "Sleep" || n.Sel.Name == "Since" || n.Sel.Name == "After" || n.Sel.Name == "NewTimer" || n.Sel.Name == "Tick") {
					t.Errorf("%s: time.%s", fset.Position(n.Pos()), n.Sel.Name)
				}
			}
			return true
		})
	}
}
