// Package purity checks that a protocol core stays pure (STYLE.md): no
// wall clock, sleeping, goroutines, channels, locks, global randomness or
// I/O in its non-test files. Each core runs Check from a test, so the rule
// is an ordinary test failure.
package purity

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Options relax the rules for one package.
type Options struct {
	// SeededRand allows math/rand/v2 with an explicit seeded source
	// (rand.New, rand.NewPCG): simulators draw their faults from a seed.
	SeededRand bool
}

var forbiddenTime = map[string]bool{"Now": true, "Sleep": true, "Since": true, "Until": true,
	"After": true, "AfterFunc": true, "NewTimer": true, "NewTicker": true, "Tick": true}

// Check fails t for every rule broken by a non-test .go file in the
// current directory (the package under test).
func Check(t testing.TB, o Options) {
	t.Helper()
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
			bad := p == "os" || strings.HasPrefix(p, "os/") || p == "net" || strings.HasPrefix(p, "net/") || p == "sync" ||
				strings.HasPrefix(p, "math/rand") && !(o.SeededRand && p == "math/rand/v2")
			if bad {
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
				id, ok := n.X.(*ast.Ident)
				if !ok {
					break
				}
				if id.Name == "time" && forbiddenTime[n.Sel.Name] {
					t.Errorf("%s: time.%s", fset.Position(n.Pos()), n.Sel.Name)
				}
				if id.Name == "rand" && n.Sel.Name != "New" && n.Sel.Name != "NewPCG" && n.Sel.Name != "Rand" {
					t.Errorf("%s: global rand.%s: draw from the seeded source", fset.Position(n.Pos()), n.Sel.Name)
				}
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("purity: no files checked")
	}
}
