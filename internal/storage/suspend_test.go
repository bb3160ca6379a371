package storage

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
)

// suspendEnv is a storage service on a first-boot database (the "Local
// storage" file SR is the pool's and host's suspend image SR) with a
// session to make VMs with.
type suspendEnv struct {
	t    *testing.T
	srv  *api.Server
	s    *Service
	d    *db.DB
	sess string
	dir  string
}

func newSuspendEnv(t *testing.T) *suspendEnv {
	t.Helper()
	needQemuNBD(t)
	cfg := api.DefaultConfig()
	cfg.PasswordIterations = 1000
	d := db.New(dm.Model, db.Options{})
	hash, err := api.HashPassword("pw", cfg.PasswordIterations)
	if err != nil {
		t.Fatal(err)
	}
	host, err := api.FirstBoot(d, api.ProbeHost(), api.BootOptions{RootPasswordHash: hash})
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostRef = host
	srv := api.New(d, cfg, nil)
	dir := t.TempDir()
	s, err := Register(srv, mux.NewRouter(), Config{DataDir: dir, HostRef: host, FirstBoot: true, OpWait: 2 * time.Second,
		ReserveBytes: 16 << 20, ReservePercent: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); srv.Close() })
	e := &suspendEnv{t: t, srv: srv, s: s, d: d, dir: dir}
	v, _, err := srv.Invoke(context.Background(), "", "session.login_with_password", "root", "pw", "1.0", "test")
	if err != nil {
		t.Fatal(err)
	}
	e.sess = v.(string)
	return e
}

func (e *suspendEnv) newVM(name string, mem int64) *db.Row {
	e.t.Helper()
	rec := testdaemon.VMRecord(name)
	for k, v := range rec {
		if n, ok := v.(int); ok {
			rec[k] = int64(n)
		}
	}
	for _, k := range []string{"memory_target", "memory_static_max", "memory_dynamic_max", "memory_dynamic_min"} {
		rec[k] = mem
	}
	rec["memory_static_min"] = mem / 2
	v, _, err := e.srv.Invoke(context.Background(), e.sess, "VM.create", rec)
	if err != nil {
		e.t.Fatal(err)
	}
	row, _ := e.d.Snapshot().Get(dm.VM.Class, v.(string))
	return row
}

func (e *suspendEnv) vdi(ref string) *db.Row {
	row, _ := e.d.Snapshot().Get(dm.VDI.Class, ref)
	return row
}

// image writes a file shaped like a memory image: data, a long run of
// zeroes, more data.
func image(t *testing.T, path string) []byte {
	t.Helper()
	b := make([]byte, 5<<20+1234)
	rand.Read(b[:1<<20])
	rand.Read(b[4<<20:])
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	if !xerr.HasCode(err, code) {
		t.Fatalf("got %v, want %s", err, code)
	}
}

// TestSuspendVDILifecycle: a suspend VDI is made as xapi makes it, holds
// an image thinly, gives it back, is copied for a clone and destroyed.
func TestSuspendVDILifecycle(t *testing.T) {
	e := newSuspendEnv(t)
	ctx := context.Background()
	vm := e.newVM("sleeper", 64<<20)
	ref, err := e.s.CreateSuspendVDI(ctx, vm.Ref, "", schema.NullRef, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	v := e.vdi(ref)
	smc := mapField(v, dm.VDI.SMConfig)
	pool := e.d.Snapshot().All(dm.Pool.Class)[0]
	if v.String(dm.VDI.Type) != "suspend" || v.String(dm.VDI.NameLabel) != "Suspend image" ||
		v.String(dm.VDI.NameDescription) != "Suspend image" || smc["vmhint"] != vm.UUID() ||
		v.String(dm.VDI.SR) != pool.String(dm.Pool.SuspendImageSR) {
		t.Fatalf("suspend VDI: type %s name %q/%q sm_config %v SR %s", v.String(dm.VDI.Type), v.String(dm.VDI.NameLabel),
			v.String(dm.VDI.NameDescription), smc, v.String(dm.VDI.SR))
	}
	if want := SuspendImageSize(64 << 20); vdiSize(v) < want || smc["initial_allocation"] == "" {
		t.Fatalf("virtual_size %d, want at least %d (sm_config %v)", vdiSize(v), want, smc)
	}

	src := filepath.Join(e.dir, "img")
	data := image(t, src)
	if err := e.s.SaveSuspendImage(ctx, ref, src); err != nil {
		t.Fatal(err)
	}
	phys := vdiPhys(e.vdi(ref))
	if phys < 2<<20 || phys > 4<<20 {
		t.Errorf("physical_utilisation %d after writing 2 MiB of data in %d bytes", phys, len(data))
	}
	out := filepath.Join(e.dir, "out")
	if err := e.s.LoadSuspendImage(ctx, vm.Ref, ref, out); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(out)
	if len(got) < len(data) || !bytes.Equal(got[:len(data)], data) || !allZero(got[len(data):]) {
		t.Fatalf("image read back differs: %d bytes for %d", len(got), len(data))
	}
	if e.s.attachedDPs(ref) != 0 {
		t.Fatal("a transfer datapath is left attached")
	}

	// A clone's copy belongs to the clone.
	other := e.newVM("clone", 64<<20)
	cp, err := e.s.CopySuspendVDI(ctx, ref, other.UUID(), schema.NullRef)
	if err != nil {
		t.Fatal(err)
	}
	if c := e.vdi(cp); c.String(dm.VDI.Type) != "suspend" || mapField(c, dm.VDI.SMConfig)["vmhint"] != other.UUID() {
		t.Fatalf("copy: type %s sm_config %v", c.String(dm.VDI.Type), mapField(c, dm.VDI.SMConfig))
	}
	if err := e.s.LoadSuspendImage(ctx, other.Ref, cp, out); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(out); len(got) < len(data) || !bytes.Equal(got[:len(data)], data) {
		t.Fatal("the copy's image differs")
	}
	// Each VM reads only its own.
	wantCode(t, e.s.LoadSuspendImage(ctx, other.Ref, ref, out), xerr.SuspendImageNotAccessible)
	wantCode(t, e.s.LoadSuspendImage(ctx, vm.Ref, cp, out), xerr.SuspendImageNotAccessible)

	for _, r := range []string{ref, cp} {
		if err := e.s.DestroySuspendVDI(ctx, r); err != nil {
			t.Fatal(err)
		}
		if e.vdi(r) != nil {
			t.Fatal("VDI record left")
		}
		if err := e.s.DestroySuspendVDI(ctx, r); err != nil {
			t.Fatalf("destroying a VDI already gone: %v", err)
		}
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// TestSuspendVDIHostile: VDIs that are not this VM's suspend image are
// never read as one nor destroyed; an image larger than the VM's memory
// can make is refused; no suspend SR, and no room, are the XenAPI's
// errors.
func TestSuspendVDIHostile(t *testing.T) {
	e := newSuspendEnv(t)
	ctx := context.Background()
	vm := e.newVM("victim", 64<<20)
	snap := e.d.Snapshot()
	sr := snap.All(dm.Pool.Class)[0].String(dm.Pool.SuspendImageSR)
	v, _, err := e.srv.Invoke(ctx, e.sess, "VDI.create", map[string]any{"SR": sr, "virtual_size": int64(1 << 30), "type": "user",
		"name_label": "precious", "name_description": "", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{"vmhint": vm.UUID()}, "tags": []string{}})
	if err != nil {
		t.Fatal(err)
	}
	user := v.(string)
	out := filepath.Join(e.dir, "out")
	wantCode(t, e.s.LoadSuspendImage(ctx, vm.Ref, user, out), xerr.SuspendImageNotAccessible)
	wantCode(t, e.s.DestroySuspendVDI(ctx, user), xerr.VDIIncompatibleType)
	wantCode(t, e.s.SaveSuspendImage(ctx, user, out), xerr.VDIIncompatibleType)
	if _, err := e.s.CopySuspendVDI(ctx, user, vm.UUID(), schema.NullRef); !xerr.HasCode(err, xerr.VDIIncompatibleType) {
		t.Fatalf("copying a user VDI as a suspend image: %v", err)
	}
	if e.vdi(user) == nil {
		t.Fatal("a user VDI was destroyed")
	}
	wantCode(t, e.s.LoadSuspendImage(ctx, vm.Ref, "OpaqueRef:nonesuch", out), xerr.SuspendImageNotAccessible)

	// More data than 64 MiB of memory makes: refused, nothing left.
	big, err := e.s.CreateSuspendVDI(ctx, vm.Ref, "", schema.NullRef, 512<<20)
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(e.dir, "big")
	f, _ := os.Create(src)
	chunk := make([]byte, 1<<20)
	rand.Read(chunk)
	for range 200 {
		f.Write(chunk)
	}
	f.Close()
	if err := e.s.SaveSuspendImage(ctx, big, src); err != nil {
		t.Fatal(err)
	}
	wantCode(t, e.s.LoadSuspendImage(ctx, vm.Ref, big, out), xerr.SuspendImageNotAccessible)
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a refused image was copied out: %v", err)
	}
	// An image larger than the VDI.
	small, err := e.s.CreateSuspendVDI(ctx, vm.Ref, "", schema.NullRef, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(src, vdiSize(e.vdi(small))+1); err != nil {
		t.Fatal(err)
	}
	wantCode(t, e.s.SaveSuspendImage(ctx, small, src), xerr.VDITooSmall)

	// No room for a huge VM's memory.
	huge := e.newVM("huge", 1<<44)
	if _, err := e.s.CreateSuspendVDI(ctx, huge.Ref, "", schema.NullRef, 0); !xerr.HasCode(err, xerr.SRSuspendSpaceInsufficient) {
		t.Fatalf("suspend VDI for 16 TiB of memory: %v", err)
	}
	// No suspend SR anywhere (the VM's hint is not an SR).
	if _, err := e.d.Update(func(tx *db.Tx) error {
		if err := tx.Set(dm.Pool.SuspendImageSR, snap.All(dm.Pool.Class)[0].Ref, schema.NullRef); err != nil {
			return err
		}
		return tx.Set(dm.Host.SuspendImageSR, e.s.host, schema.NullRef)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.CreateSuspendVDI(ctx, vm.Ref, "", "OpaqueRef:bogus", 0); !xerr.HasCode(err, xerr.VMNoSuspendSR) {
		t.Fatalf("without a suspend SR: %v", err)
	}
	// VM.suspend_SR alone is enough.
	ref, err := e.s.CreateSuspendVDI(ctx, vm.Ref, "", sr, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{ref, big, small} {
		if err := e.s.DestroySuspendVDI(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSuspendImageSize(t *testing.T) {
	gib := float64(1 << 30)
	for _, c := range []struct{ mem, want int64 }{
		{0, 104857600},
		{1 << 30, int64(gib*1.2*1.05) + 104857600},
		{1 << 62, 64 << 40},
	} {
		if got := SuspendImageSize(c.mem); got != c.want {
			t.Errorf("SuspendImageSize(%d) = %d, want %d", c.mem, got, c.want)
		}
	}
}
