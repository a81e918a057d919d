// Package cyclo measures what the repository keeps small: the cyclomatic
// complexity of each function and the length of each file. Its test holds
// the module to the bounds, so that go test ./... fails on a function or a
// file that outgrows them.
package cyclo

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Func is one function's complexity.
type Func struct {
	Pos        token.Position
	Name       string // Name or (Recv).Name
	Complexity int
}

func (f Func) String() string {
	return fmt.Sprintf("%s: %s has complexity %d", f.Pos, f.Name, f.Complexity)
}

// Complexity counts as gocyclo does: 1, plus one for each if, for, range,
// case but the default, select case but the default, && and ||. Function
// literals count toward the function they are in.
func Complexity(body ast.Node) int {
	c := 1
	ast.Inspect(body, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if x.List != nil {
				c++
			}
		case *ast.CommClause:
			if x.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if x.Op == token.LAND || x.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}

// File is one Go file's functions and length.
type File struct {
	Path  string
	Lines int
	Funcs []Func
}

// ParseFile measures the Go source src, read from path.
func ParseFile(fset *token.FileSet, path string, src []byte) (File, error) {
	f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		return File{}, err
	}
	out := File{Path: path, Lines: bytes.Count(src, []byte("\n"))}
	if len(src) > 0 && src[len(src)-1] != '\n' {
		out.Lines++
	}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		out.Funcs = append(out.Funcs, Func{Pos: fset.Position(fd.Pos()), Name: funcName(fd), Complexity: Complexity(fd.Body)})
	}
	return out, nil
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return "(" + id.Name + ")." + fd.Name.Name
	}
	return fd.Name.Name
}

// Walk measures every Go file under root but tests, skipping testdata,
// vendor and hidden directories.
func Walk(root string) ([]File, error) {
	fset := token.NewFileSet()
	var out []File
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f, err := ParseFile(fset, p, src)
		if err != nil {
			return err
		}
		out = append(out, f)
		return nil
	})
	return out, err
}
