package network_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/network"
	"toolstackd/internal/network/locking"
	"toolstackd/internal/network/netlinkx"
	"toolstackd/internal/testkit/netnstest"
)

// plugEnv is a Manager on netlink and nf_tables in a namespace of its
// own, as the daemon has in the host's.
type plugEnv struct {
	ns      *netnstest.Namespace
	d       *db.DB
	m       *network.Manager
	links   *netlinkx.NS
	network string
	host    string
}

func newPlugEnv(t testing.TB) *plugEnv {
	t.Helper()
	ns := netnstest.New(t)
	links, err := netlinkx.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = links.Close() })
	lk, err := locking.Open(ns.Path())
	if err != nil {
		t.Skipf("VIF locking not available here: %v", err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	cfg := api.DefaultConfig()
	cfg.PasswordIterations = 1000
	d := db.New(dm.Model, db.Options{})
	facts := api.HostFacts{Hostname: "h1", Address: "192.0.2.10", Device: "eth0", MAC: "52:54:00:00:00:00", CPUs: 2, MemTotal: 8 << 30}
	host, err := api.FirstBoot(d, facts, api.BootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostRef = host
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := api.New(d, cfg, quiet)
	t.Cleanup(srv.Close)
	m, err := network.Register(network.Config{Links: links, Server: srv, HostRef: host, Log: quiet, Locker: lk})
	if err != nil {
		t.Fatal(err)
	}
	e := &plugEnv{ns: ns, d: d, m: m, links: links, host: host}
	if _, err := d.Update(func(tx *db.Tx) error {
		e.network, err = tx.Insert(dm.Network.Class, "", (&dm.NetworkRecord{NameLabel: "guests", Bridge: "xenbr9", MTU: 1450,
			OtherConfig: map[string]string{}, Purpose: []dm.NetworkPurpose{}}).Row())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return e
}

// vif adds a running VM with a locked VIF (MAC and address i) on the
// network.
func (e *plugEnv) vif(t testing.TB, i int, qos map[string]string) string {
	t.Helper()
	var vif string
	_, err := e.d.Update(func(tx *db.Tx) error {
		vm, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: "vm", PowerState: dm.VMPowerStateRunning,
			ResidentOn: dm.HostRef(e.host), OtherConfig: map[string]string{}}).Row())
		if err != nil {
			return err
		}
		rec := &dm.VIFRecord{Device: "0", Network: dm.NetworkRef(e.network), VM: dm.VMRef(vm),
			MAC: fmt.Sprintf("02:00:00:00:%02x:%02x", i>>8&0xff, i&0xff), MTU: 1450, CurrentlyAttached: true,
			OtherConfig: map[string]string{}, LockingMode: dm.VIFLockingModeLocked,
			IPV4Allowed: []string{fmt.Sprintf("10.0.%d.%d", i>>8&0xff, i&0xff)}, IPV6Allowed: []string{}, QosAlgorithmParams: map[string]string{}}
		if qos != nil {
			rec.QosAlgorithmType, rec.QosAlgorithmParams = "ratelimit", qos
		}
		vif, err = tx.Insert(dm.VIF.Class, "", rec.Row())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return vif
}

// TestPlugTapNetlink: the tap the QEMU backend gets from the module is
// on the network's bridge, with its MTU, up, locked, and rate limited as
// its qos fields say; UnplugTap leaves nothing of it, and the bridge goes
// with the VIF's Release.
func TestPlugTapNetlink(t *testing.T) {
	e := newPlugEnv(t)
	vif := e.vif(t, 1, map[string]string{"kbps": "2048"})
	ctx := context.Background()
	bridge, err := e.m.EnsureVIF(ctx, vif)
	if err != nil {
		t.Fatal(err)
	}
	if !e.m.HasBridge(bridge) || bridge != "xenbr9" {
		t.Fatalf("bridge %q after EnsureVIF", bridge)
	}
	if err := e.m.PlugTap(ctx, vif, "tsvif1.0", bridge, 1450); err != nil {
		t.Fatal(err)
	}
	l, err := e.links.Get("tsvif1.0")
	if err != nil {
		t.Fatal(err)
	}
	if l.Kind != "tuntap" || l.Master != bridge || l.MTU != 1450 || !l.Up || !l.Ours {
		t.Fatalf("tap %+v", l)
	}
	if out := netnstest.Exec(t, e.ns, "tc", "qdisc", "show", "dev", "tsvif1.0"); !strings.Contains(out, "ingress") {
		t.Fatalf("no ingress qdisc for the rate limit:\n%s", out)
	}
	if out := netnstest.Exec(t, e.ns, "tc", "qdisc", "show", "dev", "tsq1.0"); !strings.Contains(out, "tbf") || !strings.Contains(out, "rate 16777Kbit") {
		t.Fatalf("no 2048 KiB/s (16,777 kbit/s) tbf on the IFB:\n%s", out)
	}
	// A second plug of the same name (an earlier domain's leftover)
	// replaces it.
	if err := e.m.PlugTap(ctx, vif, "tsvif1.0", bridge, 1450); err != nil {
		t.Fatal(err)
	}
	if err := e.m.UnplugTap(ctx, vif, "tsvif1.0"); err != nil {
		t.Fatal(err)
	}
	out := netnstest.Exec(t, e.ns, "ip", "-br", "link")
	if strings.Contains(out, "tsvif1.0") || strings.Contains(out, "tsq1.0") {
		t.Fatalf("left after UnplugTap:\n%s", out)
	}
	// The VM lifecycle records the VIF detached, then lets its network go.
	if _, err := e.d.Update(func(tx *db.Tx) error { return tx.Set(dm.VIF.CurrentlyAttached, vif, false) }); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Release(ctx, vif); err != nil {
		t.Fatal(err)
	}
	if e.m.HasBridge(bridge) {
		t.Fatal("the bridge outlived the only VIF on it")
	}
}

// BenchmarkPlugTap is a whole VIF plug as the QEMU backend has it now:
// Manager.PlugTap (a leftover of the name removed, the tap made with the
// network's MTU, on the bridge, up) with the VIF's locking rules (locked,
// one address), in a namespace filling with VIFs: ns/plug is the
// figure for one; µs-unplug/op is UnplugTap's. With -benchtime Nx up to
// 1,000 (a bridge takes 1,024 ports).
func BenchmarkPlugTap(b *testing.B) {
	e := newPlugEnv(b)
	ctx := context.Background()
	const maxVIFs = 1000
	vifs := make([]string, maxVIFs)
	for i := range vifs {
		vifs[i] = e.vif(b, i, nil)
	}
	bridge, err := e.m.EnsureVIF(ctx, vifs[0])
	if err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		if i == maxVIFs {
			b.Fatalf("at most %d plugs", maxVIFs)
		}
		if err := e.m.PlugTap(ctx, vifs[i], fmt.Sprintf("tsvif%d.0", i), bridge, 1450); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(i), "ns/plug")
	start := time.Now()
	for k := range i {
		if err := e.m.UnplugTap(ctx, vifs[k], fmt.Sprintf("tsvif%d.0", k)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/float64(i), "µs-unplug/op")
}
