package datamodel

import (
	"slices"
	"testing"

	"toolstackd/internal/schema"
)

// TestPublishedOpsCoverEveryClass: every class with allowed_operations has
// its sets, so a class added to the datamodel is not published unchecked.
func TestPublishedOpsCoverEveryClass(t *testing.T) {
	for _, c := range Model.Classes {
		if c.Field("allowed_operations") == nil {
			continue
		}
		if _, ok := publishedSets[c.Name]; !ok {
			t.Errorf("%s has allowed_operations but no published set", c.Name)
		}
	}
	if got := PublishedOpClasses(); len(got) != len(publishedOpRules) {
		t.Errorf("classes %v", got)
	}
}

// TestPublishedOpsFacts pins values of xapi's sets that clients depend on.
func TestPublishedOpsFacts(t *testing.T) {
	for _, tc := range []struct {
		class, op string
		allowed   bool
	}{
		{"SR", "vdi_copy", false}, {"SR", "vdi_forget", false}, {"SR", "vdi_update", false},
		{"SR", "vdi_generate_config", false}, {"SR", "vdi_force_unlock", false}, {"SR", "vdi_blocked", false},
		{"SR", "vdi_resize_online", false}, {"SR", "vdi_create", true}, {"SR", "pbd_destroy", true},
		{"SR", "scan", true}, {"SR", "vdi_introduce", true},
		{"VDI", "set_on_boot", false}, {"VDI", "blocked", false}, {"VDI", "force_unlock", false},
		{"VDI", "enable_cbt", false}, {"VDI", "revert_to", false}, {"VDI", "clone", true}, {"VDI", "forget", true},
		{"VDI", "generate_config", true},
		{"VM", "start", true}, {"VM", "provision", true}, {"VM", "import", false}, {"VM", "changing_VCPUs", false},
		{"VM", "get_boot_record", false}, {"VM", "reverting", false}, {"VM", "changing_VCPUs_live", true},
		{"VBD", "unplug_force", true}, {"VIF", "attach", true}, {"task", "cancel", true}, {"task", "destroy", false},
		{"network", "attaching", false}, {"Cluster_host", "destroy", false}, {"VTPM", "destroy", true},
		{"no such class", "start", false},
	} {
		if got := PublishedAllowedOp(tc.class, tc.op); got != tc.allowed {
			t.Errorf("%s.allowed_operations %s: %v, want %v", tc.class, tc.op, got, tc.allowed)
		}
	}
	if !PublishedCurrentOp("VDI", "set_on_boot") || PublishedCurrentOp("VDI", "blocked") ||
		PublishedCurrentOp("SR", "vdi_copy") || !PublishedCurrentOp("SR", "vdi_set_on_boot") ||
		!PublishedCurrentOp("VM", "import") || PublishedCurrentOp("task", "cancel") {
		t.Error("current_operations sets")
	}
	in := []string{"vdi_copy", "scan", "vdi_forget", "unplug", "vdi_update"}
	if got := PublishableAllowed("SR", in); !slices.Equal(got, []string{"scan", "unplug"}) || len(in) != 5 {
		t.Errorf("PublishableAllowed: %v", got)
	}
}

// TestRouteMarksArePublished: every mark the route table takes in a
// current_operations field is a value xapi writes there.
func TestRouteMarksArePublished(t *testing.T) {
	n := 0
	for _, m := range Model.Messages {
		r := RouteOf(m)
		if r == nil {
			continue
		}
		for _, mk := range r.Marks {
			c := markClass(t, m, mk.On)
			if c == nil {
				continue
			}
			n++
			if !PublishedCurrentOp(c.Name, mk.Op) {
				t.Errorf("%s marks %s (%s) with %q, which xapi never writes there", m.Wire, mk.On, c.Name, mk.Op)
			}
		}
	}
	if n < 50 {
		t.Errorf("checked %d marks", n)
	}
}

// markClass follows a mark's path to the class it marks.
func markClass(t *testing.T, m *schema.Message, p schema.Path) *schema.Class {
	switch p {
	case "$pool":
		return Model.Class("pool")
	case "$target":
		return Model.Class("host")
	}
	var c *schema.Class
	for _, prm := range m.Params {
		if prm.Name == p.Param() {
			c = refClassOf(prm.Type)
			if prm.Type.Kind == schema.KRecord {
				c = prm.Type.Class
			}
		}
	}
	for _, name := range p.Fields() {
		if c == nil {
			break
		}
		f := c.Field(name)
		if f == nil {
			c = nil
			break
		}
		c = refClassOf(f.Type)
	}
	if c == nil {
		t.Errorf("%s: cannot follow mark path %s", m.Wire, p)
	}
	return c
}

func refClassOf(ty *schema.Type) *schema.Class {
	if ty.Kind == schema.KSet {
		ty = ty.Elem
	}
	if ty.Kind == schema.KRef {
		return ty.Class
	}
	return nil
}
