package xenops

import (
	"testing"

	dm "toolstackd/internal/datamodel"
)

// TestVMOpsArePublished: every operation allowed_operations is made of is
// one xapi lists, and no VM state, however odd, yields another.
func TestVMOpsArePublished(t *testing.T) {
	for _, o := range listedVMOps {
		if !dm.PublishedAllowedOp("VM", string(o)) {
			t.Errorf("listedVMOps holds %s, which xapi never lists", o)
		}
	}
	n := 0
	for _, power := range allPowerStates {
		for bits := range 1 << 6 {
			for _, cur := range []map[string]string{nil, {"t1": "clone"}, {"t1": "hard_shutdown"}, {"t1": "migrate_send"}} {
				v := vmCheck{ref: "OpaqueRef:vm", power: power, current: cur,
					template: bits&1 != 0, snapshot: bits&2 != 0, control: bits&4 != 0, dom0: bits&12 == 12,
					defaultTpl: bits&16 != 0, acpi: bits&32 != 0}
				for _, o := range allowedVMOps(v) {
					n++
					if !dm.PublishedAllowedOp("VM", o) {
						t.Errorf("%+v allows %s, which xapi never lists", v, o)
					}
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no operation was ever allowed")
	}
}

// TestDeviceOpsArePublished: the same for VBDs and VIFs.
func TestDeviceOpsArePublished(t *testing.T) {
	for _, class := range []string{"VBD", "VIF"} {
		for _, power := range allPowerStates {
			for bits := range 1 << 4 {
				for _, cur := range []map[string]string{nil, {"t1": "plug"}} {
					d := devCheck{class: class, ref: "OpaqueRef:d", vm: "OpaqueRef:vm", vmPower: power, current: cur,
						attached: bits&1 != 0, cd: bits&2 != 0, empty: bits&4 != 0, unpluggable: bits&8 != 0}
					for _, o := range d.allowed() {
						if !dm.PublishedAllowedOp(class, o) {
							t.Errorf("%+v allows %s, which xapi never lists", d, o)
						}
					}
				}
			}
		}
	}
}
