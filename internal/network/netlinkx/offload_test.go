package netlinkx_test

import (
	"errors"
	"testing"

	"toolstackd/internal/network"
	"toolstackd/internal/testkit/netnstest"
)

// GRO through the ethtool ioctls on a veth standing in for a NIC: read,
// refused until the NIC is ours, turned off and on again.
func TestGRO(t *testing.T) {
	ns, peer := netnstest.New(t), netnstest.New(t)
	netnstest.Veth(t, ns, "nic0", peer, "peer0")
	l := open(t, ns)
	on, err := l.GRO("nic0")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetGRO("nic0", !on); !errors.Is(err, network.ErrNotOurs) {
		t.Fatalf("SetGRO on a NIC not adopted: %v, want ErrNotOurs", err)
	}
	if _, err := l.GRO("nope0"); !errors.Is(err, network.ErrNotFound) {
		t.Fatalf("GRO of a missing link: %v, want ErrNotFound", err)
	}
	if err := l.Adopt("nic0"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []bool{!on, on, false, true} {
		if err := l.SetGRO("nic0", want); err != nil {
			t.Fatalf("SetGRO(%v): %v", want, err)
		}
		if got, err := l.GRO("nic0"); err != nil || got != want {
			t.Fatalf("GRO after SetGRO(%v) = %v, %v", want, got, err)
		}
	}
}
