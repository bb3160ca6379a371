package main

import (
	"bytes"
	"fmt"
	"log"
	"sort"
	"strings"

	"toolstackd/internal/gen/genutil"
	"toolstackd/internal/schema"
)

// routes.json: where each message runs in a pool and what it marks. A
// message takes its own entry, else its class's, else the default, so the
// generated table has a route for every message of the model.

type jsonRoutes struct {
	About    string               `json:"about"`
	Default  jsonRoute            `json:"default"`
	Classes  map[string]jsonRoute `json:"classes"`
	Messages map[string]jsonRoute `json:"messages"`
}

type jsonRoute struct {
	Route         string   `json:"route"`
	Targets       []string `json:"targets"`
	Else          string   `json:"else"`
	CoordinatorIf string   `json:"coordinator_if"`
	Marks         []string `json:"marks"` // "path:op"
}

// Two mark paths name objects no argument does: the pool itself (calls
// such as pool.enable_ha lock it) and the host the call is routed to
// (VM.start marks it vm_start).
const (
	poolPath   = "$pool"
	targetPath = "$target"
)

// genRoutes reads the route data at path, checks every entry against the
// model and returns zz_routes.go. Any entry naming a class, message,
// parameter, field or operation the model does not have is fatal.
func genRoutes(model *schema.Model, path string) []byte {
	var jr jsonRoutes
	genutil.ReadJSONStrict(path, &jr)
	routes, err := buildRoutes(model, &jr)
	if err != nil {
		log.Fatalf("gen: %s: %v", path, err)
	}
	return writeRoutes(model, routes)
}

func buildRoutes(model *schema.Model, jr *jsonRoutes) (map[string]*schema.Route, error) {
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	for _, name := range schema.SortedKeys(jr.Classes) {
		if model.Class(name) == nil {
			fail("classes: no class %q", name)
		}
	}
	for _, wire := range schema.SortedKeys(jr.Messages) {
		if model.Message(wire) == nil {
			fail("messages: no message %q", wire)
		}
	}
	out := map[string]*schema.Route{}
	for _, m := range model.Messages {
		jr1, where := jr.Default, "default"
		if r, ok := jr.Classes[m.Class.Name]; ok {
			jr1, where = r, "classes."+m.Class.Name
		}
		if r, ok := jr.Messages[m.Wire]; ok {
			jr1, where = r, "messages."+m.Wire
		}
		r, err := checkRoute(model, m, jr1)
		if err != nil {
			fail("%s (for %s): %v", where, m.Wire, err)
			continue
		}
		out[m.Wire] = r
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%d problems:\n\t%s", len(problems), strings.Join(problems, "\n\t"))
	}
	return out, nil
}

// targetClasses are the classes a kind's target paths may end at, and how
// many targets it takes (-1: one or more).
var targetRules = map[schema.RouteKind]struct {
	classes []string
	count   int
}{
	schema.RouteCoordinator:   {nil, 0},
	schema.RouteLocal:         {nil, 0},
	schema.RouteHostArg:       {[]string{"host"}, 1},
	schema.RouteObjectHost:    {[]string{"host"}, 1},
	schema.RouteVMResident:    {[]string{"VM"}, 1},
	schema.RoutePlacement:     {[]string{"VM"}, 1},
	schema.RouteSRAccess:      {[]string{"VM", "VDI", "SR"}, -1},
	schema.RouteSRPlugged:     {[]string{"SR"}, 1},
	schema.RouteSRAllPBDs:     {[]string{"SR"}, 1},
	schema.RouteTaskForwarded: {[]string{"task"}, 1},
}

func checkRoute(model *schema.Model, m *schema.Message, jr jsonRoute) (*schema.Route, error) {
	kind, ok := schema.ParseRouteKind(jr.Route)
	if !ok {
		return nil, fmt.Errorf("unknown route %q", jr.Route)
	}
	r := &schema.Route{Kind: kind, CoordinatorIf: jr.CoordinatorIf}
	rule := targetRules[kind]
	if (rule.count >= 0 && len(jr.Targets) != rule.count) || (rule.count < 0 && len(jr.Targets) == 0) {
		return nil, fmt.Errorf("route %s takes %d targets, has %d", kind, rule.count, len(jr.Targets))
	}
	for _, t := range jr.Targets {
		c, err := checkPath(model, m, t)
		if err != nil {
			return nil, err
		}
		if !contains(rule.classes, c.Name) {
			return nil, fmt.Errorf("target %q ends at %s, route %s needs %s", t, c.Name, kind, strings.Join(rule.classes, " or "))
		}
		switch {
		case kind == schema.RouteHostArg && strings.Contains(t, "."):
			return nil, fmt.Errorf("host_arg target %q must be a parameter (use object_host for a path)", t)
		case kind == schema.RouteObjectHost && !strings.Contains(t, "."):
			return nil, fmt.Errorf("object_host target %q must follow a field (use host_arg for a parameter)", t)
		}
		r.Targets = append(r.Targets, schema.Path(t))
	}
	switch jr.Else {
	case "":
	case "coordinator", "sr_access":
		if kind != schema.RouteVMResident {
			return nil, fmt.Errorf("else is only for vm_resident")
		}
		r.Else, _ = schema.ParseRouteKind(jr.Else)
	default:
		return nil, fmt.Errorf("else %q: want coordinator or sr_access", jr.Else)
	}
	if jr.CoordinatorIf != "" {
		p := param(m, jr.CoordinatorIf)
		if p == nil || p.Type.Kind != schema.KBool {
			return nil, fmt.Errorf("coordinator_if %q is not a bool parameter", jr.CoordinatorIf)
		}
	}
	for _, mk := range jr.Marks {
		on, op, ok := strings.Cut(mk, ":")
		if !ok {
			return nil, fmt.Errorf("mark %q: want path:op", mk)
		}
		var c *schema.Class
		switch on {
		case poolPath:
			c = model.Class("pool")
		case targetPath:
			c = model.Class("host")
		default:
			var err error
			if c, err = checkPath(model, m, on); err != nil {
				return nil, err
			}
		}
		f := c.Field("current_operations")
		if f == nil || f.Type.Kind != schema.KMap || f.Type.Elem.Kind != schema.KEnum {
			return nil, fmt.Errorf("mark %q: %s has no current_operations", mk, c.Name)
		}
		if !f.Type.Elem.Enum.Has(op) {
			return nil, fmt.Errorf("mark %q: %q is not a %s", mk, op, f.Type.Elem.Enum.Name)
		}
		r.Marks = append(r.Marks, schema.Mark{On: schema.Path(on), Op: op})
	}
	return r, nil
}

// checkPath follows a path through the model and returns the class it
// ends at. Each step must be a ref or a set of refs.
func checkPath(model *schema.Model, m *schema.Message, path string) (*schema.Class, error) {
	p := schema.Path(path)
	prm := param(m, p.Param())
	if prm == nil {
		return nil, fmt.Errorf("path %q: %s has no parameter %q", path, m.Wire, p.Param())
	}
	c := refClass(prm.Type)
	if prm.Type.Kind == schema.KRecord && len(p.Fields()) > 0 {
		// A constructor's record: the path goes on from one of its fields.
		c = prm.Type.Class
	}
	if c == nil {
		return nil, fmt.Errorf("path %q: parameter %q is %s, not a ref (or a record with a field after it)", path, p.Param(), prm.Type)
	}
	for _, name := range p.Fields() {
		f := c.Field(name)
		if f == nil || f.Name != name {
			return nil, fmt.Errorf("path %q: %s has no field %q", path, c.Name, name)
		}
		if c = refClass(f.Type); c == nil {
			return nil, fmt.Errorf("path %q: %s.%s is %s, not a ref", path, f.Class.Name, name, f.Type)
		}
	}
	return c, nil
}

func refClass(t *schema.Type) *schema.Class {
	if t.Kind == schema.KSet {
		t = t.Elem
	}
	if t.Kind == schema.KRef {
		return t.Class
	}
	return nil
}

func param(m *schema.Message, name string) *schema.Param {
	for i := range m.Params {
		if m.Params[i].Name == name {
			return &m.Params[i]
		}
	}
	return nil
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

const routesHeader = "// Code generated by internal/datamodel/gen from routes.json. DO NOT EDIT.\n\n"

func writeRoutes(model *schema.Model, routes map[string]*schema.Route) []byte {
	var b bytes.Buffer
	b.WriteString(routesHeader)
	b.WriteString("package datamodel\n\nimport \"toolstackd/internal/schema\"\n\n")
	// Routes with nothing but a kind are shared.
	plain := map[schema.RouteKind]bool{}
	for _, r := range routes {
		if isPlain(r) {
			plain[r.Kind] = true
		}
	}
	kinds := make([]schema.RouteKind, 0, len(plain))
	for k := range plain {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return kinds[i] < kinds[j] })
	b.WriteString("// Routes that say nothing but their kind, shared by many messages.\nvar (\n")
	for _, k := range kinds {
		fmt.Fprintf(&b, "\troute%s = &schema.Route{Kind: schema.%s}\n", goName(k.String()), kindConst(k))
	}
	b.WriteString(")\n\n// routes holds the route of every message, by wire name.\nvar routes = map[string]*schema.Route{\n")
	for _, m := range model.Messages {
		r := routes[m.Wire]
		if isPlain(r) {
			fmt.Fprintf(&b, "\t%q: route%s,\n", m.Wire, goName(r.Kind.String()))
			continue
		}
		fmt.Fprintf(&b, "\t%q: {Kind: schema.%s", m.Wire, kindConst(r.Kind))
		if len(r.Targets) > 0 {
			parts := make([]string, len(r.Targets))
			for i, t := range r.Targets {
				parts[i] = fmt.Sprintf("%q", t)
			}
			fmt.Fprintf(&b, ", Targets: []schema.Path{%s}", strings.Join(parts, ", "))
		}
		if r.Else != schema.RouteCoordinator {
			fmt.Fprintf(&b, ", Else: schema.%s", kindConst(r.Else))
		}
		if r.CoordinatorIf != "" {
			fmt.Fprintf(&b, ", CoordinatorIf: %q", r.CoordinatorIf)
		}
		if len(r.Marks) > 0 {
			parts := make([]string, len(r.Marks))
			for i, mk := range r.Marks {
				parts[i] = fmt.Sprintf("{On: %q, Op: %q}", mk.On, mk.Op)
			}
			fmt.Fprintf(&b, ", Marks: []schema.Mark{%s}", strings.Join(parts, ", "))
		}
		b.WriteString("},\n")
	}
	b.WriteString("}\n\n")
	b.WriteString(`// RouteOf is where m runs in a pool and what it marks; every message of
// Model has one. The result is shared: do not change it.
func RouteOf(m *schema.Message) *schema.Route { return routes[m.Wire] }
`)
	return b.Bytes()
}

func isPlain(r *schema.Route) bool {
	return len(r.Targets) == 0 && len(r.Marks) == 0 && r.Else == schema.RouteCoordinator && r.CoordinatorIf == ""
}

func kindConst(k schema.RouteKind) string { return "Route" + goName(k.String()) }
