package cli

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/ha"
	"toolstackd/internal/pool"
	"toolstackd/internal/pool/dbraft"
	"toolstackd/internal/storage"
	"toolstackd/internal/sysstatus"
	"toolstackd/internal/xenops"
	"toolstackd/internal/xva"
)

// newFullHarness is a CLI server over a host put together as the daemon
// does it (cmd/toolstackd): first boot, storage with its local SR,
// xenops on the simulator, XVA export and import, the pool layer and HA
// registered. Its handler
// table is the daemon's, which the command walk needs; the commands that
// drive VMs and disks run for real on it.
func newFullHarness(t testing.TB) *harness {
	t.Helper()
	dir := t.TempDir()
	quiet := slog.New(slog.DiscardHandler)
	cfg := api.DefaultConfig()
	cfg.PasswordIterations = 1000
	hash, err := api.HashPassword(rootPW, cfg.PasswordIterations)
	if err != nil {
		t.Fatal(err)
	}
	d := db.New(dm.Model, db.Options{})
	hostRef, err := api.FirstBoot(d, api.ProbeHost(), api.BootOptions{RootPasswordHash: hash})
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostRef = hostRef
	srv := api.New(d, cfg, quiet)
	srv.Start()
	r := mux.NewRouter()
	srv.Routes(r)
	stor, err := storage.Register(srv, r, storage.Config{DataDir: dir, HostRef: hostRef, FirstBoot: true, Log: quiet,
		RunDir: t.TempDir(), ReserveBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	xm, err := xenops.Register(srv, r, xenops.Config{Backend: "simulator", DataDir: dir, HostRef: hostRef, Log: quiet,
		Disks: storageDisks{stor}})
	if err != nil {
		t.Fatal(err)
	}
	xva.Register(srv, r, stor, xva.Config{HostRef: hostRef, Log: quiet})
	sysstatus.Register(srv, r, sysstatus.Config{DataDir: dir, HostRef: hostRef, Log: quiet})
	host, _ := d.Snapshot().Get(dm.Host.Class, hostRef)
	p, err := pool.Open(pool.Config{DataDir: dir, Advertise: "127.0.0.1:1", Port: "1", HostUUID: host.UUID(), Server: srv,
		Repl: dbraft.New(dbraft.Options{Model: dm.Model, Log: quiet}), Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p.Register(srv)
	svc, err := ha.New(ha.Config{Server: srv, Pool: p, Fencer: xm, HostRef: hostRef, HostUUID: host.UUID(), Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	svc.Register(srv)
	c := New(srv, Options{Log: quiet})
	c.Routes(r)
	h := &harness{d: d, api: srv, cli: c, router: r, host: hostRef}
	h.http = httptest.NewServer(r)
	h.local = httptest.NewServer(api.LocalHandler(r))
	t.Cleanup(func() { h.http.Close(); h.local.Close(); srv.Close(); xm.Close() })
	if tt, ok := t.(*testing.T); ok {
		h.t = tt
	}
	return h
}

// storageDisks gives the simulated VMs their disks through the storage
// layer's datapaths, as the daemon's resolver does (cmd/toolstackd,
// without its live-snapshot hook).
type storageDisks struct{ s *storage.Service }

func (d storageDisks) Attach(ctx context.Context, vm, vdi string, readonly bool) (xenops.DiskSource, error) {
	dp := "vbd/" + vm + "/" + vdi
	p, err := d.s.Attach(ctx, dp, vdi, readonly)
	if err != nil {
		return xenops.DiskSource{}, err
	}
	if err := d.s.Activate(ctx, dp, vdi); err != nil {
		_ = d.s.Detach(ctx, dp, vdi)
		return xenops.DiskSource{}, err
	}
	if p.Kind == "nbd" {
		return xenops.DiskSource{Kind: xenops.DiskNBD, NBDURI: p.URI, Format: "raw"}, nil
	}
	return xenops.DiskSource{Kind: xenops.DiskFile, Path: p.Path, Format: p.Format}, nil
}

func (d storageDisks) Detach(ctx context.Context, vm, vdi string) error {
	dp := "vbd/" + vm + "/" + vdi
	if err := d.s.Deactivate(ctx, dp, vdi); err != nil {
		return err
	}
	return d.s.Detach(ctx, dp, vdi)
}
