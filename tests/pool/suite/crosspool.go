package suite

import (
	"context"
	"encoding/json"
	"net/netip"
	"testing"

	"toolstackd/internal/testkit/pooltest"
)

// TwoPools starts two hosts and does not join them: a session on each.
func TwoPools(t *testing.T, ctx context.Context, o pooltest.Options) (*pooltest.Pool, [2]RPC, [2]string) {
	t.Helper()
	o.Hosts = 2
	p := pooltest.Start(t, o)
	c := pooltest.NewClient(netip.Addr{})
	var rs [2]RPC
	var hosts [2]string
	for i := range 2 {
		s, err := p.Login(ctx, c, i)
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = RPC{T: t, Ctx: ctx, C: c, At: p.Addr(i), S: s}
		var all []string
		if err := json.Unmarshal(rs[i].Call("host.get_all"), &all); err != nil || len(all) != 1 {
			t.Fatalf("host.get_all on pool %d: %v %v", i, all, err)
		}
		hosts[i] = all[0]
	}
	return p, rs, hosts
}

// MgmtNetwork is the network of host's management PIF.
func MgmtNetwork(r RPC, host string) string {
	r.T.Helper()
	var pifs map[string]map[string]any
	if err := json.Unmarshal(r.Call("PIF.get_all_records"), &pifs); err != nil {
		r.T.Fatal(err)
	}
	for _, p := range pifs {
		if p["host"] == host && p["management"] == true {
			return p["network"].(string)
		}
	}
	r.T.Fatalf("host %s has no management PIF", host)
	return ""
}

// AssertArgs are VM.assert_can_migrate's arguments after the session.
func AssertArgs(vm string, dest, vdiMap, vifMap map[string]string) []any {
	return []any{vm, dest, true, vdiMap, vifMap, map[string]string{}, map[string]string{}}
}
