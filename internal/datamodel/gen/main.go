// Command gen turns the published XenAPI datamodel (datamodel.json) and
// toolstackd's overlay (overlay.json) into Go: the schema specs from which
// schema.Build makes the Model, and typed records, refs and enums.
//
// It is run by `go generate` in internal/datamodel.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"

	"toolstackd/internal/gen/genutil"
	"toolstackd/internal/schema"
)

type jsonModel struct {
	SchemaVersion struct{ Major, Minor int } `json:"schema_version"`
	Classes       []jsonClass                `json:"classes"`
	Enums         map[string][]string        `json:"enums"`
	Relations     []struct {
		Field, Inverse struct{ Class, Field string }
	} `json:"relations"`
}

type jsonClass struct {
	Name      string        `json:"name"`
	Lifecycle string        `json:"lifecycle"`
	Persist   *bool         `json:"persist"`
	GenEvents *bool         `json:"gen_events"`
	InDB      *bool         `json:"in_db"`
	Fields    []jsonField   `json:"fields"`
	Messages  []jsonMessage `json:"messages"`
}

type jsonField struct {
	Name      string  `json:"name"`
	Type      string  `json:"type"`
	Qualifier string  `json:"qualifier"`
	Default   *string `json:"default"`
	Lifecycle string  `json:"lifecycle"`
}

type jsonMessage struct {
	Name     string `json:"name"`
	Implicit bool   `json:"implicit"`
	Result   string `json:"result"`
	Params   []struct {
		Type, Name string
		Required   bool
	} `json:"params"`
	Errors    []string `json:"errors"`
	Roles     []string `json:"roles"`
	Lifecycle string   `json:"lifecycle"`
}

type overlay struct {
	Namespaces     map[string]map[string][]string `json:"namespaces"`
	InternalFields map[string][]jsonField         `json:"internal_fields"`
	ClassOverrides map[string]struct {
		InDB *bool `json:"in_db"`
	} `json:"class_overrides"`
}

func main() {
	in := flag.String("in", "datamodel.json", "published datamodel")
	ov := flag.String("overlay", "overlay.json", "toolstackd additions")
	out := flag.String("out", ".", "output directory")
	docs := flag.String("docs", "", "where to write the API reference (empty: none)")
	flag.Parse()
	var dm jsonModel
	var ol overlay
	genutil.ReadJSON(*in, &dm)
	genutil.ReadJSON(*ov, &ol)
	specs, enums, rels := toSpecs(&dm, &ol)
	model, err := schema.Build(dm.SchemaVersion.Major, dm.SchemaVersion.Minor, specs, enums, rels)
	if err != nil {
		log.Fatalf("gen: the datamodel does not build: %v", err)
	}
	genutil.WriteGo(filepath.Join(*out, "zz_model.go"), genModel(&dm, specs, enums, rels))
	genutil.WriteGo(filepath.Join(*out, "zz_records.go"), genRecords(model))
	genutil.WriteGo(filepath.Join(*out, "zz_routes.go"), genRoutes(model, filepath.Join(filepath.Dir(*ov), "routes.json")))
	genutil.WriteGo(filepath.Join(*out, "zz_args.go"), genArgs(model))
	if *docs != "" {
		genDocs(model, *docs)
	}
}

// asyncExcluded are classes whose own messages have no Async variant.
var asyncExcluded = map[string]bool{"session": true, "task": true, "event": true, "message": true}

func hasAsync(class string, m jsonMessage) bool {
	if asyncExcluded[class] {
		return false
	}
	if m.Implicit {
		for _, p := range []string{"get_", "set_", "add_", "remove_"} {
			if strings.HasPrefix(m.Name, p) {
				return false
			}
		}
	}
	return true
}

func toSpecs(dm *jsonModel, ol *overlay) ([]schema.ClassSpec, []schema.EnumSpec, []schema.RelationSpec) {
	var classes []schema.ClassSpec
	for _, jc := range dm.Classes {
		cs := schema.ClassSpec{Name: jc.Name, Lifecycle: jc.Lifecycle, Persist: boolOr(jc.Persist, false),
			GenEvents: boolOr(jc.GenEvents, false), InDB: boolOr(jc.InDB, false)}
		if o, ok := ol.ClassOverrides[jc.Name]; ok && o.InDB != nil {
			cs.InDB = *o.InDB
		}
		addField := func(f jsonField, internal bool) {
			fs := schema.FieldSpec{Name: f.Name, Type: f.Type, Qualifier: f.Qualifier, Lifecycle: f.Lifecycle,
				Column: column(ol, jc.Name, f.Name), Internal: internal}
			if f.Default != nil {
				fs.HasDefault, fs.Default = true, *f.Default
			}
			cs.Fields = append(cs.Fields, fs)
		}
		for _, f := range jc.Fields {
			addField(f, false)
		}
		for _, f := range ol.InternalFields[jc.Name] {
			addField(f, true)
		}
		var getAllRecords *jsonMessage
		have := map[string]bool{}
		for i, m := range jc.Messages {
			have[m.Name] = true
			ms := schema.MessageSpec{Name: m.Name, Implicit: m.Implicit, Async: hasAsync(jc.Name, m),
				Result: m.Result, Errors: m.Errors, Roles: m.Roles, Lifecycle: m.Lifecycle}
			for _, p := range m.Params {
				ms.Params = append(ms.Params, schema.ParamSpec{Name: p.Name, Type: p.Type, Required: p.Required})
			}
			cs.Messages = append(cs.Messages, ms)
			if m.Name == "get_all_records" {
				getAllRecords = &jc.Messages[i]
			}
		}
		if getAllRecords != nil {
			// Served by xapi but left out of the published dump.
			params := []schema.ParamSpec{{Name: "session_id", Type: "session ref", Required: true}, {Name: "expr", Type: "string", Required: true}}
			for _, ms := range []schema.MessageSpec{
				{Name: "get_all_where", Result: jc.Name + " ref set"},
				{Name: "get_all_records_where", Result: "(" + jc.Name + " ref -> " + jc.Name + " record) map"},
			} {
				if have[ms.Name] {
					continue // the class publishes its own (message.get_all_records_where)
				}
				ms.Implicit, ms.Extra, ms.Params, ms.Roles, ms.Lifecycle = true, true, params, getAllRecords.Roles, "Published_s"
				cs.Messages = append(cs.Messages, ms)
			}
		}
		classes = append(classes, cs)
	}
	var enums []schema.EnumSpec
	for _, name := range schema.SortedKeys(dm.Enums) {
		enums = append(enums, schema.EnumSpec{Name: name, Values: dm.Enums[name]})
	}
	var rels []schema.RelationSpec
	known := map[string]bool{}
	for _, c := range classes {
		for _, f := range c.Fields {
			known[c.Name+"."+f.Name] = true
		}
	}
	for _, r := range dm.Relations {
		if !known[r.Field.Class+"."+r.Field.Field] || !known[r.Inverse.Class+"."+r.Inverse.Field] {
			log.Fatalf("gen: relation %s.%s <-> %s.%s names a field that is neither published nor in the overlay",
				r.Field.Class, r.Field.Field, r.Inverse.Class, r.Inverse.Field)
		}
		rels = append(rels, schema.RelationSpec{Class: r.Field.Class, Field: r.Field.Field, InverseClass: r.Inverse.Class, InverseField: r.Inverse.Field})
	}
	return classes, enums, rels
}

// column is the database column of a field: a namespace and its member
// joined with "__".
func column(ol *overlay, class, field string) string {
	for _, scope := range []string{"*", class} {
		for ns, members := range ol.Namespaces[scope] {
			for _, m := range members {
				if field == ns+"_"+m {
					return ns + "__" + m
				}
			}
		}
	}
	return ""
}

func boolOr(b *bool, def bool) bool {
	if b == nil {
		return def
	}
	return *b
}

const header = "// Code generated by internal/datamodel/gen from datamodel.json and overlay.json. DO NOT EDIT.\n\n"

func genModel(dm *jsonModel, classes []schema.ClassSpec, enums []schema.EnumSpec, rels []schema.RelationSpec) []byte {
	var b bytes.Buffer
	b.WriteString(header)
	b.WriteString("package datamodel\n\nimport \"toolstackd/internal/schema\"\n\n")
	fmt.Fprintf(&b, "// Schema version of the datamodel.\nconst (\n\tSchemaMajor = %d\n\tSchemaMinor = %d\n)\n\n", dm.SchemaVersion.Major, dm.SchemaVersion.Minor)
	b.WriteString("var classSpecs = []schema.ClassSpec{\n")
	for _, c := range classes {
		fmt.Fprintf(&b, "\t{Name: %q, Lifecycle: %q, Persist: %t, GenEvents: %t, InDB: %t,\n\t\tFields: []schema.FieldSpec{\n",
			c.Name, c.Lifecycle, c.Persist, c.GenEvents, c.InDB)
		for _, f := range c.Fields {
			fmt.Fprintf(&b, "\t\t\t{Name: %q, Type: %q, Qualifier: %q, Lifecycle: %q", f.Name, f.Type, f.Qualifier, f.Lifecycle)
			if f.Column != "" {
				fmt.Fprintf(&b, ", Column: %q", f.Column)
			}
			if f.HasDefault {
				fmt.Fprintf(&b, ", HasDefault: true, Default: %q", f.Default)
			}
			if f.Internal {
				b.WriteString(", Internal: true")
			}
			b.WriteString("},\n")
		}
		b.WriteString("\t\t},\n\t\tMessages: []schema.MessageSpec{\n")
		for _, m := range c.Messages {
			fmt.Fprintf(&b, "\t\t\t{Name: %q, Result: %q, Lifecycle: %q", m.Name, m.Result, m.Lifecycle)
			if m.Implicit {
				b.WriteString(", Implicit: true")
			}
			if m.Extra {
				b.WriteString(", Extra: true")
			}
			if m.Async {
				b.WriteString(", Async: true")
			}
			b.WriteString(", Params: []schema.ParamSpec{")
			for i, p := range m.Params {
				if i > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "{Name: %q, Type: %q, Required: %t}", p.Name, p.Type, p.Required)
			}
			fmt.Fprintf(&b, "}, Roles: %s", strList(m.Roles))
			if len(m.Errors) > 0 {
				fmt.Fprintf(&b, ", Errors: %s", strList(m.Errors))
			}
			b.WriteString("},\n")
		}
		b.WriteString("\t\t},\n\t},\n")
	}
	b.WriteString("}\n\nvar enumSpecs = []schema.EnumSpec{\n")
	for _, e := range enums {
		fmt.Fprintf(&b, "\t{Name: %q, Values: %s},\n", e.Name, strList(e.Values))
	}
	b.WriteString("}\n\nvar relationSpecs = []schema.RelationSpec{\n")
	for _, r := range rels {
		fmt.Fprintf(&b, "\t{Class: %q, Field: %q, InverseClass: %q, InverseField: %q},\n", r.Class, r.Field, r.InverseClass, r.InverseField)
	}
	b.WriteString("}\n")
	return b.Bytes()
}

func strList(ss []string) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = strconv.Quote(s)
	}
	return "[]string{" + strings.Join(parts, ", ") + "}"
}

// Go naming.

var initialisms = map[string]string{}

func init() {
	for _, w := range strings.Fields("api cpu cpus dns dr gpu ha hvm id ip ipv4 ipv6 mac mtu nbd numa os pbd pbds pci pgpu pif pifs pv pvs sm sr srs ssl tls url usb uuid vbd vbds vdi vdis vgpu vif vifs vlan vm vmpp vmss vms vtpm vusb uefi bios nvram sdn iscsi json rpc xml http https ntp ssh lvhd") {
		initialisms[w] = strings.ToUpper(w)
	}
	for k, v := range map[string]string{"cpus": "CPUs", "pbds": "PBDs", "pifs": "PIFs", "srs": "SRs", "vbds": "VBDs", "vdis": "VDIs", "vifs": "VIFs", "vms": "VMs"} {
		initialisms[k] = v
	}
}

// goName turns a datamodel name into an exported Go identifier:
// "name_label" -> "NameLabel", "VM_guest_metrics" -> "VMGuestMetrics".
func goName(s string) string {
	var b strings.Builder
	for _, part := range strings.FieldsFunc(s, func(r rune) bool { return r == '_' || r == '-' || r == '.' || r == ' ' || r == '/' || r == ':' }) {
		if up, ok := initialisms[strings.ToLower(part)]; ok {
			b.WriteString(up)
			continue
		}
		r := []rune(part)
		r[0] = unicode.ToUpper(r[0])
		b.WriteString(string(r))
	}
	out := b.String()
	if out == "" || unicode.IsDigit(rune(out[0])) {
		out = "V" + out
	}
	return out
}
