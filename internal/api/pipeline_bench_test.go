package api_test

import (
	"context"
	"io"
	"os"
	"testing"

	"toolstackd/internal/api"
	"toolstackd/internal/api/wire"
	"toolstackd/internal/metrics"
)

// BenchmarkPipeline measures one call through Dispatch, in process: a
// host.get_record (session, roles, arguments, route, handler; the reply
// encoded to JSON as the wire would) and a write (network.set_name_label,
// one durable-less database commit). docs/performance.md compares it with
// the code before the pipeline.
func BenchmarkPipeline(b *testing.B) {
	srv, s, net := benchServer(b, api.DefaultLimits())
	if os.Getenv("TOOLSTACKD_BENCH_METRICS") == "1" {
		// The daemon's /metrics observer on every call (compare with
		// and without: docs/performance.md).
		srv.SetObserver(metrics.New())
	}
	ctx := context.Background()
	host := srv.Cfg.HostRef
	req := &wire.JSONRequest{V2: true, ID: []byte("1")}
	b.Run("host.get_record", func(b *testing.B) {
		for b.Loop() {
			v, err := srv.Dispatch(ctx, "host.get_record", []any{s, host})
			if err != nil {
				b.Fatal(err)
			}
			if err := wire.WriteJSONSuccess(io.Discard, req, v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("network.set_name_label", func(b *testing.B) {
		for b.Loop() {
			if _, err := srv.Dispatch(ctx, "network.set_name_label", []any{s, net, "n"}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
