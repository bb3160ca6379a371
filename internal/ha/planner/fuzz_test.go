package planner

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

// bytesReader hands out bytes of the fuzz input, zeros when it runs out.
type bytesReader struct {
	b []byte
}

func (r *bytesReader) next() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// decodePool turns fuzz bytes into a small pool (up to 8 hosts, 24 VMs),
// a set of failed hosts and a failure count.
func decodePool(data []byte) (Pool, []string, int) {
	r := &bytesReader{b: data}
	n := 1 + int(r.next()%8)
	var p Pool
	for i := range n {
		b := r.next()
		p.Hosts = append(p.Hosts, Host{
			ID:         fmt.Sprintf("h%d", i),
			FreeMemory: int64(r.next()%64) - 8,
			Live:       b&1 == 0 || b&2 == 0,
		})
	}
	nv := int(r.next() % 25)
	for i := range nv {
		flags := r.next()
		v := VM{ID: fmt.Sprintf("v%02d", i), Memory: int64(r.next() % 24), Order: int64(r.next()%5) - 1}
		if h := int(r.next() % byte(n+1)); h < n {
			v.Host = p.Hosts[h].ID
		}
		switch flags % 3 {
		case 0:
			v.Priority = PriorityRestart
		case 1:
			v.Priority = PriorityBestEffort
		}
		if flags&4 != 0 {
			mask := r.next()
			v.Hosts = []string{}
			for h := range n {
				if mask&(1<<h) != 0 {
					v.Hosts = append(v.Hosts, p.Hosts[h].ID)
				}
			}
		}
		p.VMs = append(p.VMs, v)
	}
	var failed []string
	mask := r.next()
	for h := range n {
		if mask&(1<<h) != 0 {
			failed = append(failed, p.Hosts[h].ID)
		}
	}
	return p, failed, int(r.next() % 4)
}

func FuzzPlan(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{2, 0, 40, 0, 40, 3, 0, 10, 0, 0, 0, 10, 1, 1, 4, 10, 1, 0, 1, 1})
	f.Add([]byte{4, 0, 20, 0, 20, 0, 20, 0, 20, 8, 0, 5, 0, 0, 0, 5, 1, 1, 4, 6, 2, 2, 3, 0, 7, 0, 3, 0, 9, 1, 4, 5, 3, 2})
	f.Add([]byte{7, 1, 63, 0, 63, 2, 63, 0, 1, 3, 30, 0, 63, 0, 63, 24, 4, 23, 0, 0, 255, 5, 1, 1, 1, 3, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		pool, failed, r := decodePool(data)
		ctx := context.Background()

		// ha_compute_vm_failover_plan for the VMs of the failed hosts.
		vms := failedVMs(pool, failed)
		pls, err := FailoverPlan(pool, failed, vms)
		if err != nil {
			t.Fatal(err)
		}
		if len(pls) != len(vms) {
			t.Fatalf("%d placements for %d VMs", len(pls), len(vms))
		}
		for i, pl := range pls {
			if pl.VM != vms[i] || (pl.Host == "") != (pl.Reason != Placed) {
				t.Fatalf("placement %+v", pl)
			}
		}
		if err := checkPlan(pool, failed, planMap(pls), nil); err != nil {
			t.Fatalf("failover plan: %v\npool %+v failed %v plan %+v", err, pool, failed, pls)
		}

		// The restart executor's list: hosts as above, memory shared
		// between protected restarts, pinned VMs and best-effort ones.
		ro, err := RestartOrder(pool, failed)
		if err != nil {
			t.Fatal(err)
		}
		plan := map[string]string{}
		seen := map[string]bool{}
		complete := true
		for i, rs := range ro.Restarts {
			if seen[rs.VM] {
				t.Fatalf("VM %s restarted twice", rs.VM)
			}
			seen[rs.VM] = true
			if rs.Host != "" {
				plan[rs.VM] = rs.Host
			} else if rs.Priority == PriorityRestart {
				complete = false
			}
			if i > 0 {
				prev := ro.Restarts[i-1]
				if rs.Wave < prev.Wave || rs.Wave > prev.Wave+1 {
					t.Fatalf("waves out of order: %+v", ro.Restarts)
				}
				if prev.Priority == PriorityBestEffort && rs.Priority == PriorityRestart {
					t.Fatalf("best-effort before protected: %+v", ro.Restarts)
				}
			}
		}
		if complete != ro.Complete {
			t.Fatalf("Complete = %v, but %+v", ro.Complete, ro.Restarts)
		}
		// Everything given a host fits, on live hosts it may run on.
		if err := checkPlan(pool, failed, plan, nil); err != nil {
			t.Fatalf("restart order: %v\npool %+v failed %v order %+v", err, pool, failed, ro.Restarts)
		}

		// Planning questions answer without error and consistently.
		res, err := PlanExists(ctx, pool, r, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status == PlanExistsForAllVMs {
			all, err := RestartOrder(pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !all.Complete {
				t.Fatalf("a plan exists for %d failures but not for the offline VMs now", r)
			}
		}
		max, err := MaxFailuresTolerated(ctx, pool, -1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if max < 0 || max > len(pool.Hosts) {
			t.Fatalf("max failures %d of %d hosts", max, len(pool.Hosts))
		}
		if max > 0 {
			if res, _ := PlanExists(ctx, pool, max, Options{}); res.Status != PlanExistsForAllVMs {
				t.Fatalf("max failures %d but PlanExists says %v", max, res.Status)
			}
		}
		limited, err := MaxFailuresTolerated(ctx, pool, QuorumLimit(len(pool.Hosts), 0), Options{})
		if err != nil || limited > QuorumLimit(len(pool.Hosts), 0) || limited > max {
			t.Fatalf("quorum-limited max %d (unlimited %d): %v", limited, max, err)
		}

		// A change: the failed hosts disabled, the first VM doubled.
		ch := Change{DisableHosts: failed}
		if len(pool.VMs) > 0 {
			v := pool.VMs[0]
			v.Memory *= 2
			ch.SetVMs = []VM{v}
		}
		verdict, err := CheckChange(ctx, pool, ch, r, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if verdict.WouldBreak != (verdict.Before.Status == PlanExistsForAllVMs && verdict.After.Status != PlanExistsForAllVMs) {
			t.Fatalf("verdict %+v", verdict)
		}
		if slices.ContainsFunc(pool.Hosts, func(h Host) bool { return h.ID == "" }) {
			t.Fatal("input modified")
		}
	})
}
