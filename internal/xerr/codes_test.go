package xerr

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The generated table is errors.json: every code, its parameter names in
// order, and null (undocumented) kept apart from an empty list.
func TestTableIsErrorsJSON(t *testing.T) {
	b, err := os.ReadFile("../datamodel/errors.json")
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]*[]string
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if len(published) != len(want) || len(Codes) != len(want) {
		t.Fatalf("table has %d codes (Codes %d), errors.json %d", len(published), len(Codes), len(want))
	}
	for code, p := range want {
		got, ok := ParamNames(code)
		if !Published(code) || ok != (p != nil) || (p != nil && strings.Join(got, "\x00") != strings.Join(*p, "\x00")) {
			t.Errorf("%s: table %q (%t), errors.json %v", code, got, ok, p)
		}
	}
	if !sort.StringsAreSorted(Codes) {
		t.Error("Codes is not sorted")
	}
	// The codes raised outside the published list, named here so that a
	// new one is a visible change.
	var extra []string
	for code := range unpublished {
		if _, ok := want[code]; ok {
			t.Errorf("%s is published: drop it from unpublished", code)
		}
		extra = append(extra, code)
	}
	sort.Strings(extra)
	if strings.Join(extra, ",") != MissingParameter {
		t.Errorf("unpublished codes %q, want [%s]", extra, MissingParameter)
	}
	if names, ok := ParamNames(VMBadPowerState); !ok || strings.Join(names, ",") != "vm,expected,actual" {
		t.Errorf("VM_BAD_POWER_STATE: %q %t", names, ok)
	}
	if Published("NO_SUCH_CODE") {
		t.Error("NO_SUCH_CODE is published")
	}
}

// raiser is a function that makes a XenAPI error from a code argument and
// its parameters: either the arguments from params on (variadic) or a
// []string argument at params.
type raiser struct {
	code, params int
	variadic     bool
}

// raisers are the functions whose calls the parameter-count check reads,
// by package path and name.
var raisers = map[string]raiser{
	"toolstackd/internal/xerr.New":                       {0, 1, true},
	"toolstackd/internal/api/wire.WriteXMLFailure":       {1, 2, false},
	"toolstackd/internal/api/wire.WriteJSONFailure":      {2, 3, false},
	"toolstackd/internal/api/wire.WriteJSONParseFailure": {1, 2, false},
	"toolstackd/internal/cli/proto.Error":                {0, 1, false},
}

// xapiRaises lists the codes xapi itself raises with other parameters than
// errors.json documents, and the counts it uses: toolstackd follows xapi
// on the wire, so these counts are accepted too.
var xapiRaises = map[string][]int{
	// xapi_session.ml raises it with [uname; msg] for a refused login;
	// toolstackd sends the same for every refusal.
	SessionAuthenticationFailed: {2},
	// xapi_vm_lifecycle.ml's operation check raises [vm; operation].
	VMIsTemplate: {2},
	// xapi_host.ml's evacuation plan names the VM that has no host or no
	// room ([vm]).
	NoHostsAvailable:        {1},
	HostNotEnoughFreeMemory: {1},
}

// goFile is one parsed non-test, non-generated source file.
type goFile struct {
	pkg  string // import path
	name string // path for messages
	fset *token.FileSet
	f    *ast.File
}

// sources parses every non-test, non-generated Go file under cmd and
// internal.
func sources(t *testing.T) []goFile {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var out []goFile
	for _, top := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if d.Name() == "testdata" {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, p, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			if ast.IsGenerated(f) {
				return nil
			}
			rel, _ := filepath.Rel(root, p)
			out = append(out, goFile{pkg: "toolstackd/" + filepath.ToSlash(filepath.Dir(rel)), name: rel, fset: fset, f: f})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(out) < 50 {
		t.Fatalf("found only %d source files", len(out))
	}
	return out
}

// constants maps the name of every package-level string constant to its
// value, per package ("pkg.Name"), from the sources and zz_codes.go.
func constants(t *testing.T, files []goFile) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	gen, err := parser.ParseFile(fset, "zz_codes.go", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	all := append([]goFile{{pkg: "toolstackd/internal/xerr", f: gen}}, files...)
	// Two rounds resolve a constant defined as another package's.
	consts := map[string]string{}
	for range 2 {
		for _, gf := range all {
			imports := importNames(gf.f)
			for _, decl := range gf.f.Decls {
				g, ok := decl.(*ast.GenDecl)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for _, spec := range g.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							if v, ok := constValue(vs.Values[i], gf.pkg, imports, consts); ok {
								consts[gf.pkg+"."+n.Name] = v
							}
						}
					}
				}
			}
		}
	}
	return consts
}

// importNames maps the names a file uses for its imports to their paths.
func importNames(f *ast.File) map[string]string {
	m := map[string]string{}
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		name := p[strings.LastIndex(p, "/")+1:]
		if im.Name != nil {
			name = im.Name.Name
		}
		m[name] = p
	}
	return m
}

// constValue is the value of a string literal or of a constant named by
// an identifier (in pkg) or a selector (an imported package's).
func constValue(e ast.Expr, pkg string, imports, consts map[string]string) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.Ident:
		v, ok := consts[pkg+"."+e.Name]
		return v, ok
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok {
			v, ok := consts[imports[x.Name]+"."+e.Sel.Name]
			return v, ok
		}
	}
	return "", false
}

// callee is the "pkgpath.Name" of a call's function, when it is a
// package-level function of this module or an import.
func callee(c *ast.CallExpr, pkg string, imports map[string]string) string {
	switch fn := c.Fun.(type) {
	case *ast.Ident:
		return pkg + "." + fn.Name
	case *ast.SelectorExpr:
		if x, ok := fn.X.(*ast.Ident); ok {
			if p, ok := imports[x.Name]; ok {
				return p + "." + fn.Sel.Name
			}
		}
	}
	return ""
}

// No error code is written as a string literal outside internal/xerr: the
// generated constants name them all.
func TestNoLiteralErrorCodes(t *testing.T) {
	var bad []string
	for _, gf := range sources(t) {
		if gf.pkg == "toolstackd/internal/xerr" {
			continue // the unpublished codes live here
		}
		ast.Inspect(gf.f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if s, err := strconv.Unquote(lit.Value); err == nil && Published(s) {
				bad = append(bad, gf.fset.Position(lit.Pos()).String()+": "+lit.Value)
			}
			return true
		})
	}
	if len(bad) > 0 {
		t.Errorf("%d literal error codes; use the xerr constants:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}

// Every error raised with a known code carries the number of parameters
// errors.json documents for it. Calls whose code is not a constant or
// whose parameters are a spread slice are counted, not checked.
func TestRaisedErrorsHaveDocumentedParams(t *testing.T) {
	files := sources(t)
	consts := constants(t, files)
	var bad []string
	checked, dynamic, undocumented := 0, 0, 0
	for _, gf := range files {
		imports := importNames(gf.f)
		ast.Inspect(gf.f, func(n ast.Node) bool {
			c, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			r, ok := raisers[callee(c, gf.pkg, imports)]
			if !ok || len(c.Args) <= r.code {
				return true
			}
			pos := gf.fset.Position(c.Pos()).String()
			code, ok := constValue(c.Args[r.code], gf.pkg, imports, consts)
			if !ok {
				t.Logf("%s: code not a constant", pos)
				dynamic++
				return true
			}
			if !Published(code) {
				bad = append(bad, pos+": "+code+" is not a published code")
				return true
			}
			var got int
			switch {
			case r.variadic && c.Ellipsis.IsValid():
				t.Logf("%s: %s with a spread slice", pos, code)
				dynamic++
				return true
			case r.variadic:
				got = len(c.Args) - r.params
			default:
				lit, ok := c.Args[r.params].(*ast.CompositeLit)
				if !ok {
					if id, ok := c.Args[r.params].(*ast.Ident); ok && id.Name == "nil" {
						got = 0
						break
					}
					t.Logf("%s: %s with a computed slice", pos, code)
					dynamic++
					return true
				}
				got = len(lit.Elts)
			}
			names, ok := ParamNames(code)
			if !ok {
				undocumented++
				return true
			}
			checked++
			if got != len(names) && !slices.Contains(xapiRaises[code], got) {
				bad = append(bad, pos+": "+code+" with "+strconv.Itoa(got)+" parameters, documented "+
					strconv.Itoa(len(names))+" ("+strings.Join(names, ", ")+")")
			}
			return true
		})
	}
	t.Logf("%d calls checked, %d with a code whose parameters are undocumented, %d dynamic", checked, undocumented, dynamic)
	if checked < 100 {
		t.Errorf("only %d calls checked: is the walk finding the sources?", checked)
	}
	if len(bad) > 0 {
		t.Errorf("%d errors raised with the wrong parameters:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}
