package xenops_test

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/testkit/testdaemon"
)

// The metrics module on real QEMU, seen as a client sees it: the issue's
// acceptance test. A guest reads its whole disk and keeps its VCPU busy;
// /rrd_updates shows the VCPU busy and the disk's reads (the issue asks
// for 15 s; 5 s on a quiet machine, which the test logs).

// qmLoadWindow is how soon after the load starts /rrd_updates must show
// it: the daemon samples every 5 s, and a row is complete once the next
// sample is in, about 5 s on a quiet machine. The bound is ten times
// that (a busy machine slows the guest under TCG), and the rows of the
// load stay within the 60 s that /rrd_updates?start=-60 covers.
const qmLoadWindow = 50 * time.Second

// qmBusyCPU is how much more cpu0 (a fraction of one CPU) than the idle
// row some row covering the busy loop must show. Measured under TCG on
// two cores: the guest just after its boot 0.02 to 0.15; its boot 0.6
// to 0.9 on a quiet host; rows of the load 0.65 on a quiet host, 0.45
// with other tests keeping 5 to 8 threads runnable, and as low as 0.24
// at load average 12 (the VCPU thread gets a fraction of a core).
const qmBusyCPU = 0.1

// qmXport is /rrd_updates's JSON: numbers are strings, as xapi sends.
type qmXport struct {
	Meta struct {
		Start  int64    `json:"start,string"`
		Step   int64    `json:"step,string"`
		End    int64    `json:"end,string"`
		Legend []string `json:"legend"`
	} `json:"meta"`
	Data []struct {
		T      int64    `json:"t,string"`
		Values []string `json:"values"`
	} `json:"data"`
}

// column is the values of the legend entry named name, by row time; ok is
// false when the legend has no such entry.
func (x *qmXport) column(name string) (vals map[int64]float64, ok bool) {
	for i, l := range x.Meta.Legend {
		if l != name {
			continue
		}
		vals = make(map[int64]float64, len(x.Data))
		for _, r := range x.Data {
			if i < len(r.Values) {
				if v, err := strconv.ParseFloat(r.Values[i], 64); err == nil {
					vals[r.T] = v
				}
			}
		}
		return vals, true
	}
	return nil, false
}

// qmVCPUTime is the CPU time of VCPU 0's thread of the VM's QEMU, found
// by its name ("CPU 0/TCG", "CPU 0/KVM"), from /proc: the figure cpu0
// should follow. USER_HZ is 100 on x86.
func qmVCPUTime(uuid string) (time.Duration, bool) {
	pids := qemuProcesses(uuid)
	if len(pids) != 1 {
		return 0, false
	}
	dir := "/proc/" + strconv.Itoa(pids[0]) + "/task/"
	tasks, _ := os.ReadDir(dir)
	for _, task := range tasks {
		comm, err := os.ReadFile(dir + task.Name() + "/comm")
		if err != nil || !strings.HasPrefix(string(comm), "CPU 0/") {
			continue
		}
		stat, err := os.ReadFile(dir + task.Name() + "/stat")
		if err != nil {
			return 0, false
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			return 0, false
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 13 {
			return 0, false
		}
		ut, err1 := strconv.ParseInt(f[11], 10, 64)
		st, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			return 0, false
		}
		return time.Duration(ut+st) * 10 * time.Millisecond, true
	}
	return 0, false
}

// qmGet fetches a path of the daemon with the session.
func (e *env) qmGet(path string) (int, []byte) {
	e.t.Helper()
	resp, err := http.Get(e.url + path + "&session_id=" + url.QueryEscape(e.sess))
	if err != nil {
		e.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, b
}

// TestQEMUMetrics starts a VM with an 8 MiB disk on the real daemon with
// the QEMU backend. Once the guest is up it reads its whole disk past
// its page cache and then spins for 8 s; /rrd_updates, polled every
// second, must show within qmLoadWindow a row with cpu0 qmBusyCPU above
// the idle row's and rows of vbd_<device>_read adding up to at least
// half the disk. /vm_rrd serves the VM's RRD with cpu0 and memory.
func TestQEMUMetrics(t *testing.T) {
	g := testGuest(t)
	t.Logf("guest accelerator: %s", g.accel)
	t0 := time.Now()
	d := startDaemon(t, shortTempDir(t), testdaemon.FreeAddr(t, ""), "qemu",
		"TOOLSTACKD_QEMU_ACCEL="+g.accel, "TOOLSTACKD_GUEST_KERNEL_DIRS="+g.dir)
	defer d.Kill()
	e := remote(t, d)
	vm := e.guestVM(g, "qemu-metrics", nil)
	uuid := strings.ToLower(e.uuidOf(vm))
	t.Cleanup(func() {
		for _, pid := range qemuProcesses(uuid) {
			t.Errorf("QEMU %d left running; killing it", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	const size = 8 << 20
	_, vbd := e.m14Disk(vm, "0", size)
	e.call("VM.start", vm, false, false)
	con := e.console(vm, "vt100")
	defer con.Close()
	ready := con.waitFor(t, "GUEST-READY", 2*time.Minute)
	upAt := time.Now()
	t.Logf("guest up %v after the daemon's start", time.Since(t0).Round(time.Millisecond))
	gdev := ""
	if _, list, ok := strings.Cut(ready, "disks:"); ok {
		for _, f := range strings.Fields(list) {
			if strings.HasPrefix(f, "vd") || strings.HasPrefix(f, "sd") || strings.HasPrefix(f, "hd") {
				gdev = f
				break
			}
		}
	}
	if gdev == "" {
		t.Fatalf("the guest lists no disk: %q", ready)
	}
	device, _ := e.field("VBD", vbd, "device").(string)
	if device == "" {
		t.Fatalf("VBD %s of the running VM has no device", vbd)
	}
	prefix := "AVERAGE:vm:" + uuid + ":"
	cpuName, readName := prefix+"cpu0", prefix+"vbd_"+device+"_read"

	q := "/rrd_updates?start=-60&host=false&cf=AVERAGE&json=true&vm_uuid=" + uuid
	var (
		last       *qmXport
		lastStatus int
		lastBody   []byte
	)
	// poll fetches /rrd_updates; it returns the columns of cpu0 and of
	// the disk's reads when the answer has both.
	poll := func() (cpu, reads map[int64]float64, ok bool) {
		t.Helper()
		st, body := e.qmGet(q)
		if st != http.StatusOK {
			lastStatus, lastBody = st, body
			return nil, nil, false
		}
		var x qmXport
		if err := json.Unmarshal(body, &x); err != nil {
			t.Fatalf("/rrd_updates is not JSON: %v\n%.500s", err, body)
		}
		if x.Meta.Step != 5 {
			t.Fatalf("/rrd_updates?start=-60 has rows of %d s, want 5", x.Meta.Step)
		}
		last = &x
		cpu, okC := x.column(cpuName)
		reads, okR := x.column(readName)
		return cpu, reads, okC && okR
	}

	// The idle guest first: a row wholly after GUEST-READY, so that the
	// rise is the load's and not the boot's (a TCG boot keeps the VCPU
	// near 0.9 on a quiet host).
	var idleRow int64
	idleCPU := math.NaN()
	for idleRow == 0 {
		if cpu, _, ok := poll(); ok {
			for ts, v := range cpu {
				if ts-5 > upAt.Unix() && !math.IsNaN(v) && ts > idleRow {
					idleRow, idleCPU = ts, v
				}
			}
		}
		if idleRow == 0 {
			// About 10 s on a quiet machine.
			if time.Since(upAt) > 2*time.Minute {
				t.Fatalf("no complete row of %s within 2 min of the guest's start: last %d %.300s", cpuName, lastStatus, lastBody)
			}
			time.Sleep(time.Second)
		}
	}
	t.Logf("idle guest: cpu0 %.3f in the row ending %v after GUEST-READY", idleCPU, time.Unix(idleRow, 0).Sub(upAt).Round(time.Second))
	// A loaded row must stand above this baseline: a guest that has just
	// booted under TCG is not quite idle yet (0.02 to 0.15 seen).
	busy := idleCPU + qmBusyCPU

	// From here on only this goroutine reads the console: it reports the
	// load's two steps as they end (the echoed command line has "$?"
	// where the output has the status).
	marks := make(chan string, 8)
	go func() {
		for {
			line, err := con.r.ReadString('\n')
			for _, m := range []string{"DD-DONE-", "BUSY-DONE-"} {
				if i := strings.Index(line, m); i >= 0 && !strings.Contains(line, "$?") {
					select {
					case marks <- strings.TrimSpace(line[i:]):
					default:
					}
				}
			}
			if err != nil {
				return
			}
		}
	}()

	vcpu0, vcpuOK := qmVCPUTime(uuid)
	load := time.Now()
	from := load.Unix()
	fmt.Fprintf(con, "echo 3 > /proc/sys/vm/drop_caches; dd if=/dev/%s of=/dev/null bs=64k; echo DD-DONE-$?; "+
		"end=$(($(date +%%s)+8)); while [ $(date +%%s) -lt $end ]; do :; done; echo BUSY-DONE-$?\n", gdev)

	// Rows are stamped with the end of their 5 s. The readings of the
	// sample before the load began are spread back over the rows since
	// that sample, so the disk's bytes count from every row after the
	// idle one; the CPU only from rows ending after the load began.
	var (
		cpuAt, readAt, sumAt time.Duration
		cpuRow, readRow      int64
		maxCPU, readSum      float64
	)
	for {
		if cpu, reads, ok := poll(); ok {
			maxCPU, readSum = 0, 0
			for ts, v := range cpu {
				if ts > from && v > maxCPU {
					maxCPU = v
				}
				if ts > from && v > busy && (cpuRow == 0 || ts < cpuRow) {
					cpuRow = ts
				}
			}
			for ts, v := range reads {
				if ts > idleRow && v > 0 {
					readSum += v * 5
					if readRow == 0 || ts < readRow {
						readRow = ts
					}
				}
			}
			if cpuAt == 0 && cpuRow != 0 {
				cpuAt = time.Since(load)
			}
			if readAt == 0 && readRow != 0 {
				readAt = time.Since(load)
			}
			if sumAt == 0 && readSum >= size/2 {
				sumAt = time.Since(load)
			}
		}
	drain:
		for {
			select {
			case m := <-marks:
				t.Logf("%s at %v", m, time.Since(load).Round(time.Millisecond))
				if !strings.HasSuffix(m, "-0") {
					t.Errorf("a step of the load failed in the guest: %s", m)
				}
			default:
				break drain
			}
		}
		if (cpuAt != 0 && sumAt != 0) || time.Since(load) > qmLoadWindow {
			break
		}
		time.Sleep(time.Second)
	}
	if vcpu1, ok := qmVCPUTime(uuid); ok && vcpuOK {
		t.Logf("VCPU 0's thread used %v of CPU in the %v since the load began (from /proc)",
			(vcpu1 - vcpu0).Round(10*time.Millisecond), time.Since(load).Round(time.Millisecond))
	} else {
		t.Logf("VCPU 0's thread not found in /proc")
	}

	if last == nil {
		t.Fatalf("/rrd_updates never answered 200: last %d %.300s", lastStatus, lastBody)
	}
	cpu, okC := last.column(cpuName)
	reads, okR := last.column(readName)
	mem, okM := last.column(prefix + "memory")
	if !okC || !okR || !okM {
		t.Fatalf("/rrd_updates has no %s, %s or memory; legend %v", cpuName, readName, last.Meta.Legend)
	}
	var rows []string
	for _, r := range last.Data {
		rows = append(rows, fmt.Sprintf("%+d s: cpu0 %.3f read %.0f B/s memory %.0f", r.T-from, cpu[r.T], reads[r.T], mem[r.T]))
	}
	t.Logf("rows of the last /rrd_updates (time relative to the load's start), step %d s:\n%s",
		last.Meta.Step, strings.Join(rows, "\n"))
	if cpuAt == 0 {
		t.Errorf("no row within %v of the load has cpu0 above %.3f, the idle row's plus %v (highest %.3f)", qmLoadWindow, busy, qmBusyCPU, maxCPU)
	} else {
		t.Logf("cpu0 above %.3f seen %v after the load began (row ending %+d s), highest %.3f; within the issue's 15 s: %v",
			busy, cpuAt.Round(time.Millisecond), cpuRow-from, maxCPU, cpuAt <= 15*time.Second)
	}
	switch {
	case readAt == 0:
		t.Errorf("no row of %s after the idle one shows reads within %v of the load", readName, qmLoadWindow)
	case sumAt == 0:
		t.Errorf("within %v of the load, rows of %s add up to %.0f bytes, want at least %d (half the disk)",
			qmLoadWindow, readName, readSum, size/2)
	default:
		t.Logf("%s: reads seen %v after the load began (first row ending %+d s), %.0f bytes in all (disk %d) seen after %v; within the issue's 15 s: %v",
			readName, readAt.Round(time.Millisecond), readRow-from, readSum, size, sumAt.Round(time.Millisecond), sumAt <= 15*time.Second)
	}
	if len(last.Data) > 0 {
		if m := mem[last.Data[0].T]; m <= 0 {
			t.Errorf("memory of the newest row is %v", m)
		}
	}

	// The VM's whole RRD, as XML.
	st, body := e.qmGet("/vm_rrd?uuid=" + uuid)
	if st != http.StatusOK {
		t.Fatalf("/vm_rrd: %d %.300s", st, body)
	}
	var dump struct {
		DS []struct {
			Name string `xml:"name"`
		} `xml:"ds"`
	}
	if err := xml.Unmarshal(body, &dump); err != nil {
		t.Fatalf("/vm_rrd is not an RRD dump: %v\n%.300s", err, body)
	}
	have := map[string]bool{}
	for _, ds := range dump.DS {
		have[strings.TrimSpace(ds.Name)] = true
	}
	for _, want := range []string{"cpu0", "memory", "vbd_" + device + "_read"} {
		if !have[want] {
			t.Errorf("/vm_rrd has no data source %s: %v", want, have)
		}
	}

	e.call("VM.hard_shutdown", vm)
	stop(t, d)
	t.Logf("whole test %v", time.Since(t0).Round(time.Millisecond))
}
