package metrics

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"toolstackd/internal/testkit/testdaemon"
)

// TestMetricsCost measures, on the real daemon with N simulated running
// VMs (TOOLSTACKD_METRICS_VMS, default 1,000; the test runs only when it
// is set, as it takes minutes): the daemon's CPU while it does nothing
// but sample (an upper bound of the sampling cost per 5 s tick), its
// memory, and the latency of /rrd_updates over the last 10 minutes for
// the host and every VM. docs/performance.md keeps the figures.
func TestMetricsCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("TOOLSTACKD_METRICS_VMS"))
	if n <= 0 {
		t.Skip("set TOOLSTACKD_METRICS_VMS=1000 to measure")
	}
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator", LogLevel: "warn"})
	s := d.Login(t)
	vms := make([]string, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := d.Client()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				raw, err := c.Call("VM.create", s, testdaemon.VMRecord("cost-"+strconv.Itoa(i)))
				if err == nil {
					vms[i], _ = testdaemon.String(raw)
					_, err = c.Call("VM.start", s, vms[i], false, false)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("%d VMs running", n)
	// Let the VMs' RRDs be made, then measure over 12 ticks.
	time.Sleep(15 * time.Second)
	const window = 60 * time.Second
	before := cpuTicks(t, d.PID)
	time.Sleep(window)
	used := time.Duration(cpuTicks(t, d.PID)-before) * 10 * time.Millisecond
	t.Logf("figure: %d running VMs: the idle daemon used %v of CPU in %v: %.2f%% of one core, %v per 5 s tick; RSS %.0f MiB",
		n, used, window, 100*used.Seconds()/window.Seconds(), used/12, float64(d.RSS())/(1<<20))
	for _, format := range []string{"", "&json=true"} {
		var best time.Duration
		var size int
		for range 5 {
			start := time.Now()
			url := fmt.Sprintf("%s/rrd_updates?session_id=%s&start=%d&host=true&vm_uuid=all%s", d.URL, s, time.Now().Unix()-600, format)
			resp, err := http.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			took := time.Since(start)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("/rrd_updates: %d %.200s", resp.StatusCode, b)
			}
			if best == 0 || took < best {
				best, size = took, len(b)
			}
			if !strings.Contains(string(b), vmsUUIDPrefix(t, d, s, vms[n-1])) {
				t.Fatal("the last VM is not in /rrd_updates")
			}
		}
		t.Logf("figure: /rrd_updates%s for the host and %d VMs over the last 10 minutes: best of 5 %v, %.1f MB", format, n, best, float64(size)/1e6)
	}
}

func vmsUUIDPrefix(t *testing.T, d *testdaemon.Daemon, s, vm string) string {
	raw, err := d.Client().Call("VM.get_uuid", s, vm)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := testdaemon.String(raw)
	return "vm:" + u + ":"
}

// cpuTicks is testdaemon.CPUTicks, failing the test on an error.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	n, err := testdaemon.CPUTicks(pid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
