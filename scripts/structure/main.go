// Command structure prints the figures issue 30 measures the tree's shape
// by, for the module in the current directory:
//
//   - lines of non-test, non-generated Go per package, the largest first,
//     and those over the bound (8,000);
//   - types with the most methods, and those over the bound (100);
//   - packages without a package doc comment;
//   - upward imports: a package that imports P/sub, where P is a package
//     that itself depends (directly or not) on the importer, so the arrow
//     reaches back up into the tree of a package above it;
//   - production packages that import a test-only package (one under
//     internal/testkit); only tests, tests/ and cmd/ tools may.
//
// Run it as scripts/structure.sh (which also counts duplicates when the
// duplicates tool is installed). It exits 0; the figures are for reading
// and for docs, not a gate.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

const (
	maxPackageLines = 8000
	maxMethods      = 100
	top             = 10
)

type pkg struct {
	ImportPath string
	Dir        string
	Name       string
	GoFiles    []string
	Imports    []string
	Deps       []string
	Module     *struct{ Path string }
}

func main() {
	pkgs, err := list()
	if err != nil {
		fmt.Fprintln(os.Stderr, "structure:", err)
		os.Exit(1)
	}
	type sized struct {
		path  string
		lines int
	}
	var sizes []sized
	type typeCount struct {
		name  string
		count int
	}
	var types []typeCount
	var undocumented []string
	for _, p := range pkgs {
		lines, methods, doc := measure(p)
		sizes = append(sizes, sized{p.ImportPath, lines})
		for t, n := range methods {
			types = append(types, typeCount{p.ImportPath + "." + t, n})
		}
		if !doc && lines > 0 {
			undocumented = append(undocumented, p.ImportPath)
		}
	}
	sort.Slice(sizes, func(i, j int) bool { return sizes[i].lines > sizes[j].lines })
	sort.Slice(types, func(i, j int) bool { return types[i].count > types[j].count })

	over := 0
	fmt.Printf("## Lines of Go per package (non-test, non-generated), the %d largest\n", top)
	for i, s := range sizes {
		if s.lines > maxPackageLines {
			over++
		}
		if i < top {
			fmt.Printf("%7d  %s\n", s.lines, s.path)
		}
	}
	fmt.Printf("packages over %d lines: %d\n\n", maxPackageLines, over)

	over = 0
	fmt.Printf("## Methods per type, the %d largest\n", top)
	for i, t := range types {
		if t.count > maxMethods {
			over++
		}
		if i < top {
			fmt.Printf("%7d  %s\n", t.count, t.name)
		}
	}
	fmt.Printf("types over %d methods: %d\n\n", maxMethods, over)

	fmt.Println("## Packages without a doc comment")
	sort.Strings(undocumented)
	for _, u := range undocumented {
		fmt.Println("  " + u)
	}
	fmt.Printf("packages without a doc comment: %d of %d\n\n", len(undocumented), len(pkgs))

	up := upward(pkgs)
	fmt.Println("## Upward imports (importer -> P/sub, where P depends on the importer)")
	for _, u := range up {
		fmt.Println("  " + u)
	}
	fmt.Printf("upward imports: %d\n\n", len(up))

	kit := testkitImports(pkgs)
	fmt.Println("## Production packages importing internal/testkit")
	for _, k := range kit {
		fmt.Println("  " + k)
	}
	fmt.Printf("production imports of test-only packages: %d\n", len(kit))
}

// testkitImports lists the imports of a test-only package (under
// internal/testkit) by a package of the daemon: one under internal/ that
// is not itself in the kit. Tests, tests/ and cmd/ tools may import it.
func testkitImports(pkgs []pkg) []string {
	var out []string
	for _, p := range pkgs {
		if p.Module == nil {
			continue
		}
		kit := p.Module.Path + "/internal/testkit/"
		if !strings.HasPrefix(p.ImportPath, p.Module.Path+"/internal/") || strings.HasPrefix(p.ImportPath, kit) {
			continue
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, kit) {
				out = append(out, p.ImportPath+" -> "+imp)
			}
		}
	}
	sort.Strings(out)
	return out
}

// list is `go list -json -deps=false ./...` for the module's packages.
func list() ([]pkg, error) {
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		return nil, err
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

// measure counts a package's lines of non-generated Go, its types'
// methods and whether any file carries a package doc comment.
func measure(p pkg) (lines int, methods map[string]int, doc bool) {
	methods = map[string]int{}
	fset := token.NewFileSet()
	for _, name := range p.GoFiles {
		path := filepath.Join(p.Dir, name)
		src, err := os.ReadFile(path) //nolint:gosec // files go list named
		if err != nil || generated(src) {
			continue
		}
		lines += bytes.Count(src, []byte("\n"))
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		if err != nil {
			continue
		}
		if f.Doc != nil && len(strings.TrimSpace(f.Doc.Text())) > 0 {
			doc = true
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || len(fn.Recv.List) == 0 {
				continue
			}
			methods[receiver(fn.Recv.List[0].Type)]++
		}
	}
	return lines, methods, doc
}

func receiver(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return receiver(t.X)
	case *ast.IndexExpr:
		return receiver(t.X)
	case *ast.IndexListExpr:
		return receiver(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

// generated says whether a file carries Go's "Code generated ... DO NOT
// EDIT." line before its package clause.
func generated(src []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(src))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "package ") {
			return false
		}
		if strings.HasPrefix(l, "// Code generated ") && strings.HasSuffix(l, " DO NOT EDIT.") {
			return true
		}
	}
	return false
}

// upward lists imports X -> P/sub (X outside P's tree) where P, a package
// of the module, depends on X: X sits below P, yet reaches into P's tree.
func upward(pkgs []pkg) []string {
	byPath := map[string]pkg{}
	for _, p := range pkgs {
		byPath[p.ImportPath] = p
	}
	var out []string
	for _, x := range pkgs {
		for _, y := range x.Imports {
			for parent := pathParent(y); parent != ""; parent = pathParent(parent) {
				p, ok := byPath[parent]
				if !ok || strings.HasPrefix(x.ImportPath+"/", parent+"/") {
					continue
				}
				if contains(p.Deps, x.ImportPath) {
					out = append(out, fmt.Sprintf("%s -> %s (%s depends on %s)", x.ImportPath, y, parent, x.ImportPath))
					break
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

func pathParent(p string) string {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return ""
	}
	return p[:i]
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
