package ha

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"toolstackd/internal/ha/journal"
	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/tests/pool/suite"
)

// TestHASoak runs a pool of three with HA on (default timing, fake
// watchdogs) and ten protected VMs under a steady write load for
// TOOLSTACKD_HA_SOAK (e.g. 1h) and counts false fencings: hosts
// declared dead, watchdog resets and protected VMs killed or moved, of
// which there must be none.
//
//	TOOLSTACKD_HA_SOAK=1h go test -count=1 -timeout 2h -v -run TestHASoak ./tests/pool/
func TestHASoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("TOOLSTACKD_HA_SOAK"))
	if err != nil || d <= 0 {
		t.Skip("set TOOLSTACKD_HA_SOAK to a duration to run the HA soak")
	}
	jpath := filepath.Join(t.TempDir(), "instances")
	ctx, cancel := context.WithTimeout(context.Background(), d+5*time.Minute)
	defer cancel()
	p, r, hosts := suite.Joined(t, ctx, pooltest.Options{Hosts: 3, Daemon: testdaemon.Options{ExtraArgs: []string{
		"--watchdog", "fake", "--instance-journal", jpath}}})
	r.Call("pool.enable_ha", []string{}, map[string]string{})
	where := map[string]string{}
	for i := range 10 {
		vm := r.Str("VM.create", testdaemon.VMRecord("soak-"+strconv.Itoa(i)))
		r.Call("VM.set_ha_restart_priority", vm, "restart")
		r.Call("VM.start_on", vm, hosts[i%3], false, false)
		where[vm] = hosts[i%3]
	}
	pids := []int{p.Hosts[0].PID, p.Hosts[1].PID, p.Hosts[2].PID}
	// The load: four clients writing as fast as the pool lets them.
	var writes, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := pooltest.NewClient(netip.Addr{})
			s, err := p.Login(ctx, c, 0)
			if err != nil {
				t.Error(err)
				return
			}
			vm := r.Str("VM.create", testdaemon.VMRecord("load-"+strconv.Itoa(w)))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := c.Call(ctx, p.Addr(0), "VM.set_name_description", s, vm, strconv.Itoa(i)); err != nil {
					failed.Add(1)
					time.Sleep(100 * time.Millisecond)
					continue
				}
				writes.Add(1)
			}
		}()
	}
	time.Sleep(d)
	close(stop)
	wg.Wait()
	resets := 0
	for i, pid := range pids {
		if !processAlive(pid) {
			resets++
			t.Errorf("host %d was reset or died during the soak", i)
		}
	}
	moved := 0
	for vm, h := range where {
		if on := r.Str("VM.get_resident_on", vm); on != h || r.Str("VM.get_power_state", vm) != "Running" {
			moved++
			t.Errorf("protected VM %s: now %s on %s, was running on %s", vm, r.Str("VM.get_power_state", vm), on, h)
		}
	}
	events, err := journal.Read(jpath)
	if err != nil {
		t.Fatal(err)
	}
	stops := 0
	for _, e := range events {
		if e.Kind != journal.Start {
			stops++
		}
	}
	t.Logf("HA soak of %v: %d writes (%d failed), %d hosts reset, %d protected VMs moved or stopped, %d stops or resets in the journal",
		d, writes.Load(), failed.Load(), resets, moved, stops)
	if stops > 0 {
		t.Errorf("%d false fencings (stops or resets in the journal)", stops)
	}
}
