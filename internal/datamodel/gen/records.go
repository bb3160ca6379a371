package main

import (
	"fmt"
	"log"
	"strings"

	"toolstackd/internal/schema"
)

// idents guards against two generated top-level names colliding.
type idents map[string]string

func (ids idents) claim(name, what string) string {
	if prev, ok := ids[name]; ok {
		log.Fatalf("gen: Go name %s used by both %s and %s", name, prev, what)
	}
	ids[name] = what
	return name
}

func enumGo(name string) string   { return goName(name) }
func refGo(class string) string   { return goName(class) + "Ref" }
func recGo(class string) string   { return goName(class) + "Record" }
func tableGo(class string) string { return goName(class) }

// goType is the Go type of a field in a typed record.
func goType(t *schema.Type) string {
	switch t.Kind {
	case schema.KString:
		return "string"
	case schema.KInt:
		return "int64"
	case schema.KFloat:
		return "float64"
	case schema.KBool:
		return "bool"
	case schema.KDateTime:
		return "time.Time"
	case schema.KEnum:
		return enumGo(t.Name)
	case schema.KRef:
		return refGo(t.Name)
	case schema.KRecord:
		if t.Class == nil {
			return "map[string]any"
		}
		return "*" + recGo(t.Name)
	case schema.KSet:
		return "[]" + goType(t.Elem)
	case schema.KMap:
		return "map[" + goType(t.Key) + "]" + goType(t.Elem)
	case schema.KOption:
		if t.Elem.Kind == schema.KRecord {
			return goType(t.Elem)
		}
		return "*" + goType(t.Elem)
	}
	log.Fatalf("gen: no Go type for %s", t)
	return ""
}

// canonGo is the Go type of the canonical value (see schema/value.go).
func canonGo(t *schema.Type) string {
	switch {
	case t.StringLike():
		return "string"
	case t.Kind == schema.KSet && t.Elem.StringLike():
		return "[]string"
	case t.Kind == schema.KSet && t.Elem.Kind == schema.KInt:
		return "[]int64"
	case t.Kind == schema.KMap:
		return "map[string]" + canonGo(t.Elem)
	case t.Kind == schema.KRecord:
		return "map[string]any"
	}
	return goType(t)
}

// fromCanon is an expression turning canonical value v into the record type.
func fromCanon(t *schema.Type, v string) string {
	switch t.Kind {
	case schema.KString, schema.KInt, schema.KFloat, schema.KBool, schema.KDateTime:
		return fmt.Sprintf("as[%s](%s)", goType(t), v)
	case schema.KEnum, schema.KRef:
		return fmt.Sprintf("%s(as[string](%s))", goType(t), v)
	case schema.KRecord:
		if t.Class == nil {
			return fmt.Sprintf("as[map[string]any](%s)", v)
		}
		return fmt.Sprintf("%sFromMap(as[map[string]any](%s))", recGo(t.Name), v)
	case schema.KSet:
		switch {
		case t.Elem.Kind == schema.KString:
			return fmt.Sprintf("cloneSlice(as[[]string](%s))", v)
		case t.Elem.StringLike():
			return fmt.Sprintf("toSlice[%s](as[[]string](%s))", goType(t.Elem), v)
		case t.Elem.Kind == schema.KInt:
			return fmt.Sprintf("cloneSlice(as[[]int64](%s))", v)
		}
	case schema.KMap:
		cv := canonGo(t.Elem)
		switch {
		case t.Key.Kind == schema.KInt:
			return fmt.Sprintf("intKeys(as[%s](%s))", canonGo(t), v)
		case t.Key.StringLike() && t.Elem.StringLike():
			return fmt.Sprintf("toMap[%s, %s](as[map[string]string](%s))", goType(t.Key), goType(t.Elem), v)
		case t.Key.StringLike() && cv == goType(t.Elem):
			return fmt.Sprintf("rekey[%s](as[%s](%s))", goType(t.Key), canonGo(t), v)
		}
	case schema.KOption:
		if t.Elem.Kind == schema.KRecord {
			return fromCanon(t.Elem, v)
		}
		if t.Elem.Kind == schema.KString {
			return fmt.Sprintf("optPtr[string](%s)", v)
		}
	}
	log.Fatalf("gen: no conversion from canonical %s", t)
	return ""
}

// toCanon is an expression turning record field x into its canonical value.
func toCanon(t *schema.Type, x string) string {
	switch t.Kind {
	case schema.KString, schema.KInt, schema.KFloat, schema.KBool:
		return x
	case schema.KDateTime:
		return "timeOrEpoch(" + x + ")"
	case schema.KEnum:
		return "string(" + x + ")"
	case schema.KRef:
		return "refOrNull(" + x + ")"
	case schema.KRecord:
		if t.Class == nil {
			return x
		}
		return fmt.Sprintf("%s.Map()", x)
	case schema.KSet:
		switch {
		case t.Elem.Kind == schema.KString, t.Elem.Kind == schema.KInt:
			return "cloneSlice(" + x + ")"
		case t.Elem.StringLike():
			return "fromSlice(" + x + ")"
		}
	case schema.KMap:
		switch {
		case t.Key.Kind == schema.KInt:
			return "strKeys(" + x + ")"
		case t.Key.StringLike() && t.Elem.StringLike():
			return "fromMap(" + x + ")"
		case t.Key.StringLike():
			return "unkey(" + x + ")"
		}
	case schema.KOption:
		if t.Elem.Kind == schema.KRecord {
			return fmt.Sprintf("optRecord(%s)", x)
		}
		return "optVal(" + x + ")"
	}
	log.Fatalf("gen: no conversion to canonical %s", t)
	return ""
}

func genRecords(m *schema.Model) []byte {
	ids := idents{}
	b := startFile("time", "toolstackd/internal/schema")

	// Enums.
	for _, e := range m.Enums {
		tn := ids.claim(enumGo(e.Name), "enum "+e.Name)
		fmt.Fprintf(b, "// %s is the enum %s.\ntype %s string\n\n// Values of %s.\nconst (\n", tn, e.Name, tn, e.Name)
		for _, v := range e.Values {
			cn := ids.claim(tn+goName(v), "enum value "+e.Name+"."+v)
			fmt.Fprintf(b, "\t%s %s = %q\n", cn, tn, v)
		}
		b.WriteString(")\n\n")
	}

	for _, c := range m.Classes {
		ref := ids.claim(refGo(c.Name), "ref of "+c.Name)
		rec := ids.claim(recGo(c.Name), "record of "+c.Name)
		tbl := ids.claim(tableGo(c.Name), "class "+c.Name)
		cv := "class" + tbl
		ids.claim(cv, "class var of "+c.Name)
		fmt.Fprintf(b, "// %s is a reference to a %s.\ntype %s string\n\n", ref, c.Name, ref)
		fmt.Fprintf(b, "var %s = Model.Classes[%d]\n\n", cv, c.Index)

		// Field table: datamodel.VM.PowerState is the *schema.Field.
		members := map[string]bool{"Class": true}
		names := make([]string, len(c.Fields))
		for i, f := range c.Fields {
			n := goName(f.Name)
			for members[n] {
				n += "_"
			}
			members[n] = true
			names[i] = n
		}
		fmt.Fprintf(b, "// %s is the class %s with its fields.\nvar %s = struct {\n\tClass *schema.Class\n", tbl, c.Name, tbl)
		for i := range c.Fields {
			fmt.Fprintf(b, "\t%s *schema.Field\n", names[i])
		}
		fmt.Fprintf(b, "}{\n\tClass: %s,\n", cv)
		for i := range c.Fields {
			fmt.Fprintf(b, "\t%s: %s.Fields[%d],\n", names[i], cv, i)
		}
		b.WriteString("}\n\n")

		// Typed record.
		fmt.Fprintf(b, "// %s is a %s as a typed Go value.\ntype %s struct {\n", rec, c.Name, rec)
		for i, f := range c.Fields {
			tag := f.Name
			if f.Internal {
				tag = "-"
			}
			fmt.Fprintf(b, "\t%s %s `json:%q`\n", names[i], goType(f.Type), tag)
		}
		b.WriteString("}\n\n")
		fmt.Fprintf(b, "// FromRow fills r from a database row of canonical values.\nfunc (r *%s) FromRow(row []any) {\n", rec)
		for i, f := range c.Fields {
			fmt.Fprintf(b, "\tr.%s = %s\n", names[i], fromCanon(f.Type, fmt.Sprintf("row[%d]", i)))
		}
		fmt.Fprintf(b, "}\n\n// Row returns r as a database row of canonical values.\nfunc (r *%s) Row() []any {\n\treturn []any{\n", rec)
		for i, f := range c.Fields {
			fmt.Fprintf(b, "\t\t%s,\n", toCanon(f.Type, "r."+names[i]))
		}
		b.WriteString("\t}\n}\n\n")
		fmt.Fprintf(b, "// Map returns r as a canonical record (field name to value).\nfunc (r *%s) Map() map[string]any {\n\tif r == nil {\n\t\treturn nil\n\t}\n\treturn rowToMap(%s, r.Row())\n}\n\n", rec, cv)
		fmt.Fprintf(b, "// %sFromMap makes a record from a canonical record; missing fields take\n// their defaults.\nfunc %sFromMap(m map[string]any) *%s {\n\tif m == nil {\n\t\treturn nil\n\t}\n\tr := new(%s)\n\tr.FromRow(mapToRow(%s, m))\n\treturn r\n}\n\n", rec, rec, rec, rec, cv)
	}
	_ = strings.TrimSpace
	return b.Bytes()
}
