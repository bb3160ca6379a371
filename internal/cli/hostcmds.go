package cli

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// addHostCommands registers the commands on hosts, the pool, HA, and the
// small objects (secrets, groups, schedules) that are made and destroyed
// from the command line.
func (s *Server) addHostCommands() {
	s.addHostStateCommands()
	s.addHostInfoCommands()
	s.addPoolSettingCommands()
	s.addPoolHACommands()
	s.register("message-destroy-all", "Destroys every message, or those before= or after= a time (RFC 3339), or of "+
		"the priority= given.", s.destroyAllMessages)
	s.addSessionSubjectCommands()
	s.addSubjectCommands()
	s.addObjectCommands()
	s.addDiagnosticCommands()
}

// hostCommand registers a command that acts on the host the selectors
// pick (several with --multiple when multiple).
func (s *Server) hostCommand(name, help string, multiple bool, op func(c *Ctx, host *db.Row) error) {
	s.register(name, help, func(c *Ctx) error {
		return c.eachSelected(hostSelector, selectOpts{}, multiple, func(row *db.Row, _ formatter) error { return op(c, row) })
	})
}

// addHostStateCommands registers the commands that enable, disable and
// declare hosts dead, and those that print a host's memory figures.
func (s *Server) addHostStateCommands() {
	s.hostCommand("host-disable", "Disables the selected hosts: no VM starts or resumes on them (auto-enable=false: they stay "+
		"disabled across a restart of the toolstack).", true, func(c *Ctx, h *db.Row) error {
		auto, err := c.boolParamOr("auto-enable", true)
		if err != nil {
			return err
		}
		_, err = c.call("host.disable", h.Ref, auto)
		return err
	})
	s.hostCommand("host-enable", "Enables the selected hosts (and takes them out of maintenance mode).", true,
		func(c *Ctx, h *db.Row) error {
			if oc, _ := h.Get(dm.Host.OtherConfig).(map[string]string); oc["MAINTENANCE_MODE"] != "" {
				if _, err := c.call("host.remove_from_other_config", h.Ref, "MAINTENANCE_MODE"); err != nil {
					return err
				}
			}
			_, err := c.call("host.enable", h.Ref)
			return err
		})
	s.hostCommand("host-compute-free-memory", "Prints the memory free for new VMs on the selected host, in bytes.", false,
		printHostInt("host.compute_free_memory"))
	s.hostCommand("host-compute-memory-overhead", "Prints the memory overhead of the selected host, in bytes.", false,
		printHostInt("host.compute_memory_overhead"))
	s.register("host-declare-dead", "Declares the host with this uuid dead: its VMs are recorded as halted. Only for a "+
		"host known to be off; asks first unless --force is given.", s.declareHostDead, params([]string{"uuid"}, []string{"force"}))
	s.register("host-emergency-ha-disable", "Turns HA off on this host alone, for when the pool's HA cannot be disabled "+
		"normally (--force required; soft=true leaves the rest of the pool's HA state).", forcedOnly(func(c *Ctx) error {
		soft, err := c.boolParam("soft")
		if err != nil {
			return err
		}
		_, err = c.call("host.emergency_ha_disable", soft)
		return err
	}))
}

// printHostInt is a host command that prints what method returns for the
// host.
func printHostInt(method string) func(c *Ctx, h *db.Row) error {
	return func(c *Ctx, h *db.Row) error {
		v, err := c.call(method, h.Ref)
		if err != nil {
			return err
		}
		c.out.msg(fmt.Sprint(v))
		return nil
	}
}

// declareHostDead is host-declare-dead: it asks first, unless --force is
// given.
func (s *Server) declareHostDead(c *Ctx) error {
	ref, err := c.objectRef(dm.Host.Class, c.require("uuid"))
	if err != nil {
		return err
	}
	force, err := c.boolParam("force")
	if err != nil {
		return err
	}
	if !force {
		for _, w := range []string{
			"WARNING: A host should only be declared dead if it is verified offline.",
			"WARNING: Performing this operation if the host is still online and has any",
			"WARNING: running VMs may lead to possible data loss and/or corruption.",
		} {
			c.out.msg(w)
		}
		yes, err := c.confirm()
		if err != nil || !yes {
			return err
		}
	}
	_, err = c.call("host.declare_dead", ref)
	return err
}

// addHostInfoCommands registers the commands that show a host's CPU,
// licence and editions.
func (s *Server) addHostInfoCommands() {
	s.registerHostMap("host-cpu-info", "Shows the CPU of the host with this uuid (default: this host).", "uuid", dm.Host.CPUInfo, nil)
	s.registerHostMap("host-get-cpu-features", "Shows the CPU features of the host with this uuid (default: this host).", "uuid",
		dm.Host.CPUInfo, []string{"features_pv", "features_hvm", "features_pv_host", "features_hvm_host"})
	s.registerHostMap("host-license-view", "Shows the licence of the host host-uuid (default: this host).", "host-uuid",
		dm.Host.LicenseParams, nil, "sku_type")
	s.register("host-all-editions", "Lists the editions this host can be licensed for.", func(c *Ctx) error {
		row, err := c.hostOrThis("")
		if err != nil {
			return err
		}
		c.out.list(strs(row.Get(dm.Host.Editions))...)
		return nil
	})
}

// registerHostMap registers a command that shows the map field f of the
// host param names (default: this host) as one record: the keys given
// (all when none), less those in hide.
func (s *Server) registerHostMap(name, help, param string, f *schema.Field, keys []string, hide ...string) {
	s.register(name, help, func(c *Ctx) error {
		row, err := c.hostOrThis(param)
		if err != nil {
			return err
		}
		m, _ := row.Get(f).(map[string]string)
		c.out.table([][]field{mapRecord(m, keys, hide)})
		return nil
	})
}

// addPoolSettingCommands registers the commands that show or change the
// pool's CPU features, secret and update synchronisation.
func (s *Server) addPoolSettingCommands() {
	s.register("pool-get-cpu-features", "Shows the CPU features every host of the pool has.", func(c *Ctx) error {
		pool, err := c.thePool()
		if err != nil {
			return err
		}
		m, _ := pool.Get(dm.Pool.CPUInfo).(map[string]string)
		c.out.table([][]field{mapRecord(m, []string{"features_pv_host", "features_hvm_host"}, nil)})
		return nil
	})
	s.register("pool-disable-ssl-legacy", "Does nothing: kept for old scripts, as in xapi.", func(*Ctx) error { return nil })
	s.register("pool-secret-rotate", "Gives the pool a new secret for the hosts' own connections.", call0("pool.rotate_secret"))
	s.register("pool-set-update-sync-enabled", "Turns the pool's periodic update synchronisation on or off (value=).",
		func(c *Ctx) error {
			pool, err := c.thePool()
			if err != nil {
				return err
			}
			v, err := c.boolParam("value")
			if err != nil {
				return err
			}
			_, err = c.call("pool.set_update_sync_enabled", pool.Ref, v)
			return err
		})
}

// addPoolHACommands registers the commands that turn the pool's HA on
// and off and that show what its plan can survive.
func (s *Server) addPoolHACommands() {
	s.register("pool-ha-enable", "Turns HA on for the pool (heartbeat-sr-uuids: the SRs for its heartbeat; ha-config:<key>=<value>).",
		func(c *Ctx) error {
			srs, err := c.objectRefs(dm.SR.Class, "heartbeat-sr-uuids")
			if err != nil {
				return err
			}
			_, err = c.call("pool.enable_ha", srs, c.mapParams("ha-config"))
			return err
		})
	s.register("pool-ha-disable", "Turns HA off for the pool.", call0("pool.disable_ha"))
	s.register("pool-ha-prevent-restarts-for", "Stops HA restarting VMs for this many seconds.", func(c *Ctx) error {
		n, err := strconv.ParseInt(strings.TrimSpace(c.require("seconds")), 10, 64)
		if err != nil {
			return failf("Parameter seconds must be an integer")
		}
		_, err = c.call("pool.ha_prevent_restarts_for", n)
		return err
	})
	s.register("pool-ha-compute-max-host-failures-to-tolerate", "Prints how many host failures the pool's HA plan can "+
		"survive now.", func(c *Ctx) error {
		v, err := c.call("pool.ha_compute_max_host_failures_to_tolerate")
		if err != nil {
			return err
		}
		c.out.list(fmt.Sprint(v))
		return nil
	})
	s.register("pool-ha-compute-hypothetical-max-host-failures-to-tolerate", "Prints how many host failures HA could "+
		"survive if the VMs given (vm-uuid=, each followed by its restart-priority=) were protected.", s.hypotheticalHostFailures)
	s.register("pool-ha-compute-vm-failover-plan", "Shows where HA would restart the VMs of the hosts host-uuids "+
		"(a comma-separated list) if they failed.", s.failoverPlan)
}

// hypotheticalHostFailures is
// pool-ha-compute-hypothetical-max-host-failures-to-tolerate: each
// vm-uuid= pairs with the restart-priority= in the same place.
func (s *Server) hypotheticalHostFailures(c *Ctx) error {
	var vms, pris []string
	for _, p := range c.params {
		switch p.k {
		case "vm-uuid":
			vms = append(vms, p.v)
		case "restart-priority":
			pris = append(pris, p.v)
		}
	}
	if len(vms) != len(pris) {
		return failf("Call requires an equal number of vm-uuid and restart-priority arguments")
	}
	conf := map[string]string{}
	for i, u := range vms {
		ref, err := c.objectRef(dm.VM.Class, u)
		if err != nil {
			return err
		}
		conf[ref] = pris[i]
	}
	v, err := c.call("pool.ha_compute_hypothetical_max_host_failures_to_tolerate", conf)
	if err != nil {
		return err
	}
	c.out.list(fmt.Sprint(v))
	return nil
}

// destroyAllMessages is message-destroy-all: before= and after= are
// RFC 3339 times, priority= a positive integer.
func (s *Server) destroyAllMessages(c *Ctx) error {
	filters := map[string]string{}
	for _, k := range []string{"before", "after"} {
		if v, ok := c.param(k); ok {
			t, err := time.Parse(time.RFC3339, strings.TrimSpace(v))
			if err != nil {
				return failf("Invalid timestamp format for '%s' (expected RFC3339, for example, 2025-01-01T00:00:00Z)", k)
			}
			filters[k] = t.UTC().Format(time.RFC3339)
		}
	}
	if v, ok := c.param("priority"); ok {
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 63)
		if err != nil {
			return failf("Invalid priority format (expected positive integer)")
		}
		filters["priority"] = strconv.FormatUint(n, 10)
	}
	_, err := c.call("message.destroy_all", filters)
	return err
}

// addSessionSubjectCommands registers the commands that list the
// subjects with sessions open and end their sessions.
func (s *Server) addSessionSubjectCommands() {
	s.register("session-subject-identifier-list", "Lists the subjects (external users) with sessions open.", func(c *Ctx) error {
		v, err := c.call("session.get_all_subject_identifiers")
		if err != nil {
			return err
		}
		var recs [][]field
		for _, id := range strs(v) {
			recs = append(recs, []field{{"subject-identifier ( RO)", id}})
		}
		c.out.table(recs)
		return nil
	})
	s.register("session-subject-identifier-logout", "Ends every session of the subject subject-identifier.", func(c *Ctx) error {
		_, err := c.call("session.logout_subject_identifier", c.require("subject-identifier"))
		return err
	})
	s.register("session-subject-identifier-logout-all", "Ends every session of every subject.", func(c *Ctx) error {
		v, err := c.call("session.get_all_subject_identifiers")
		if err != nil {
			return err
		}
		for _, id := range strs(v) {
			if _, err := c.call("session.logout_subject_identifier", id); err != nil {
				return err
			}
		}
		return nil
	})
}

// addSubjectCommands registers the commands that remove subjects and
// give them roles or take roles from them.
func (s *Server) addSubjectCommands() {
	s.register("subject-remove", "Removes the subject with subject-uuid: its user may no longer log in.",
		onObject("subject.destroy", dm.Subject.Class, "subject-uuid"))
	s.register("subject-role-add", "Gives the subject with this uuid a role (role-name or role-uuid).", subjectRole("subject.add_to_roles"))
	s.register("subject-role-remove", "Takes a role (role-name or role-uuid) from the subject with this uuid.",
		subjectRole("subject.remove_from_roles"))
}

// subjectRole is a command that calls method with the subject uuid= and
// the role role-uuid= or role-name= names (one of them).
func subjectRole(method string) func(c *Ctx) error {
	return func(c *Ctx) error {
		subject, err := c.objectRef(dm.Subject.Class, c.require("uuid"))
		if err != nil {
			return err
		}
		id, name := c.paramOr("role-uuid", ""), c.paramOr("role-name", "")
		var role string
		switch {
		case id == "" && name == "":
			return failf("Required parameter not found: role-uuid or role-name")
		case id != "" && name != "":
			return failf("Parameters role-uuid and role-name cannot be used together")
		case id != "":
			if role, err = c.objectRef(dm.Role.Class, id); err != nil {
				return err
			}
		default:
			v, err := c.call("role.get_by_name_label", name)
			if err != nil {
				return err
			}
			role = schema.NullRef
			if r := strs(v); len(r) > 0 {
				role = r[0]
			}
		}
		_, err = c.call(method, subject, role)
		return err
	}
}

// addObjectCommands registers the create and destroy commands of small
// objects: each create prints the new object's uuid.
func (s *Server) addObjectCommands() {
	s.addObjectDestroyCommands()
	s.addObjectCreateCommands()
	s.addObjectSetCommands()
}

// addObjectDestroyCommands registers the commands that destroy a small
// object by uuid.
func (s *Server) addObjectDestroyCommands() {
	for _, d := range []struct {
		name, help string
		cls        *schema.Class
	}{
		{"secret-destroy", "Destroys the secret with this uuid.", dm.Secret.Class},
		{"vmss-destroy", "Destroys the snapshot schedule with this uuid.", dm.VMSS.Class},
		{"vm-group-destroy", "Destroys the VM group with this uuid.", dm.VMGroup.Class},
		{"appliance-destroy", "Destroys the VM appliance with this uuid (its VMs stay).", dm.VMAppliance.Class},
		{"observer-destroy", "Destroys the tracing observer with this uuid.", dm.Observer.Class},
		{"caller-destroy", "Destroys the caller with this uuid.", dm.Caller.Class},
		{"rate-limit-destroy", "Destroys the rate limit with this uuid.", dm.RateLimit.Class},
		{"pvs-cache-storage-destroy", "Destroys the PVS cache storage with this uuid.", dm.PVSCacheStorage.Class},
	} {
		s.register(d.name, d.help, c1(d.cls.Name+".destroy", d.cls))
	}
}

// addObjectCreateCommands registers the commands that create a small
// object and print its uuid.
func (s *Server) addObjectCreateCommands() {
	s.register("secret-create", "Stores a secret value and prints its uuid.", func(c *Ctx) error {
		return c.create("secret.create", map[string]any{"value": c.require("value"), "other_config": c.mapParams("other-config")})
	})
	s.register("vm-create", "Creates an empty halted VM (256 MiB, one VCPU) and prints its uuid.", s.createVM)
	s.register("vmss-create", "Creates a VM snapshot schedule (type, frequency, schedule:<key>=<value>) and prints its uuid.",
		s.createVMSS)
	s.register("vm-group-create", "Creates a VM group with a placement policy and prints its uuid.", func(c *Ctx) error {
		pl, err := c.parseValue(dm.VMGroup.Placement.Type, c.require("placement"), "placement")
		if err != nil {
			return err
		}
		return c.create("VM_group.create", map[string]any{"name_label": c.require("name-label"),
			"name_description": c.paramOr("name-description", ""), "placement": pl})
	})
	s.register("appliance-create", "Creates a VM appliance and prints its uuid.", func(c *Ctx) error {
		return c.create("VM_appliance.create", map[string]any{"name_label": c.require("name-label"),
			"name_description": c.paramOr("name-description", "")})
	})
	s.register("observer-create", "Creates a tracing observer and prints its uuid.", s.createObserver)
	s.register("caller-create", "Creates a caller (matched by user-agent or client-ip) and prints its uuid.", func(c *Ctx) error {
		ua, ip := c.paramOr("user-agent", ""), c.paramOr("client-ip", "")
		if ua == "" && ip == "" {
			return failf("Either user-agent or client-ip must be specified")
		}
		return c.create("Caller.create", map[string]any{"name_label": c.paramOr("name-label", ""),
			"name_description": c.paramOr("name-description", ""), "user_agent": ua, "client_ip": ip})
	})
	s.register("pvs-cache-storage-create", "Creates PVS cache storage on the selected host and prints its uuid.",
		s.createPVSCacheStorage)
	s.register("rate-limit-create", "Creates a rate limit (burst-size, fill-rate: calls per second) for the callers "+
		"caller-uuids, and prints its uuid.", s.createRateLimit)
}

// createVM is vm-create: a VM with xapi's defaults.
func (s *Server) createVM(c *Ctx) error {
	const mib = 1 << 20
	null, none := schema.NullRef, map[string]string{}
	return c.create("VM.create", map[string]any{
		"name_label": c.require("name-label"), "name_description": c.paramOr("name-description", ""),
		"user_version": int64(0), "is_a_template": false, "blocked_operations": map[string]string{}, "affinity": null,
		"memory_target": int64(256 * mib), "memory_static_max": int64(256 * mib), "memory_dynamic_max": int64(256 * mib),
		"memory_dynamic_min": int64(128 * mib), "memory_static_min": int64(128 * mib), "VCPUs_params": none,
		"VCPUs_max": int64(1), "VCPUs_at_startup": int64(1), "actions_after_softreboot": "soft_reboot",
		"actions_after_shutdown": "destroy", "actions_after_reboot": "restart", "actions_after_crash": "destroy",
		"PV_bootloader": "", "PV_kernel": "", "PV_ramdisk": "", "PV_args": "", "PV_bootloader_args": "", "PV_legacy_args": "",
		"HVM_boot_policy": "", "HVM_boot_params": none, "HVM_shadow_multiplier": 1.0, "platform": none, "PCI_bus": "",
		"other_config": none, "xenstore_data": none, "recommendations": "", "ha_always_run": false, "ha_restart_priority": "",
		"tags": []string{}, "protection_policy": null, "is_snapshot_from_vmpp": false, "snapshot_schedule": null,
		"is_vmss_snapshot": false, "appliance": null, "start_delay": int64(0), "shutdown_delay": int64(0), "order": int64(0),
		"suspend_SR": null, "suspend_VDI": null, "version": int64(0), "generation_id": "", "hardware_platform_version": int64(0),
		"has_vendor_device": false, "reference_label": "", "domain_type": "unspecified", "NVRAM": none,
		"last_booted_record": "", "last_boot_CPU_flags": none, "power_state": "Halted",
	})
}

// createVMSS is vmss-create: enabled unless enabled=false, keeping 7
// snapshots unless retained-snapshots= says otherwise.
func (s *Server) createVMSS(c *Ctx) error {
	typ, err := c.parseValue(dm.VMSS.Type.Type, c.require("type"), "type")
	if err != nil {
		return err
	}
	freq, err := c.parseValue(dm.VMSS.Frequency.Type, c.require("frequency"), "frequency")
	if err != nil {
		return err
	}
	enabled, err := c.boolParamOr("enabled", true)
	if err != nil {
		return err
	}
	kept, err := c.parseValue(schema.Int, c.paramOr("retained-snapshots", "7"), "retained-snapshots")
	if err != nil {
		return err
	}
	return c.create("VMSS.create", map[string]any{
		"name_label": c.require("name-label"), "name_description": c.paramOr("name-description", ""),
		"enabled": enabled, "type": typ, "retained_snapshots": kept, "frequency": freq, "schedule": c.mapParams("schedule"),
	})
}

// createObserver is observer-create: endpoints and components are
// comma-separated lists (endpoints: bugtool by default).
func (s *Server) createObserver(c *Ctx) error {
	hosts, err := c.objectRefs(dm.Host.Class, "host-uuids")
	if err != nil {
		return err
	}
	enabled, err := c.boolParam("enabled")
	if err != nil {
		return err
	}
	endpoints := []string{"bugtool"}
	if v, ok := c.param("endpoints"); ok {
		endpoints = strings.Split(v, ",")
	}
	components := []string{}
	if v, ok := c.param("components"); ok && v != "" {
		components = strings.Split(v, ",")
	}
	return c.create("Observer.create", map[string]any{"name_label": c.require("name-label"),
		"name_description": c.paramOr("name-description", ""), "hosts": hosts, "attributes": c.mapParams("attributes"),
		"endpoints": endpoints, "components": components, "enabled": enabled})
}

// createPVSCacheStorage is pvs-cache-storage-create, on the selected
// host.
func (s *Server) createPVSCacheStorage(c *Ctx) error {
	return c.eachSelected(hostSelector, selectOpts{}, false, func(h *db.Row, _ formatter) error {
		sr, err := c.objectRef(dm.SR.Class, c.require("sr-uuid"))
		if err != nil {
			return err
		}
		site, err := c.objectRef(dm.PVSSite.Class, c.require("pvs-site-uuid"))
		if err != nil {
			return err
		}
		size, err := parseBytes("size", c.require("size"))
		if err != nil {
			return err
		}
		return c.create("PVS_cache_storage.create", map[string]any{"host": h.Ref, "SR": sr, "site": site, "size": size})
	})
}

// createRateLimit is rate-limit-create: the new rate limit is given its
// callers before its uuid is printed.
func (s *Server) createRateLimit(c *Ctx) error {
	var rates [2]float64
	for i, k := range []string{"burst-size", "fill-rate"} {
		v, err := strconv.ParseFloat(strings.TrimSpace(c.require(k)), 64)
		if err != nil || v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return failf("Parameter %s must be a non-negative number", k)
		}
		rates[i] = v
	}
	callers, err := c.objectRefs(dm.Caller.Class, "caller-uuids")
	if err != nil {
		return err
	}
	ref, err := c.call("Rate_limit.create", map[string]any{"name_label": c.paramOr("name-label", ""),
		"name_description": c.paramOr("name-description", ""), "burst_size": rates[0], "fill_rate": rates[1]})
	if err != nil {
		return err
	}
	for _, caller := range callers {
		if _, err := c.call("Rate_limit.add_caller", ref, caller); err != nil {
			return err
		}
	}
	return c.printUUID(dm.RateLimit.Class, ref)
}

// addObjectSetCommands registers the commands that set one field of an
// object by uuid.
func (s *Server) addObjectSetCommands() {
	s.registerSetter("repository-set-gpgkey-path", "Sets the GPG key the repository with this uuid is checked with.",
		"Repository.set_gpgkey_path", dm.Repository.Class, "gpgkey-path", schema.String)
	s.registerSetter("pif-set-primary-address-type", "Sets whether the PIF with this uuid uses IPv4 or IPv6 for management.",
		"PIF.set_primary_address_type", dm.PIF.Class, "primary_address_type", dm.PIF.PrimaryAddressType.Type)
	s.registerSetter("bond-set-mode", "Sets the mode of the bond with this uuid.", "Bond.set_mode", dm.Bond.Class, "mode", dm.Bond.Mode.Type)
}

// registerSetter registers a command that calls method on the object of
// class cls with this uuid and the parameter param, of type t.
func (s *Server) registerSetter(name, help, method string, cls *schema.Class, param string, t *schema.Type) {
	s.register(name, help, func(c *Ctx) error {
		ref, err := c.objectRef(cls, c.require("uuid"))
		if err != nil {
			return err
		}
		v, err := c.parseValue(t, c.require(param), param)
		if err != nil {
			return err
		}
		_, err = c.call(method, ref, v)
		return err
	})
}

// hostOrThis is the host the parameter names by uuid, or this host.
func (c *Ctx) hostOrThis(param string) (*db.Row, error) {
	ref := c.s.api.Cfg.HostRef
	if param != "" {
		if u, ok := c.param(param); ok {
			var err error
			if ref, err = c.objectRef(dm.Host.Class, u); err != nil {
				return nil, err
			}
		}
	}
	row, ok := c.s.api.DB.Snapshot().Get(dm.Host.Class, ref)
	if !ok {
		return nil, failf("Host %s not found", ref)
	}
	return row, nil
}

// thePool is the pool's record.
func (c *Ctx) thePool() (*db.Row, error) {
	pools := c.s.api.DB.Snapshot().All(dm.Pool.Class)
	if len(pools) == 0 {
		return nil, failf("No pool found")
	}
	return pools[0], nil
}

// mapRecord shows a map as one record: the keys given that it has (in
// that order), or all of them sorted, less those hidden.
func mapRecord(m map[string]string, keys, hide []string) []field {
	if keys == nil {
		keys = slices.Sorted(maps.Keys(m))
	}
	var out []field
	for _, k := range keys {
		v, ok := m[k]
		if !ok || slices.Contains(hide, k) {
			continue
		}
		out = append(out, field{k, v})
	}
	return out
}

// failoverPlan is pool-ha-compute-vm-failover-plan: the VMs resident on
// the hosts given (not control domains), and where HA would put each.
func (s *Server) failoverPlan(c *Ctx) error {
	snap := s.api.DB.Snapshot()
	hosts, vms := []string{}, []string{}
	for _, u := range strings.Split(c.require("host-uuids"), ",") {
		ref, err := c.objectRef(dm.Host.Class, strings.TrimSpace(u))
		if err != nil {
			return err
		}
		hosts = append(hosts, ref)
		h, _ := snap.Get(dm.Host.Class, ref)
		for _, vm := range strs(snap.Value(h, dm.Host.ResidentVMs)) {
			if r, ok := snap.Get(dm.VM.Class, vm); ok && r.Get(dm.VM.IsControlDomain) != true {
				vms = append(vms, vm)
			}
		}
	}
	v, err := c.call("pool.ha_compute_vm_failover_plan", hosts, vms)
	if err != nil {
		return err
	}
	snap = s.api.DB.Snapshot()
	plan, _ := v.(map[string]map[string]string)
	rec := []field{{"VM", "Destination Host or Error"}}
	for _, ref := range slices.Sorted(maps.Keys(plan)) {
		res := plan[ref]
		name := ref
		if r, ok := snap.Get(dm.VM.Class, ref); ok {
			name = fmt.Sprintf("%s (%s)", r.UUID(), r.String(dm.VM.NameLabel))
		}
		dest := "UNKNOWN"
		if h, ok := res["host"]; ok {
			dest = h
			if r, ok := snap.Get(dm.Host.Class, h); ok {
				dest = fmt.Sprintf("%s (%s)", r.UUID(), r.String(dm.Host.NameLabel))
			}
		} else if e, ok := res["error_code"]; ok {
			dest = e
		}
		rec = append(rec, field{name, dest})
	}
	c.out.table([][]field{rec})
	return nil
}

// addDiagnosticCommands registers diagnostic-vm-status and
// diagnostic-license-status.
func (s *Server) addDiagnosticCommands() {
	s.register("diagnostic-vm-status", "Shows why the VM with this uuid can or cannot start: its disks, each host's "+
		"answer to VM.assert_can_boot_here, and whether it is agile (can run on more than one host).", func(c *Ctx) error {
		vmView, vbdView := c.s.classes["vm"], c.s.classes["vbd"]
		vm, fm, err := c.rowByUUID(vmView, c.require("uuid"))
		if err != nil {
			return err
		}
		c.out.table([][]field{fm.record(vmView, vm, fieldSet("uuid", "name-label", "power-state", "possible-hosts"))})
		c.out.list("Checking to see whether disks are attachable")
		only := fieldSet("uuid", "userdevice", "device", "vdi-uuid", "empty", "mode", "type", "storage-lock", "attachable")
		var vbds [][]field
		for _, ref := range strs(fm.snap.Value(vm, dm.VM.VBDs)) {
			if vbd, ok := fm.snap.Get(dm.VBD.Class, ref); ok {
				vbds = append(vbds, fm.record(vbdView, vbd, only))
			}
		}
		c.out.table(vbds)
		c.out.list("Checking to see whether VM can boot on each host")
		var report []field
		for _, h := range fm.snap.All(dm.Host.Class) {
			res := "OK"
			if _, err := c.call("VM.assert_can_boot_here", vm.Ref, h.Ref); err != nil {
				res = "Cannot start here [" + errorText(err) + "]"
			}
			report = append(report, field{h.String(dm.Host.NameLabel), res})
		}
		c.out.table([][]field{report})
		if _, err := c.call("VM.assert_agile", vm.Ref); err != nil {
			c.out.list("VM is not agile because: " + errorText(err))
		} else {
			c.out.list("VM is agile.")
		}
		return nil
	})
	s.register("diagnostic-license-status", "Shows the licence of every host: edition, expiry and days left, nearest "+
		"expiry first.", func(c *Ctx) error {
		hosts, err := c.allRows(c.s.classes["host"])
		if err != nil {
			return err
		}
		type lic struct {
			row    []string
			expiry time.Time
		}
		now := time.Now()
		var valid []lic
		var invalid [][]string
		for _, h := range hosts {
			lp, _ := h.Get(dm.Host.LicenseParams).(map[string]string)
			short := h.UUID()
			if len(short) > 8 {
				short = short[:8]
			}
			exp, err := time.Parse(time.RFC3339, lp["expiry"])
			if lp["expiry"] == "" {
				exp, err = time.Unix(0, 0).UTC(), nil
			}
			if err != nil {
				invalid = append(invalid, []string{h.String(dm.Host.Hostname), short, "-", "-", "-", "-"})
				continue
			}
			valid = append(valid, lic{[]string{h.String(dm.Host.Hostname), short, "-", h.String(dm.Host.Edition),
				exp.UTC().Format(time.RFC3339), fmt.Sprintf("%.1f", exp.Sub(now).Hours()/24)}, exp})
		}
		sort.SliceStable(valid, func(i, j int) bool { return valid[i].expiry.Before(valid[j].expiry) })
		divider := []string{"-", "-", "-", "-", "-", "-"}
		table := [][]string{{"Hostname", "UUID", "Features", "Edition", "Expiry", "Days left"}, divider}
		for _, l := range valid {
			table = append(table, l.row)
		}
		table = append(append(table, invalid...), divider, []string{"-", "-", "-", "-", "-", "-"})
		widths := make([]int, 6)
		for _, r := range table {
			for i, cell := range r {
				widths[i] = max(widths[i], len(cell))
			}
		}
		for _, r := range table {
			cells := make([]string, len(r))
			for i, cell := range r {
				cells[i] = cell + strings.Repeat(" ", widths[i]-len(cell))
			}
			c.out.msg(strings.Join(cells, " "))
		}
		return nil
	})
}
