package main

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"toolstackd/internal/schema"
)

// Typed arguments and results of the explicit messages (zz_args.go).
//
// Each explicit message M of class C gets a struct CMArgs with one field
// per parameter after the session, methods that move it to and from the
// canonical argument list the pipeline carries, and its result type R:
// api.Register binds a handler func(*api.Call, CMArgs) (R, error) to the
// message, and (&CMArgs{...}).Call(ctx, caller) runs the message from
// inside the daemon with typed arguments and result.

// typedOK reports whether a type has a typed Go form with conversions both
// ways; other types (records, maps of records) stay canonical (any).
func typedOK(t *schema.Type) bool {
	switch t.Kind {
	case schema.KString, schema.KInt, schema.KFloat, schema.KBool, schema.KDateTime, schema.KEnum, schema.KRef:
		return true
	case schema.KSet:
		return t.Elem.StringLike() || t.Elem.Kind == schema.KInt
	case schema.KMap:
		return t.Key.StringLike() && t.Elem.StringLike()
	}
	return false
}

// argGo is the Go type of a typed argument or result, and the expressions
// converting canonical value v to it and x back.
func argGo(t *schema.Type) (typ string, from func(v string) string, to func(x string) string) {
	if t == nil || t.Kind == schema.KVoid {
		return "Void", func(string) string { return "Void{}" }, func(string) string { return "nil" }
	}
	if !typedOK(t) {
		return "any", func(v string) string { return v }, func(x string) string { return x }
	}
	return goType(t), func(v string) string { return fromCanon(t, v) }, func(x string) string { return toCanon(t, x) }
}

func genArgs(m *schema.Model) []byte {
	ids := idents{}
	b := startFile("context", "time")
	for _, msg := range m.Messages {
		if msg.Implicit {
			continue
		}
		name := ids.claim(goName(msg.Class.Name)+goName(msg.Name)+"Args", "arguments of "+msg.Wire)
		first := 0
		if msg.TakesSession {
			first = 1
		}
		params := msg.Params[first:]
		fields := make([]string, len(params))
		// The methods' names are taken: a parameter named args or call
		// becomes ArgsParam, CallParam.
		seen := map[string]bool{"Message": true, "FromArgs": true, "Args": true, "Result": true, "ResultFrom": true, "Call": true}
		fmt.Fprintf(b, "// %s are the arguments of %s after the session.\ntype %s struct {\n", name, msg.Wire, name)
		for i, p := range params {
			f := goName(p.Name)
			if seen[f] {
				f += "Param"
			}
			for seen[f] {
				f += "_"
			}
			seen[f] = true
			fields[i] = f
			typ, _, _ := argGo(p.Type)
			fmt.Fprintf(b, "\t%s %s // %s\n", f, typ, p.Name)
		}
		b.WriteString("}\n\n")
		fmt.Fprintf(b, "// Message is the wire name of the message.\nfunc (*%s) Message() string { return %q }\n\n", name, msg.Wire)
		fmt.Fprintf(b, "// FromArgs fills a from canonical arguments.\nfunc (a *%s) FromArgs(v []any) {\n", name)
		for i, p := range params {
			_, from, _ := argGo(p.Type)
			fmt.Fprintf(b, "\ta.%s = %s\n", fields[i], from(fmt.Sprintf("v[%d]", i)))
		}
		if len(params) == 0 {
			b.WriteString("\t_ = v\n")
		}
		fmt.Fprintf(b, "}\n\n// Args returns a as canonical arguments.\nfunc (a *%s) Args() []any {\n\treturn []any{", name)
		for i, p := range params {
			_, _, to := argGo(p.Type)
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(to("a." + fields[i]))
		}
		b.WriteString("}\n}\n\n")
		rt, rfrom, rto := argGo(msg.Result)
		fmt.Fprintf(b, "// Result turns the handler's result into its canonical value.\nfunc (*%s) Result(r %s) any { return %s }\n\n", name, rt, rto("r"))
		fmt.Fprintf(b, "// ResultFrom turns a canonical result into its typed value.\nfunc (*%s) ResultFrom(v any) %s {\n\t_ = v\n\treturn %s\n}\n\n", name, rt, rfrom("v"))
		fmt.Fprintf(b, "// Call runs %s through inv with typed arguments and result.\n", msg.Wire)
		fmt.Fprintf(b, "func (a *%s) Call(ctx context.Context, inv Invoker) (%s, error) {\n\tv, err := inv.InvokeArgs(ctx, %q, a.Args())\n", name, rt, msg.Wire)
		fmt.Fprintf(b, "\tif err != nil {\n\t\tvar zero %s\n\t\treturn zero, err\n\t}\n\treturn a.ResultFrom(v), nil\n}\n\n", rt)
	}
	return b.Bytes()
}

// startFile begins a generated file of package datamodel that imports the
// given packages (time among them: its "var _" keeps the import used when
// no type needs it).
func startFile(imports ...string) *bytes.Buffer {
	var b bytes.Buffer
	b.WriteString(header)
	b.WriteString("package datamodel\n\nimport (\n")
	for _, imp := range imports {
		if strings.Contains(imp, ".") || strings.Contains(imp, "/") {
			b.WriteString("\n")
		}
		b.WriteString("\t" + strconv.Quote(imp) + "\n")
	}
	b.WriteString(")\n\nvar _ time.Time\n\n")
	return &b
}
