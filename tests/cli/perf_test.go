package cli

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// The figures for docs/performance.md (issue 5). They take a while, so
// they run only with XE_PERF=1:
//
//	XE_PERF=1 go test -run Perf -v -count=1 ./tests/cli/

func perfOnly(t *testing.T) {
	if os.Getenv("XE_PERF") == "" {
		t.Skip("set XE_PERF=1 to measure")
	}
}

// timeRuns runs a command n times and returns the run times, sorted.
func timeRuns(t *testing.T, n int, env []string, name string, args ...string) []time.Duration {
	var ds []time.Duration
	for range n {
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), env...)
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = &out
		start := time.Now()
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
		}
		ds = append(ds, time.Since(start))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds
}

func summary(ds []time.Duration) string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	return fmt.Sprintf("min %s, median %s, p90 %s, max %s (%d runs)", ms(ds[0]), ms(ds[len(ds)/2]),
		ms(ds[len(ds)*9/10]), ms(ds[len(ds)-1]), len(ds))
}

func TestPerfVMList(t *testing.T) {
	perfOnly(t)
	d := startDaemon(t)
	start := time.Now()
	d.makeVMs(1000, "perf-")
	t.Logf("made 1000 VMs in %s", time.Since(start))
	if n := len(split(d.ok("vm-list", "--minimal"))); n != 1001 {
		t.Fatalf("%d VMs listed", n)
	}
	out := d.ok("vm-list")
	t.Logf("vm-list prints %d bytes, %d lines", len(out), strings.Count(out, "\n"))
	tcp := []string{"-s", "127.0.0.1", "-p", d.port, "-pw", password}
	local := []string{"TOOLSTACKD_SOCKET=" + d.socket()}
	timeRuns(t, 3, local, d.xeBin, "vm-list") // warm up
	t.Logf("xe vm-list, local socket:        %s", summary(timeRuns(t, 30, local, d.xeBin, "vm-list")))
	t.Logf("xe vm-list --minimal, local:     %s", summary(timeRuns(t, 30, local, d.xeBin, "vm-list", "--minimal")))
	t.Logf("xe vm-list params=all, local:    %s", summary(timeRuns(t, 10, local, d.xeBin, "vm-list", "params=all")))
	t.Logf("xe vm-list, TCP + password:      %s", summary(timeRuns(t, 30, nil, d.xeBin, append(tcp, "vm-list")...)))
	t.Logf("xe host-list, TCP + password:    %s", summary(timeRuns(t, 30, nil, d.xeBin, append(tcp, "host-list")...)))
	t.Logf("xe host-list, local socket:      %s", summary(timeRuns(t, 30, local, d.xeBin, "host-list")))
	t.Logf("xe -version (process start):     %s", summary(timeRuns(t, 30, nil, d.xeBin, "-version")))
}

func TestPerfVDIImport(t *testing.T) {
	perfOnly(t)
	d := startDaemon(t)
	const size = 1 << 30
	sr := d.ok("pool-param-get", "uuid="+d.ok("pool-list", "--minimal"), "param-name=default-SR")
	vdi := d.ok("vdi-create", "sr-uuid="+sr, "name-label=perf-disk", "virtual-size=1GiB")
	file := filepath.Join(d.dir, "disk.raw")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*131 + 7)
	}
	for i := 0; i < size>>20; i++ {
		chunk[0] = byte(i)
		f.Write(chunk)
	}
	f.Close()
	session := d.login()
	rate := func(dur time.Duration) float64 { return float64(size) / (1 << 20) / dur.Seconds() }
	var xeTimes, localTimes, rawTimes []time.Duration
	xeRun := func(env []string, args ...string) time.Duration {
		start := time.Now()
		if r := d.xeEnv(env, args...); r.code != 0 {
			t.Fatalf("vdi-import: %+v", r)
		}
		return time.Since(start)
	}
	rawRun := func() time.Duration {
		fh, _ := os.Open(file)
		defer fh.Close()
		req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("http://%s/import_raw_vdi?session_id=%s&vdi=%s&format=raw", d.Addr, session, vdi), fh)
		req.ContentLength = size
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("raw PUT: %s", resp.Status)
		}
		return time.Since(start)
	}
	tcp := []string{"-s", "127.0.0.1", "-p", d.port, "-pw", password, "vdi-import", "uuid=" + vdi, "filename=disk.raw"}
	local := []string{"TOOLSTACKD_SOCKET=" + d.socket()}
	rawRun() // warm the page cache and the image
	for i := range 5 {
		// Alternate the order, so that neither side always goes first.
		if i%2 == 0 {
			xeTimes = append(xeTimes, xeRun(nil, tcp...))
			rawTimes = append(rawTimes, rawRun())
		} else {
			rawTimes = append(rawTimes, rawRun())
			xeTimes = append(xeTimes, xeRun(nil, tcp...))
		}
		localTimes = append(localTimes, xeRun(local, "vdi-import", "uuid="+vdi, "filename=disk.raw"))
	}
	for _, ts := range [][]time.Duration{xeTimes, localTimes, rawTimes} {
		sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
	}
	xm, lm, rm := xeTimes[len(xeTimes)/2], localTimes[len(localTimes)/2], rawTimes[len(rawTimes)/2]
	t.Logf("xe vdi-import of 1 GiB (TCP, whole command): median %s = %.0f MiB/s (runs %v)", xm, rate(xm), xeTimes)
	t.Logf("xe vdi-import of 1 GiB (local socket):        median %s = %.0f MiB/s (runs %v)", lm, rate(lm), localTimes)
	t.Logf("raw HTTP PUT of 1 GiB to /import_raw_vdi:    median %s = %.0f MiB/s (runs %v)", rm, rate(rm), rawTimes)
	t.Logf("ratio xe / raw: %.2f (TCP), %.2f (local socket)", rate(xm)/rate(rm), rate(lm)/rate(rm))
}
