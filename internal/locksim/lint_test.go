package locksim

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPure fails if a non-test file of this package reads the clock, sleeps,
// starts goroutines, uses channels or imports os, net or math/rand (math/rand/v2 with an explicit seeded
// source is allowed in this simulator): the
// package is a pure protocol core (STYLE.md).
func TestPure(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if p == "os" || p == "net" || strings.HasPrefix(p, "net/") || strings.HasPrefix(p, "os/") || strings.HasPrefix(p, "math/rand") && p != "math/rand/v2" {
				t.Errorf("%s: imports %s", fset.Position(imp.Pos()), p)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: go statement", fset.Position(n.Pos()))
			case *ast.ChanType:
				t.Errorf("%s: channel type", fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				// Only explicitly seeded sources: no global rand.
				if id, ok := n.X.(*ast.Ident); ok && id.Name == "rand" && n.Sel.Name != "New" && n.Sel.Name != "NewPCG" && n.Sel.Name != "Rand" {
					t.Errorf("%s: global rand.%s", fset.Position(n.Pos()), n.Sel.Name)
				}
				if id, ok := n.X.(*ast.Ident); ok && id.Name == "time" && (n.Sel.Name == "Now" || n.Sel.Name == "Sleep" || n.Sel.Name == "Since" || n.Sel.Name == "After" || n.Sel.Name == "NewTimer" || n.Sel.Name == "Tick") {
					t.Errorf("%s: time.%s", fset.Position(n.Pos()), n.Sel.Name)
				}
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("no files checked")
	}
}
