package xenops

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/rrdd/stats"
	"toolstackd/internal/xenops/backend"
)

// statsParallel bounds how many domains' counters are read at once.
const statsParallel = 16

// defaultStatsTimeout bounds one VM's read when Stats is given none.
const defaultStatsTimeout = 2 * time.Second

// Stats reads the counters of the VMs running on this host, for the
// metrics module's tick, sorted by uuid. Paused VMs are left out, as xapi
// leaves them out. A VM counts as running when its domain runs, its start
// has finished and the database says Running here.
//
// Devices carry the names xapi's data sources use: a disk its VBD's
// device as the database records it ("xvda", "hdd"; the name the guest
// sees it under when none is recorded), a NIC its VIF's device. Disks
// and NICs are in device order; a disk the domain did not have when the
// tick began is left out.
//
// Domains are read at most statsParallel at a time, each within perVM
// (<= 0: 2 s) and ctx. A VM whose read fails or takes too long is left
// out of this tick and logged at debug level. A backend that cannot read
// counters gives nil.
func (m *Manager) Stats(ctx context.Context, perVM time.Duration) []stats.VM {
	sr, ok := m.be.(backend.StatsReporter)
	if !ok {
		return nil
	}
	if perVM <= 0 {
		perVM = defaultStatsTimeout
	}
	snap := m.db.Snapshot()
	type read struct {
		uuid  string
		disks map[string]string // userdevice -> guest device name
		nics  map[string]string // backend device -> VIF device
		out   stats.VM
		ok    bool
	}
	var reads []*read
	for _, info := range m.be.List() {
		if info.State != backend.DomainRunning || !info.Complete {
			continue
		}
		vm, ok := snap.ByUUID(dm.VM.Class, info.UUID)
		if !ok || vm.String(dm.VM.PowerState) != psRunning || vm.String(dm.VM.ResidentOn) != m.host {
			continue
		}
		r := &read{uuid: info.UUID, disks: make(map[string]string, len(info.Disks)), nics: make(map[string]string, len(info.NICs))}
		for _, d := range info.Disks {
			name := ""
			if vbd, ok := snap.Get(dm.VBD.Class, d.VBD); ok {
				name = vbd.String(dm.VBD.Device)
			}
			if name == "" {
				name = guestDeviceName(d, vm)
			}
			if name != "" {
				r.disks[d.Device] = name
			}
		}
		for _, n := range info.NICs {
			name := n.Device
			if vif, ok := snap.Get(dm.VIF.Class, n.VIF); ok && vif.String(dm.VIF.Device) != "" {
				name = vif.String(dm.VIF.Device)
			}
			r.nics[n.Device] = name
		}
		reads = append(reads, r)
	}

	sem := make(chan struct{}, statsParallel)
	var wg sync.WaitGroup
	for _, r := range reads {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			rctx, cancel := context.WithTimeout(ctx, perVM)
			defer cancel()
			t0 := time.Now()
			out, err := sr.Stats(rctx, r.uuid)
			if err != nil {
				m.log.Debug("VM counters not read this tick", "vm", r.uuid, "after", time.Since(t0).Round(time.Millisecond), "err", err)
				return
			}
			r.out, r.ok = renameDevices(out, r.uuid, r.disks, r.nics), true
		}()
	}
	wg.Wait()

	out := make([]stats.VM, 0, len(reads))
	for _, r := range reads {
		if r.ok {
			out = append(out, r.out)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UUID < out[j].UUID })
	return out
}

// renameDevices gives a backend's counters the names xapi uses: each disk
// its VBD's device, each NIC its VIF's device; disks the read did not
// expect are dropped. Both are sorted by name.
func renameDevices(v stats.VM, uuid string, disks, nics map[string]string) stats.VM {
	v.UUID = strings.ToLower(uuid)
	kept := v.Disks[:0]
	for _, d := range v.Disks {
		if name, ok := disks[d.Device]; ok {
			d.Device = name
			kept = append(kept, d)
		}
	}
	v.Disks = kept
	for i := range v.NICs {
		if name, ok := nics[v.NICs[i].Device]; ok {
			v.NICs[i].Device = name
		}
	}
	sort.SliceStable(v.Disks, func(i, j int) bool { return deviceLess(v.Disks[i].Device, v.Disks[j].Device) })
	sort.SliceStable(v.NICs, func(i, j int) bool { return deviceLess(v.NICs[i].Device, v.NICs[j].Device) })
	return v
}

// deviceLess orders device names: shorter first ("xvdz" before "xvdaa",
// "9" before "10"), then alphabetically.
func deviceLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}
