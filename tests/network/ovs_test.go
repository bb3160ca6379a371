package network_test

// The Open vSwitch backend (--network-backend openvswitch) and its OVN
// mode (--ovn-nb), with the real daemon: each test starts an Open
// vSwitch of its own (ovsdb-server, and ovs-vswitchd with the userspace
// datapath in the test's network namespace) and, for OVN, northbound and
// southbound ovsdb-servers with ovn-northd, all in temporary directories
// with their own sockets (package ovstest); they skip, naming what is
// missing, where openvswitch-switch or ovn-central are not installed.

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/network/ovs"
	"toolstackd/internal/testkit/netnstest"
	"toolstackd/internal/testkit/ovstest"
	"toolstackd/internal/testkit/testdaemon"
)

// ovsVIF is what a test needs of a VM with one VIF on a private network.
type ovsVIF struct {
	network, bridge, vm, vif          string
	networkUUID, vmUUID, vifUUID, mac string
	tap                               string
}

// ovsVM makes a private network with MTU 1400 and a halted VM with a VIF
// on it (locking mode as given, allowed IPv4 addresses as given).
func ovsVM(t *testing.T, r *rpc, mode string, ipv4 []string) ovsVIF {
	t.Helper()
	var v ovsVIF
	v.network = r.str("network.create", map[string]any{"name_label": "ovs-private", "name_description": "", "MTU": 1400,
		"other_config": map[string]string{}})
	v.bridge = r.str("network.get_bridge", v.network)
	v.vm = r.str("VM.create", testdaemon.VMRecord("ovsvm"))
	rec := vifRecord(v.vm, v.network)
	rec["locking_mode"], rec["ipv4_allowed"] = mode, ipv4
	v.vif = r.str("VIF.create", rec)
	v.networkUUID = r.str("network.get_uuid", v.network)
	v.vmUUID = r.str("VM.get_uuid", v.vm)
	v.vifUUID = r.str("VIF.get_uuid", v.vif)
	v.mac = r.str("VIF.get_MAC", v.vif)
	var err error
	if v.tap, err = ovs.TapName(v.vifUUID); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestOVSBackend: a VM's VIF on a private network becomes a port of an
// Open vSwitch bridge with xapi's external_ids when the VM starts, and
// the port and the bridge go when it stops.
func TestOVSBackend(t *testing.T) {
	if why := ovstest.Available(); why != "" {
		t.Skip("Open vSwitch tests not run: " + why)
	}
	host := netnstest.New(t)
	o := ovstest.Start(t, host.Name())
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator",
		ExtraArgs: []string{"--network-backend", "openvswitch", "--network-namespace", host.Path(), "--ovs-db", o.DB}})
	r := &rpc{t: t, c: d.Client(), s: d.Login(t)}
	v := ovsVM(t, r, "network_default", []string{})
	if _, err := o.TryVsctl("br-exists", v.bridge); err == nil {
		t.Fatalf("bridge %s exists before any VM runs", v.bridge)
	}

	start := time.Now()
	r.call("VM.start", v.vm, false, false)
	t.Logf("VM.start with one VIF on Open vSwitch: %v", time.Since(start).Round(time.Millisecond))
	if got := o.Vsctl(t, "br-get-external-id", v.bridge, "toolstackd"); got != "bridge" {
		t.Errorf("bridge %s: external_ids:toolstackd %q", v.bridge, got)
	}
	if got := o.Vsctl(t, "get", "Interface", v.bridge, "mtu_request"); got != "1400" {
		t.Errorf("bridge %s: mtu_request %s, want the network's 1400", v.bridge, got)
	}
	if got := o.Vsctl(t, "port-to-br", v.tap); got != v.bridge {
		t.Fatalf("VIF port %s on %q, want %s\n%s", v.tap, got, v.bridge, o.Vsctl(t, "show"))
	}
	for key, want := range map[string]string{"iface-id": v.vifUUID, "vm-id": v.vmUUID, "attached-mac": v.mac,
		"iface-status": "active", "xs-vif-uuid": v.vifUUID, "xs-vm-uuid": v.vmUUID, "xs-network-uuid": v.networkUUID} {
		if got := strings.Trim(o.Vsctl(t, "get", "Interface", v.tap, "external_ids:"+key), `"`); got != want {
			t.Errorf("external_ids:%s of %s = %q, want %q", key, v.tap, got, want)
		}
	}
	if out := netnstest.Exec(t, host, "ip", "-o", "link", "show", v.bridge); !strings.Contains(out, "UP") {
		t.Errorf("device of bridge %s not up: %s", v.bridge, out)
	}

	// A bridge the daemon did not make survives its reconciliation.
	o.Vsctl(t, "add-br", "foreignbr", "--", "set", "Bridge", "foreignbr", "datapath_type=netdev")

	// A restart of the daemon keeps the running VM's port as it is.
	before := o.Vsctl(t, "get", "Interface", v.tap, "_uuid", "external_ids")
	d = d.Restart()
	r = &rpc{t: t, c: d.Client(), s: d.Login(t)}
	if got := o.Vsctl(t, "get", "Interface", v.tap, "_uuid", "external_ids"); got != before {
		t.Errorf("the VIF's interface changed across a restart:\nbefore %s\nafter  %s", before, got)
	}

	r.call("VM.hard_shutdown", v.vm)
	took := waitFor(t, "VIF port and bridge gone after VM.hard_shutdown", 30*time.Second, func() (bool, string) {
		if out, err := o.TryVsctl("port-to-br", v.tap); err == nil {
			return false, "port still on " + out
		}
		if _, err := o.TryVsctl("br-exists", v.bridge); err == nil {
			return false, "bridge " + v.bridge + " still there"
		}
		return true, ""
	})
	t.Logf("port and bridge gone %v after VM.hard_shutdown returned", took.Round(time.Millisecond))
	if _, err := host.Run("ip", "link", "show", v.tap); err == nil {
		t.Errorf("tap %s left in the namespace", v.tap)
	}
	o.Vsctl(t, "br-exists", "foreignbr")
}

// TestOVNLogicalPorts: in OVN mode a started VM's VIF has a logical
// switch port named by its uuid on a logical switch named by its
// network's uuid, with addresses and port security from its locking,
// and the port goes when the VM stops.
func TestOVNLogicalPorts(t *testing.T) {
	if why := ovstest.Available(); why != "" {
		t.Skip("Open vSwitch tests not run: " + why)
	}
	if why := ovstest.OVNAvailable(); why != "" {
		t.Skip("OVN tests not run: " + why)
	}
	host := netnstest.New(t)
	o := ovstest.Start(t, host.Name())
	n := ovstest.StartOVN(t)
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator",
		ExtraArgs: []string{"--network-backend", "openvswitch", "--network-namespace", host.Path(), "--ovs-db", o.DB, "--ovn-nb", n.NB}})
	r := &rpc{t: t, c: d.Client(), s: d.Login(t)}
	v := ovsVM(t, r, "locked", []string{"192.0.2.7"})

	r.call("VM.start", v.vm, false, false)
	if got := n.Nbctl(t, "--bare", "--columns=name", "find", "Logical_Switch", "name="+v.networkUUID); got != v.networkUUID {
		t.Fatalf("logical switch named %s: %q", v.networkUUID, got)
	}
	if got := n.Nbctl(t, "lsp-list", v.networkUUID); !strings.Contains(got, v.vifUUID) {
		t.Errorf("lsp-list: %q, want the port %s", got, v.vifUUID)
	}
	want := strings.ToLower(v.mac) + " 192.0.2.7"
	if got := n.Nbctl(t, "lsp-get-addresses", v.vifUUID); got != want {
		t.Errorf("addresses %q, want %q", got, want)
	}
	if got := n.Nbctl(t, "lsp-get-port-security", v.vifUUID); got != want {
		t.Errorf("port_security %q, want %q", got, want)
	}
	if got := strings.Trim(o.Vsctl(t, "get", "Interface", v.tap, "external_ids:iface-id"), `"`); got != v.vifUUID {
		t.Errorf("iface-id %q, want %q", got, v.vifUUID)
	}

	// The VIF's locking changes while it runs: the port follows (Watch).
	r.call("VIF.set_locking_mode", v.vif, "unlocked")
	waitFor(t, "port security cleared after VIF.set_locking_mode unlocked", 30*time.Second, func() (bool, string) {
		got, err := n.TryNbctl("lsp-get-port-security", v.vifUUID)
		return err == nil && got == "", got
	})
	r.call("VIF.set_locking_mode", v.vif, "disabled")
	waitFor(t, "port disabled after VIF.set_locking_mode disabled", 30*time.Second, func() (bool, string) {
		got, err := n.TryNbctl("lsp-get-enabled", v.vifUUID)
		return err == nil && got == "disabled", got
	})

	r.call("VM.hard_shutdown", v.vm)
	waitFor(t, "logical switch port gone after VM.hard_shutdown", 30*time.Second, func() (bool, string) {
		got, err := n.TryNbctl("lsp-list", v.networkUUID)
		return err == nil && !strings.Contains(got, v.vifUUID), got
	})
	// The logical switch stays (other hosts' VIFs may be on it).
	n.Nbctl(t, "ls-list")
}

// TestOVSMissing: without an Open vSwitch database the daemon does not
// start with --network-backend openvswitch, and says what is missing.
func TestOVSMissing(t *testing.T) {
	bin := testdaemon.Build(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sock := dir + "/no-such-ovs/db.sock"
	cmd := exec.CommandContext(ctx, bin, "--data-dir", dir+"/data", "--listen", testdaemon.FreeAddr(t, "127.0.0.1"),
		"--network-backend", "openvswitch", "--ovs-db", "unix:"+sock)
	cmd.Env = append(os.Environ(), "TOOLSTACKD_ROOT_PASSWORD="+testdaemon.DefaultPassword)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the daemon started without Open vSwitch:\n%s", out)
	}
	if ctx.Err() != nil {
		t.Fatalf("the daemon did not exit within 60s without Open vSwitch:\n%.2000s", out)
	}
	for _, want := range []string{sock, "openvswitch"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the daemon's error does not name %q:\n%.3000s", want, out)
		}
	}
	t.Logf("daemon without Open vSwitch: %v", err)
}
