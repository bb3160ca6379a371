package cli

import (
	"slices"
	"strconv"
	"strings"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// vmMigrateSXMParams are vm-migrate's parameters (or prefixes) for a
// storage migration, to another pool or SR, through VM.migrate_send
// (xapi's vm_migrate_sxm_params).
var vmMigrateSXMParams = []string{"remote-master", "remote-username", "vif", "remote-password", "remote-network", "vdi", "vgpu", "image-format"}

// addEvacuationCommands registers host-evacuate,
// host-get-vms-which-prevent-evacuation and vm-migrate.
func (s *Server) addEvacuationCommands() {
	s.register("host-evacuate", "Migrates every running VM off the selected host to the other hosts of the pool "+
		"(network-uuid: the network to migrate over; batch-size: migrations at once, default 10).", func(c *Ctx) error {
		network := schema.NullRef
		if u, ok := c.param("network-uuid"); ok {
			ref, err := c.objectRef(dm.Network.Class, u)
			if err != nil {
				return err
			}
			network = ref
		}
		var batch int64
		if b, ok := c.param("batch-size"); ok {
			n, err := strconv.ParseUint(b, 10, 63)
			if err != nil {
				return failf("batch-size: %q is not a number of VMs", b)
			}
			batch = int64(n)
		}
		return c.eachSelected(hostSelector, selectOpts{}, false, func(h *db.Row, _ formatter) error {
			_, err := c.call("host.evacuate", h.Ref, network, batch)
			return err
		})
	})

	s.register("host-get-vms-which-prevent-evacuation", "Lists the VMs that stop the host with this uuid from "+
		"being evacuated, each with the reason (an error code and its parameters).", func(c *Ctx) error {
		host, err := c.objectRef(dm.Host.Class, c.require("uuid"))
		if err != nil {
			return err
		}
		v, err := c.call("host.get_vms_which_prevent_evacuation", host)
		if err != nil {
			return err
		}
		reasons, _ := v.(map[string][]string)
		vms := make([]string, 0, len(reasons))
		for vm := range reasons {
			vms = append(vms, vm)
		}
		slices.Sort(vms)
		snap := c.s.api.DB.Snapshot()
		fm := formatter{snap}
		view := c.s.classes["vm"]
		only := c.pickFields(view, "params", []string{"uuid", "name-label"})
		for _, ref := range vms {
			rec := []field{}
			if row, ok := snap.Get(dm.VM.Class, ref); ok {
				rec = fm.record(view, row, only)
			}
			rec = append(rec, field{"reason ( RO)", strings.Join(reasons[ref], ",")})
			c.out.table([][]field{rec})
		}
		return nil
	})

	s.register("vm-migrate", "Migrates the selected running VMs to another host of the pool (host=<name or uuid>). "+
		"vdi:<vdi-uuid>=<sr-uuid> moves a disk to another SR on the way (storage migration inside the pool, "+
		"through host.migrate_receive and VM.migrate_send; disks not named stay on their SR; remote-network= the "+
		"network to receive on, default the host's management network). To another pool: remote-master=<address[:port]> "+
		"remote-username= remote-password= [host=<remote host>] vdi:<vdi-uuid>=<remote sr-uuid> "+
		"vif:<vif-uuid>=<remote network-uuid>.", func(c *Ctx) error {
		if _, ok := c.param("remote-master"); ok {
			return c.migrateToPool() // crosspool.go
		}
		sxm, err := c.sxmParams()
		if err != nil {
			return err
		}
		dest, ok := c.param("host")
		if !ok {
			dest, ok = c.param("host-uuid")
		}
		if !ok {
			return failf("No destination host specified")
		}
		host, err := c.hostRef(dest)
		if err != nil {
			return err
		}
		options, err := c.migrateOptions()
		if err != nil {
			return err
		}
		if v, ok := c.param("compress"); ok {
			options["compress"] = v
		}
		if sxm {
			return c.migrateSend(host, options)
		}
		return c.eachSelected(vmSelector, selectOpts{controlDomains: true}, true, func(vm *db.Row, _ formatter) error {
			_, err := c.call("VM.pool_migrate", vm.Ref, host, options)
			return err
		})
	})
}

// migrateOptions is vm-migrate's options map: force=, live= and copy=,
// each "true" or "false" (false when not given).
func (c *Ctx) migrateOptions() (map[string]string, error) {
	options := map[string]string{}
	for _, k := range []string{"force", "live", "copy"} {
		b, err := c.boolParam(k)
		if err != nil {
			return nil, err
		}
		options[k] = strconv.FormatBool(b)
	}
	return options, nil
}

// migrateSend is vm-migrate's storage migration inside the pool:
// host.migrate_receive on the destination, then VM.migrate_send for each
// selected VM with the vdi: and vif: maps (a VM's disks that are not
// named stay on their SRs, as xapi's vdi_map must name every disk).
func (c *Ctx) migrateSend(host string, options map[string]string) error {
	snap := c.s.api.DB.Snapshot()
	network := ""
	if n, ok := c.param("remote-network"); ok {
		for _, row := range snap.All(dm.Network.Class) {
			if row.UUID() == n || row.String(dm.Network.NameLabel) == n || row.String(dm.Network.Bridge) == n {
				network = row.Ref
				break
			}
		}
		if network == "" {
			return failf("Failed to find network: %s", n)
		}
	} else {
		for _, pif := range snap.All(dm.PIF.Class) {
			if pif.String(dm.PIF.Host) == host && pif.Get(dm.PIF.Management) == true {
				network = pif.String(dm.PIF.Network)
				break
			}
		}
		if network == "" {
			h, _ := snap.Get(dm.Host.Class, host)
			uuid := ""
			if h != nil {
				uuid = h.UUID()
			}
			return failf("Could not find management PIF on host %s", uuid)
		}
	}
	vdiMap := map[string]string{}
	for vdi, sr := range c.mapParams("vdi") {
		vref, err := c.objectRef(dm.VDI.Class, vdi)
		if err != nil {
			return err
		}
		sref, err := c.objectRef(dm.SR.Class, sr)
		if err != nil {
			return err
		}
		vdiMap[vref] = sref
	}
	vifMap := map[string]string{}
	for vif, n := range c.mapParams("vif") {
		vref, err := c.objectRef(dm.VIF.Class, vif)
		if err != nil {
			return err
		}
		nref, err := c.objectRef(dm.Network.Class, n)
		if err != nil {
			return err
		}
		vifMap[vref] = nref
	}
	v, err := c.call("host.migrate_receive", host, network, map[string]string{})
	if err != nil {
		return err
	}
	dest, _ := v.(map[string]string)
	c.out.msg("Performing a storage live migration. Your VM's VDIs will be migrated with the VM.")
	return c.eachSelected(vmSelector, selectOpts{controlDomains: true}, true, func(vm *db.Row, _ formatter) error {
		snap := c.s.api.DB.Snapshot()
		full := map[string]string{}
		for k, v := range vdiMap {
			full[k] = v
		}
		vbds, _ := snap.Value(vm, dm.VM.VBDs).([]string)
		for _, vbd := range vbds {
			row, ok := snap.Get(dm.VBD.Class, vbd)
			if !ok || row.Get(dm.VBD.Empty) == true {
				continue
			}
			vdi := row.String(dm.VBD.VDI)
			if _, named := full[vdi]; named {
				continue
			}
			if vr, ok := snap.Get(dm.VDI.Class, vdi); ok {
				full[vdi] = vr.String(dm.VDI.SR)
			}
		}
		_, err := c.call("VM.migrate_send", vm.Ref, dest, true, full, vifMap, options, map[string]string{}, map[string]string{})
		return err
	})
}

// sxmParams says whether vm-migrate has storage-migration parameters
// (a migration through VM.migrate_send) and refuses those of a
// migration to another pool (remote-master, remote-username,
// remote-password), which toolstackd does not do. The parameters are
// never ignored: a migration the user did not ask for (within the pool,
// disks left in place) must not happen instead.
func (c *Ctx) sxmParams() (bool, error) {
	var given []string
	for _, p := range c.params {
		for _, sxm := range vmMigrateSXMParams {
			if p.k == sxm || strings.HasPrefix(p.k, sxm+":") {
				if !slices.Contains(given, p.k) {
					given = append(given, p.k)
				}
			}
		}
	}
	if len(given) == 0 {
		return false, nil
	}
	var remote []string
	for _, k := range []string{"remote-master", "remote-username", "remote-password"} {
		if slices.Contains(given, k) {
			remote = append(remote, k)
		}
	}
	if len(remote) > 0 {
		return false, failf("Storage live migration requires remote-master, remote-username, and remote-password to be specified "+
			"(given: %s): nothing was migrated.", strings.Join(remote, ", "))
	}
	return true, nil
}
