// Command owners prints, for each XenAPI class, the packages that serve
// its explicit messages and how many each serves: the table of
// docs/architecture.md "Who serves each class". It reads the source, not
// a running daemon: it finds every registration of a handler,
//
//	srv.Handle("Class.message", h)   the message named by a literal
//	api.Register(srv, h)             h takes the message's generated
//	                                 argument type (dm.XxxArgs)
//
// by finding, in each package, Handle calls with a literal and every
// function (declared or literal) with a parameter of a generated argument
// type, mapped to its message by the Message methods of
// internal/datamodel/zz_args.go.
// Messages with no explicit handler are served by the database (the
// implicit getters, setters and constructors) and are not listed.
//
// Run it from the module's root: `go run ./scripts/owners`. It prints
// registrations it could not resolve at the end, so that a new way of
// registering is noticed rather than silently left out.
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

func main() {
	msgs, err := argMessages("internal/datamodel/zz_args.go")
	if err != nil {
		fmt.Fprintln(os.Stderr, "owners:", err)
		os.Exit(1)
	}
	owners := map[string]map[string]int{} // class -> package dir -> messages
	var unresolved []string
	dirs, err := packageDirs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "owners:", err)
		os.Exit(1)
	}
	for _, dir := range dirs {
		found, bad := scan(dir, msgs)
		for _, m := range found {
			class, _, _ := strings.Cut(m, ".")
			if owners[class] == nil {
				owners[class] = map[string]int{}
			}
			owners[class][dir]++
		}
		unresolved = append(unresolved, bad...)
	}
	classes := make([]string, 0, len(owners))
	for c := range owners {
		classes = append(classes, c)
	}
	sort.Slice(classes, func(i, j int) bool { return strings.ToLower(classes[i]) < strings.ToLower(classes[j]) })
	fmt.Println("| class | packages serving its explicit messages (messages each) |")
	fmt.Println("|---|---|")
	for _, c := range classes {
		dirs := make([]string, 0, len(owners[c]))
		for d := range owners[c] {
			dirs = append(dirs, d)
		}
		sort.Slice(dirs, func(i, j int) bool {
			if owners[c][dirs[i]] != owners[c][dirs[j]] {
				return owners[c][dirs[i]] > owners[c][dirs[j]]
			}
			return dirs[i] < dirs[j]
		})
		var cells []string
		for _, d := range dirs {
			cells = append(cells, fmt.Sprintf("`%s` %d", d, owners[c][d]))
		}
		fmt.Printf("| %s | %s |\n", c, strings.Join(cells, ", "))
	}
	if len(unresolved) > 0 {
		sort.Strings(unresolved)
		fmt.Fprintf(os.Stderr, "\n%d registrations not resolved:\n", len(unresolved))
		for _, u := range unresolved {
			fmt.Fprintln(os.Stderr, "  "+u)
		}
	}
}

// packageDirs lists the directories under cmd/ and internal/ that hold
// production Go (tests and test-only packages are not owners).
func packageDirs() ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, root := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if d.Name() == "testdata" || d.Name() == "testkit" || d.Name() == "gen" {
					return filepath.SkipDir
				}
				return nil
			}
			if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
				if dir := filepath.Dir(path); !seen[dir] {
					seen[dir] = true
					out = append(out, dir)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	sort.Strings(out)
	return out, nil
}

// argMessages maps each generated argument type (VMStartArgs) to the
// message its Message method names (VM.start).
func argMessages(path string) (map[string]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "Message" || fn.Recv == nil || len(fn.Recv.List) != 1 || fn.Body == nil {
			continue
		}
		star, ok := fn.Recv.List[0].Type.(*ast.StarExpr)
		if !ok {
			continue
		}
		id, ok := star.X.(*ast.Ident)
		if !ok || len(fn.Body.List) != 1 {
			continue
		}
		ret, ok := fn.Body.List[0].(*ast.ReturnStmt)
		if !ok || len(ret.Results) != 1 {
			continue
		}
		if lit, ok := ret.Results[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if s, err := strconv.Unquote(lit.Value); err == nil {
				out[id.Name] = s
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no Message methods found", path)
	}
	return out, nil
}

// scan finds the messages the package in dir serves: those named by a
// literal in a Handle call, and those whose generated argument type is a
// parameter of one of its functions or function literals (a handler
// given to api.Register, or to a helper that registers it, as xenops'
// powerOp does). Each message counts once per package.
func scan(dir string, msgs map[string]string) (found, unresolved []string) {
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, []string{dir + ": " + err.Error()}
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			unresolved = append(unresolved, name+": "+err.Error())
			continue
		}
		files = append(files, f)
	}
	seen := map[string]bool{}
	add := func(m string) {
		if m != "" && !seen[m] {
			seen[m] = true
			found = append(found, m)
		}
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncType:
				if n.Params != nil {
					for _, field := range n.Params.List {
						if sel, ok := field.Type.(*ast.SelectorExpr); ok {
							add(msgs[sel.Sel.Name])
						}
					}
				}
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "Handle" || len(n.Args) != 2 {
					return true
				}
				lit, ok := n.Args[0].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true // some other Handle (an http mux's, a slog handler's)
				}
				if s, err := strconv.Unquote(lit.Value); err == nil && strings.Contains(s, ".") && !strings.HasPrefix(s, "/") {
					add(s)
				}
			}
			return true
		})
	}
	return found, unresolved
}
