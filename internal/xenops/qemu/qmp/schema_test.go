package qmp

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// schemaInfo is one entry of query-qmp-schema (QEMU's introspection; type
// names other than the built-in ones are opaque numbers).
type schemaInfo struct {
	Name        string `json:"name"`
	MetaType    string `json:"meta-type"`
	ArgType     string `json:"arg-type"`
	RetType     string `json:"ret-type"`
	ElementType string `json:"element-type"`
	Members     []struct {
		Name string `json:"name"`
		Type string `json:"type"`
	} `json:"members"`
	Variants []struct {
		Case string `json:"case"`
		Type string `json:"type"`
	} `json:"variants"`
}

type schema map[string]schemaInfo

// members is every member name an object type accepts: its own and
// those of each of its variants (a flat union's branches).
func (s schema) members(typ string) map[string]bool {
	out := map[string]bool{}
	t, ok := s[typ]
	if !ok {
		return out
	}
	for _, m := range t.Members {
		out[m.Name] = true
	}
	for _, v := range t.Variants {
		for n := range s.members(v.Type) {
			out[n] = true
		}
	}
	return out
}

// object is the object type a return type is, or holds as an array.
func (s schema) object(typ string) string {
	if t := s[typ]; t.MetaType == "array" {
		return t.ElementType
	}
	return typ
}

// jsonFields are the JSON member names of a struct type's fields.
func jsonFields(t reflect.Type) []string {
	for t.Kind() == reflect.Slice || t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

// TestCommandsMatchQEMUSchema checks every command this package defines
// against the installed QEMU's own schema: the command exists, each
// argument this package can send is one QEMU accepts, and each member it
// decodes from the return is one QEMU can send. A misspelt member would
// otherwise be an error only at run time (an argument) or silently a zero
// value (a return member).
func TestCommandsMatchQEMUSchema(t *testing.T) {
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("needs qemu-system-x86_64 (Debian's qemu-system-x86); the commands are then checked only by the backend's own tests")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "qmp.sock")
	cmd := exec.Command(bin, "-machine", "none", "-nodefaults", "-display", "none", "-S",
		"-qmp", "unix:"+sock+",server=on,wait=off")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var c *Conn
	for {
		if c, err = Dial(ctx, sock, nil); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("QEMU's monitor did not answer: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	defer c.Close()
	var infos []schemaInfo
	if err := c.Execute(ctx, "query-qmp-schema", nil, &infos); err != nil {
		t.Fatal(err)
	}
	s := schema{}
	for _, i := range infos {
		s[i.Name] = i
	}

	for _, command := range Commands() {
		name := command.Name()
		info, ok := s[name]
		if !ok || info.MetaType != "command" {
			t.Errorf("%s: QEMU has no such command", name)
			continue
		}
		if reflect.TypeOf(command).Kind() == reflect.Map {
			continue // the driver's own options: QEMU's schema leaves them open or as a union
		}
		accepted := s.members(info.ArgType)
		for _, f := range jsonFields(reflect.TypeOf(command)) {
			if !accepted[f] {
				t.Errorf("%s: QEMU takes no argument %q (it takes %v)", name, f, keys(accepted))
			}
		}
		rt := resultType(command)
		if rt == nil {
			t.Errorf("%s: no return type", name)
			continue
		}
		sent := s.members(s.object(info.RetType))
		for _, f := range jsonFields(rt) {
			if !sent[f] {
				t.Errorf("%s: QEMU returns no member %q (it returns %v)", name, f, keys(sent))
			}
		}
	}
}

// returner is a command of this package with return type R.
type returner[R any] interface{ returns() R }

// resultType is the return type of one of this package's commands (a
// type switch: reflect does not list unexported methods). A command
// whose return type is not here fails the test as having none.
func resultType(cmd any) reflect.Type {
	switch c := cmd.(type) {
	case returner[Empty]:
		return reflect.TypeOf(c.returns())
	case returner[StatusInfo]:
		return reflect.TypeOf(c.returns())
	case returner[[]CPUInfoFast]:
		return reflect.TypeOf(c.returns())
	case returner[[]HotpluggableCPU]:
		return reflect.TypeOf(c.returns())
	case returner[BalloonInfo]:
		return reflect.TypeOf(c.returns())
	case returner[[]BlockDeviceInfo]:
		return reflect.TypeOf(c.returns())
	case returner[json.RawMessage]:
		return reflect.TypeOf(c.returns())
	case returner[[]BlockJobInfo]:
		return reflect.TypeOf(c.returns())
	case returner[[]BlockExportInfo]:
		return reflect.TypeOf(c.returns())
	case returner[AddfdInfo]:
		return reflect.TypeOf(c.returns())
	case returner[[]FdsetInfo]:
		return reflect.TypeOf(c.returns())
	case returner[MigrationInfo]:
		return reflect.TypeOf(c.returns())
	}
	return nil
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestCommandsListsEveryCommand keeps Commands complete: every type in
// commands.go with a Name method is listed, so that the schema check
// sees it.
func TestCommandsListsEveryCommand(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "commands.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, c := range Commands() {
		listed[reflect.TypeOf(c).Name()] = true
	}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Recv == nil || fn.Name.Name != "Name" {
			continue
		}
		if id, ok := fn.Recv.List[0].Type.(*ast.Ident); ok && !listed[id.Name] {
			t.Errorf("%s is not in Commands", id.Name)
		}
	}
}
