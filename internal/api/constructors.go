package api

import "toolstackd/internal/schema"

// serverOwnedAtCreation names, per class, the fields a constructor takes
// on the wire (the datamodel marks them RO/constructor) that describe
// state only the server establishes: whether a VM runs or holds a memory
// image, whether a device is plugged, what a guest last booted with.
// Whatever a caller sends for them, a new object starts in its initial
// state: the value given here, or else the field's datamodel default (or
// its empty value when there is none), as xapi's constructors leave them. A VM made by VM.create is
// therefore always Halted with a null suspend_VDI: the only way to a
// Suspended VM is a suspend the server performed itself.
//
// Fields marked RO/runtime are never taken from a caller at all; this
// table is for the RO/constructor ones that are runtime state in
// disguise, and for RO/runtime ones whose initial value is not their
// datamodel default. A handler's own choices (implicitCreate's server map) still
// apply on top.
var serverOwnedAtCreation = map[string]map[string]any{
	"VM": {"power_state": nil, "suspend_VDI": nil, "last_booted_record": nil, "last_boot_CPU_flags": nil,
		"domid": int64(-1)}, // no domain: xapi's VM.create says -1, not 0
	"VM_metrics": {"numa_optimised": nil, "numa_nodes": nil},
	"VBD":        {"currently_attached": nil},
	"VIF":        {"currently_attached": nil},
	"blob":       {"last_updated": nil},
}

// serverOwnedAtCreate reports whether a constructor must ignore what its
// caller sends for f.
func serverOwnedAtCreate(f *schema.Field) bool {
	_, listed := serverOwnedAtCreation[f.Class.Name][f.Name]
	return f.Qualifier == schema.DynamicRO || listed
}

// initialValue is what a server-owned field holds in a new object; ok is
// false when the datamodel's default applies.
func initialValue(f *schema.Field) (any, bool) {
	if v := serverOwnedAtCreation[f.Class.Name][f.Name]; v != nil {
		return v, true
	}
	if f.HasDefault {
		return nil, false
	}
	return f.Zero(), true
}
