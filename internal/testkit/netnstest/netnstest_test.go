package netnstest_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/netnstest"
)

func TestNamespacesAndCleanup(t *testing.T) {
	var a, b *netnstest.Namespace
	t.Run("make", func(t *testing.T) {
		a, b = netnstest.New(t), netnstest.New(t)
		if a.Name() == b.Name() || !strings.HasPrefix(a.Name(), netnstest.Prefix) {
			t.Fatalf("names %q %q", a.Name(), b.Name())
		}
		if _, err := os.Stat(a.Path()); err != nil {
			t.Fatal(err)
		}
		netnstest.Veth(t, a, "nic0", b, "nic0")
		netnstest.Exec(t, a, "ip", "addr", "add", "192.0.2.1/24", "dev", "nic0")
		netnstest.Exec(t, b, "ip", "addr", "add", "192.0.2.2/24", "dev", "nic0")
		out := netnstest.Exec(t, a, "ip", "-d", "link", "show", "nic0")
		if !strings.Contains(out, "alias "+netnstest.NICAlias) {
			t.Errorf("nic0 not marked as a NIC:\n%s", out)
		}
		netnstest.Ping(t, a, "192.0.2.2")
		if _, err := netnstest.PingErr(a, "192.0.2.3", 300*time.Millisecond); err == nil {
			t.Error("an address nobody has answered")
		}
		if _, err := a.Run("false"); err == nil {
			t.Error("Run of a failing command succeeded")
		}
		// Stopping midway still removes the namespaces.
		t.SkipNow()
	})
	if a == nil {
		t.Skip("no namespaces here")
	}
	for _, ns := range []*netnstest.Namespace{a, b} {
		if _, err := os.Stat(ns.Path()); !os.IsNotExist(err) {
			t.Errorf("namespace %s left behind (%v)", ns.Name(), err)
		}
	}
}
