package storage

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/xerr"
)

// TestStorageAllowedOpsArePublished: everything refreshSR and refreshVDI
// can list is a value xapi lists for the class (clients with an older
// enum refuse the rest), and the values clients look for are there.
func TestStorageAllowedOpsArePublished(t *testing.T) {
	sr := slices.Concat(srPluggedOps, srUnpluggedOps, slices.Collect(maps.Keys(srCapOps)))
	vdi := slices.Concat([]string{"forget"}, vdiPluggedOps, slices.Collect(maps.Keys(vdiCapOps)), slices.Collect(maps.Keys(vdiIdleCapOps)))
	for class, ops := range map[string][]string{"SR": sr, "VDI": vdi} {
		for _, op := range ops {
			if !dm.PublishedAllowedOp(class, op) {
				t.Errorf("%s.allowed_operations may hold %s, which xapi never lists", class, op)
			}
		}
	}
	for _, op := range []string{"scan", "vdi_create", "vdi_snapshot", "unplug", "plug", "destroy"} {
		if !slices.Contains(sr, op) {
			t.Errorf("SR operations lack %s", op)
		}
	}
	for _, op := range []string{"vdi_copy", "vdi_forget", "vdi_update"} {
		if slices.Contains(sr, op) {
			t.Errorf("SR operations list %s", op)
		}
	}
	if slices.Contains(vdi, "set_on_boot") || !slices.Contains(vdi, "destroy") {
		t.Errorf("VDI operations %v", vdi)
	}
}

// TestPublishedMarks: SR marks xapi does not write become the ones it
// does, or none; an unknown mark is an INTERNAL_ERROR.
func TestPublishedMarks(t *testing.T) {
	in := []marked{{dm.VDI.Class, "v", "copy"}, {dm.SR.Class, "s", "vdi_copy"}, {dm.SR.Class, "s", "vdi_forget"},
		{dm.SR.Class, "s", "vdi_update"}, {dm.VDI.Class, "v", "set_on_boot"}, {dm.SR.Class, "s", "vdi_set_on_boot"}}
	got, err := publishedMarks(in)
	want := []marked{{dm.VDI.Class, "v", "copy"}, {dm.SR.Class, "s", "vdi_create"}, {dm.VDI.Class, "v", "set_on_boot"},
		{dm.SR.Class, "s", "vdi_set_on_boot"}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("publishedMarks: %v %v", got, err)
	}
	if in[1].key != "vdi_copy" {
		t.Error("publishedMarks changed its argument")
	}
	for _, bad := range []marked{{dm.SR.Class, "s", "vdi_generate_config"}, {dm.VDI.Class, "v", "blocked"}, {dm.VDI.Class, "v", "nonsense"}} {
		if _, err := publishedMarks([]marked{bad}); !xerr.HasCode(err, xerr.InternalError) {
			t.Errorf("%v: %v", bad, err)
		}
	}
}

// TestMarkSitesArePublished reads this package's sources: every marked{}
// literal and holdIdleVDI call with a literal operation marks a value xapi
// writes (after srMarkAs), so the INTERNAL_ERROR above never reaches a
// client.
func TestMarkSitesArePublished(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	n := 0
	check := func(pos token.Pos, class, op string) {
		n++
		if as, ok := srMarkAs[op]; ok && class == "SR" {
			if as == "" {
				return
			}
			op = as
		}
		if !dm.PublishedCurrentOp(class, op) {
			t.Errorf("%s: marks %s with %q", fset.Position(pos), class, op)
		}
	}
	for _, name := range files {
		if filepath.Ext(name) != ".go" || len(name) > 8 && name[len(name)-8:] == "_test.go" {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(x ast.Node) bool {
			switch x := x.(type) {
			case *ast.CompositeLit:
				if id, ok := x.Type.(*ast.Ident); ok && id.Name == "marked" && len(x.Elts) == 3 {
					if op, ok := stringLit(x.Elts[2]); ok {
						check(x.Pos(), classOfExpr(x.Elts[0]), op)
					}
				}
			case *ast.CallExpr:
				if sel, ok := x.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "holdIdleVDI" && len(x.Args) == 4 {
					if op, ok := stringLit(x.Args[3]); ok {
						check(x.Pos(), "VDI", op)
						check(x.Pos(), "SR", "vdi_"+op)
					}
				}
			}
			return true
		})
	}
	if n < 15 {
		t.Errorf("found %d mark sites", n)
	}
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// classOfExpr reads dm.SR.Class or dm.VDI.Class.
func classOfExpr(e ast.Expr) string {
	if sel, ok := e.(*ast.SelectorExpr); ok {
		if inner, ok := sel.X.(*ast.SelectorExpr); ok {
			return inner.Sel.Name
		}
	}
	return "?"
}
