package migrate

import (
	"encoding/json"
	"testing"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
	"toolstackd/tests/pool/suite"
)

// VM.start without a host places VMs by room, on simulated hosts of 2, 3
// and 4 GiB (--host-memory): VMs of 1.5 GiB, each with a VIF on the
// management network, go each to the host with the most room left, as the
// hosts' metrics say once each start is done; host.compute_free_memory
// reads the same; scheduled_to_be_resident_on is clear once a VM runs; a
// VM of 1.75 GiB then finds no room (NO_HOSTS_AVAILABLE), and VM.start_on a host
// without room is HOST_NOT_ENOUGH_FREE_MEMORY.
func TestPlacementByRoom(t *testing.T) {
	ctx := suite.Ctx(t)
	p, r, hosts := suite.Joined(t, ctx, pooltest.Options{Hosts: 3, HostArgs: map[int][]string{
		0: {"--host-memory", "2GiB"}, 1: {"--host-memory", "3GiB"}, 2: {"--host-memory", "4GiB"}}})
	c, s := r.C, r.S
	// Every host's management PIF is on one pool-wide network.
	var nets []string
	if err := json.Unmarshal(r.Call("network.get_all"), &nets); err != nil {
		t.Fatal(err)
	}
	var mgmt string
	for _, n := range nets {
		var pifs []string
		if err := json.Unmarshal(r.Call("network.get_PIFs", n), &pifs); err != nil {
			t.Fatal(err)
		}
		if len(pifs) > 0 {
			if mgmt != "" || len(pifs) != 3 {
				t.Fatalf("the pool's networks with PIFs: %s has %d (and %q before)", n, len(pifs), mgmt)
			}
			mgmt = n
		}
	}
	newVM := func(size int64) string {
		rec := testdaemon.VMRecord("large")
		for _, f := range []string{"memory_static_max", "memory_dynamic_max", "memory_dynamic_min", "memory_target"} {
			rec[f] = size
		}
		vm := r.Str("VM.create", rec)
		r.Call("VIF.create", map[string]any{
			"device": "0", "network": mgmt, "VM": vm, "MAC": "", "MTU": 1500, "other_config": map[string]string{},
			"qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}, "locking_mode": "network_default",
			"ipv4_allowed": []string{}, "ipv6_allowed": []string{},
		})
		return vm
	}
	const vmSize = 3 << 29 // 1.5 GiB
	// Room before: 2, 3, 4 GiB. Each start takes 1.5 GiB from the roomiest.
	for i, want := range []int{2, 1, 2, 0} {
		vm := newVM(vmSize)
		r.Call("VM.start", vm, false, false)
		if on := r.Str("VM.get_resident_on", vm); on != hosts[want] {
			t.Fatalf("start %d went to %s, want host %d (%s)", i, on, want, hosts[want])
		}
		if sched := r.Str("VM.get_scheduled_to_be_resident_on", vm); sched != "OpaqueRef:NULL" {
			t.Errorf("scheduled_to_be_resident_on after the start: %s", sched)
		}
	}
	for i, want := range []int64{1 << 29, 3 << 29, 2 << 29} {
		var free int64
		if err := json.Unmarshal(r.Call("host.compute_free_memory", hosts[i]), &free); err != nil || free != want {
			t.Errorf("host %d's free memory: %d %v, want %d", i, free, err, want)
		}
	}
	vm := newVM(7 << 28) // 1.75 GiB: more than any host has left
	if _, err := c.Call(ctx, p.Addr(0), "VM.start", s, vm, false, false); pooltest.Code(err) != xerr.NoHostsAvailable {
		t.Fatalf("a VM no host has room for: %v, want NO_HOSTS_AVAILABLE", err)
	}
	if _, err := c.Call(ctx, p.Addr(0), "VM.start_on", s, vm, hosts[1], false, false); pooltest.Code(err) != xerr.HostNotEnoughFreeMemory {
		t.Fatalf("VM.start_on a host without room: %v, want HOST_NOT_ENOUGH_FREE_MEMORY", err)
	}
}
