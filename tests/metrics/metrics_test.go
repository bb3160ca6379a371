// Package metrics tests the metrics module (issue 15) through the real
// daemon: the data-source messages, /rrd_updates and the RRD handlers, a
// metric plugin writing into the plugin directory, the data sources on
// GET /metrics, the xe data-source commands, and archives kept across a
// restart. The daemon samples every 5 s of real time, so these tests wait
// for ticks.
package metrics

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"toolstackd/internal/testkit/testdaemon"
)

// env is one daemon and a session on it.
type env struct {
	t *testing.T
	d *testdaemon.Daemon
	s string
}

func (e *env) call(method string, params ...any) json.RawMessage {
	e.t.Helper()
	raw, err := e.d.Client().Call(method, append([]any{e.s}, params...)...)
	if err != nil {
		e.t.Fatalf("%s: %v", method, err)
	}
	return raw
}

func (e *env) str(raw json.RawMessage) string {
	e.t.Helper()
	s, err := testdaemon.String(raw)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// get fetches a path with the session and returns status and body.
func (e *env) get(path string) (int, string) {
	e.t.Helper()
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	resp, err := http.Get(e.d.URL + path + sep + "session_id=" + e.s)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

type dataSource struct {
	Name    string `json:"name_label"`
	Enabled bool   `json:"enabled"`
	Units   string `json:"units"`
}

func (e *env) dataSources(method, ref string) map[string]dataSource {
	e.t.Helper()
	var dss []dataSource
	if err := json.Unmarshal(e.call(method, ref), &dss); err != nil {
		e.t.Fatal(err)
	}
	out := map[string]dataSource{}
	for _, d := range dss {
		out[d.Name] = d
	}
	return out
}

// waitFor polls cond every 500 ms until it holds or bound passes, and
// logs how long it took. The daemon samples every 5 s: what the test
// waits for comes within two or three ticks on a quiet machine, and the
// bounds are ten times that.
func (e *env) waitFor(what string, bound time.Duration, cond func() bool) {
	e.t.Helper()
	start := time.Now()
	deadline := start.Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("after %v: %s", bound, what)
		}
		time.Sleep(500 * time.Millisecond)
	}
	e.t.Logf("%s after %v", what, time.Since(start).Round(time.Millisecond))
}

// xport is /rrd_updates's XML.
type xport struct {
	Meta struct {
		Start  int64    `xml:"start"`
		Step   int64    `xml:"step"`
		End    int64    `xml:"end"`
		Rows   int      `xml:"rows"`
		Legend []string `xml:"legend>entry"`
	} `xml:"meta"`
	Data []struct {
		T int64    `xml:"t"`
		V []string `xml:"v"`
	} `xml:"data>row"`
}

func TestMetricsModule(t *testing.T) {
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator"})
	e := &env{t: t, d: d, s: d.Login(t)}
	var hosts []string
	if err := json.Unmarshal(e.call("host.get_all"), &hosts); err != nil || len(hosts) != 1 {
		t.Fatalf("host.get_all: %v %v", hosts, err)
	}
	host := hosts[0]
	hostUUID := e.str(e.call("host.get_uuid", host))
	vm := e.str(e.call("VM.create", testdaemon.VMRecord("metrics")))
	vmUUID := e.str(e.call("VM.get_uuid", vm))
	// A disk on the pool's default SR, whose traffic the host's SR sources
	// add up.
	var pools []string
	if err := json.Unmarshal(e.call("pool.get_all"), &pools); err != nil || len(pools) != 1 {
		t.Fatalf("pool.get_all: %v %v", pools, err)
	}
	sr := e.str(e.call("pool.get_default_SR", pools[0]))
	srUUID := e.str(e.call("SR.get_uuid", sr))
	vdi := e.str(e.call("VDI.create", map[string]any{"name_label": "metrics disk", "name_description": "", "SR": sr,
		"virtual_size": "16777216", "type": "user", "sharable": false, "read_only": false,
		"other_config": map[string]string{}, "xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}}))
	e.call("VBD.create", map[string]any{"VM": vm, "VDI": vdi, "userdevice": "0", "bootable": true,
		"mode": "RW", "type": "Disk", "unpluggable": true, "empty": false, "other_config": map[string]string{},
		"qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	e.call("VM.start", vm, false, false)

	// A plugin writing into the daemon's plugin directory, one host
	// source and one of the VM's.
	plugins := filepath.Join(d.DataDir, "metrics-plugins")
	if _, err := exec.LookPath("python3"); err == nil {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		script, _ := filepath.Abs("../../scripts/rrd-sample-plugin")
		cmd := exec.CommandContext(ctx, "python3", script, "--dir", plugins, "--name", "e2e", "--interval", "1", "--vm", vmUUID)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); _ = cmd.Wait(); t.Logf("plugin output: %s", out.String()) }()
	} else {
		t.Log("python3 is missing: not running the sample plugin")
	}

	// Within a few ticks the host's and the VM's standard sources are
	// recorded.
	e.waitFor("the VM's cpu0 and memory recorded", 2*time.Minute, func() bool {
		ds := e.dataSources("VM.get_data_sources", vm)
		return ds["cpu0"].Enabled && ds["memory"].Enabled
	})
	// The simulator's disk moves a few MB/s: the VBD's and the SR's
	// sources show it.
	srRead := "read_" + srUUID[:8]
	e.waitFor("the SR's read rate on the host", 2*time.Minute, func() bool {
		raw, err := d.Client().Call("host.query_data_source", e.s, host, srRead)
		var v float64
		return err == nil && json.Unmarshal(raw, &v) == nil && v > 0
	})
	for _, n := range []string{"io_throughput_read_" + srUUID[:8], "iops_total_" + srUUID[:8]} {
		if !e.dataSources("host.get_data_sources", host)[n].Enabled {
			t.Errorf("host data source %s not recorded", n)
		}
	}
	hostDS := e.dataSources("host.get_data_sources", host)
	for _, n := range []string{"cpu0", "cpu_avg", "memory_total_kib", "memory_free_kib", "loadavg", "pif_aggr_rx"} {
		if !hostDS[n].Enabled {
			t.Errorf("host data source %s: %+v", n, hostDS[n])
		}
	}
	if u := hostDS["memory_total_kib"].Units; u != "KiB" {
		t.Errorf("memory_total_kib units %q", u)
	}
	var total float64
	if err := json.Unmarshal(e.call("host.query_data_source", host, "memory_total_kib"), &total); err != nil || total <= 0 {
		t.Fatalf("host memory_total_kib %v %v", total, err)
	}
	var mem float64
	e.waitFor("VM memory known", 2*time.Minute, func() bool {
		raw, err := d.Client().Call("VM.query_data_source", e.s, vm, "memory")
		return err == nil && json.Unmarshal(raw, &mem) == nil && mem > 0
	})
	if mem != 128<<20 {
		t.Errorf("the VM's memory: %v, want %v", mem, 128<<20)
	}
	// An unknown source: INTERNAL_ERROR naming it, as xapi.
	if _, err := d.Client().Call("host.query_data_source", e.s, host, "no_such_source"); err == nil || !strings.Contains(err.Error(), "no_such_source") {
		t.Fatalf("query of an unknown source: %v", err)
	}

	// The plugin's sources: the host's gauge is queryable, its optional
	// source can be recorded and forgotten, the VM's source is the VM's.
	if _, err := exec.LookPath("python3"); err == nil {
		e.waitFor("the plugin's gauge recorded", 2*time.Minute, func() bool {
			return e.dataSources("host.get_data_sources", host)["sample_gauge"].Enabled
		})
		var g float64
		if err := json.Unmarshal(e.call("host.query_data_source", host, "sample_gauge"), &g); err != nil || g < 0 || g > 100 {
			t.Fatalf("sample_gauge %v %v", g, err)
		}
		if ds := e.dataSources("host.get_data_sources", host)["sample_uptime"]; ds.Name == "" || ds.Enabled {
			t.Fatalf("the plugin's optional source: %+v", ds)
		}
		e.call("host.record_data_source", host, "sample_uptime")
		if !e.dataSources("host.get_data_sources", host)["sample_uptime"].Enabled {
			t.Fatal("record_data_source did not enable sample_uptime")
		}
		e.call("host.forget_data_source_archives", host, "sample_uptime")
		if e.dataSources("host.get_data_sources", host)["sample_uptime"].Enabled {
			t.Fatal("forget_data_source_archives left sample_uptime enabled")
		}
		e.waitFor("the plugin's VM source", 2*time.Minute, func() bool {
			return e.dataSources("VM.get_data_sources", vm)["sample_vm_gauge"].Enabled
		})
	}

	// /rrd_updates, XML, the host and one VM.
	// Five minutes back: well inside the 5 s archive's ten minutes (a
	// start at its very edge picks the 1 min archive, as xapi's rule says).
	start := time.Now().Add(-5 * time.Minute).Unix()
	st, body := e.get(fmt.Sprintf("/rrd_updates?start=%d&host=true&vm_uuid=%s&cf=AVERAGE&interval=5", start, vmUUID))
	if st != http.StatusOK {
		t.Fatalf("/rrd_updates: %d %s", st, body)
	}
	var x xport
	if err := xml.Unmarshal([]byte(body), &x); err != nil {
		t.Fatalf("/rrd_updates does not parse: %v\n%.500s", err, body)
	}
	legend := strings.Join(x.Meta.Legend, " ")
	for _, want := range []string{"AVERAGE:host:" + hostUUID + ":cpu_avg", "AVERAGE:vm:" + vmUUID + ":cpu0", "AVERAGE:vm:" + vmUUID + ":memory"} {
		if !strings.Contains(legend, want) {
			t.Errorf("legend lacks %s: %s", want, legend)
		}
	}
	if x.Meta.Step != 5 || len(x.Data) < 2 || x.Data[0].T <= x.Data[1].T || len(x.Data[0].V) != len(x.Meta.Legend) {
		t.Fatalf("xport: step %d, %d rows, first %+v", x.Meta.Step, len(x.Data), x.Data)
	}
	// Bad parameters: 400 with a reason.
	for _, q := range []string{"/rrd_updates?start=abc", "/rrd_updates", "/vm_rrd?uuid=../../etc/passwd"} {
		if st, body := e.get(q); st != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", q, st, body)
		}
	}
	if st, body := e.get("/vm_rrd?uuid=" + vmUUID); st != http.StatusOK || !strings.Contains(body, "<name>cpu0</name>") {
		t.Errorf("/vm_rrd: %d %.300s", st, body)
	}

	// GET /metrics carries the data sources.
	st, body = e.get("/metrics")
	if st != http.StatusOK {
		t.Fatalf("/metrics: %d", st)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	seen := map[string]bool{}
	for _, m := range fams["toolstackd_data_source"].GetMetric() {
		var lv []string
		for _, l := range m.GetLabel() {
			lv = append(lv, l.GetName()+"="+l.GetValue())
		}
		seen[strings.Join(lv, ",")] = true
	}
	for _, want := range []string{"name=cpu_avg,owner=host,uuid=" + hostUUID, "name=cpu0,owner=vm,uuid=" + vmUUID} {
		if !seen[want] {
			t.Errorf("/metrics lacks toolstackd_data_source{%s}", want)
		}
	}

	// xe's data-source commands.
	xe := testdaemon.BuildCommand(t, "xe", "XE_BIN")
	_, port, _ := net.SplitHostPort(d.Addr)
	out, err := exec.Command(xe, "-s", "127.0.0.1", "-p", port, "-pw", testdaemon.DefaultPassword,
		"vm-data-source-list", "uuid="+vmUUID).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "cpu0") {
		t.Errorf("xe vm-data-source-list: %v\n%s", err, out)
	}
	out, err = exec.Command(xe, "-s", "127.0.0.1", "-p", port, "-pw", testdaemon.DefaultPassword,
		"host-data-source-query", "uuid="+hostUUID, "data-source=memory_total_kib").CombinedOutput()
	if v, perr := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err != nil || perr != nil || v <= 0 {
		t.Errorf("xe host-data-source-query: %v\n%s", err, out)
	}

	// A clean stop archives every RRD; the next start serves them at once,
	// before its first tick.
	_, before := e.get("/host_rrd")
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{hostUUID, vmUUID} {
		if _, err := os.Stat(filepath.Join(d.DataDir, "rrds", u+".gz")); err != nil {
			t.Fatalf("no archive for %s after a clean stop: %v", u, err)
		}
	}
	d2 := d.Restart()
	e2 := &env{t: t, d: d2, s: d2.Login(t)}
	st, after := e2.get("/host_rrd")
	if st != http.StatusOK {
		t.Fatalf("/host_rrd after restart: %d", st)
	}
	if lastUpdate(before) == 0 || lastUpdate(after) < lastUpdate(before) {
		t.Fatalf("host RRD last updated at %d before the restart and %d after", lastUpdate(before), lastUpdate(after))
	}
	if st, body := e2.get("/vm_rrd?uuid=" + vmUUID); st != http.StatusOK || !strings.Contains(body, "<name>memory</name>") {
		t.Fatalf("the VM's RRD after a restart: %d %.200s", st, body)
	}
}

// lastUpdate reads <lastupdate> from an rrdtool XML dump.
func lastUpdate(dump string) int64 {
	_, rest, ok := strings.Cut(dump, "<lastupdate>")
	if !ok {
		return 0
	}
	v, _, _ := strings.Cut(rest, "</lastupdate>")
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}
