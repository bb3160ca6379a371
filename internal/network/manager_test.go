package network

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// At start-up the management NIC, which carries the host's address, is
// left alone: no bridge, no adoption, no call at all.
func TestStartupLeavesManagementNIC(t *testing.T) {
	e := newEnv(t)
	if err := e.m.Apply(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, e.rec.Calls())
	if p := e.m.plan(); len(p.Bridges) != 0 {
		t.Fatalf("bridges planned: %+v", p.Bridges)
	}
}

func TestVLANCreateDestroyCalls(t *testing.T) {
	e := newEnv(t)
	e.scan()
	eth1 := e.pifOn("eth1", -1)
	n := e.network("v10")
	br := e.bridgeOf(n)
	e.rec.Reset()
	vlan := e.ok("VLAN.create", eth1, int64(10), n)
	wantCalls(t, e.rec.Calls(), "adopt eth1", "up eth1", "vlan eth1.10 parent eth1 tag 10 mtu 1500", "up eth1.10",
		"bridge "+br+" mtu 1500", "up "+br, "master eth1.10 "+br)
	u := e.pifOn("eth1", 10)
	p := e.pif(u)
	if !p.CurrentlyAttached || p.MAC != vlanMAC || string(p.VLANMasterOf) != vlan || p.Physical || string(p.Network) != n {
		t.Fatalf("VLAN PIF %+v", p)
	}
	e.rec.Reset()
	if err := e.m.Apply(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, e.rec.Calls()) // idempotent
	e.ok("VLAN.destroy", vlan)
	wantCalls(t, e.rec.Calls(), "delete eth1.10", "delete "+br)
	if e.d.Snapshot().Count(dm.VLAN.Class) != 0 {
		t.Fatal("VLAN left in the database")
	}
}

func TestVLANRollback(t *testing.T) {
	e := newEnv(t)
	e.scan()
	eth1 := e.pifOn("eth1", -1)
	n := e.network("v10")
	br := e.bridgeOf(n)
	before, k := e.counts(), kernel(e.rec)
	e.rec.FailOn = "master eth1.10"
	e.rec.Reset()
	e.fails(xerr.InternalError, "VLAN.create", eth1, int64(10), n)
	calls := e.rec.Calls()
	if !slices.Contains(calls, "delete eth1.10") || !slices.Contains(calls, "delete "+br) {
		t.Fatalf("not rolled back: %q", calls)
	}
	if got := e.counts(); got != before {
		t.Fatalf("database changed:\n %s\n %s", before, got)
	}
	got := kernel(e.rec)
	if !slices.Equal(got, k) {
		t.Fatalf("kernel changed:\n %q\n %q", k, got)
	}
	e.rec.FailOn = ""
	e.rec.Reset()
	if err := e.m.Apply(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, e.rec.Calls())
}

func TestUnsupportedKernel(t *testing.T) {
	e := newEnv(t)
	e.scan()
	n := e.network("v10")
	before := e.counts()
	e.rec.Unsupported["vlan"] = true
	err := e.fails(xerr.InternalError, "VLAN.create", e.pifOn("eth1", -1), int64(10), n)
	if !strings.Contains(strings.Join(err.Params, " "), "cannot do it") || !strings.Contains(strings.Join(err.Params, " "), "8021q") {
		t.Fatalf("unclear error: %v", err)
	}
	if got := e.counts(); got != before {
		t.Fatalf("database changed:\n %s\n %s", before, got)
	}
	for _, l := range kernel(e.rec) {
		if strings.Contains(l, "bridge") {
			t.Fatalf("left behind: %q", kernel(e.rec))
		}
	}
	e.rec.Unsupported["bond"] = true
	e.fails(xerr.InternalError, "Bond.create", e.network("b"), []string{e.pifOn("eth2", -1), e.pifOn("eth3", -1)}, "", "lacp", map[string]string{})
	if got := e.counts(); !strings.HasPrefix(got, strings.Split(before, " network=")[0]) {
		t.Fatalf("database changed:\n %s\n %s", before, got)
	}
}

func TestBondCreateDestroyCalls(t *testing.T) {
	e := newEnv(t)
	e.scan()
	eth2, eth3 := e.pifOn("eth2", -1), e.pifOn("eth3", -1)
	n := e.network("bond")
	br := e.bridgeOf(n)
	e.rec.Reset()
	bond := e.ok("Bond.create", n, []string{eth2, eth3}, "", "lacp", map[string]string{"lacp-time": "fast"})
	wantCalls(t, e.rec.Calls(),
		"bond bond0 mode 802.3ad lacp_rate=fast,miimon=100,xmit_hash_policy=layer3+4 mtu 1500", "mac 52:54:00:00:00:02 bond0",
		"adopt eth2", "master eth2 bond0", "adopt eth3", "master eth3 bond0", "up bond0",
		"bridge "+br+" mtu 1500", "up "+br, "master bond0 "+br)
	row, _ := e.d.Snapshot().Get(dm.Bond.Class, bond)
	var b dm.BondRecord
	b.FromRow(e.d.Snapshot().Values(row))
	master := e.pif(string(b.Master))
	if master.Device != "bond0" || !master.CurrentlyAttached || len(b.Slaves) != 2 || !b.AutoUpdateMAC ||
		b.Properties["hashing_algorithm"] != "tcpudp_ports" || b.Properties["lacp-time"] != "fast" || string(b.PrimarySlave) != eth2 {
		t.Fatalf("bond %+v master %+v", b, master)
	}
	e.rec.Reset()
	if err := e.m.Apply(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, e.rec.Calls())

	e.ok("Bond.set_mode", bond, "active-backup")
	wantCalls(t, e.rec.Calls(), "delete bond0", "bond bond0 mode active-backup miimon=100 mtu 1500", "mac 52:54:00:00:00:02 bond0",
		"master eth2 bond0", "master eth3 bond0", "up bond0", "master bond0 "+br)
	row, _ = e.d.Snapshot().Get(dm.Bond.Class, bond)
	if p, _ := row.Get(dm.Bond.Properties).(map[string]string); len(p) != 0 {
		t.Fatalf("lacp properties kept: %v", p)
	}
	e.rec.Reset()
	e.ok("Bond.destroy", bond)
	calls := e.rec.Calls()
	if calls[0] != "delete bond0" || calls[1] != "delete "+br {
		t.Fatalf("calls %q", calls)
	}
	// The members were plugged with the bond: they go back on their own networks.
	if !e.pif(eth2).CurrentlyAttached || !e.pif(eth3).CurrentlyAttached {
		t.Fatal("members not plugged after the bond")
	}
	k := strings.Join(kernel(e.rec), "|")
	if !strings.Contains(k, "eth2 device in xenbr2") || !strings.Contains(k, "eth3 device in xenbr3") || strings.Contains(k, "bond0") {
		t.Fatalf("kernel %s", k)
	}
}

func TestLinksNotOursUntouched(t *testing.T) {
	e := newEnv(t, Link{Name: "docker0", Kind: "bridge"}, Link{Name: "eth3.99", Kind: "vlan", Parent: "eth3", Tag: 99},
		Link{Name: "xapi7", Kind: "bridge"})
	e.scan()
	n := e.network("v")
	e.ok("VLAN.create", e.pifOn("eth1", -1), int64(5), n)
	e.ok("PIF.plug", e.pifOn("eth2", -1))
	e.fails(xerr.VLANInUse, "VLAN.create", e.pifOn("eth3", -1), int64(99), e.network("w"))
	if err := e.m.Apply(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, c := range e.rec.Calls() {
		for _, f := range []string{"docker0", "eth3.99", "xapi7"} {
			if strings.Contains(c, f) {
				t.Fatalf("touched %s: %q", f, c)
			}
		}
	}
}

func TestPlugManagementAdoptsAndMovesAddress(t *testing.T) {
	e := newEnv(t)
	// The distribution's configuration of eth0.
	_ = e.rec.Adopt("eth0")
	_ = e.rec.ReplaceAddrs("eth0", 4, []net.IPNet{mustCIDR("192.0.2.10/24")})
	_ = e.rec.SetDefaultGateway(4, mustIP("192.0.2.1"), "eth0")
	e.rec.Reset()
	e.ok("PIF.plug", e.mgmt)
	wantCalls(t, e.rec.Calls(), "bridge xenbr0 mtu 1500", "up xenbr0", "master eth0 xenbr0",
		"addrs xenbr0 4 192.0.2.10/24", "addrs eth0 4 ", "gateway 4 192.0.2.1 xenbr0")
	if e.pif(e.mgmt).OtherConfig[AdoptedKey] != "true" {
		t.Fatal("not marked adopted")
	}
	if gw, dev, _ := e.rec.DefaultGateway(4); dev != "xenbr0" || gw.String() != "192.0.2.1" {
		t.Fatalf("gateway %v %s", gw, dev)
	}
	e.rec.Reset()
	if err := e.m.Apply(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, e.rec.Calls())
}

func TestEnsureVIFAndRelease(t *testing.T) {
	e := newEnv(t)
	n := e.network("private")
	br := e.bridgeOf(n)
	vm, vif := e.vmWithVIF(n, dm.VMPowerStateHalted, false)
	_ = vm
	got, err := e.m.EnsureVIF(context.Background(), vif)
	if err != nil || got != br {
		t.Fatalf("EnsureVIF = %q, %v", got, err)
	}
	wantCalls(t, e.rec.Calls(), "bridge "+br+" mtu 1500", "up "+br)
	e.rec.Reset()
	if _, err := e.m.EnsureVIF(context.Background(), vif); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, e.rec.Calls())
	if err := e.m.Release(context.Background(), vif); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, e.rec.Calls(), "delete "+br)
}

// A VIF released while the database still shows its VM running (the
// shutdown releases the VIF before it writes the VM halted) leaves the
// bridge, which the database still asks for; once the database says
// halted, the next pass of Watch removes it, whatever plan Watch itself
// applied last (before the fix, Watch compared with its own last plan,
// from before the VM started, found no difference and left the bridge
// for ever: TestHostNetworking on a loaded machine).
func TestWatchAfterAReleaseFromAnOlderSnapshot(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	n := e.network("private")
	br := e.bridgeOf(n)
	if err := e.m.applyChanged(ctx); err != nil { // Watch's pass before the VM starts
		t.Fatal(err)
	}
	vm, vif := e.vmWithVIF(n, dm.VMPowerStateRunning, true)
	if _, err := e.m.EnsureVIF(ctx, vif); err != nil {
		t.Fatal(err)
	}
	e.rec.Reset()
	if err := e.m.Release(ctx, vif); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, e.rec.Calls()) // the database still shows the VIF attached
	if _, err := e.d.Update(func(tx *db.Tx) error {
		if err := tx.Set(dm.VIF.CurrentlyAttached, vif, false); err != nil {
			return err
		}
		if err := tx.Set(dm.VM.ResidentOn, vm, schema.NullRef); err != nil {
			return err
		}
		return tx.Set(dm.VM.PowerState, vm, string(dm.VMPowerStateHalted))
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.applyChanged(ctx); err != nil { // Watch's next pass
		t.Fatal(err)
	}
	wantCalls(t, e.rec.Calls(), "delete "+br)
}

// Watch brings what the database learns from elsewhere into the kernel:
// a VM started here on a private network.
func TestWatch(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.m.Watch(ctx, 5*time.Millisecond); close(done) }()
	defer func() { cancel(); <-done }()
	n := e.network("private")
	br := e.bridgeOf(n)
	e.vmWithVIF(n, dm.VMPowerStateRunning, true)
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Contains(e.rec.Calls(), "bridge "+br+" mtu 1500") {
		if time.Now().After(deadline) {
			t.Fatalf("no bridge made: %q", e.rec.Calls())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// env is a first-boot host (management PIF on eth0, not adopted) with a
// XenAPI server, the network module registered on it, and a Recorder
// with four NICs standing in for the kernel.
type env struct {
	t    *testing.T
	d    *db.DB
	srv  *api.Server
	m    *Manager
	rec  *Recorder
	host string
	sess string
	mgmt string
}

func nic(i int) Link {
	return Link{Name: "eth" + itoa(i), Kind: "device", Physical: true, MAC: net.HardwareAddr{0x52, 0x54, 0, 0, 0, byte(i)},
		MTU: 1500, Carrier: true, Speed: 1000, Duplex: "full", Vendor: "8086", Device: "100e"}
}

func newEnv(t *testing.T, extra ...Link) *env {
	t.Helper()
	cfg := api.DefaultConfig()
	cfg.PasswordIterations = 1000
	d := db.New(dm.Model, db.Options{})
	hash, err := api.HashPassword("pw", cfg.PasswordIterations)
	if err != nil {
		t.Fatal(err)
	}
	facts := api.HostFacts{Hostname: "h1", Address: "192.0.2.10", Device: "eth0", MAC: "52:54:00:00:00:00", CPUs: 2, MemTotal: 8 << 30}
	host, err := api.FirstBoot(d, facts, api.BootOptions{RootPasswordHash: hash})
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostRef = host
	srv := api.New(d, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	eth0 := nic(0)
	eth0.Up = true
	links := append([]Link{eth0, nic(1), nic(2), nic(3)}, extra...)
	rec := NewRecorder(links...)
	m, err := Register(Config{Links: rec, Server: srv, HostRef: host, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	e := &env{t: t, d: d, srv: srv, m: m, rec: rec, host: host}
	v, _, err := srv.Invoke(context.Background(), "", "session.login_with_password", "root", "pw", "1.0", "test")
	if err != nil {
		t.Fatal(err)
	}
	e.sess = v.(string)
	e.mgmt = e.pifOn("eth0", -1)
	return e
}

func (e *env) call(method string, args ...any) (any, error) {
	v, _, err := e.srv.Invoke(context.Background(), e.sess, method, args...)
	return v, err
}

func (e *env) ok(method string, args ...any) string {
	e.t.Helper()
	v, err := e.call(method, args...)
	if err != nil {
		e.t.Fatalf("%s: %v", method, err)
	}
	s, _ := v.(string)
	return s
}

func (e *env) fails(code string, method string, args ...any) *xerr.Error {
	e.t.Helper()
	_, err := e.call(method, args...)
	if !xerr.HasCode(err, code) {
		e.t.Fatalf("%s: got %v, want %s", method, err, code)
	}
	return xerr.From(err)
}

// pifOn is this host's PIF of a device and VLAN.
func (e *env) pifOn(device string, vlan int64) string {
	ref := ""
	e.d.Snapshot().Ascend(dm.PIF.Class, func(r *db.Row) bool {
		if r.String(dm.PIF.Host) == e.host && r.String(dm.PIF.Device) == device && r.Get(dm.PIF.VLAN) == vlan {
			ref = r.Ref
			return false
		}
		return true
	})
	if ref == "" {
		e.t.Fatalf("no PIF %s VLAN %d", device, vlan)
	}
	return ref
}

func (e *env) pif(ref string) dm.PIFRecord {
	p, ok := pifRecord(e.d.Snapshot(), ref)
	if !ok {
		e.t.Fatalf("no PIF %s", ref)
	}
	return p
}

func (e *env) network(name string) string {
	return e.ok("network.create", map[string]any{"name_label": name, "name_description": "", "MTU": int64(1500),
		"other_config": map[string]any{}})
}

func (e *env) bridgeOf(network string) string {
	row, _ := e.d.Snapshot().Get(dm.Network.Class, network)
	return row.String(dm.Network.Bridge)
}

// scan introduces eth1..eth3.
func (e *env) scan() {
	e.t.Helper()
	e.ok("PIF.scan", e.host)
}

// counts is the number of rows of the classes a change may touch.
func (e *env) counts() string {
	s := e.d.Snapshot()
	var b strings.Builder
	for _, n := range []struct {
		name string
		n    int
	}{{"PIF", s.Count(dm.PIF.Class)}, {"VLAN", s.Count(dm.VLAN.Class)}, {"Bond", s.Count(dm.Bond.Class)},
		{"tunnel", s.Count(dm.Tunnel.Class)}, {"network", s.Count(dm.Network.Class)}, {"PIF_metrics", s.Count(dm.PIFMetrics.Class)}} {
		b.WriteString(n.name + "=" + itoa(n.n) + " ")
	}
	var attached []string
	s.Ascend(dm.PIF.Class, func(r *db.Row) bool {
		if r.Get(dm.PIF.CurrentlyAttached) == true {
			attached = append(attached, r.String(dm.PIF.Device)+"/"+itoa(int(r.Get(dm.PIF.VLAN).(int64))))
		}
		return true
	})
	slices.Sort(attached)
	b.WriteString("attached=" + strings.Join(attached, ","))
	return b.String()
}

func wantCalls(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("calls:\n got  %q\n want %q", got, want)
	}
}

// kernel is the links of the recorder, as "name kind master" lines.
func kernel(r *Recorder) []string {
	ls, _ := r.List()
	var out []string
	for _, l := range ls {
		s := l.Name + " " + l.Kind
		if l.Master != "" {
			s += " in " + l.Master
		}
		out = append(out, s)
	}
	return out
}

func mustCIDR(s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip.To4()
	return *n
}

func mustIP(s string) net.IP { return net.ParseIP(s).To4() }

// vmWithVIF puts a VM (resident here unless halted) with a VIF on a
// network into the database.
func (e *env) vmWithVIF(network string, power dm.VMPowerState, attached bool) (vm, vif string) {
	e.t.Helper()
	_, err := e.d.Update(func(tx *db.Tx) error {
		rec := &dm.VMRecord{NameLabel: "vm", PowerState: power, OtherConfig: map[string]string{}}
		if power != dm.VMPowerStateHalted {
			rec.ResidentOn = dm.HostRef(e.host)
		}
		var err error
		if vm, err = tx.Insert(dm.VM.Class, "", rec.Row()); err != nil {
			return err
		}
		vif, err = tx.Insert(dm.VIF.Class, "", (&dm.VIFRecord{Device: "0", Network: dm.NetworkRef(network), VM: dm.VMRef(vm),
			MAC: "02:00:00:00:00:01", MTU: 1500, CurrentlyAttached: attached, OtherConfig: map[string]string{}}).Row())
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return vm, vif
}
