package storage_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestPerformanceFigures measures what docs/performance.md reports under
// "Issue 6: storage". It runs only with TOOLSTACKD_PERF=1 (it moves
// gigabytes): TOOLSTACKD_PERF=1 go test ./tests/storage -run Performance -v
// TOOLSTACKD_PERF_MIB sets the transfer size (default 1024).
func TestPerformanceFigures(t *testing.T) {
	if os.Getenv("TOOLSTACKD_PERF") != "1" {
		t.Skip("set TOOLSTACKD_PERF=1 to measure")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("the measurements use curl as the client")
	}
	size := int64(1024) << 20
	if v, err := strconv.Atoi(os.Getenv("TOOLSTACKD_PERF_MIB")); err == nil && v > 0 {
		size = int64(v) << 20
	}
	h := newHarness(t)
	dir := t.TempDir()
	sr := h.createSR("file", map[string]string{"location": dir}, map[string]string{"overprovision": "true"})
	data := randomBytes(int(size))
	rounds := 5
	if v, err := strconv.Atoi(os.Getenv("TOOLSTACKD_PERF_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}

	// Each round pairs a baseline with the transfer it is compared to, as
	// the disk's speed drifts: the same bytes written to a file on the
	// same disk with fsync (an import ends with a flush), and read back
	// from it with a cold and a warm page cache; then an import into a
	// new VDI on a file SR in the same directory, and its export.
	base := filepath.Join(dir, "baseline.raw")
	// The client is curl, in its own process, as a real client would be;
	// it uploads from a file in the page cache (on tmpfs if there is one).
	src := filepath.Join(t.TempDir(), "upload.raw")
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		src = filepath.Join("/dev/shm", fmt.Sprintf("toolstackd-perf-%d.raw", os.Getpid()))
	}
	os.WriteFile(src, data, 0o600)
	defer os.Remove(src)
	var wBase, wBase2, rCold, rWarm, wImp, wImp2, xCold, xWarm, hCold, hWarm []time.Duration
	// The transport's own ceiling: the baseline file served by net/http
	// (sendfile) to the same client.
	fs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, base) }))
	defer fs.Close()
	for range rounds {
		os.Remove(base)
		dropCaches()
		t0 := time.Now()
		f, _ := os.Create(base)
		f.Write(data)
		f.Sync()
		f.Close()
		wBase = append(wBase, time.Since(t0))
		// The same, starting writeback every 32 MiB as the import does.
		os.Remove(base)
		dropCaches()
		t0 = time.Now()
		f, _ = os.Create(base)
		for off := 0; off < len(data); off += 32 << 20 {
			end := min(off+32<<20, len(data))
			f.Write(data[off:end])
			syscall.SyncFileRange(int(f.Fd()), int64(off), int64(end-off), 2)
		}
		f.Sync()
		f.Close()
		wBase2 = append(wBase2, time.Since(t0))
		dropCaches()
		rCold = append(rCold, timeRead(base))
		rWarm = append(rWarm, timeRead(base))
		dropCaches()
		hCold = append(hCold, curl(t, "-o", "/dev/null", fs.URL))
		hWarm = append(hWarm, curl(t, "-o", "/dev/null", fs.URL))
		os.Remove(base)

		vdi := h.createVDI(sr, size)
		dropCaches()
		wImp = append(wImp, timeImport(t, h, vdi, src))
		dropCaches()
		xCold = append(xCold, timeExport(t, h, vdi, size))
		xWarm = append(xWarm, timeExport(t, h, vdi, size))
		// Again into the same VDI, which now has data: through qemu-nbd.
		dropCaches()
		wImp2 = append(wImp2, timeImport(t, h, vdi, src))
		h.ok("VDI.destroy", vdi)
	}
	mbps := func(d time.Duration) float64 { return float64(size) / d.Seconds() / (1 << 20) }
	ratio := func(base, x []time.Duration) float64 {
		var rs []float64
		for i := range base {
			rs = append(rs, base[i].Seconds()/x[i].Seconds())
		}
		sort.Float64s(rs)
		return rs[len(rs)/2]
	}
	med := func(ds []time.Duration) time.Duration {
		c := append([]time.Duration{}, ds...)
		sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
		return c[len(c)/2]
	}
	fmt.Printf("| %d MiB, median of %d rounds | toolstackd MiB/s | file on the same disk MiB/s | ratio (median of per-round ratios) |\n|---|---|---|---|\n", size>>20, rounds)
	fmt.Printf("| import: PUT /import_raw_vdi raw, until flushed | %.0f | %.0f (write + fsync) | %.2f |\n", mbps(med(wImp)), mbps(med(wBase)), ratio(wBase, wImp))
	fmt.Printf("| import, against a file written with early writeback (sync_file_range every 32 MiB) + fsync | %.0f | %.0f | %.2f |\n", mbps(med(wImp)), mbps(med(wBase2)), ratio(wBase2, wImp))
	fmt.Printf("| import into a VDI that has data (through qemu-nbd) | %.0f | %.0f (write + fsync) | %.2f |\n", mbps(med(wImp2)), mbps(med(wBase)), ratio(wBase, wImp2))
	fmt.Printf("| export: GET /export_raw_vdi raw, cold cache | %.0f | %.0f (read) | %.2f |\n", mbps(med(xCold)), mbps(med(rCold)), ratio(rCold, xCold))
	fmt.Printf("| export: GET /export_raw_vdi raw, warm cache | %.0f | %.0f (read) | %.2f |\n", mbps(med(xWarm)), mbps(med(rWarm)), ratio(rWarm, xWarm))
	fmt.Printf("| reference: the baseline file served by net/http, cold | %.0f | %.0f (read) | %.2f |\n", mbps(med(hCold)), mbps(med(rCold)), ratio(rCold, hCold))
	fmt.Printf("| reference: the baseline file served by net/http, warm | %.0f | %.0f (read) | %.2f |\n", mbps(med(hWarm)), mbps(med(rWarm)), ratio(rWarm, hWarm))
	fmt.Printf("| export against the net/http reference, cold / warm | | | %.2f / %.2f |\n", ratio(hCold, xCold), ratio(hWarm, xWarm))

	// Snapshot and clone of thin VDIs, as XenAPI calls (JSON-RPC round
	// trip included), median of 9.
	fmt.Printf("\n| thin VDI | VDI.snapshot | VDI.clone |\n|---|---|---|\n")
	for _, gib := range []int64{1, 100} {
		v := h.createVDI(sr, gib<<30)
		h.importRaw(v, data[:16<<20])
		fmt.Printf("| %d GiB | %v | %v |\n", gib, median(t, h, "VDI.snapshot", v), median(t, h, "VDI.clone", v))
		h.ok("VDI.destroy", v)
	}
}

func timeRead(path string) time.Duration {
	t0 := time.Now()
	f, _ := os.Open(path)
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Read(buf); err != nil {
			break
		}
	}
	f.Close()
	return time.Since(t0)
}

func curl(t *testing.T, args ...string) time.Duration {
	t.Helper()
	t0 := time.Now()
	out, err := exec.Command("curl", append([]string{"-sS", "-f"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("curl: %v %s", err, out)
	}
	return time.Since(t0)
}

func timeImport(t *testing.T, h *harness, vdi, src string) time.Duration {
	return curl(t, "-o", "/dev/null", "-T", src, h.xferURL("/import_raw_vdi", url.Values{"vdi": {vdi}, "format": {"raw"}}))
}

func timeExport(t *testing.T, h *harness, vdi string, size int64) time.Duration {
	return curl(t, "-o", "/dev/null", h.xferURL("/export_raw_vdi", url.Values{"vdi": {vdi}}))
}

func median(t *testing.T, h *harness, method, vdi string) time.Duration {
	var ds []time.Duration
	for range 9 {
		t0 := time.Now()
		ref := h.str(h.ok(method, vdi, map[string]string{}))
		ds = append(ds, time.Since(t0))
		h.ok("VDI.destroy", ref)
	}
	for i := range ds {
		for j := i + 1; j < len(ds); j++ {
			if ds[j] < ds[i] {
				ds[i], ds[j] = ds[j], ds[i]
			}
		}
	}
	return ds[len(ds)/2].Round(100 * time.Microsecond)
}

// dropCaches empties the page cache (root only; otherwise a no-op).
func dropCaches() {
	syscall.Sync()
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
}
