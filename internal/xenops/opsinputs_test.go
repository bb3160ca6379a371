package xenops

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"slices"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// TestVMOpsInputsComplete reads the source of vmStale and of the
// functions it calls to judge a VM and its devices (vmCheckOf,
// devCheckOf) and checks that every VM field they name is in
// vmOpsInputs: watchDB passes over changes to any other field, so a field
// read there and missing from the list would leave allowed_operations
// stale.
func TestVMOpsInputsComplete(t *testing.T) {
	fset := token.NewFileSet()
	read := map[string]bool{}
	for file, funcs := range map[string][]string{"xenops.go": {"vmStale"}, "lifecycle.go": {"vmCheckOf", "devCheckOf"}} {
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		found := 0
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || !slices.Contains(funcs, fn.Name.Name) {
				continue
			}
			found++
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				// dm.VM.Field
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if inner, ok := sel.X.(*ast.SelectorExpr); ok {
						if id, ok := inner.X.(*ast.Ident); ok && id.Name == "dm" && inner.Sel.Name == "VM" {
							read[sel.Sel.Name] = true
						}
					}
				}
				return true
			})
		}
		if found != len(funcs) {
			t.Fatalf("%s: found %d of %v", file, found, funcs)
		}
	}
	if len(read) < 5 {
		t.Fatalf("read only %v: the parse is off", read)
	}
	for name := range read {
		if name == "Class" || name == "AllowedOperations" {
			continue // the class itself, and the output compared
		}
		f, _ := reflect.ValueOf(dm.VM).FieldByName(name).Interface().(*schema.Field)
		if f == nil {
			t.Errorf("dm.VM.%s: not a field", name)
			continue
		}
		if !slices.Contains(vmOpsInputs, f) {
			t.Errorf("vmStale reads VM.%s, which is not in vmOpsInputs", f.Name)
		}
	}
}

// TestVMOpsInputChanged: whole rows (a pool member's applies) count only
// when an input differs; a write by Set counts by its field.
func TestVMOpsInputChanged(t *testing.T) {
	const vm = "OpaqueRef:vm"
	d := db.New(dm.Model, db.Options{})
	update := func(fn func(tx *db.Tx) error) *db.Row {
		t.Helper()
		if _, err := d.Update(fn); err != nil {
			t.Fatal(err)
		}
		row, _ := d.Snapshot().Get(dm.VM.Class, vm)
		return row
	}
	base := update(func(tx *db.Tx) error {
		insertFields(t, tx, dm.VM.Class, vm, map[string]any{"power_state": psHalted})
		return nil
	})
	renamed := update(func(tx *db.Tx) error { return tx.Set(dm.VM.NameDescription, vm, "x") })
	started := update(func(tx *db.Tx) error { return tx.Set(dm.VM.PowerState, vm, psRunning) })
	cases := []struct {
		name string
		ch   db.Change
		want bool
	}{
		{"insert", db.Change{Op: db.OpCreate, Row: base}, true},
		{"whole row, description only", db.Change{Op: db.OpModify, Old: base, Row: renamed}, false},
		{"whole row, power state", db.Change{Op: db.OpModify, Old: renamed, Row: started}, true},
		{"set description", db.Change{Op: db.OpModify, Old: base, Row: renamed, Field: dm.VM.NameDescription}, false},
		{"set power state", db.Change{Op: db.OpModify, Old: renamed, Row: started, Field: dm.VM.PowerState}, true},
	}
	for _, c := range cases {
		if got := vmOpsInputChanged(&c.ch); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
