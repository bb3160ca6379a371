package api_test

import (
	"context"
	"fmt"
	"testing"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// benchServer is a server with a root session and a network, no HTTP.
func benchServer(b *testing.B, limits api.Limits) (*api.Server, string, string) {
	cfg := api.DefaultConfig()
	cfg.PasswordIterations = 1000
	cfg.Limits = limits
	d := db.New(dm.Model, db.Options{})
	hash, _ := api.HashPassword(rootPW, cfg.PasswordIterations)
	host, err := api.FirstBoot(d, api.ProbeHost(), api.BootOptions{RootPasswordHash: hash})
	if err != nil {
		b.Fatal(err)
	}
	cfg.HostRef = host
	srv := api.New(d, cfg, nil)
	b.Cleanup(srv.Close)
	v, _, err := srv.Invoke(context.Background(), "", "session.login_with_password", "root", rootPW, "2.21", "bench")
	if err != nil {
		b.Fatal(err)
	}
	s := v.(string)
	v, _, err = srv.Invoke(context.Background(), s, "network.create", map[string]any{"name_label": "n", "other_config": map[string]string{}})
	if err != nil {
		b.Fatal(err)
	}
	return srv, s, v.(string)
}

// BenchmarkDispatchLimits measures Dispatch (role check, decoding, the
// argument limits and the handler) with the default limits and with none,
// for a read and for a write carrying a 32-entry map.
func BenchmarkDispatchLimits(b *testing.B) {
	oc := map[string]any{}
	for i := range 32 {
		oc[fmt.Sprintf("key-%d", i)] = fmt.Sprintf("a value of moderate length, number %d", i)
	}
	for _, lim := range []struct {
		name string
		l    api.Limits
	}{{"limits=default", api.DefaultLimits()}, {"limits=off", api.Limits{}}} {
		srv, s, net := benchServer(b, lim.l)
		ctx := context.Background()
		b.Run("get_name_label/"+lim.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := srv.Dispatch(ctx, "network.get_name_label", []any{s, net}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("set_other_config/"+lim.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := srv.Dispatch(ctx, "network.set_other_config", []any{s, net, oc}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
