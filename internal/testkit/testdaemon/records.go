package testdaemon

// VMRecord is a VM.create record for a small diskless HVM guest named
// name (128 MiB, one vCPU), with every field VM.create requires.
func VMRecord(name string) map[string]any {
	return map[string]any{
		"name_label": name, "name_description": "", "user_version": 1, "is_a_template": false,
		"affinity": "OpaqueRef:NULL", "memory_target": 128 << 20,
		"memory_static_max": 128 << 20, "memory_dynamic_max": 128 << 20, "memory_dynamic_min": 128 << 20, "memory_static_min": 64 << 20,
		"VCPUs_params": map[string]string{}, "VCPUs_max": 1, "VCPUs_at_startup": 1,
		"actions_after_shutdown": "destroy", "actions_after_reboot": "restart", "actions_after_crash": "destroy",
		"PV_bootloader": "", "PV_kernel": "", "PV_ramdisk": "", "PV_args": "", "PV_bootloader_args": "", "PV_legacy_args": "",
		"HVM_boot_policy": "BIOS order", "HVM_boot_params": map[string]string{"order": "cd"}, "HVM_shadow_multiplier": 1.0,
		"platform": map[string]string{"acpi": "1"}, "PCI_bus": "", "other_config": map[string]string{},
		"recommendations": "", "xenstore_data": map[string]string{}, "ha_always_run": false, "ha_restart_priority": "",
		"tags": []string{}, "blocked_operations": map[string]string{}, "protection_policy": "OpaqueRef:NULL",
		"is_snapshot_from_vmpp": false, "appliance": "OpaqueRef:NULL", "start_delay": 0, "shutdown_delay": 0, "order": 0,
		"suspend_SR": "OpaqueRef:NULL", "version": 0, "generation_id": "", "hardware_platform_version": 0,
		"has_vendor_device": false, "reference_label": "", "domain_type": "hvm", "NVRAM": map[string]string{},
	}
}
