package ovs_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"toolstackd/internal/network"
	"toolstackd/internal/network/locking"
	"toolstackd/internal/network/netlinkx"
	"toolstackd/internal/testkit/netnstest"
	"toolstackd/internal/testkit/ovstest"
)

// TestFigurePlugVIF measures the time to plug (and unplug) a VIF on an
// Open vSwitch bridge (userspace datapath; with and without OVN mode;
// unlocked, and locked with its OpenFlow rules) against a Linux bridge
// (unlocked, and locked with its nf_tables rules) in the same session,
// for docs/performance.md (Issue 17). It runs only with
// TOOLSTACKD_FIGURES=1; N VIFs each (TOOLSTACKD_FIGURES_VIFS, default
// 200).
func TestFigurePlugVIF(t *testing.T) {
	if os.Getenv("TOOLSTACKD_FIGURES") != "1" {
		t.Skip("figures: set TOOLSTACKD_FIGURES=1")
	}
	n := 200
	if v, err := strconv.Atoi(os.Getenv("TOOLSTACKD_FIGURES_VIFS")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	mode := locking.ModeUnlocked
	port := func(i int, bridge string) network.VIFPort {
		mac := net.HardwareAddr{2, 0, 0, 0, byte(i >> 8), byte(i)}
		p := network.VIFPort{VIF: fmt.Sprintf("%08x-0000-4000-8000-000000000000", i), VM: "66666666-7777-4888-8999-000000000000",
			Network: "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee", Bridge: bridge, MAC: mac, MTU: 1500, Mode: mode}
		if mode == locking.ModeLocked {
			p.IPv4 = []net.IP{net.IPv4(10, 9, byte(i>>8), byte(i))}
		}
		return p
	}

	// Baseline: a Linux bridge through netlink, as the Linux backend and
	// QEMU's taps do (make the tap, put it on the bridge, set it up).
	ns := netnstest.New(t)
	kernel, err := netlinkx.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer kernel.Close()
	if err := kernel.AddBridge("lbr0", 1500); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := range n {
		name := fmt.Sprintf("ltap%d", i)
		if err := kernel.AddTap(name, 1500); err != nil {
			t.Fatal(err)
		}
		if err := kernel.SetMaster(name, "lbr0"); err != nil {
			t.Fatal(err)
		}
		if err := kernel.SetUp(name); err != nil {
			t.Fatal(err)
		}
	}
	linuxPlug := time.Since(start) / time.Duration(n)
	start = time.Now()
	for i := range n {
		if err := kernel.Delete(fmt.Sprintf("ltap%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	linuxUnplug := time.Since(start) / time.Duration(n)

	// Baseline, locked: the same with the VIF's nf_tables rules, as the
	// Linux backend's PlugTap does (LockVIF).
	locker, err := locking.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	rules := func(i int) locking.Rules {
		p := port(i, "lbr0")
		return locking.Rules{Port: fmt.Sprintf("ltap%d", i), MAC: p.MAC, Mode: locking.ModeLocked, IPv4: []net.IP{net.IPv4(10, 9, byte(i>>8), byte(i))}}
	}
	start = time.Now()
	for i := range n {
		name := fmt.Sprintf("ltap%d", i)
		if err := kernel.AddTap(name, 1500); err != nil {
			t.Fatal(err)
		}
		if err := kernel.SetMaster(name, "lbr0"); err != nil {
			t.Fatal(err)
		}
		if err := kernel.SetUp(name); err != nil {
			t.Fatal(err)
		}
		if err := locker.Apply(rules(i)); err != nil {
			t.Fatal(err)
		}
	}
	linuxLockedPlug := time.Since(start) / time.Duration(n)
	start = time.Now()
	for i := range n {
		if err := locker.Remove(fmt.Sprintf("ltap%d", i)); err != nil {
			t.Fatal(err)
		}
		if err := kernel.Delete(fmt.Sprintf("ltap%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	linuxLockedUnplug := time.Since(start) / time.Duration(n)

	measure := func(sw interface {
		PlugVIF(context.Context, network.VIFPort) error
		UnplugVIF(context.Context, string) error
	}, bridge string) (time.Duration, time.Duration) {
		start := time.Now()
		for i := range n {
			if err := sw.PlugVIF(ctx, port(i, bridge)); err != nil {
				t.Fatal(err)
			}
		}
		plug := time.Since(start) / time.Duration(n)
		start = time.Now()
		for i := range n {
			if err := sw.UnplugVIF(ctx, port(i, bridge).VIF); err != nil {
				t.Fatal(err)
			}
		}
		return plug, time.Since(start) / time.Duration(n)
	}
	sw, _, _ := open(t, "")
	if err := sw.AddBridge("obr0", 1500); err != nil {
		t.Fatal(err)
	}
	ovsPlug, ovsUnplug := measure(sw, "obr0")
	mode = locking.ModeLocked
	lockedPlug, lockedUnplug := measure(sw, "obr0")
	mode = locking.ModeUnlocked

	nb := ovstest.StartOVN(t)
	swn, _, _ := open(t, nb.NB)
	if err := swn.AddBridge("obr1", 1500); err != nil {
		t.Fatal(err)
	}
	ovnPlug, ovnUnplug := measure(swn, "obr1")

	t.Logf("%d VIFs each, datapath %s", n, sw.Datapath())
	t.Logf("Linux bridge (netlink): plug %v, unplug %v per VIF", linuxPlug.Round(time.Microsecond), linuxUnplug.Round(time.Microsecond))
	t.Logf("Open vSwitch:           plug %v (%.1fx), unplug %v (%.1fx)", ovsPlug.Round(time.Microsecond),
		float64(ovsPlug)/float64(linuxPlug), ovsUnplug.Round(time.Microsecond), float64(ovsUnplug)/float64(linuxUnplug))
	t.Logf("Open vSwitch + OVN:     plug %v (%.1fx), unplug %v (%.1fx)", ovnPlug.Round(time.Microsecond),
		float64(ovnPlug)/float64(linuxPlug), ovnUnplug.Round(time.Microsecond), float64(ovnUnplug)/float64(linuxUnplug))
	t.Logf("locked, Linux bridge + nf_tables: plug %v, unplug %v per VIF", linuxLockedPlug.Round(time.Microsecond), linuxLockedUnplug.Round(time.Microsecond))
	t.Logf("locked, Open vSwitch + OpenFlow:  plug %v (%.1fx), unplug %v (%.1fx)", lockedPlug.Round(time.Microsecond),
		float64(lockedPlug)/float64(linuxLockedPlug), lockedUnplug.Round(time.Microsecond), float64(lockedUnplug)/float64(linuxLockedUnplug))
}
