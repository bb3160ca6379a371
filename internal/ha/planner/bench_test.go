package planner

import (
	"context"
	"fmt"
	"testing"
)

// The figure of issue 13: 64 hosts of 256 GiB and 1,000 protected VMs of
// 1 to 16 GiB. With more than 32 hosts xapi's rule always chooses the
// approximate planner.
func BenchmarkMaxFailuresTolerated64x1000(b *testing.B) {
	pool := bigPool(64, 1000, 256, 1)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		limit int
	}{{"nolimit", -1}, {"quorum64", QuorumLimit(64, 0)}} {
		b.Run(tc.name, func(b *testing.B) {
			var n int
			for b.Loop() {
				var err error
				if n, err = MaxFailuresTolerated(ctx, pool, tc.limit, Options{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n), "failures")
		})
	}
}

func BenchmarkPlanExists64x1000(b *testing.B) {
	pool := bigPool(64, 1000, 256, 1)
	ctx := context.Background()
	for _, r := range []int{1, 2, 8} {
		res, err := PlanExists(ctx, pool, r, Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("r=%d/%v/%v", r, res.Heuristic, res.Status), func(b *testing.B) {
			for b.Loop() {
				if _, err := PlanExists(ctx, pool, r, Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FailoverPlan for the 64x1000 pool with 1 and 4 hosts failed.
func BenchmarkFailoverPlan64x1000(b *testing.B) {
	pool := bigPool(64, 1000, 256, 1)
	for _, k := range []int{1, 4} {
		var failed []string
		for i := range k {
			failed = append(failed, pool.Hosts[i].ID)
		}
		vms := failedVMs(pool, failed)
		b.Run(fmt.Sprintf("failed=%d/vms=%d", k, len(vms)), func(b *testing.B) {
			for b.Loop() {
				if _, err := FailoverPlan(pool, failed, vms); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRestartOrder64x1000(b *testing.B) {
	pool := bigPool(64, 1000, 256, 1)
	failed := []string{pool.Hosts[0].ID, pool.Hosts[1].ID}
	for b.Loop() {
		if _, err := RestartOrder(pool, failed); err != nil {
			b.Fatal(err)
		}
	}
}

// The exhaustive search at the edge of xapi's rule: 16 hosts and 3
// failures (C(16,3)·3! = 3,360 orderings), and 32 hosts with 2.
func BenchmarkExhaustive(b *testing.B) {
	ctx := context.Background()
	for _, tc := range []struct {
		hosts, vms, r int
		hostGiB       int64
	}{{16, 1000, 3, 1024}, {32, 1000, 2, 512}, {8, 200, 2, 512}} {
		pool := bigPool(tc.hosts, tc.vms, tc.hostGiB, 1)
		res, err := PlanExists(ctx, pool, tc.r, Options{Budget: -1})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("%dx%d/r=%d/%v/%v", tc.hosts, tc.vms, tc.r, res.Heuristic, res.Status), func(b *testing.B) {
			for b.Loop() {
				if _, err := PlanExists(ctx, pool, tc.r, Options{Budget: -1}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(res.Steps), "steps")
		})
	}
}
