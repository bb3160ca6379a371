package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/rrd/plugin"
	"toolstackd/internal/rrdd"
	"toolstackd/internal/rrdd/hoststat"
	"toolstackd/internal/rrdd/stats"
)

// openRRDD brings up the metrics module (internal/rrdd): it samples the
// host, its running VMs, its attached SRs and the metric plugins every
// 5 s into round-robin archives kept under DATA_DIR/rrds, and serves
// them through the data-source messages and /rrd_updates and its
// siblings.
func (h *host) openRRDD(o options, hostRef string) error {
	row, _ := h.db.Snapshot().Get(dm.Host.Class, hostRef)
	if err := os.MkdirAll(o.metricsPlugins, 0o755); err != nil { //nolint:gosec // plugins run as other users and write here
		h.log.Warn("metrics: no plugin directory", "dir", o.metricsPlugins, "err", err)
	}
	d := h.db
	samplers := []rrdd.Named{
		{Name: "host", Sampler: rrdd.HostSampler(hoststat.Reader{}.Read, pifFilter(d, hostRef))},
		{Name: "srs", Sampler: rrdd.SRSampler(func() []rrdd.SR { return attachedSRs(d.Snapshot(), hostRef) })},
		{Name: "plugins", Sampler: rrdd.PluginSampler(o.metricsPlugins, h.log)},
	}
	if xm := h.xm; xm != nil {
		samplers = append(samplers, rrdd.Named{Name: "vms", Sampler: rrdd.VMSRSampler(func(ctx context.Context) []stats.VM {
			return xm.Stats(ctx, 2*time.Second)
		}, func(vm, device string) (string, bool) { return srOfDisk(d.Snapshot(), vm, device) })})
	}
	cfg := rrdd.Config{
		Dir:      filepath.Join(o.dataDir, "rrds"),
		HostUUID: row.UUID(),
		Samplers: samplers,
		Exists: func(ow plugin.Owner) bool {
			cls := dm.VM.Class
			if ow.Kind == plugin.SR {
				cls = dm.SR.Class
			}
			_, ok := d.Snapshot().ByUUID(cls, ow.UUID)
			return ok
		},
		MinMax: func() bool {
			for _, p := range d.Snapshot().All(dm.Pool.Class) {
				oc, _ := p.Get(dm.Pool.OtherConfig).(map[string]string)
				return oc["create_min_max_in_new_VM_RRDs"] == "true"
			}
			return false
		},
		Log: h.log.With("component", "rrdd"),
	}
	svc, err := rrdd.New(cfg)
	if err != nil {
		return err
	}
	pub := rrdd.NewPublisher(d, hostRef, svc, cfg.Log)
	svc.OnTick(pub.Publish)
	rrdd.Register(h.srv, h.router, svc)
	h.rrdd = svc
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		svc.Run(ctx)
	}()
	h.closers = append(h.closers, func() error { cancel(); <-done; return nil })
	return nil
}

// pifFilter accepts the network devices of this host's PIFs, or every
// device when the host has no PIF in the database.
func pifFilter(d *db.DB, hostRef string) func(string) bool {
	return func(dev string) bool {
		snap := d.Snapshot()
		host, ok := snap.Get(dm.Host.Class, hostRef)
		if !ok {
			return true
		}
		pifs, _ := snap.Value(host, dm.Host.PIFs).([]string)
		if len(pifs) == 0 {
			return !strings.HasPrefix(dev, "tap")
		}
		for _, p := range pifs {
			if r, ok := snap.Get(dm.PIF.Class, p); ok && r.String(dm.PIF.Device) == dev {
				return true
			}
		}
		return false
	}
}

// srOfDisk is the uuid of the SR holding the VDI of a VM's disk, by the
// VM's uuid and the VBD's device name.
func srOfDisk(snap db.Reader, vmUUID, device string) (string, bool) {
	vm, ok := snap.ByUUID(dm.VM.Class, vmUUID)
	if !ok {
		return "", false
	}
	vbds, _ := snap.Value(vm, dm.VM.VBDs).([]string)
	for _, ref := range vbds {
		vbd, ok := snap.Get(dm.VBD.Class, ref)
		if !ok || vbd.String(dm.VBD.Device) != device {
			continue
		}
		vdi, ok := snap.Get(dm.VDI.Class, vbd.String(dm.VBD.VDI))
		if !ok {
			return "", false
		}
		sr, ok := snap.Get(dm.SR.Class, vdi.String(dm.VDI.SR))
		if !ok {
			return "", false
		}
		return strings.ToLower(sr.UUID()), true
	}
	return "", false
}

// attachedSRs are the SRs with a plugged PBD on this host, with the sizes
// the database has for them.
func attachedSRs(snap db.Reader, hostRef string) []rrdd.SR {
	var out []rrdd.SR
	host, ok := snap.Get(dm.Host.Class, hostRef)
	if !ok {
		return nil
	}
	pbds, _ := snap.Value(host, dm.Host.PBDs).([]string)
	for _, p := range pbds {
		pbd, ok := snap.Get(dm.PBD.Class, p)
		if !ok || pbd.Get(dm.PBD.CurrentlyAttached) != true {
			continue
		}
		sr, ok := snap.Get(dm.SR.Class, pbd.String(dm.PBD.SR))
		if !ok {
			continue
		}
		size, _ := sr.Get(dm.SR.PhysicalSize).(int64)
		used, _ := sr.Get(dm.SR.PhysicalUtilisation).(int64)
		virt, _ := sr.Get(dm.SR.VirtualAllocation).(int64)
		out = append(out, rrdd.SR{UUID: strings.ToLower(sr.UUID()), Size: size, Utilisation: used, VirtualAllocation: virt})
	}
	return out
}
