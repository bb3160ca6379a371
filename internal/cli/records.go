package cli

import (
	"sort"
	"strconv"
	"strings"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// notInDB is how xe shows a reference to no object.
const notInDB = "<not in database>"

// fieldKind says what a record line shows.
type fieldKind uint8

const (
	fieldValue  fieldKind = iota // the field's value (refs as uuids)
	fieldNameOf                  // the name_label of the object a ref field points to
)

// fieldView is one field of a class as xe shows it.
type fieldView struct {
	name string // "name-label", "vm-uuid", "VIF-uuids"
	f    *schema.Field
	kind fieldKind
	// The XenAPI calls that change the field, or "": set_X for a plain
	// field, add_X/remove_X for a set, add_to_X/remove_from_X for a map.
	setter, adder, remover string
}

func (fv *fieldView) isSet() bool { return fv.kind == fieldValue && fv.f.Type.Kind == schema.KSet }
func (fv *fieldView) isMap() bool { return fv.kind == fieldValue && fv.f.Type.Kind == schema.KMap }

// marker is xe's access tag after a field name: ( RO), ( RW), (SRO),
// (SRW), (MRO), (MRW).
func (fv *fieldView) marker() string {
	switch {
	case fv.isSet() && fv.adder != "":
		return " (SRW)"
	case fv.isSet():
		return " (SRO)"
	case fv.isMap() && fv.adder != "":
		return " (MRW)"
	case fv.isMap():
		return " (MRO)"
	case fv.setter != "":
		return " ( RW)"
	}
	return " ( RO)"
}

// classView is a class as xe shows it: its CLI name, its fields, the
// fields <class>-list shows unless told otherwise and the filters it
// always applies. The VM class has three views: vm, template, snapshot.
type classView struct {
	cli      string
	plural   string
	class    *schema.Class
	fields   []*fieldView
	byName   map[string]*fieldView
	byFold   map[string]*fieldView
	defaults []string
	filters  []param
}

// lookup finds a field by its CLI name, exactly or else ignoring case.
func (v *classView) lookup(name string) *fieldView {
	if fv := v.byName[name]; fv != nil {
		return fv
	}
	return v.byFold[strings.ToLower(name)]
}

// cliClassNames are xe's names for the classes whose name is not simply
// the class name in lower case with dashes.
var cliClassNames = map[string]string{
	"pool_patch": "patch", "pool_update": "update", "VM_appliance": "appliance", "DR_task": "drtask",
	"Driver_variant": "hostdriver-variant", "Host_driver": "hostdriver",
}

// cliClassName is the name xe gives a class in its commands.
func cliClassName(c *schema.Class) string {
	if n, ok := cliClassNames[c.Name]; ok {
		return n
	}
	return strings.ReplaceAll(strings.ToLower(c.Name), "_", "-")
}

// listDefaults are the fields <class>-list shows by default, as xapi
// chose them; a class not named here shows every field.
var listDefaults = map[string][]string{
	"pool":               {"uuid", "name-label", "name-description", "master", "default-SR"},
	"pif":                {"uuid", "device", "VLAN", "MAC", "network-uuid", "currently-attached", "host-uuid"},
	"bond":               {"uuid", "master", "slaves"},
	"vlan":               {"uuid", "tagged-PIF", "untagged-PIF", "tag"},
	"tunnel":             {"uuid", "transport-PIF", "access-PIF", "status"},
	"vif":                {"uuid", "device", "vm-uuid", "network-uuid"},
	"network":            {"uuid", "name-label", "name-description", "bridge"},
	"console":            {"uuid", "vm-uuid", "vm-name-label", "protocol", "location"},
	"vm":                 {"name-label", "uuid", "power-state"},
	"template":           {"name-label", "name-description", "uuid"},
	"snapshot":           {"name-label", "name-description", "uuid", "snapshot-of", "snapshot-time", "is-vmss-snapshot"},
	"host":               {"uuid", "name-label", "name-description"},
	"host-cpu":           {"uuid", "number", "vendor", "speed", "utilisation"},
	"host-crashdump":     {"uuid", "host", "timestamp", "size"},
	"patch":              {"uuid", "name-label", "name-description", "size", "hosts", "after-apply-guidance"},
	"update":             {"uuid", "name-label", "name-description", "version", "installation-size", "hosts", "after-apply-guidance"},
	"vdi":                {"uuid", "name-label", "name-description", "virtual-size", "read-only", "sharable", "sr-uuid"},
	"vbd":                {"uuid", "vm-uuid", "vm-name-label", "vdi-uuid", "device", "empty"},
	"sr":                 {"uuid", "name-label", "name-description", "host", "type", "content-type"},
	"sm":                 {"uuid", "type", "name-label", "name-description", "vendor", "copyright", "configuration"},
	"pbd":                {"uuid", "host-uuid", "sr-uuid", "device-config", "currently-attached"},
	"task":               {"uuid", "name-label", "name-description", "status", "progress"},
	"subject":            {"uuid", "subject-identifier", "other-config", "roles"},
	"role":               {"uuid", "name", "description", "subroles"},
	"vmss":               {"uuid", "name-label", "name-description", "enabled", "type", "retained-snapshots", "frequency", "schedule", "last-run-time", "VMs"},
	"vm-group":           {"uuid", "name-label", "name-description", "placement", "vm-uuids"},
	"pgpu":               {"uuid", "pci-uuid", "vendor-name", "device-name", "gpu-group-uuid"},
	"gpu-group":          {"uuid", "name-label", "name-description"},
	"vgpu":               {"uuid", "vm-uuid", "device", "gpu-group-uuid"},
	"vgpu-type":          {"uuid", "vendor-name", "model-name", "max-resolution", "max-heads"},
	"pvs-site":           {"uuid", "name-label", "name-description", "pvs-uuid", "pvs-server-uuids"},
	"pvs-server":         {"uuid", "addresses", "pvs-site-uuid"},
	"pvs-proxy":          {"uuid", "vif-uuid", "pvs-site-uuid", "currently-attached", "cache-sr-uuid"},
	"pvs-cache-storage":  {"uuid", "host-uuid", "sr-uuid", "pvs-site-uuid", "size"},
	"feature":            {"uuid", "name-label", "name-description", "enabled", "experimental", "version", "host-uuid"},
	"sdn-controller":     {"uuid", "protocol", "address", "port"},
	"pusb":               {"uuid", "path", "product-id", "product-desc", "vendor-id", "vendor-desc", "serial", "version", "description", "speed"},
	"usb-group":          {"uuid", "name-label", "name-description"},
	"vusb":               {"uuid", "vm-uuid", "usb-group-uuid"},
	"network-sriov":      {"uuid", "physical-pif", "logical-pif", "requires-reboot", "configuration-mode"},
	"cluster":            {"uuid", "cluster-hosts", "cluster-token", "cluster-stack", "allowed-operations", "current-operations", "pool-auto-join", "cluster-config", "other-config"},
	"cluster-host":       {"uuid", "cluster", "pif", "host", "enabled", "allowed-operations", "current-operations", "other-config"},
	"certificate":        {"uuid", "type", "name", "host", "not-before", "not-after", "fingerprint"},
	"repository":         {"uuid", "name-label", "name-description", "binary-url", "source-url", "update", "hash", "up-to-date", "gpgkey-path", "origin"},
	"hostdriver-variant": {"uuid", "driver-name", "name", "version", "priority", "host-uuid", "driver-uuid", "active", "selected", "status", "hw-present"},
	"hostdriver":         {"uuid", "name", "host-uuid", "active-variant", "selected-variant", "variants", "variants-uuid"},
	"vtpm":               {"uuid", "vm-uuid", "profile"},
	"observer":           {"uuid", "name-label", "name-description", "host-uuids", "endpoints", "enabled"},
	"pci":                {"uuid", "vendor-name", "device-name", "pci-id"},
}

// buildViews makes a view of every class that has records.
func (s *Server) buildViews() {
	m := s.api.Model
	for _, c := range m.Classes {
		if !c.InDB || !c.HasGetAllRecords || c.Lifecycle == schema.Removed {
			continue
		}
		v := s.newView(c, cliClassName(c))
		if c == dm.VM.Class {
			v.filters = []param{{"is-a-template", "false"}}
			t := s.newView(c, "template")
			t.filters = []param{{"is-a-template", "true"}, {"is-a-snapshot", "false"}}
			sn := s.newView(c, "snapshot")
			sn.filters = []param{{"is-a-snapshot", "true"}}
			s.addView(t)
			s.addView(sn)
		}
		s.addView(v)
	}
}

func (s *Server) addView(v *classView) {
	s.classes[v.cli] = v
	s.views = append(s.views, v)
}

func (s *Server) newView(c *schema.Class, cli string) *classView {
	v := &classView{cli: cli, plural: cli + "s", class: c, byName: map[string]*fieldView{}, byFold: map[string]*fieldView{},
		defaults: listDefaults[cli]}
	if cli == "patch" {
		v.plural = "patches"
	}
	add := func(fv *fieldView) {
		if v.byName[fv.name] != nil {
			return
		}
		v.fields = append(v.fields, fv)
		v.byName[fv.name] = fv
		if _, dup := v.byFold[strings.ToLower(fv.name)]; !dup {
			v.byFold[strings.ToLower(fv.name)] = fv
		}
	}
	msg := func(name string) string {
		if mm := s.api.Model.Message(c.Name + "." + name); mm != nil && mm.Lifecycle != schema.Removed {
			return mm.Wire
		}
		return ""
	}
	// A field's own name comes first, so that a generated name never
	// hides a real field.
	taken := map[string]bool{}
	for _, f := range c.Fields {
		taken[strings.ReplaceAll(f.Name, "_", "-")] = true
	}
	for _, f := range c.Fields {
		if f.Internal || f.Lifecycle == schema.Removed {
			continue
		}
		name, companion := fieldCLIName(f)
		if name != strings.ReplaceAll(f.Name, "_", "-") && taken[name] {
			name, companion = strings.ReplaceAll(f.Name, "_", "-"), ""
		}
		fv := &fieldView{name: name, f: f}
		switch f.Type.Kind {
		case schema.KSet:
			if !f.Derived {
				fv.adder, fv.remover = msg("add_"+f.Name), msg("remove_"+f.Name)
			}
		case schema.KMap:
			fv.adder, fv.remover = msg("add_to_"+f.Name), msg("remove_from_"+f.Name)
			fv.setter = msg("set_" + f.Name)
		default:
			fv.setter = msg("set_" + f.Name)
		}
		add(fv)
		if companion != "" && !taken[companion] {
			add(&fieldView{name: companion, f: f, kind: fieldNameOf})
		}
	}
	return v
}

// fieldCLIName is the name xe shows a field under: underscores become
// dashes; a ref to the class the field is named after is shown as
// "<class>-uuid" (VBD.VM is vm-uuid) with a "<class>-name-label" line
// after it; a set of refs named after its class (network.VIFs) is shown
// as "<Class>-uuids". Other refs keep their name and show uuids too.
func fieldCLIName(f *schema.Field) (name, companion string) {
	t := f.Type
	switch {
	case t.Kind == schema.KRef && t.Class != nil && strings.EqualFold(f.Name, t.Class.Name):
		base := cliClassName(t.Class)
		if t.Class.NameLabel != nil {
			companion = base + "-name-label"
		}
		return base + "-uuid", companion
	case t.Kind == schema.KSet && t.Elem.Kind == schema.KRef && t.Elem.Class != nil &&
		strings.EqualFold(f.Name, t.Elem.Class.Name+"s"):
		return f.Name[:len(f.Name)-1] + "-uuids", ""
	}
	return strings.ReplaceAll(f.Name, "_", "-"), ""
}

// lowerEnums are the enumerations xe shows in lower case (power-state:
// halted, running); the others appear as the datamodel spells them.
var lowerEnums = map[string]bool{"vm_power_state": true}

// formatter shows values as xe does, resolving refs against one
// snapshot.
type formatter struct {
	snap *db.Snapshot
}

// ref shows a reference as its object's uuid.
func (fm formatter) ref(t *schema.Type, ref string) string {
	if ref == "" || ref == schema.NullRef {
		return notInDB
	}
	var row *db.Row
	var ok bool
	if t != nil && t.Class != nil {
		row, ok = fm.snap.Get(t.Class, ref)
	} else {
		row, ok = fm.snap.Lookup(ref)
	}
	if !ok {
		return notInDB
	}
	if id := row.UUID(); id != "" {
		return id
	}
	return ref
}

// scalar shows a value of a non-collection type.
func (fm formatter) scalar(t *schema.Type, v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		switch t.Kind {
		case schema.KRef:
			return fm.ref(t, x)
		case schema.KEnum:
			if lowerEnums[t.Name] {
				return strings.ToLower(x)
			}
		}
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return schema.FormatFloat(x)
	case bool:
		return strconv.FormatBool(x)
	case time.Time:
		return schema.FormatTime(x)
	}
	if t != nil && (t.Kind == schema.KSet || t.Kind == schema.KMap) {
		return fm.value(t, v)
	}
	return schema.FormatDB(t, v)
}

// items shows the members of a set.
func (fm formatter) items(t *schema.Type, v any) []string {
	var et *schema.Type
	if t != nil {
		et = t.Elem
	}
	switch x := v.(type) {
	case []string:
		out := make([]string, len(x))
		for i, e := range x {
			out[i] = fm.scalar(et, e)
		}
		return out
	case []int64:
		out := make([]string, len(x))
		for i, e := range x {
			out[i] = strconv.FormatInt(e, 10)
		}
		return out
	case []any:
		out := make([]string, len(x))
		for i, e := range x {
			out[i] = fm.scalar(et, e)
		}
		return out
	}
	return nil
}

// entries shows the pairs of a map, in key order.
func (fm formatter) entries(t *schema.Type, v any) []param {
	var kt, vt *schema.Type
	if t != nil {
		kt, vt = t.Key, t.Elem
	}
	var out []param
	for k, e := range schema.MapEntries(v) {
		out = append(out, param{fm.scalar(kt, k), fm.scalar(vt, e)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].k < out[j].k })
	return out
}

// value shows any value: sets as "a; b", maps as "k: v; k2: v2".
func (fm formatter) value(t *schema.Type, v any) string {
	if t == nil {
		return fm.scalar(t, v)
	}
	switch t.Kind {
	case schema.KSet:
		return strings.Join(fm.items(t, v), "; ")
	case schema.KMap:
		es := fm.entries(t, v)
		parts := make([]string, len(es))
		for i, e := range es {
			parts[i] = e.k + ": " + e.v
		}
		return strings.Join(parts, "; ")
	case schema.KOption:
		if v == nil {
			return ""
		}
		return fm.value(t.Elem, v)
	}
	return fm.scalar(t, v)
}

// get shows one field of a row.
func (fm formatter) get(row *db.Row, fv *fieldView) string {
	v := fm.snap.Value(row, fv.f)
	if fv.kind == fieldNameOf {
		ref, _ := v.(string)
		target, ok := fm.snap.Get(fv.f.Type.Class, ref)
		if !ok || target.Class.NameLabel == nil {
			return notInDB
		}
		return target.String(target.Class.NameLabel)
	}
	return fm.value(fv.f.Type, v)
}

// record is a row as record lines, either every field or those named.
func (fm formatter) record(v *classView, row *db.Row, only map[string]bool) []field {
	out := make([]field, 0, len(v.fields))
	for _, fv := range v.fields {
		if only != nil && !only[fv.name] {
			continue
		}
		out = append(out, field{fv.name + fv.marker(), fm.get(row, fv)})
	}
	return out
}

// argForms says what a command-line value of each schema.ParseScalar
// kind must be, for the message when it is not.
var argForms = map[schema.Kind]string{
	schema.KInt:      "an integer",
	schema.KFloat:    "a floating-point number",
	schema.KDateTime: "a date and time (for example 20250101T00:00:00Z)",
}

// parseValue reads a command-line value as a canonical value of t. name
// is the parameter, for messages.
func (c *Ctx) parseValue(t *schema.Type, s, name string) (any, error) {
	switch t.Kind {
	case schema.KString:
		return s, nil
	case schema.KInt, schema.KFloat, schema.KDateTime:
		v, err := schema.ParseScalar(t.Kind, strings.TrimSpace(s))
		if err != nil {
			return nil, failf("Parameter %s must be %s", name, argForms[t.Kind])
		}
		return v, nil
	case schema.KBool:
		b, ok := parseBool(s)
		if !ok {
			return nil, failf("Parameter %s must be a boolean (true or false)", name)
		}
		return b, nil
	case schema.KEnum:
		if t.Enum == nil {
			return s, nil
		}
		if v, ok := t.Enum.Match(s); ok {
			return v, nil
		}
		return nil, xerr.New(xerr.InvalidValue, name, s)
	case schema.KRef:
		return c.refOf(t.Class, s)
	case schema.KOption:
		if s == "" {
			return nil, nil
		}
		return c.parseValue(t.Elem, s, name)
	case schema.KSet:
		var parts []string
		if strings.TrimSpace(s) != "" {
			parts = strings.Split(s, ",")
		}
		switch {
		case t.Elem.StringLike():
			out := make([]string, 0, len(parts))
			for _, p := range parts {
				e, err := c.parseValue(t.Elem, strings.TrimSpace(p), name)
				if err != nil {
					return nil, err
				}
				out = append(out, e.(string))
			}
			return out, nil
		case t.Elem.Kind == schema.KInt:
			out := make([]int64, 0, len(parts))
			for _, p := range parts {
				e, err := c.parseValue(t.Elem, p, name)
				if err != nil {
					return nil, err
				}
				out = append(out, e.(int64))
			}
			return out, nil
		}
	}
	return nil, failf("Parameter %s cannot be given on the command line (type %s)", name, t)
}

// objectRef is refOf for an object that must be named: an empty value
// is no uuid at all.
func (c *Ctx) objectRef(cls *schema.Class, s string) (string, error) {
	if s == "" {
		return "", xerr.New(xerr.UUIDInvalid, cls.Name, s)
	}
	return c.refOf(cls, s)
}

// objectRefs reads parameter k, a comma-separated list of the uuids of
// objects of class cls, as their refs. Absent or empty, it names no
// object: an empty list, not nil, as the calls take a set.
func (c *Ctx) objectRefs(cls *schema.Class, k string) ([]string, error) {
	refs := []string{}
	list := c.paramOr(k, "")
	if list == "" {
		return refs, nil
	}
	for _, u := range strings.Split(list, ",") {
		ref, err := c.objectRef(cls, strings.TrimSpace(u))
		if err != nil {
			return nil, err
		}
		refs = append(refs, ref)
	}
	return refs, nil
}

// refOf turns what a user typed for an object (its uuid, or a ref) into
// its ref. An empty value is the null ref.
func (c *Ctx) refOf(cls *schema.Class, s string) (string, error) {
	if s == "" || s == schema.NullRef {
		return schema.NullRef, nil
	}
	if schema.IsRef(s) {
		return s, nil
	}
	if cls == nil {
		return "", xerr.New(xerr.UUIDInvalid, "", s)
	}
	row, ok := c.s.api.DB.Snapshot().ByUUID(cls, s)
	if !ok {
		return "", xerr.New(xerr.UUIDInvalid, cls.Name, s)
	}
	return row.Ref, nil
}
