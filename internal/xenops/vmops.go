package xenops

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/ha/journal"
	"toolstackd/internal/ha/planner"
	"toolstackd/internal/schema"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// The micro-ops of the power operations, shared by the XenAPI calls and
// by the automatic actions after a guest stops.

// internalOp is an operation the manager starts itself (restarting a
// crashed guest): no task, no progress.
func (m *Manager) internalOp(ctx context.Context, ref, uuid, name string) *opCtx {
	return &opCtx{m: m, ctx: ctx, vm: ref, uuid: uuid, op: name, hi: 1, total: 1}
}

// boot builds and starts a VM's domain: pre-start hook, create, build,
// disks (read-write first), NICs (in device order), device model and,
// unless paused, unpause; then the database. Any failure or cancellation
// removes what was made, leaving the VM as it was (Halted, or Suspended
// for a resume). restore names a memory image to resume from.
func (m *Manager) boot(o *opCtx, lo, hi float64, paused bool, restore string) (err error) {
	var p *bootPlan
	if restore != "" {
		p, err = m.restorePlan(m.db.Snapshot(), o.vm, restore)
	} else {
		p, err = m.plan(m.db.Snapshot(), o.vm)
	}
	if err != nil {
		return err
	}
	spec := p.spec
	spec.AutoStart = !paused && restore == ""
	if err := m.be.Check(spec); err != nil {
		return err
	}
	if err := m.reserve(spec.Memory); err != nil {
		return err
	}
	defer m.reserved.Add(-spec.Memory)

	steps := 5 + len(p.disks) + len(p.nics)
	if !paused {
		steps++
	}
	o.window(lo, hi, steps)
	hook := hookPreStart
	if restore != "" {
		hook = hookPreResume
	}
	if err := o.run("hook:"+hook, func(ctx context.Context) error { return m.runHooks(ctx, hook, o.uuid, reasonNone) }); err != nil {
		return err
	}
	var made bootMade
	defer func() {
		if err != nil {
			made.undo(m, o)
		}
	}()
	if err = m.buildDomain(o, p, &made); err != nil {
		return err
	}
	if !paused {
		if err = o.run("unpause", func(ctx context.Context) error { return m.be.Unpause(ctx, o.uuid) }); err != nil {
			return err
		}
	}
	return o.run("finish", func(ctx context.Context) error { return m.finishBoot(o, p, paused, restore != "") })
}

// bootMade is what a start has made so far: what a failed start removes.
type bootMade struct {
	domain   bool           // the backend created the domain
	attached []backend.Disk // disks attached through storage
	vifs     []string       // VIFs whose networks were made real
}

// undo removes what a failed or cancelled start made, whatever the
// operation's context says.
func (b *bootMade) undo(m *Manager, o *opCtx) {
	bg := context.WithoutCancel(o.ctx)
	if b.domain {
		if err := m.be.Destroy(bg, o.uuid); err != nil {
			m.log.Error("removing a domain after a failed start", "vm", o.uuid, "err", err)
		} else {
			m.journal(journal.Stop, o.uuid)
		}
	}
	m.detachAll(bg, o.uuid, b.attached)
	m.releaseNICs(bg, b.vifs)
}

// buildDomain is the backend's part of a start, one step each: create,
// build, each disk (attached through storage first), each NIC and the
// device model. made records what exists, for undo.
func (m *Manager) buildDomain(o *opCtx, p *bootPlan, made *bootMade) error {
	if err := o.run("create", func(ctx context.Context) error {
		if !p.spec.Incoming { // an incoming guest starts when its move commits
			m.journal(journal.Start, o.uuid)
		}
		_, e := m.be.Create(ctx, p.spec)
		made.domain = e == nil
		return e
	}); err != nil {
		return err
	}
	if err := o.run("build", func(ctx context.Context) error { return m.be.Build(ctx, o.uuid) }); err != nil {
		return err
	}
	for _, d := range p.disks {
		if err := o.run("attach-disk:"+d.Device, func(ctx context.Context) error {
			if d.VDI != "" {
				src, err := m.disks.Attach(ctx, o.uuid, d.VDI, d.ReadOnly)
				if err != nil {
					return err
				}
				made.attached = append(made.attached, d)
				d.Path, d.Format = src.Target(), src.Format
			}
			return m.be.AddDisk(ctx, o.uuid, d)
		}); err != nil {
			return err
		}
	}
	for _, n := range p.nics {
		if err := o.run("attach-nic:"+n.Device, func(ctx context.Context) error {
			if err := m.ensureNIC(ctx, &n); err != nil {
				return err
			}
			made.vifs = append(made.vifs, n.VIF)
			if err := m.be.AddNIC(ctx, o.uuid, n); err != nil {
				return err
			}
			// Before the device model starts: no frame passes unlocked.
			return m.lockNIC(ctx, o.uuid, n.VIF)
		}); err != nil {
			return err
		}
	}
	return o.run("device-model", func(ctx context.Context) error { return m.be.StartDeviceModel(ctx, o.uuid) })
}

// finishBoot marks the domain complete and records the started VM: the
// device numbers and MACs the plan chose, no suspend image any more after
// a resume, and the VM live on this host, Running or Paused.
func (m *Manager) finishBoot(o *opCtx, p *bootPlan, paused, resumed bool) error {
	if err := m.be.MarkComplete(o.uuid); err != nil {
		return err
	}
	info, ok := m.be.Info(o.uuid)
	if !ok {
		return xerr.New(xerr.InternalError, "domain disappeared during start")
	}
	power := psRunning
	if paused {
		power = psPaused
	}
	_, err := m.db.Update(func(tx *db.Tx) error {
		if err := setExisting(tx, dm.VBD.Class, dm.VBD.Userdevice, p.userdevices); err != nil {
			return err
		}
		if err := setExisting(tx, dm.VIF.Class, dm.VIF.MAC, p.macs); err != nil {
			return err
		}
		if resumed {
			if err := tx.Set(dm.VM.SuspendVDI, o.vm, schema.NullRef); err != nil {
				return err
			}
		}
		if err := o.release(tx); err != nil {
			return err
		}
		return m.setLive(tx, o.vm, info, power)
	})
	return err
}

// setExisting sets field f of each row of cls named in vals to its value,
// skipping the rows that no longer exist.
func setExisting(tx *db.Tx, cls *schema.Class, f *schema.Field, vals map[string]string) error {
	for ref, v := range vals {
		if _, ok := tx.Get(cls, ref); ok {
			if err := tx.Set(f, ref, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// stop destroys a VM's domain: the pre-shutdown hook (whose failure stops
// a clean operation but not a hard one), the domain and its taps, its
// VDIs, then the post-destroy hook. Once the domain is being destroyed,
// cancelling no longer interrupts.
func (m *Manager) stop(o *opCtx, lo, hi float64, reason string, hard bool) error {
	o.window(lo, hi, 3)
	info, ok := m.be.Info(o.uuid)
	if err := m.runPreHook(o, hookPreShutdown, reason, hard); err != nil {
		return err
	}
	bg := context.WithoutCancel(o.ctx)
	keep := o.ctx
	o.ctx = bg
	defer func() { o.ctx = keep }()
	if err := o.run("destroy", func(ctx context.Context) error { return m.be.Destroy(ctx, o.uuid) }); err != nil {
		return err
	}
	m.journal(journal.Stop, o.uuid)
	if ok {
		m.detachAll(bg, o.uuid, info.Disks)
		vifs := make([]string, 0, len(info.NICs))
		for _, n := range info.NICs {
			vifs = append(vifs, n.VIF)
		}
		m.releaseNICs(bg, vifs)
	}
	return o.run("hook:"+hookPostDestroy, func(ctx context.Context) error {
		if err := m.runHooks(ctx, hookPostDestroy, o.uuid, reason); err != nil {
			m.log.Warn("post-destroy hook failed", "vm", o.uuid, "err", err)
		}
		return nil
	})
}

// runPreHook runs a hook that comes before the guest is stopped, as a
// step. Its failure stops a clean operation; a hard one logs it and goes
// on (a cancellation stops either).
func (m *Manager) runPreHook(o *opCtx, hook, reason string, hard bool) error {
	err := o.run("hook:"+hook, func(ctx context.Context) error { return m.runHooks(ctx, hook, o.uuid, reason) })
	if err == nil || !hard || xerr.HasCode(err, xerr.TaskCancelled) {
		return err
	}
	m.log.Warn("hook failed; going on with a hard operation", "hook", hook, "vm", o.uuid, "err", err)
	return nil
}

func (m *Manager) halt(o *opCtx) error {
	_, err := m.db.Update(func(tx *db.Tx) error {
		if err := o.release(tx); err != nil {
			return err
		}
		return m.setHalted(tx, o.vm)
	})
	return err
}

// stopAndHalt is stop, then the record goes Halted.
func (m *Manager) stopAndHalt(o *opCtx, lo, hi float64, reason string, hard bool) error {
	if err := m.stop(o, lo, hi, reason, hard); err != nil {
		return err
	}
	return m.halt(o)
}

// errTimeout is waitGuestStop's timeout.
var errTimeout = errors.New("timed out")

// waitGuestStop waits for the guest to power off (or reboot, or crash, or
// vanish) after a shutdown request.
func (m *Manager) waitGuestStop(o *opCtx, timeout time.Duration) (backend.DomainInfo, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		ch := m.changes(o.uuid)
		info, ok := m.be.Info(o.uuid)
		if !ok {
			return info, nil
		}
		switch info.State {
		case backend.DomainShutdown, backend.DomainReboot, backend.DomainCrashed, backend.DomainGone:
			return info, nil
		}
		select {
		case <-ch:
		case <-time.After(500 * time.Millisecond):
		case <-deadline.C:
			return info, errTimeout
		case <-o.ctx.Done():
			return info, cancelledErr(o.task)
		}
	}
}

// shutdownTimeout and shutdownFallback read the VM's own settings.
func (m *Manager) shutdownPolicy(ref string) (time.Duration, bool) {
	timeout, hard := m.cfg.ShutdownTimeout, m.cfg.ShutdownFallback == "hard"
	if row, ok := m.db.Snapshot().Get(dm.VM.Class, ref); ok {
		oc, _ := row.Get(dm.VM.OtherConfig).(map[string]string)
		if s, err := strconv.ParseFloat(oc["clean_shutdown_timeout"], 64); err == nil && s > 0 {
			timeout = time.Duration(s * float64(time.Second))
		}
		switch oc["clean_shutdown_fallback"] {
		case "hard":
			hard = true
		case "none":
			hard = false
		}
	}
	return timeout, hard
}

// requestStop asks the guest to power off and waits. It returns true when
// the guest did; false when it timed out and the policy says to go on
// hard.
func (m *Manager) requestStop(o *opCtx, alwaysFallback bool) (bool, error) {
	timeout, fallback := m.shutdownPolicy(o.vm)
	fallback = fallback || alwaysFallback
	o.window(0, 0.5, 2)
	if err := o.run("acpi-shutdown", func(ctx context.Context) error { return m.be.RequestShutdown(ctx, o.uuid) }); err != nil {
		return false, err
	}
	var waitErr error
	if err := o.run("wait-guest", func(ctx context.Context) error {
		_, waitErr = m.waitGuestStop(o, timeout)
		if waitErr == errTimeout {
			return nil
		}
		return waitErr
	}); err != nil {
		return false, err
	}
	if waitErr == errTimeout {
		if !fallback {
			return false, xerr.New(xerr.VMShutdownTimeout, o.vm, strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64))
		}
		m.log.Info("guest did not shut down in time; shutting it down hard", "vm", o.uuid, "timeout", timeout)
		return false, nil
	}
	return true, nil
}

// cleanShutdown is VM.clean_shutdown (and VM.shutdown with fallback).
func (m *Manager) cleanShutdown(o *opCtx, alwaysFallback bool) error {
	clean, err := m.requestStop(o, alwaysFallback)
	if err != nil {
		return err
	}
	reason := reasonCleanShutdown
	if !clean {
		reason = reasonHardShutdown
	}
	return m.stopAndHalt(o, 0.5, 1, reason, !clean)
}

// hardShutdown is VM.hard_shutdown: a live domain is destroyed; a
// suspended VM loses its memory image.
func (m *Manager) hardShutdown(o *opCtx) error {
	row, ok := m.db.Snapshot().Get(dm.VM.Class, o.vm)
	if ok && row.String(dm.VM.PowerState) == psSuspended {
		o.window(0, 1, 1)
		if err := o.run("discard-suspend-image", func(ctx context.Context) error {
			return m.discardSuspendImage(ctx, row)
		}); err != nil {
			return err
		}
		_, err := m.db.Update(func(tx *db.Tx) error {
			if err := tx.Set(dm.VM.SuspendVDI, o.vm, schema.NullRef); err != nil {
				return err
			}
			return m.setHalted(tx, o.vm)
		})
		return err
	}
	return m.stopAndHalt(o, 0, 1, reasonHardShutdown, true)
}

// reboot stops the domain and starts a new one from the current record.
func (m *Manager) reboot(o *opCtx, lo float64, reason string, hard bool) error {
	o.window(lo, lo+0.05, 1)
	if err := m.runPreHook(o, hookPreReboot, reason, hard); err != nil {
		return err
	}
	mid := lo + (1-lo)/3
	if err := m.stop(o, lo+0.05, mid, reason, hard); err != nil {
		return err
	}
	if err := m.boot(o, mid, 1, false, ""); err != nil {
		// The old domain is gone and the new one did not come: Halted.
		if herr := m.halt(o); herr != nil {
			m.log.Error("recording a failed reboot", "vm", o.uuid, "err", herr)
		}
		return err
	}
	return nil
}

// suspend saves the domain's memory to an image and destroys it.
func (m *Manager) suspend(o *opCtx) error {
	row, ok := m.db.Snapshot().Get(dm.VM.Class, o.vm)
	if !ok {
		return xerr.New(xerr.HandleInvalid, "VM", o.vm)
	}
	o.window(0, 0.1, 1)
	img, err := m.newSuspendImage(o, row, o.uuid)
	if err != nil {
		return err
	}
	if err := m.saveMemory(o, img, 0.1, 0.8); err != nil {
		return err
	}
	// The memory is saved: from here the suspend completes.
	o.ctx = context.WithoutCancel(o.ctx)
	img.release(m)
	if err := m.stop(o, 0.8, 1, reasonSuspend, true); err != nil {
		return err
	}
	_, err = m.db.Update(func(tx *db.Tx) error {
		if err := o.release(tx); err != nil {
			return err
		}
		return m.setSuspended(tx, o.vm, img.vdi)
	})
	return err
}

// saveMemory is the step that writes the domain's memory into img,
// reporting progress from lo to hi; a failed save discards the image.
// An image kept in a VDI is saved into its staging file and then copied
// into the VDI (the last fifth of the window); when that copy fails, a
// guest that ran before the save runs on.
func (m *Manager) saveMemory(o *opCtx, img *suspendImage, lo, hi float64) error {
	mid := hi
	if img.staged {
		mid = lo + (hi-lo)*0.8
	}
	wasRunning := false
	if info, ok := m.be.Info(o.uuid); ok {
		wasRunning = info.State == backend.DomainRunning
	}
	o.window(lo, mid, 1)
	err := o.run("save-memory", func(ctx context.Context) error {
		return m.be.Suspend(ctx, o.uuid, img.path, func(f float64) { o.prog.Progress(lo + (mid-lo)*f) })
	})
	if err == nil && img.staged {
		o.window(mid, hi, 1)
		err = o.run("write-suspend-image", func(ctx context.Context) error {
			store, ok := m.disks.(SuspendStore)
			if !ok {
				return xerr.New(xerr.InternalError, "suspend image store gone")
			}
			return store.SaveSuspendImage(ctx, img.vdi, img.path)
		})
		if err != nil && wasRunning {
			if uerr := m.be.Unpause(context.WithoutCancel(o.ctx), o.uuid); uerr != nil {
				m.log.Error("running the guest again after a failed save", "vm", o.uuid, "err", uerr)
			}
		}
	}
	if err != nil {
		img.discard(m)
		return err
	}
	img.dropStaging(m) // the VDI holds the image now
	return nil
}

// resume starts a suspended VM from its memory image.
func (m *Manager) resume(o *opCtx, paused bool) error {
	row, ok := m.db.Snapshot().Get(dm.VM.Class, o.vm)
	if !ok {
		return xerr.New(xerr.HandleInvalid, "VM", o.vm)
	}
	img, err := m.openSuspendImage(o.ctx, row)
	if err != nil {
		return err
	}
	staged := img.staged
	err = m.boot(o, 0, 0.95, paused, img.path)
	img.release(m)
	if err != nil {
		if staged && xerr.HasCode(err, xerr.SuspendImageNotAccessible) {
			// Name the VDI, as xapi does, not the staging file.
			return xerr.New(xerr.SuspendImageNotAccessible, img.vdi)
		}
		return err
	}
	bg := context.WithoutCancel(o.ctx)
	if err := m.discardImage(bg, img); err != nil {
		m.log.Warn("removing a used suspend image", "vm", o.uuid, "err", err)
	}
	if err := m.runHooks(bg, hookPostResume, o.uuid, reasonNone); err != nil {
		m.log.Warn("post-resume hook failed", "vm", o.uuid, "err", err)
	}
	return nil
}

// suspendImage is where a memory image goes: a VDI from storage, or a
// file under the data directory. An image in a VDI of a SuspendStore is
// written and read by the backend as a staging file under the data
// directory (staged), copied into the VDI after a save and out of it
// before a restore; a VDI of a plain DiskResolver is attached and its
// path used as the file.
type suspendImage struct {
	vm       string // the VM uuid it was attached for
	vdi      string // "" (null) when a plain file
	path     string
	attached bool
	staged   bool // path is a staging copy of the VDI's image
}

// stagePath is the staging file of a VM's image kept in a VDI.
func (m *Manager) stagePath(uuid string) (string, error) {
	return backend.EntryPath(m.suspendDir(), uuid, ".staging")
}

func (m *Manager) newSuspendImage(o *opCtx, vm *db.Row, forUUID string) (*suspendImage, error) {
	img := &suspendImage{vm: vm.UUID(), vdi: schema.NullRef}
	err := o.run("prepare-image", func(ctx context.Context) error {
		if m.cfg.DataDir == "" { // nowhere for the image or its staging file
			return xerr.New(xerr.VMNoSuspendSR, vm.Ref)
		}
		store, ok := m.disks.(SuspendStore)
		if !ok {
			var err error
			img.path, err = m.suspendPath(forUUID)
			return err
		}
		path, err := m.stagePath(forUUID)
		if err != nil {
			return err
		}
		size := vm.Get(dm.VM.MemoryStaticMax).(int64) + 64<<20
		vdi, err := store.CreateSuspendVDI(ctx, vm.Ref, forUUID, vm.String(dm.VM.SuspendSR), size)
		if err != nil {
			return err
		}
		img.vdi, img.path, img.staged = vdi, path, true
		return nil
	})
	return img, err
}

// openSuspendImage finds a suspended VM's image: its suspend VDI, copied
// out by the store (which checks that the VDI is this VM's suspend
// image) or attached, else the file a daemon without a store (or before
// VDIs held images) wrote.
func (m *Manager) openSuspendImage(ctx context.Context, vm *db.Row) (*suspendImage, error) {
	vdi := vm.String(dm.VM.SuspendVDI)
	if vdi != "" && vdi != schema.NullRef {
		if store, ok := m.disks.(SuspendStore); ok && m.cfg.DataDir != "" {
			path, err := m.stagePath(vm.UUID())
			if err != nil {
				return nil, err
			}
			if err := store.LoadSuspendImage(ctx, vm.Ref, vdi, path); err != nil {
				return nil, err
			}
			return &suspendImage{vm: vm.UUID(), vdi: vdi, path: path, staged: true}, nil
		}
		src, err := m.disks.Attach(ctx, vm.UUID(), vdi, true)
		if err != nil {
			return nil, xerr.New(xerr.SuspendImageNotAccessible, vdi)
		}
		return &suspendImage{vm: vm.UUID(), vdi: vdi, path: src.Target(), attached: true}, nil
	}
	path, err := m.suspendPath(vm.UUID())
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); err != nil {
		return nil, xerr.New(xerr.VMHasNoSuspendVDI, vm.Ref)
	}
	return &suspendImage{vdi: schema.NullRef, path: path}, nil
}

// release lets go of what the backend used: the attached VDI, or the
// staging copy of a VDI's image.
func (img *suspendImage) release(m *Manager) {
	if img.attached {
		if err := m.disks.Detach(context.Background(), img.vm, img.vdi); err != nil {
			m.log.Warn("detaching suspend image", "vdi", img.vdi, "err", err)
		}
		img.attached = false
	}
	img.dropStaging(m)
}

// dropStaging removes the staging file of an image kept in a VDI.
func (img *suspendImage) dropStaging(m *Manager) {
	if !img.staged {
		return
	}
	if err := os.Remove(img.path); err != nil && !os.IsNotExist(err) {
		m.log.Warn("removing a suspend image's staging file", "path", img.path, "err", err)
	}
	img.staged = false
}

func (img *suspendImage) discard(m *Manager) {
	img.release(m)
	if err := m.discardImage(context.Background(), img); err != nil {
		m.log.Warn("removing suspend image", "err", err)
	}
}

func (m *Manager) discardImage(ctx context.Context, img *suspendImage) error {
	if img.vdi != "" && img.vdi != schema.NullRef {
		if store, ok := m.disks.(SuspendStore); ok {
			return store.DestroySuspendVDI(ctx, img.vdi)
		}
		return nil
	}
	if img.path != "" {
		if err := os.Remove(img.path); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return nil
}

// discardSuspendImage drops a suspended (or checkpoint) VM's memory. As
// in xapi, a suspend VDI that cannot be destroyed (in use, or not a
// suspend image at all) is logged and forgotten rather than failing the
// caller: the VM's record lets go of it anyway.
func (m *Manager) discardSuspendImage(ctx context.Context, vm *db.Row) error {
	vdi := vm.String(dm.VM.SuspendVDI)
	if vdi != "" && vdi != schema.NullRef {
		if _, ok := m.disks.(SuspendStore); ok && m.cfg.DataDir != "" {
			if path, err := m.stagePath(vm.UUID()); err == nil {
				(&suspendImage{path: path, staged: true}).dropStaging(m) // a resume cut short
			}
		}
		if err := m.discardImage(ctx, &suspendImage{vdi: vdi}); err != nil {
			m.log.Warn("suspend VDI left behind", "vm", vm.UUID(), "vdi", vdi, "err", err)
		}
		return nil
	}
	path, err := m.suspendPath(vm.UUID())
	if err != nil {
		return err
	}
	return m.discardImage(ctx, &suspendImage{vdi: schema.NullRef, path: path})
}

// --- Reacting to domains --------------------------------------------

// checkState brings a VM's record in line with its domain, and applies
// the VM's actions when the guest stopped on its own.
func (m *Manager) checkState(ctx context.Context, ref string) error {
	row, ok := m.db.Snapshot().Get(dm.VM.Class, ref)
	if !ok {
		return nil
	}
	uuid := row.UUID()
	power := row.String(dm.VM.PowerState)
	here := row.String(dm.VM.ResidentOn) == m.host
	live := (power == psRunning || power == psPaused) && here
	info, ok := m.be.Info(uuid)
	if ok && (info.State == backend.DomainRunning || info.State == backend.DomainPaused) {
		m.fenced.Delete(uuid) // it runs here again: no longer fenced
	} else if m.heldByFence(uuid) {
		// HA killed this domain (fence.go): its end is not the VM's stop,
		// and the record is the coordinator's to move.
		m.log.Info("HA fenced this VM's domain here: its record is left to the coordinator for now", "vm", uuid)
		if ok && info.State == backend.DomainGone {
			m.cleanupDomain(ctx, info)
		}
		return nil
	}
	if !ok {
		if live {
			m.log.Warn("VM has no domain any more: Halted", "vm", uuid)
			_, err := m.db.Update(func(tx *db.Tx) error { return m.setHalted(tx, ref) })
			return err
		}
		return nil
	}
	if !info.Complete {
		if !m.busy(ref) { // a start interrupted by a restart
			m.cleanupDomain(ctx, info)
			if live {
				_, err := m.db.Update(func(tx *db.Tx) error { return m.setHalted(tx, ref) })
				return err
			}
		}
		return nil
	}
	if !here && !m.busy(ref) && (info.State == backend.DomainRunning || info.State == backend.DomainPaused) && m.notOurs(row) {
		m.log.Warn("removing a domain of a VM this host may not run", "vm", uuid, "power", power, "resident_on", row.String(dm.VM.ResidentOn))
		m.cleanupDomain(ctx, info)
		return nil
	}
	if info.Migrated && here && !m.busy(ref) && info.State == backend.DomainPaused && power == psRunning {
		// Its state went to another host, but the move was never
		// recorded (this daemon stopped before the commit): nobody else
		// may run it now, so it runs here again (migrate.go).
		m.log.Warn("resuming a guest whose migration never committed", "vm", uuid)
		if err := m.be.Unpause(ctx, uuid); err != nil {
			return err
		}
		m.journal(journal.Start, uuid)
		if info, ok = m.be.Info(uuid); !ok {
			return nil
		}
	}
	switch info.State {
	case backend.DomainGone:
		m.log.Warn("VM's emulator vanished: Halted", "vm", uuid)
		m.cleanupDomain(ctx, info)
		_, err := m.db.Update(func(tx *db.Tx) error { return m.setHalted(tx, ref) })
		return err
	case backend.DomainShutdown, backend.DomainReboot, backend.DomainCrashed:
		return m.afterGuestStop(ctx, row, info)
	case backend.DomainRunning, backend.DomainPaused:
		want := psRunning
		if info.State == backend.DomainPaused {
			want = psPaused
		}
		if power != want || !here || row.Get(dm.VM.Domid) != info.Domid {
			m.log.Info("VM record follows its domain", "vm", uuid, "was", power, "now", want)
			_, err := m.db.Update(func(tx *db.Tx) error { return m.setLive(tx, ref, info, want) })
			return err
		}
	}
	return nil
}

// notOurs reports whether a VM whose record does not place it here must
// not be adopted by a domain found here (docs/ha.md, rule 7): its record
// places it on another host of the pool, or HA protects it (HA may
// restart it elsewhere at any time). Otherwise, on a host that was
// stopped between starting a domain and recording it, the record follows
// the domain.
func (m *Manager) notOurs(vm *db.Row) bool {
	snap := m.db.Snapshot()
	if other := vm.String(dm.VM.ResidentOn); other != m.host {
		if _, ok := snap.Get(dm.Host.Class, other); ok {
			return true
		}
	}
	if planner.Priority(vm.String(dm.VM.HARestartPriority)).Protected() {
		for _, p := range snap.All(dm.Pool.Class) {
			if on, _ := p.Get(dm.Pool.HAEnabled).(bool); on {
				return true
			}
		}
	}
	return false
}

// afterGuestStop applies actions_after_shutdown, _reboot or _crash.
func (m *Manager) afterGuestStop(ctx context.Context, row *db.Row, info backend.DomainInfo) error {
	ref, uuid := row.Ref, row.UUID()
	var action, reason string
	switch info.State {
	case backend.DomainShutdown:
		action, reason = row.String(dm.VM.ActionsAfterShutdown), reasonCleanShutdown
		if action == "" {
			action = string(dm.OnNormalExitDestroy)
		}
	case backend.DomainReboot:
		action, reason = row.String(dm.VM.ActionsAfterReboot), reasonCleanReboot
		if action == "" {
			action = string(dm.OnNormalExitRestart)
		}
	default:
		action, reason = row.String(dm.VM.ActionsAfterCrash), reasonHardShutdown
		if action == "" {
			action = string(dm.OnCrashBehaviourDestroy)
		}
		m.log.Warn("VM crashed", "vm", uuid, "what", info.Reason, "action", action)
	}
	o := m.internalOp(ctx, ref, uuid, "auto-"+string(info.State))
	switch action {
	case string(dm.OnCrashBehaviourPreserve):
		_, err := m.db.Update(func(tx *db.Tx) error { return m.setLive(tx, ref, info, psPaused) })
		return err
	case string(dm.OnNormalExitRestart), string(dm.OnCrashBehaviourCoredumpAndRestart), string(dm.OnCrashBehaviourRenameRestart):
		if m.restartLoop(ref) {
			m.log.Error("VM restarts too often: leaving it Halted", "vm", uuid)
			return m.stopAndHalt(o, 0, 1, reason, true)
		}
		m.log.Info("restarting VM", "vm", uuid, "after", info.State)
		return m.reboot(o, 0, reasonOf(reason), true)
	default:
		return m.stopAndHalt(o, 0, 1, reason, true)
	}
}

func reasonOf(r string) string {
	if r == reasonCleanReboot {
		return reasonCleanReboot
	}
	return reasonHardReboot
}

// restartLoop records an automatic restart and reports whether there
// were too many lately (more than 5 in 5 minutes).
func (m *Manager) restartLoop(ref string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	recent := slices.DeleteFunc(m.restarts[ref], func(t time.Time) bool { return now.Sub(t) > 5*time.Minute })
	recent = append(recent, now)
	m.restarts[ref] = recent
	return len(recent) > 5
}
