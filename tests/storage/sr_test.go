package storage_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/storage"
)

func TestFirstBoot(t *testing.T) {
	h := newHarness(t)
	sr := h.localSR()
	rec := h.record("SR", sr)
	if rec["type"] != "file" || rec["content_type"] != "user" || rec["shared"] != false {
		t.Fatalf("Local storage: %v", rec)
	}
	if oc := rec["other_config"].(map[string]any); oc["i18n-key"] != "local-storage" {
		t.Fatalf("other_config %v", oc)
	}
	var pbds []string
	json.Unmarshal(h.ok("SR.get_PBDs", sr), &pbds)
	if len(pbds) != 1 || h.field("PBD", pbds[0], "currently_attached") != true || h.field("PBD", pbds[0], "host") != h.host {
		t.Fatalf("PBDs %v", pbds)
	}
	loc := h.record("PBD", pbds[0])["device_config"].(map[string]any)["location"].(string)
	if !strings.HasPrefix(loc, h.dataDir) {
		t.Fatalf("Local storage at %s, not under the data dir %s", loc, h.dataDir)
	}
	var pools []string
	json.Unmarshal(h.ok("pool.get_all"), &pools)
	p := h.record("pool", pools[0])
	for _, f := range []string{"default_SR", "suspend_image_SR", "crash_dump_SR"} {
		if p[f] != sr {
			t.Errorf("pool.%s = %v", f, p[f])
		}
	}
	hr := h.record("host", h.host)
	for _, f := range []string{"suspend_image_sr", "crash_dump_sr"} {
		if hr[f] != sr {
			t.Errorf("host.%s = %v", f, hr[f])
		}
	}
	if h.int("SR", sr, "physical_size") <= 0 {
		t.Error("no physical_size")
	}
	ops := fmt.Sprint(rec["allowed_operations"])
	for _, op := range []string{"scan", "vdi_create", "vdi_snapshot", "unplug"} {
		if !strings.Contains(ops, op) {
			t.Errorf("allowed_operations %s lacks %s", ops, op)
		}
	}
	// One SM record per driver, with capabilities.
	var sms map[string]map[string]any
	json.Unmarshal(h.ok("SM.get_all_records"), &sms)
	types := map[string]map[string]any{}
	for _, r := range sms {
		types[r["type"].(string)] = r
	}
	for _, typ := range []string{"file", "sharedfs", "sample"} {
		r := types[typ]
		if r == nil {
			t.Fatalf("no SM record for %s: %v", typ, sms)
		}
		caps := fmt.Sprint(r["capabilities"])
		if !strings.Contains(caps, "VDI_SNAPSHOT") || !strings.Contains(caps, "VDI_CREATE") {
			t.Errorf("%s capabilities %s", typ, caps)
		}
		if len(r["configuration"].(map[string]any)) == 0 {
			t.Errorf("%s has no configuration keys", typ)
		}
	}
	var supported []string
	json.Unmarshal(h.ok("SR.get_supported_types"), &supported)
	if fmt.Sprint(supported) != "[file sample sharedfs]" {
		t.Errorf("supported types %v", supported)
	}
}

// After a restart the plugged PBDs are plugged again and the datapaths a
// running VM holds are attached again.
func TestRestart(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sr := h.localSR()
	vdi := h.createVDI(sr, 8<<20)
	data := randomBytes(1 << 20)
	h.importRaw(vdi, data)
	if _, err := h.svc.Attach(ctx, "vbd/vm/disk", vdi, false); err != nil {
		t.Fatal(err)
	}
	if err := h.svc.Activate(ctx, "vbd/vm/disk", vdi); err != nil {
		t.Fatal(err)
	}
	h.svc.Close()
	// A second service over the same database and data dir, as a daemon
	// restart makes.
	router := mux.NewRouter()
	h.srv.Routes(router)
	svc, err := storage.Register(h.srv, router, storage.Config{DataDir: h.dataDir, HostRef: h.host, FirstBoot: false,
		PluginDirs: []string{pluginDir(t)}})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	dps := svc.Datapaths()
	if st := dps[vdi]["vbd/vm/disk"]; !st.Activated || st.Mode != storage.RW {
		t.Fatalf("datapaths after restart: %v", dps)
	}
	hs := httptest.NewServer(router)
	defer hs.Close()
	h.http = hs
	sameDisk(t, h.export(vdi, nil), data, 8<<20)
	if err := svc.DestroyDatapath(ctx, "vbd/vm/disk"); err != nil {
		t.Fatal(err)
	}
	h.svc = svc
	h.ok("VDI.destroy", vdi)
}

func TestSRLifecycle(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	sr := h.createSR("file", map[string]string{"location": dir}, nil)
	uuid := h.field("SR", sr, "uuid").(string)
	vdi := h.createVDI(sr, 4<<20)
	h.ok("VDI.set_name_label", vdi, "boot disk")
	h.ok("SR.set_name_label", sr, "renamed")
	snap := h.str(h.ok("VDI.snapshot", vdi, map[string]string{}))
	vdiUUID := h.field("VDI", vdi, "uuid").(string)
	// Probe finds it.
	xml := h.str(h.ok("SR.probe", h.host, map[string]string{"location": dir}, "file", map[string]string{}))
	if !strings.Contains(xml, "<UUID>"+uuid+"</UUID>") {
		t.Fatalf("probe: %s", xml)
	}
	// Forget needs the PBD unplugged; forget then introduce brings back
	// the SR and, after a scan, its VDIs with their names and snapshot
	// relation.
	var pbds []string
	json.Unmarshal(h.ok("SR.get_PBDs", sr), &pbds)
	h.fails("SR_HAS_PBD", "SR.forget", sr)
	h.fails("SR_HAS_PBD", "SR.destroy", sr)
	h.fails("OPERATION_NOT_ALLOWED", "PBD.destroy", pbds[0])
	h.ok("PBD.unplug", pbds[0])
	h.ok("PBD.unplug", pbds[0]) // unplugging twice is fine
	if ops := fmt.Sprint(h.field("SR", sr, "allowed_operations")); !strings.Contains(ops, "plug") || strings.Contains(ops, "scan") {
		t.Errorf("allowed_operations of an unplugged SR: %s", ops)
	}
	h.fails("SR_NOT_ATTACHED", "SR.scan", sr)
	h.fails("SR_NOT_ATTACHED", "VDI.snapshot", vdi, map[string]string{})
	h.ok("SR.forget", sr)
	h.fails("HANDLE_INVALID", "VDI.get_record", vdi)
	sr = h.str(h.ok("SR.introduce", uuid, "back", "", "file", "user", false, map[string]string{}))
	h.fails("SR_HAS_NO_PBDS", "SR.scan", sr)
	h.fails("SR_UUID_EXISTS", "SR.introduce", uuid, "twice", "", "file", "user", false, map[string]string{})
	pbd := h.str(h.ok("PBD.create", map[string]any{"host": h.host, "SR": sr, "device_config": map[string]string{"location": dir},
		"other_config": map[string]string{}}))
	h.fails("PBD_EXISTS", "PBD.create", map[string]any{"host": h.host, "SR": sr, "device_config": map[string]string{"location": dir},
		"other_config": map[string]string{}})
	h.ok("PBD.plug", pbd)
	h.ok("SR.scan", sr)
	var vdis []string
	json.Unmarshal(h.ok("SR.get_VDIs", sr), &vdis)
	if len(vdis) != 2 {
		t.Fatalf("VDIs after introduce and scan: %v", vdis)
	}
	var back, backSnap string
	for _, v := range vdis {
		if h.field("VDI", v, "uuid") == vdiUUID {
			back = v
		} else {
			backSnap = v
		}
	}
	if back == "" || h.field("VDI", back, "name_label") != "boot disk" {
		t.Fatalf("VDI after introduce: %v", vdis)
	}
	if h.field("VDI", backSnap, "is_a_snapshot") != true || h.field("VDI", backSnap, "snapshot_of") != back {
		t.Fatalf("snapshot relation lost: %v", h.record("VDI", backSnap))
	}
	_ = snap
	// Destroy removes everything the SR made, and only that.
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("keep me"), 0o600)
	h.ok("PBD.unplug", pbd)
	h.ok("SR.destroy", sr)
	if left := listDir(t, dir); fmt.Sprint(left) != "[notes.txt]" {
		t.Fatalf("left after SR.destroy: %v", left)
	}
	h.fails("HANDLE_INVALID", "SR.get_record", sr)
}

// Image files dropped into a file SR appear at the next scan, and a
// deleted file's VDI goes.
func TestScanPicksUpFiles(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	sr := h.createSR("file", map[string]string{"location": dir}, nil)
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", filepath.Join(dir, "debian.qcow2"), "10M")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-b", "debian.qcow2", "-F", "qcow2", filepath.Join(dir, "overlay.qcow2"), "10M")
	os.WriteFile(filepath.Join(dir, "blob.img"), make([]byte, 1<<20), 0o600)
	os.WriteFile(filepath.Join(dir, "readme.txt"), []byte("not a disk"), 0o600)
	h.ok("SR.scan", sr)
	var vdis []string
	json.Unmarshal(h.ok("SR.get_VDIs", sr), &vdis)
	byLoc := map[string]map[string]any{}
	for _, v := range vdis {
		r := h.record("VDI", v)
		byLoc[r["location"].(string)] = r
	}
	if len(byLoc) != 3 || byLoc["debian.qcow2"] == nil || byLoc["overlay.qcow2"] == nil || byLoc["blob.img"] == nil {
		t.Fatalf("scanned: %v", byLoc)
	}
	if byLoc["debian.qcow2"]["read_only"] != true {
		t.Error("a backing file is not read-only")
	}
	if n := h.int("VDI", h.refOf(vdis, "blob.img"), "virtual_size"); n != 1<<20 {
		t.Errorf("blob.img virtual_size %v", n)
	}
	// Clone of the read-only image shares it.
	clone := h.str(h.ok("VDI.clone", h.refOf(vdis, "debian.qcow2"), map[string]string{}))
	if h.int("VDI", clone, "virtual_size") != 10<<20 {
		t.Fatal("clone size")
	}
	os.Remove(filepath.Join(dir, "blob.img"))
	h.ok("SR.scan", sr)
	json.Unmarshal(h.ok("SR.get_VDIs", sr), &vdis)
	if len(vdis) != 3 {
		t.Fatalf("after deleting blob.img: %d VDIs", len(vdis))
	}
}

func (h *harness) refOf(vdis []string, loc string) string {
	for _, v := range vdis {
		if h.field("VDI", v, "location") == loc {
			return v
		}
	}
	h.t.Fatalf("no VDI at %s", loc)
	return ""
}

// Operations lock their objects through current_operations: a second
// conflicting call waits and then reports OTHER_OPERATION_IN_PROGRESS.
func TestOperationLocking(t *testing.T) {
	h := newHarness(t, func(c *storage.Config) { c.OpWait = 20 * time.Millisecond })
	sr := h.localSR()
	vdi := h.createVDI(sr, 256<<20)
	h.importRaw(vdi, randomBytes(256<<20))
	// A slow copy holds the VDI; the copy shows in current_operations.
	task := h.str(h.ok("Async.VDI.copy", vdi, sr, "", ""))
	deadline := time.Now().Add(10 * time.Second)
	for {
		ops := h.record("VDI", vdi)["current_operations"].(map[string]any)
		if ops[task] == "copy" {
			break
		}
		if time.Now().After(deadline) || h.field("task", task, "status") != "pending" {
			t.Fatalf("copy never showed in current_operations (task %v)", h.record("task", task))
		}
		time.Sleep(time.Millisecond)
	}
	ao := fmt.Sprint(h.field("VDI", vdi, "allowed_operations"))
	if strings.Contains(ao, "destroy") || strings.Contains(ao, "resize") {
		t.Errorf("allowed_operations during a copy: %s", ao)
	}
	data := h.fails("OTHER_OPERATION_IN_PROGRESS", "VDI.resize", vdi, fmt.Sprint(512<<20))
	if data[0] != "VDI" || data[1] != vdi || data[2] != "copy" {
		t.Fatalf("error params %v", data)
	}
	r := h.waitTask(task)
	if r["status"] != "success" {
		t.Fatalf("copy: %v", r)
	}
	if ops := h.record("VDI", vdi)["current_operations"].(map[string]any); len(ops) != 0 {
		t.Fatalf("current_operations after the copy: %v", ops)
	}
	h.ok("VDI.resize", vdi, fmt.Sprint(512<<20))
}

// Cancelling the task of an upload stops it: the task ends cancelled and
// the VDI is free again.
func TestCancelImport(t *testing.T) {
	h := newHarness(t)
	vdi := h.createVDI(h.localSR(), 1<<30)
	task := h.str(h.ok("task.create", "upload", ""))
	pr, pw := ioPipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.uploadQuiet(vdi, task, pr)
	}()
	pw.Write(randomBytes(8 << 20))
	for h.int("task", task, "progress") == 0 && h.field("task", task, "progress") == "0.0" {
		time.Sleep(10 * time.Millisecond)
	}
	h.ok("task.cancel", task)
	// Keep sending: the server stops reading once it sees the cancel.
	stop := make(chan struct{})
	go func() {
		buf := make([]byte, 1<<20)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := pw.Write(buf); err != nil {
				return
			}
		}
	}()
	r := h.waitTask(task)
	close(stop)
	pw.Close()
	<-done
	if r["status"] != "cancelled" {
		t.Fatalf("task %v", r)
	}
	if n := len(h.svc.Datapaths()); n != 0 {
		t.Fatalf("datapaths left: %v", h.svc.Datapaths())
	}
	h.ok("VDI.destroy", vdi)
}

// A sharedfs SR seen by two hosts: a VDI attached read-write on one
// cannot be attached on the other.
func TestSharedSRTwoHosts(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	sr := h.createSR("sharedfs", map[string]string{"location": dir}, nil)
	if h.field("SR", sr, "shared") != true {
		t.Fatal("sharedfs SR is not shared")
	}
	vdi := h.createVDI(sr, 4<<20)
	// The second host: its own database, the same directory.
	h2 := newHarness(t)
	sr2 := h2.str(h2.ok("SR.introduce", h.field("SR", sr, "uuid"), "shared", "", "sharedfs", "user", true, map[string]string{}))
	pbd := h2.str(h2.ok("PBD.create", map[string]any{"host": h2.host, "SR": sr2, "device_config": map[string]string{"location": dir},
		"other_config": map[string]string{}}))
	h2.ok("PBD.plug", pbd)
	h2.ok("SR.scan", sr2)
	var vdis2 []string
	json.Unmarshal(h2.ok("SR.get_VDIs", sr2), &vdis2)
	if len(vdis2) != 1 {
		t.Fatalf("second host sees %v", vdis2)
	}
	ctx := context.Background()
	if _, err := h.svc.Attach(ctx, "vbd/a/x", vdi, false); err != nil {
		t.Fatal(err)
	}
	_, err := h2.svc.Attach(ctx, "vbd/b/x", vdis2[0], false)
	if err == nil || !strings.Contains(err.Error(), "VDI_IN_USE") {
		t.Fatalf("attach on the second host: %v", err)
	}
	h2.fails("VDI_IN_USE", "VDI.snapshot", vdis2[0], map[string]string{})
	if err := h.svc.Detach(ctx, "vbd/a/x", vdi); err != nil {
		t.Fatal(err)
	}
	if _, err := h2.svc.Attach(ctx, "vbd/b/x", vdis2[0], false); err != nil {
		t.Fatal(err)
	}
	h2.svc.Detach(ctx, "vbd/b/x", vdis2[0])
	// One host reads, then also writes (the attachment is upgraded in
	// place); a snapshot meanwhile is fine; the other host is kept out.
	if _, err := h.svc.Attach(ctx, "export/x", vdi, true); err != nil {
		t.Fatal(err)
	}
	h.str(h.ok("VDI.snapshot", vdi, map[string]string{}))
	if _, err := h.svc.Attach(ctx, "vbd/a/x", vdi, false); err != nil {
		t.Fatalf("upgrading to read-write: %v", err)
	}
	if _, err := h2.svc.Attach(ctx, "vbd/b/x", vdis2[0], true); err == nil || !strings.Contains(err.Error(), "VDI_IN_USE") {
		t.Fatalf("reading on the second host while the first writes: %v", err)
	}
	h.svc.Detach(ctx, "vbd/a/x", vdi)
	h.svc.Detach(ctx, "export/x", vdi)
}

// on_boot=reset: every activation starts from the content the VDI had
// when it was set.
func TestResetOnBoot(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	vdi := h.createVDI(h.localSR(), 4<<20)
	golden := randomBytes(1 << 20)
	h.importRaw(vdi, golden)
	h.ok("VDI.set_on_boot", vdi, "reset")
	if h.field("VDI", vdi, "on_boot") != "reset" {
		t.Fatal("on_boot not set")
	}
	h.importRaw(vdi, randomBytes(1<<20)) // the VM "writes"
	if _, err := h.svc.Attach(ctx, "vbd/vm/d", vdi, false); err != nil {
		t.Fatal(err)
	}
	if err := h.svc.Activate(ctx, "vbd/vm/d", vdi); err != nil {
		t.Fatal(err)
	}
	h.fails("VDI_IN_USE", "VDI.set_on_boot", vdi, "persist")
	h.svc.DestroyDatapath(ctx, "vbd/vm/d")
	sameDisk(t, h.export(vdi, nil), golden, 4<<20)
	h.ok("VDI.set_on_boot", vdi, "persist")
	h.ok("VDI.set_allow_caching", vdi, true)
	if h.field("VDI", vdi, "allow_caching") != true {
		t.Fatal("allow_caching")
	}
	h.ok("VDI.destroy", vdi)
}

// Many clients at once: creates, snapshots, transfers and destroys on one
// SR keep the records and the files in step.
func TestConcurrentOperations(t *testing.T) {
	h := newHarness(t)
	sr := h.localSR()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vdi := h.str(h.ok("VDI.create", map[string]any{"SR": sr, "virtual_size": fmt.Sprint(8 << 20), "name_label": fmt.Sprint("c", i),
				"type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{}}))
			data := randomBytes(4 << 20)
			h.importRaw(vdi, data)
			s := h.str(h.ok("VDI.snapshot", vdi, map[string]string{}))
			c := h.str(h.ok("VDI.clone", s, map[string]string{}))
			got := h.export(c, nil)
			if string(got[:4<<20]) != string(data) {
				errs <- fmt.Errorf("clone %d differs", i)
			}
			for _, v := range []string{c, s, vdi} {
				h.ok("VDI.destroy", v)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	h.collect(sr)
	var vdis []string
	json.Unmarshal(h.ok("SR.get_VDIs", sr), &vdis)
	if len(vdis) != 0 {
		t.Fatalf("VDIs left: %v", vdis)
	}
	dir := h.srDir(sr)
	for _, f := range listDir(t, dir) {
		if !strings.HasPrefix(f, ".") {
			t.Errorf("file left in the SR: %s", f)
		}
	}
}

// A VDI destroyed while the last bytes of its export are still on their
// way (as XO destroys a snapshot as soon as it has exported it) waits for
// the export's datapath to go, instead of failing with VDI_IN_USE.
func TestDestroyWaitsForAnEndingExport(t *testing.T) {
	h := newHarness(t)
	vdi := h.createVDI(h.localSR(), 8<<20)
	resp, err := http.Get(h.xferURL("/export_raw_vdi", url.Values{"vdi": {vdi}}))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.ReadFull(resp.Body, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	destroyed := make(chan *rpcError, 1)
	go func() {
		_, e := h.call("VDI.destroy", h.sess, vdi)
		destroyed <- e
	}()
	time.Sleep(200 * time.Millisecond) // the destroy is under way, the export not done
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if e := <-destroyed; e != nil {
		t.Fatalf("VDI.destroy as the export ended: %v", e)
	}
}

// The plugin's SR lifecycle: probe, scan, forget and introduce, destroy.
func TestPluginSRLifecycle(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	sr := h.createSR("sample", map[string]string{"path": dir}, nil)
	uuid := h.field("SR", sr, "uuid").(string)
	vdi := h.createVDI(sr, 4<<20)
	h.ok("VDI.set_name_label", vdi, "plugged in")
	xml := h.str(h.ok("SR.probe", h.host, map[string]string{"path": dir}, "sample", map[string]string{}))
	if !strings.Contains(xml, "<UUID>"+uuid+"</UUID>") {
		t.Fatalf("probe: %s", xml)
	}
	var pbds []string
	json.Unmarshal(h.ok("SR.get_PBDs", sr), &pbds)
	h.ok("PBD.unplug", pbds[0])
	h.ok("SR.forget", sr)
	sr = h.str(h.ok("SR.introduce", uuid, "again", "", "sample", "user", false, map[string]string{}))
	pbd := h.str(h.ok("PBD.create", map[string]any{"host": h.host, "SR": sr, "device_config": map[string]string{"path": dir},
		"other_config": map[string]string{}}))
	h.ok("PBD.plug", pbd)
	h.ok("SR.scan", sr)
	var vdis []string
	json.Unmarshal(h.ok("SR.get_VDIs", sr), &vdis)
	if len(vdis) != 1 || h.field("VDI", vdis[0], "name_label") != "plugged in" {
		t.Fatalf("after introduce and scan: %v", vdis)
	}
	h.ok("PBD.unplug", pbd)
	h.ok("SR.destroy", sr)
	if left := listDir(t, dir); len(left) != 0 {
		t.Fatalf("left after SR.destroy: %v", left)
	}
}

// Cancelling a copy removes the half-made VDI.
func TestCancelCopy(t *testing.T) {
	h := newHarness(t)
	sr := h.localSR()
	vdi := h.createVDI(sr, 512<<20)
	h.importRaw(vdi, randomBytes(512<<20))
	var before []string
	json.Unmarshal(h.ok("SR.get_VDIs", sr), &before)
	task := h.str(h.ok("Async.VDI.copy", vdi, sr, "", ""))
	for h.record("VDI", vdi)["current_operations"].(map[string]any)[task] == nil && h.field("task", task, "status") == "pending" {
		time.Sleep(time.Millisecond)
	}
	h.ok("task.cancel", task)
	r := h.waitTask(task)
	if r["status"] == "success" {
		t.Skip("the copy finished before the cancel")
	}
	if r["status"] != "cancelled" {
		t.Fatalf("task %v", r)
	}
	var after []string
	json.Unmarshal(h.ok("SR.get_VDIs", sr), &after)
	if len(after) != len(before) {
		t.Fatalf("VDIs before %d, after a cancelled copy %d", len(before), len(after))
	}
	h.waitNoDatapaths()
	dir := h.srDir(sr)
	n := 0
	for _, f := range listDir(t, dir) {
		if strings.HasSuffix(f, ".qcow2") {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("images in the SR after a cancelled copy: %v", listDir(t, dir))
	}
}
