package datamodel

import (
	"slices"

	"toolstackd/internal/schema"
)

// Which operations xapi ever publishes in a class's allowed_operations and
// current_operations.
//
// The enums of the datamodel have grown over the years, and xapi does not
// put every value of them in these fields: clients generated from an older
// datamodel (the SDKs, XO's typings, a pool member mid-upgrade) refuse a
// value they do not know, so a newer value is only published where xapi
// publishes it. SR.allowed_operations, for instance, never holds vdi_copy,
// vdi_forget or vdi_update, and VDI.allowed_operations keeps to the values
// that existed before the Ely release, less blocked and force_unlock. The
// sets below are the ones xapi computes from (its *_operations, *_helpers
// and *_lifecycle modules) and the operations it marks in
// current_operations (message_forwarding). Whatever toolstackd computes is
// held to them: PublishableAllowed filters a computed list, and each
// module's tests check that nothing it can compute falls outside.

// opRule describes one class's sets over the class's enum: only lists the
// values allowed (nil: every value), except removes values.
type opRule struct {
	only, except []string
}

// publishedOpRules are xapi's sets, by class: allowed_operations first,
// current_operations second.
var publishedOpRules = map[string][2]opRule{
	// xapi_vm_lifecycle: every vm_operations value but ignored_ops, which
	// are checked when called but never listed. current_operations may
	// hold any value (with_vm_operation marks each message's own).
	"VM": {{except: []string{"create_template", "power_state_reset", "csvm", "get_boot_record", "send_sysrq",
		"send_trigger", "query_services", "shutdown", "call_plugin", "changing_memory_live", "awaiting_memory_live",
		"changing_memory_limits", "changing_shadow_memory_live", "changing_VCPUs", "assert_operation_valid",
		"data_source_op", "update_allowed_operations", "import", "reverting"}}, {}},
	// xapi_vbd_helpers, xapi_vif_helpers, xapi_vusb_helpers: all_ops is
	// the whole enum.
	"VBD":  {{}, {}},
	"VIF":  {{}, {}},
	"VUSB": {{}, {}},
	// xapi_vdi: the pre-Ely values less blocked (CA-260245) and
	// force_unlock (CA-281176). VDI operations mark the VDI with every
	// value but blocked.
	"VDI": {{only: []string{"clone", "copy", "resize", "resize_online", "snapshot", "destroy", "forget", "update",
		"generate_config"}}, {except: []string{"blocked"}}},
	// xapi_sr_operations.all_ops, for both: an SR is only ever marked
	// with one of them.
	"SR": {{only: srAllOps}, {only: srAllOps}},
	// xapi_host_helpers and xapi_pool_helpers: every value.
	"host": {{}, {}},
	"pool": {{}, {}},
	// xapi_vm_appliance_lifecycle: every value.
	"VM_appliance": {{}, {}},
	// xapi_cluster_helpers: every value; xapi_cluster_host_helpers lists
	// enable and disable only.
	"Cluster":      {{}, {}},
	"Cluster_host": {{only: []string{"enable", "disable"}}, {}},
	// vtpm_update_allowed_operations: destroy, of a halted VM's VTPM;
	// nothing marks a VTPM.
	"VTPM": {{only: []string{"destroy"}}, {only: []string{}}},
	// Tasks: cancel while cancellable; never marked.
	"task": {{only: []string{"cancel"}}, {only: []string{}}},
	// Networks: xapi never writes either field.
	"network": {{only: []string{}}, {only: []string{}}},
}

// srAllOps is xapi's all_ops for SRs.
var srAllOps = []string{"scan", "destroy", "forget", "plug", "unplug", "vdi_create", "vdi_destroy", "vdi_resize",
	"vdi_clone", "vdi_snapshot", "vdi_mirror", "vdi_enable_cbt", "vdi_disable_cbt", "vdi_data_destroy",
	"vdi_list_changed_blocks", "vdi_set_on_boot", "vdi_introduce", "vdi_revert", "update", "pbd_create", "pbd_destroy"}

// publishedSets holds the rules resolved against the model's enums:
// class name -> [allowed, current] sets.
var publishedSets = buildPublishedSets(Model)

func buildPublishedSets(m *schema.Model) map[string][2]map[string]bool {
	out := map[string][2]map[string]bool{}
	for name, rules := range publishedOpRules {
		c := m.Class(name)
		if c == nil {
			panic("datamodel: published operations of unknown class " + name)
		}
		var sets [2]map[string]bool
		for i, fname := range []string{"allowed_operations", "current_operations"} {
			f := c.Field(fname)
			if f == nil || f.Type.Elem == nil || f.Type.Elem.Enum == nil {
				panic("datamodel: " + name + " has no " + fname)
			}
			enum := f.Type.Elem.Enum
			set := map[string]bool{}
			for _, v := range enum.Values {
				if (rules[i].only == nil || slices.Contains(rules[i].only, v)) && !slices.Contains(rules[i].except, v) {
					set[v] = true
				}
			}
			for _, v := range append(slices.Clone(rules[i].only), rules[i].except...) {
				if !enum.Has(v) {
					panic("datamodel: published operation " + v + " is not a " + enum.Name)
				}
			}
			sets[i] = set
		}
		out[name] = sets
	}
	return out
}

// PublishedOpClasses lists the classes PublishedAllowedOp knows, sorted.
func PublishedOpClasses() []string {
	var out []string
	for name := range publishedSets {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// PublishedAllowedOp says whether xapi may list op in class's
// allowed_operations.
func PublishedAllowedOp(class, op string) bool { return publishedSets[class][0][op] }

// PublishedCurrentOp says whether xapi may put op in class's
// current_operations.
func PublishedCurrentOp(class, op string) bool { return publishedSets[class][1][op] }

// PublishableAllowed returns ops less those xapi never lists in class's
// allowed_operations, in their order (ops itself is not changed).
func PublishableAllowed(class string, ops []string) []string {
	out := make([]string, 0, len(ops))
	for _, o := range ops {
		if PublishedAllowedOp(class, o) {
			out = append(out, o)
		}
	}
	return out
}
