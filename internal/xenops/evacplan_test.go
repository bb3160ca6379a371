package xenops

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

const evacGiB = int64(1) << 30

func evacErrOf(e *xerr.Error) []string {
	if e == nil {
		return nil
	}
	return append([]string{e.Code}, e.Params...)
}

// Biggest-fit-decreasing: the biggest VM goes to the host with the most
// free memory, which is then re-sorted; a VM that fits nowhere is named
// with HOST_NOT_ENOUGH_FREE_MEMORY [vm] and does not stop the others.
func TestPlanEvacuationPacksBiggestFirst(t *testing.T) {
	hosts := []evacHost{{"h2", 6 * evacGiB}, {"h3", 5 * evacGiB}}
	vms := []evacVM{{Ref: "a", Memory: 4 * evacGiB}, {Ref: "b", Memory: 3 * evacGiB}, {Ref: "c", Memory: 2 * evacGiB},
		{Ref: "d", Memory: 1 * evacGiB}, {Ref: "e", Memory: 3 * evacGiB}}
	p := planEvacuation(hosts, vms)
	// a(4)->h2 (6->2); b(3)->h3 (5->2); e(3): no host has 3 left; c(2)->h2
	// (ties go to the first host: 2->0); d(1)->h3 (2->1).
	want := map[string]string{"a": "h2", "b": "h3", "c": "h2", "d": "h3"}
	if !evacMapsEqual(p.Dest, want) {
		t.Errorf("dest %v, want %v", p.Dest, want)
	}
	if got := evacErrOf(p.Errs["e"]); !slices.Equal(got, []string{xerr.HostNotEnoughFreeMemory, "e"}) || len(p.Errs) != 1 {
		t.Errorf("errors %v", p.Errs)
	}
	if e := p.cannotEvacuate(); e == nil || e.Code != xerr.CannotEvacuateHost || !slices.Equal(e.Params, []string{"HOST_NOT_ENOUGH_FREE_MEMORY,e"}) {
		t.Errorf("cannotEvacuate = %v", e)
	}
}

func evacMapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// The rules' order: no target names every VM; otherwise unprotected and
// cannot-run-somewhere VMs are left out of the packing, an operation
// error overrides, and affinity is honoured where there is room.
func TestPlanEvacuationRules(t *testing.T) {
	vms := []evacVM{{Ref: "a", Memory: evacGiB}, {Ref: "b", Memory: evacGiB}}
	p := planEvacuation(nil, vms)
	if len(p.Dest) != 0 || !slices.Equal(evacErrOf(p.Errs["a"]), []string{xerr.NoHostsAvailable, "a"}) ||
		!slices.Equal(evacErrOf(p.Errs["b"]), []string{xerr.NoHostsAvailable, "b"}) {
		t.Errorf("no targets: %v %v", p.Dest, p.Errs)
	}

	hosts := []evacHost{{"h2", 8 * evacGiB}, {"h3", 2 * evacGiB}}
	sr := xerr.New(xerr.VMRequiresSR, "local", "sr-local")
	busy := xerr.New(xerr.OtherOperationInProgress, "VM", "busy", "clean_shutdown", "t")
	vms = []evacVM{
		{Ref: "local", Memory: evacGiB, Cannot: sr},
		{Ref: "unprot", Memory: evacGiB, Unprotected: true},
		{Ref: "busy", Memory: 7 * evacGiB, OpErr: busy},
		{Ref: "both", Memory: evacGiB, Cannot: sr, OpErr: busy},
		{Ref: "aff", Memory: evacGiB, Affinity: "h3"},
		{Ref: "big", Memory: 2 * evacGiB},
	}
	p = planEvacuation(hosts, vms)
	for vm, want := range map[string][]string{
		"local":  evacErrOf(sr),
		"unprot": {xerr.HostEvacuateVMNotHAProtected, "unprot"},
		"busy":   evacErrOf(busy),
		"both":   evacErrOf(busy),
		// busy (7 GiB) still takes its room on h2 in the packing, as in
		// xapi; big does not fit h3 after aff: no room anywhere.
		"big": {xerr.HostNotEnoughFreeMemory, "big"},
	} {
		if got := evacErrOf(p.Errs[vm]); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", vm, got, want)
		}
	}
	if !evacMapsEqual(p.Dest, map[string]string{"aff": "h3"}) {
		t.Errorf("dest %v", p.Dest)
	}
	if got := p.prevents(); !slices.Equal(got, []string{"big", "both", "busy", "local", "unprot"}) {
		t.Errorf("prevents %v", got)
	}
	// Affinity to a host without room falls back to the packing.
	p = planEvacuation([]evacHost{{"h2", 4 * evacGiB}, {"h3", evacGiB / 2}}, []evacVM{{Ref: "aff", Memory: evacGiB, Affinity: "h3"}})
	if !evacMapsEqual(p.Dest, map[string]string{"aff": "h2"}) || len(p.Errs) != 0 {
		t.Errorf("full affinity host: %v %v", p.Dest, p.Errs)
	}
	// Nothing resident: an empty plan, no error.
	if p := planEvacuation(hosts, nil); len(p.Dest)+len(p.Errs) != 0 || p.cannotEvacuate() != nil {
		t.Errorf("empty: %v", p)
	}
}

// A pool in a database, read as host.evacuate reads it.
func TestEvacuationInputFromDatabase(t *testing.T) {
	const (
		h1, h2, h3, h4   = "OpaqueRef:h1", "OpaqueRef:h2", "OpaqueRef:h3", "OpaqueRef:h4"
		shared, local    = "OpaqueRef:sr-shared", "OpaqueRef:sr-local"
		vmA, vmB, vmC    = "OpaqueRef:vm-a", "OpaqueRef:vm-b", "OpaqueRef:vm-c"
		vmD, vmE, vmDom0 = "OpaqueRef:vm-d", "OpaqueRef:vm-e", "OpaqueRef:vm-dom0"
		netPIF, netInt   = "OpaqueRef:net-pif", "OpaqueRef:net-internal"
		pool             = "OpaqueRef:pool"
	)
	d := db.New(dm.Model, db.Options{})
	ins := func(tx *db.Tx, c *schema.Class, ref string, fields map[string]any) {
		t.Helper()
		insertFields(t, tx, c, ref, fields)
	}
	mustUpdate := func(fn func(tx *db.Tx)) {
		t.Helper()
		if _, err := d.Update(func(tx *db.Tx) error { fn(tx); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	mustUpdate(func(tx *db.Tx) {
		ins(tx, dm.SR.Class, shared, map[string]any{"shared": true})
		for i, h := range []string{h1, h2, h3, h4} {
			ins(tx, dm.HostMetrics.Class, h+"-m", map[string]any{"live": true, "memory_free": int64(4-i) * evacGiB})
			ins(tx, dm.Host.Class, h, map[string]any{"enabled": h != h4, "metrics": h + "-m"})
			ins(tx, dm.PBD.Class, h+"-pbd", map[string]any{"host": h, "SR": shared, "currently_attached": true})
		}
		ins(tx, dm.Pool.Class, pool, map[string]any{"master": h1})
		ins(tx, dm.SR.Class, local, nil)
		ins(tx, dm.PBD.Class, "OpaqueRef:pbd-local", map[string]any{"host": h1, "SR": local, "currently_attached": true})
		ins(tx, dm.Network.Class, netPIF, nil)
		ins(tx, dm.Network.Class, netInt, nil)
		ins(tx, dm.PIF.Class, "OpaqueRef:pif-1", map[string]any{"host": h1, "network": netPIF})
		ins(tx, dm.PIF.Class, "OpaqueRef:pif-2", map[string]any{"host": h2, "network": netPIF})
		run := func(ref, sr string, extra map[string]any) {
			f := map[string]any{"power_state": "Running", "resident_on": h1, "memory_static_max": evacGiB, "name_label": ref}
			for k, v := range extra {
				f[k] = v
			}
			ins(tx, dm.VM.Class, ref, f)
			if sr != "" {
				ins(tx, dm.VDI.Class, ref+"-vdi", map[string]any{"SR": sr})
				ins(tx, dm.VBD.Class, ref+"-vbd", map[string]any{"VM": ref, "VDI": ref + "-vdi"})
			}
		}
		run(vmA, shared, nil)
		run(vmB, local, nil)
		run(vmC, shared, map[string]any{"power_state": "Halted", "resident_on": schema.NullRef})
		run(vmD, shared, nil)
		ins(tx, dm.VIF.Class, vmD+"-vif", map[string]any{"VM": vmD, "network": netPIF})
		run(vmE, shared, map[string]any{"current_operations": map[string]string{"OpaqueRef:t": "clean_shutdown"}})
		ins(tx, dm.VIF.Class, vmE+"-vif", map[string]any{"VM": vmE, "network": netInt})
		run(vmDom0, "", map[string]any{"is_control_domain": true})
	})
	targets, vms := evacuationInput(d.Snapshot(), h1, h1)
	if len(targets) != 2 || targets[0] != (evacHost{h2, 3 * evacGiB}) || targets[1] != (evacHost{h3, 2 * evacGiB}) {
		t.Fatalf("targets %v", targets)
	}
	var refs []string
	for _, v := range vms {
		refs = append(refs, v.Ref)
	}
	if !slices.Equal(refs, []string{vmA, vmB, vmD, vmE}) {
		t.Fatalf("resident VMs %v (halted and control domains stay out)", refs)
	}
	p := planEvacuation(targets, vms)
	wantErrs := map[string][]string{
		vmB: {xerr.VMRequiresSR, vmB, local},
		vmD: {xerr.VMRequiresNetwork, vmD, netPIF}, // h3 has no PIF on it
		vmE: {xerr.OtherOperationInProgress, "VM", vmE, "clean_shutdown", "OpaqueRef:t"},
	}
	if len(p.Errs) != len(wantErrs) {
		t.Errorf("errors %v", p.Errs)
	}
	for vm, want := range wantErrs {
		if got := evacErrOf(p.Errs[vm]); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", vm, got, want)
		}
	}
	if !evacMapsEqual(p.Dest, map[string]string{vmA: h2}) {
		t.Errorf("dest %v", p.Dest)
	}

	// HA on: vmA is not protected; protecting it lets it move.
	mustUpdate(func(tx *db.Tx) {
		if err := tx.Set(dm.Pool.HAEnabled, pool, true); err != nil {
			t.Fatal(err)
		}
	})
	_, vms = evacuationInput(d.Snapshot(), h1, h1)
	p = planEvacuation(targets, vms)
	if got := evacErrOf(p.Errs[vmA]); !slices.Equal(got, []string{xerr.HostEvacuateVMNotHAProtected, vmA}) {
		t.Errorf("HA on, unprotected: %v", got)
	}
	mustUpdate(func(tx *db.Tx) {
		if err := tx.Set(dm.VM.HARestartPriority, vmA, "restart"); err != nil {
			t.Fatal(err)
		}
	})
	_, vms = evacuationInput(d.Snapshot(), h1, h1)
	if p = planEvacuation(targets, vms); p.Dest[vmA] != h2 {
		t.Errorf("HA on, protected: %v %v", p.Dest, p.Errs)
	}

	// A dead target: every VM is refused with HOST_NOT_LIVE.
	mustUpdate(func(tx *db.Tx) {
		if err := tx.Set(dm.HostMetrics.Live, h3+"-m", false); err != nil {
			t.Fatal(err)
		}
	})
	_, vms = evacuationInput(d.Snapshot(), h1, h1)
	if p = planEvacuation(targets, vms); !slices.Equal(evacErrOf(p.Errs[vmA]), []string{xerr.HostNotLive}) {
		t.Errorf("dead target: %v", p.Errs[vmA])
	}
}

// runEvacMoves keeps at most batch moves running, reports progress up to 1,
// and after a failure or cancellation starts no more.
func TestRunMoves(t *testing.T) {
	moves := make([]evacMove, 25)
	for i := range moves {
		moves[i] = evacMove{vm: string(rune('a' + i)), host: "h"}
	}
	var running, peak, started atomic.Int32
	var mu sync.Mutex
	var progress []float64
	record := func(p float64) { mu.Lock(); progress = append(progress, p); mu.Unlock() }
	move := func(fail string, block chan struct{}) func(context.Context, evacMove) error {
		return func(ctx context.Context, mv evacMove) error {
			started.Add(1)
			n := running.Add(1)
			defer running.Add(-1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			if block != nil {
				select {
				case <-block:
				case <-ctx.Done():
					return xerr.New(xerr.TaskCancelled, "")
				}
			} else {
				time.Sleep(time.Millisecond)
			}
			switch mv.vm {
			case fail:
				return xerr.New(xerr.VMRequiresSR, mv.vm, "sr")
			case "c":
				return xerr.New(xerr.VMBadPowerState, mv.vm, "running", "halted")
			}
			return nil
		}
	}
	if err := runEvacMoves(context.Background(), moves, 4, record, move("", nil)); err != nil {
		t.Fatalf("runEvacMoves: %v (VM_BAD_POWER_STATE is not a failure)", err)
	}
	if peak.Load() > 4 || started.Load() != 25 {
		t.Errorf("peak %d running, %d started", peak.Load(), started.Load())
	}
	if len(progress) != 25 || progress[24] != 1 || !slices.IsSorted(progress) {
		t.Errorf("progress %v", progress)
	}

	started.Store(0)
	err := runEvacMoves(context.Background(), moves, 1, func(float64) {}, move("e", nil))
	if !xerr.HasCode(err, xerr.VMRequiresSR) || started.Load() != 5 {
		t.Errorf("failure: %v after %d started", err, started.Load())
	}

	// Cancelled while the first batch blocks: no more start, those in
	// flight see the cancellation.
	started.Store(0)
	ctx, cancel := context.WithCancel(context.Background())
	block := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- runEvacMoves(ctx, moves, 3, func(float64) {}, move("", block)) }()
	deadline := time.Now().Add(30 * time.Second)
	for started.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if !xerr.HasCode(err, xerr.TaskCancelled) && !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("runEvacMoves did not return after cancellation")
	}
	if started.Load() != 3 {
		t.Errorf("%d moves started after cancellation", started.Load()-3)
	}
	close(block)
}
