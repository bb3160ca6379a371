package xenops

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"slices"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// assertCanMigrate gives xapi's refusals, in xapi's order, on a database
// made by hand: two live enabled hosts with a shared SR, a network with
// PIFs on both and one with a PIF on the first only.
func TestAssertCanMigrate(t *testing.T) {
	const (
		h1, h2         = "OpaqueRef:h1", "OpaqueRef:h2"
		shared, local  = "OpaqueRef:sr-shared", "OpaqueRef:sr-local"
		netBoth, netH1 = "OpaqueRef:net-both", "OpaqueRef:net-h1"
		netInternal    = "OpaqueRef:net-internal"
		vm             = "OpaqueRef:vm"
		gib            = int64(1) << 30
	)
	d := db.New(dm.Model, db.Options{})
	ins := func(tx *db.Tx, c *schema.Class, ref string, fields map[string]any) {
		t.Helper()
		insertFields(t, tx, c, ref, fields)
	}
	update := func(fn func(tx *db.Tx) error) {
		t.Helper()
		if _, err := d.Update(fn); err != nil {
			t.Fatal(err)
		}
	}
	update(func(tx *db.Tx) error {
		ins(tx, dm.SR.Class, shared, map[string]any{"shared": true})
		ins(tx, dm.SR.Class, local, nil)
		ins(tx, dm.Network.Class, netBoth, nil)
		ins(tx, dm.Network.Class, netH1, nil)
		ins(tx, dm.Network.Class, netInternal, nil)
		for _, h := range []string{h1, h2} {
			ins(tx, dm.HostMetrics.Class, h+"-m", map[string]any{"live": true, "memory_free": 2 * gib})
			ins(tx, dm.Host.Class, h, map[string]any{"enabled": true, "metrics": h + "-m"})
			ins(tx, dm.PBD.Class, h+"-pbd", map[string]any{"host": h, "SR": shared, "currently_attached": true})
			ins(tx, dm.PIF.Class, h+"-pif", map[string]any{"host": h, "network": netBoth})
		}
		ins(tx, dm.PBD.Class, "OpaqueRef:pbd-local", map[string]any{"host": h1, "SR": local, "currently_attached": true})
		ins(tx, dm.PIF.Class, "OpaqueRef:pif-h1-only", map[string]any{"host": h1, "network": netH1})
		ins(tx, dm.VM.Class, vm, map[string]any{"power_state": "Running", "resident_on": h1, "memory_static_max": gib})
		ins(tx, dm.VDI.Class, "OpaqueRef:vdi", map[string]any{"SR": shared})
		ins(tx, dm.VBD.Class, "OpaqueRef:vbd", map[string]any{"VM": vm, "VDI": "OpaqueRef:vdi"})
		ins(tx, dm.VIF.Class, "OpaqueRef:vif", map[string]any{"VM": vm, "network": netBoth})
		ins(tx, dm.VIF.Class, "OpaqueRef:vif-int", map[string]any{"VM": vm, "network": netInternal})
		return nil
	})
	m := &Manager{}
	check := func(dest string, code string, params ...string) {
		t.Helper()
		snap := d.Snapshot()
		row, _ := snap.Get(dm.VM.Class, vm)
		err := m.assertCanMigrate(snap, row, dest)
		if code == "" {
			if err != nil {
				t.Fatalf("to %s: %v, want nil", dest, err)
			}
			return
		}
		var xe *xerr.Error
		if !errors.As(err, &xe) || xe.Code != code || !slices.Equal(xe.Params, params) {
			t.Fatalf("to %s: %v, want %s %v", dest, err, code, params)
		}
	}
	set := func(cls *schema.Class, ref, field string, v any) {
		t.Helper()
		update(func(tx *db.Tx) error { return tx.Set(cls.Field(field), ref, v) })
	}
	check(h2, "")
	check(h1, xerr.OperationNotAllowed, "the VM already runs on this host (a migration to the same host is not supported)")
	set(dm.HostMetrics.Class, h2+"-m", "live", false)
	check(h2, xerr.HostNotLive)
	set(dm.HostMetrics.Class, h2+"-m", "live", true)
	set(dm.Host.Class, h2, "enabled", false)
	check(h2, xerr.HostDisabled, h2)
	set(dm.Host.Class, h2, "enabled", true)
	set(dm.PBD.Class, h2+"-pbd", "currently_attached", false)
	check(h2, xerr.VMRequiresSR, vm, shared)
	set(dm.PBD.Class, h2+"-pbd", "currently_attached", true)
	set(dm.VDI.Class, "OpaqueRef:vdi", "SR", local)
	check(h2, xerr.VMRequiresSR, vm, local)
	set(dm.VDI.Class, "OpaqueRef:vdi", "SR", shared)
	set(dm.VIF.Class, "OpaqueRef:vif", "network", netH1)
	check(h2, xerr.VMRequiresNetwork, vm, netH1)
	set(dm.VIF.Class, "OpaqueRef:vif", "network", netBoth)
	set(dm.VM.Class, vm, "memory_static_max", 3*gib)
	check(h2, xerr.HostNotEnoughFreeMemory, "3221225472", "2147483648")
	set(dm.VM.Class, vm, "memory_static_max", gib)
	// A PCI device passed through (VM.attached_PCIs is PCI.attached_VMs'
	// other end).
	update(func(tx *db.Tx) error {
		ins(tx, dm.PCI.Class, "OpaqueRef:pci", map[string]any{"attached_VMs": []string{vm}})
		return nil
	})
	check(h2, xerr.VMHasPCIAttached, vm)
}

// The migration stream's framing: messages and chunked streams in both
// directions, the end of a stream found whoever reads it, and hostile
// lengths refused.
func TestMigrationWire(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	src, dst := newMigConn(a), newMigConn(b)
	payload := bytes.Repeat([]byte("guest memory "), 200000) // 2.6 MB: several chunks
	go func() {
		_ = src.send(migrateHeader{Version: migrateVersion, VM: "OpaqueRef:x"}, migrateMsgTimeout)
		cw := &chunkWriter{w: src.w}
		_, _ = cw.Write(payload)
		_ = cw.Close()
		_ = src.send(migrateMsg{Step: stepGo}, migrateMsgTimeout)
	}()
	var h migrateHeader
	if err := dst.recv(&h, migrateMsgTimeout); err != nil || h.VM != "OpaqueRef:x" {
		t.Fatalf("header %+v %v", h, err)
	}
	cr := &chunkReader{c: b, r: dst.r}
	got, err := io.ReadAll(cr)
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("stream: %d bytes, %v", len(got), err)
	}
	if err := cr.drain(0); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.recvMsg(stepGo, migrateMsgTimeout); err != nil {
		t.Fatal(err)
	}

	// A chunk over the bound, a message over the bound, a truncated
	// stream.
	for name, raw := range map[string][]byte{
		"huge chunk": {0xff, 0xff, 0xff, 0xff},
		"truncated":  {0, 0, 0, 10, 1, 2},
	} {
		cr := &chunkReader{r: bufio.NewReader(bytes.NewReader(raw))}
		if _, err := io.ReadAll(cr); err == nil {
			t.Errorf("%s: read without an error", name)
		}
	}
	mc := &migConn{c: a, r: bufio.NewReader(bytes.NewReader([]byte{0x7f, 0xff, 0xff, 0xff}))}
	var v migrateMsg
	if err := mc.recv(&v, 0); err == nil {
		t.Error("a message of 2 GiB was accepted")
	}
	// A failure carries its XenAPI error across.
	f := failedMsg(xerr.New(xerr.HostNotEnoughFreeMemory, "1", "2"))
	var xe *xerr.Error
	if err := f.asError(); !errors.As(err, &xe) || xe.Code != xerr.HostNotEnoughFreeMemory || !slices.Equal(xe.Params, []string{"1", "2"}) {
		t.Errorf("failure across: %v", err)
	}
}

// insertFields inserts a row of class c named ref with the fields given
// by name (the rest zero), failing the test on an unknown field.
func insertFields(t *testing.T, tx *db.Tx, c *schema.Class, ref string, fields map[string]any) {
	t.Helper()
	row := make([]any, len(c.Fields))
	for name, v := range fields {
		f := c.Field(name)
		if f == nil {
			t.Fatalf("%s has no field %s", c.Name, name)
		}
		row[f.Index] = v
	}
	if _, err := tx.Insert(c, ref, row); err != nil {
		t.Fatalf("insert %s: %v", ref, err)
	}
}
