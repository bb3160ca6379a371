package storage_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// The same VDI suite runs against every driver: the built-in file and
// sharedfs drivers and the sample plugin (scripts/storage-plugin-sample).

type driverCase struct {
	name string
	sr   func(h *harness, sm map[string]string) string
}

var driverCases = []driverCase{
	{"file", func(h *harness, sm map[string]string) string {
		return h.createSR("file", map[string]string{"location": h.t.TempDir()}, sm)
	}},
	{"sharedfs", func(h *harness, sm map[string]string) string {
		return h.createSR("sharedfs", map[string]string{"location": h.t.TempDir()}, sm)
	}},
	{"plugin", func(h *harness, sm map[string]string) string {
		return h.createSR("sample", map[string]string{"path": h.t.TempDir()}, sm)
	}},
}

func TestVDISuite(t *testing.T) {
	for _, dc := range driverCases {
		t.Run(dc.name, func(t *testing.T) {
			h := newHarness(t)
			sr := dc.sr(h, map[string]string{"overprovision": "true"})
			t.Run("ImportExport64MiB", func(t *testing.T) { h.t = t; suiteImportExport(h, sr) })
			t.Run("SnapshotClone", func(t *testing.T) { h.t = t; suiteSnapshotClone(h, sr) })
			t.Run("ConstantTime", func(t *testing.T) { h.t = t; suiteConstantTime(h, sr) })
			t.Run("Resize", func(t *testing.T) { h.t = t; suiteResize(h, sr) })
			t.Run("DeltaExport", func(t *testing.T) { h.t = t; suiteDelta(h, sr) })
			t.Run("VHD", func(t *testing.T) { h.t = t; suiteVHD(h, sr) })
			t.Run("Copy", func(t *testing.T) { h.t = t; suiteCopy(h, sr) })
			t.Run("HalfUpload", func(t *testing.T) { h.t = t; suiteHalfUpload(h, sr) })
			t.Run("BadInput", func(t *testing.T) { h.t = t; suiteBadInput(h, sr) })
			t.Run("Datapath", func(t *testing.T) { h.t = t; suiteDatapath(h, sr) })
			t.Run("ScanForget", func(t *testing.T) { h.t = t; suiteScanForget(h, sr) })
		})
	}
}

func suiteImportExport(h *harness, sr string) {
	t := h.t
	const size = 64 << 20
	vdi := h.createVDI(sr, size)
	data := randomBytes(size)
	h.importRaw(vdi, data)
	got := h.export(vdi, nil)
	sameDisk(t, got, data, size)
	if p := h.int("VDI", vdi, "physical_utilisation"); p < size/2 {
		t.Errorf("physical_utilisation %d after writing %d bytes", p, size)
	}
	// Chunked upload, and the qcow2 format both ways.
	data2 := randomBytes(size / 2)
	resp, body := h.upload(vdi, "raw", bytes.NewReader(data2), -1)
	if resp.StatusCode != 200 {
		t.Fatalf("chunked upload: %s %s", resp.Status, body)
	}
	want := append(append([]byte{}, data2...), data[size/2:]...)
	sameDisk(t, h.export(vdi, nil), want, size)
	q := h.export(vdi, url.Values{"format": {"qcow2"}})
	other := h.createVDI(sr, size)
	resp, body = h.upload(other, "qcow2", bytes.NewReader(q), int64(len(q)))
	if resp.StatusCode != 200 {
		t.Fatalf("qcow2 upload: %s %s", resp.Status, body)
	}
	sameDisk(t, h.export(other, nil), want, size)
	// An HTTP/1.0 upload with no length runs to the end of the connection.
	third := h.createVDI(sr, size)
	task := h.legacyUpload(third, data[:8<<20], true)
	if r := h.waitTask(task); r["status"] != "success" {
		t.Fatalf("legacy upload task: %v", r)
	}
	sameDisk(t, h.export(third, nil), data[:8<<20], size)
	h.ok("VDI.destroy", other)
	h.ok("VDI.destroy", third)
	h.ok("VDI.destroy", vdi)
}

func suiteSnapshotClone(h *harness, sr string) {
	t := h.t
	const size = 32 << 20
	vdi := h.createVDI(sr, size)
	v1 := randomBytes(size)
	h.importRaw(vdi, v1)
	snap := h.str(h.ok("VDI.snapshot", vdi, map[string]string{}))
	rec := h.record("VDI", snap)
	if rec["is_a_snapshot"] != true || rec["snapshot_of"] != vdi {
		t.Fatalf("snapshot record: %v", rec)
	}
	v2 := randomBytes(size)
	h.importRaw(vdi, v2)
	sameDisk(t, h.export(snap, nil), v1, size)
	sameDisk(t, h.export(vdi, nil), v2, size)
	clone := h.str(h.ok("VDI.clone", snap, map[string]string{}))
	if h.field("VDI", clone, "is_a_snapshot") != false {
		t.Fatal("a clone is marked as a snapshot")
	}
	sameDisk(t, h.export(clone, nil), v1, size)
	v3 := randomBytes(size / 4)
	h.importRaw(clone, v3)
	sameDisk(t, h.export(snap, nil), v1, size)
	sameDisk(t, h.export(clone, nil), append(append([]byte{}, v3...), v1[size/4:]...), size)
	c2 := h.str(h.ok("VDI.clone", vdi, map[string]string{}))
	sameDisk(t, h.export(c2, nil), v2, size)
	// Deleting snapshots leaves the live VDIs whole (and the file SRs
	// coalesce their chains).
	for _, v := range []string{snap, c2} {
		h.ok("VDI.destroy", v)
	}
	h.collect(sr)
	sameDisk(t, h.export(vdi, nil), v2, size)
	sameDisk(t, h.export(clone, nil), append(append([]byte{}, v3...), v1[size/4:]...), size)
	h.ok("VDI.destroy", clone)
	h.ok("VDI.destroy", vdi)
	h.collect(sr)
}

// collect runs an SR's garbage collection now, for drivers that have one.
func (h *harness) collect(sr string) {
	h.t.Helper()
	if err := h.svc.CollectGarbage(h.ctx(), sr); err != nil {
		h.t.Fatal(err)
	}
}

func suiteConstantTime(h *harness, sr string) {
	t := h.t
	timeOp := func(method, vdi string) time.Duration {
		best := time.Hour
		for range 3 {
			t0 := time.Now()
			ref := h.str(h.ok(method, vdi, map[string]string{}))
			if d := time.Since(t0); d < best {
				best = d
			}
			h.ok("VDI.destroy", ref)
		}
		return best
	}
	small := h.createVDI(sr, 1<<30)
	big := h.createVDI(sr, 100<<30)
	h.importRaw(small, randomBytes(4<<20))
	h.importRaw(big, randomBytes(4<<20))
	ss, sc := timeOp("VDI.snapshot", small), timeOp("VDI.clone", small)
	bs, bc := timeOp("VDI.snapshot", big), timeOp("VDI.clone", big)
	t.Logf("snapshot 1 GiB %v, 100 GiB %v; clone 1 GiB %v, 100 GiB %v", ss, bs, sc, bc)
	// On a quiet machine the two sizes take the same (8 ms to 400 ms by
	// driver); a copy in proportion to the size would take a hundred
	// times as long, ten times over the bound.
	for _, pair := range [][2]time.Duration{{ss, bs}, {sc, bc}} {
		if pair[1] > 10*pair[0]+100*time.Millisecond {
			t.Errorf("100 GiB took %v against %v for 1 GiB: not constant", pair[1], pair[0])
		}
	}
	if p := h.int("VDI", big, "physical_utilisation"); p > 64<<20 {
		t.Errorf("a thin 100 GiB VDI uses %d bytes", p)
	}
	h.ok("VDI.destroy", small)
	h.ok("VDI.destroy", big)
}

func suiteResize(h *harness, sr string) {
	t := h.t
	vdi := h.createVDI(sr, 8<<20)
	data := randomBytes(8 << 20)
	h.importRaw(vdi, data)
	h.ok("VDI.resize", vdi, fmt.Sprint(24<<20))
	if n := h.int("VDI", vdi, "virtual_size"); n != 24<<20 {
		t.Fatalf("virtual_size %d after resize", n)
	}
	sameDisk(t, h.export(vdi, nil), data, 24<<20)
	h.fails("VDI_TOO_SMALL", "VDI.resize", vdi, fmt.Sprint(4<<20))
	h.ok("VDI.resize", vdi, fmt.Sprint(24<<20)) // same size: nothing to do
	h.ok("VDI.destroy", vdi)
}

func suiteDelta(h *harness, sr string) {
	t := h.t
	const size = 64 << 20
	vdi := h.createVDI(sr, size)
	base := randomBytes(size)
	h.importRaw(vdi, base)
	snap := h.str(h.ok("VDI.snapshot", vdi, map[string]string{}))
	// Change three runs of clusters through a qcow2 upload holding only
	// them.
	dir := t.TempDir()
	patch := filepath.Join(dir, "patch.qcow2")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", patch, fmt.Sprint(size))
	changes := [][2]int64{{1 << 20, 64 << 10}, {10 << 20, 192 << 10}, {60 << 20, 64 << 10}}
	want := append([]byte{}, base...)
	for i, c := range changes {
		run(t, "qemu-io", "-f", "qcow2", "-c", fmt.Sprintf("write -P %d %d %d", 0x41+i, c[0], c[1]), patch)
		for j := c[0]; j < c[0]+c[1]; j++ {
			want[j] = byte(0x41 + i)
		}
	}
	pb, _ := os.ReadFile(patch)
	if resp, body := h.upload(vdi, "qcow2", bytes.NewReader(pb), int64(len(pb))); resp.StatusCode != 200 {
		t.Fatalf("patch upload: %s %s", resp.Status, body)
	}
	sameDisk(t, h.export(vdi, nil), want, size)
	// The delta against the snapshot carries exactly the changed clusters.
	delta := h.export(vdi, url.Values{"format": {"qcow2"}, "base": {snap}})
	dp := filepath.Join(dir, "delta.qcow2")
	os.WriteFile(dp, delta, 0o600)
	run(t, "qemu-img", "check", "-q", dp)
	var exts []struct {
		Start, Length int64
		Data          bool
		Present       bool
	}
	json.Unmarshal([]byte(run(t, "qemu-img", "map", "--output=json", dp)), &exts)
	var got [][2]int64
	for _, e := range exts {
		if e.Data {
			got = append(got, [2]int64{e.Start, e.Length})
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(changes) {
		t.Fatalf("delta holds %v, want %v", got, changes)
	}
	if len(delta) > 2<<20 {
		t.Fatalf("delta is %d bytes for 320 KiB of changes", len(delta))
	}
	// Applying full(snapshot) then the delta rebuilds the VDI.
	restored := h.createVDI(sr, size)
	h.importRaw(restored, h.export(snap, nil))
	if resp, body := h.upload(restored, "qcow2", bytes.NewReader(delta), int64(len(delta))); resp.StatusCode != 200 {
		t.Fatalf("delta upload: %s %s", resp.Status, body)
	}
	sameDisk(t, h.export(restored, nil), want, size)
	// A delta against a VDI with no shared history is computed by
	// comparison, with the same result.
	h.ok("VDI.destroy", snap)
	full := h.createVDI(sr, size)
	h.importRaw(full, base)
	delta2 := h.export(vdi, url.Values{"format": {"qcow2"}, "base": {full}})
	os.WriteFile(dp, delta2, 0o600)
	json.Unmarshal([]byte(run(t, "qemu-img", "map", "--output=json", dp)), &exts)
	got = nil
	for _, e := range exts {
		if e.Data {
			got = append(got, [2]int64{e.Start, e.Length})
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(changes) {
		t.Fatalf("compared delta holds %v, want %v", got, changes)
	}
	for _, v := range []string{vdi, restored, full} {
		h.ok("VDI.destroy", v)
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func suiteCopy(h *harness, sr string) {
	t := h.t
	const size = 16 << 20
	vdi := h.createVDI(sr, size)
	data := randomBytes(size / 2)
	h.importRaw(vdi, data)
	local := h.localSR()
	for _, dst := range []string{sr, local} {
		cp := h.str(h.ok("VDI.copy", vdi, dst, "", ""))
		if h.field("VDI", cp, "SR") != dst {
			t.Fatal("copy on the wrong SR")
		}
		sameDisk(t, h.export(cp, nil), data, size)
		// Into an existing VDI, and back the other way.
		into := h.createVDI(sr, size)
		h.ok("VDI.copy", cp, "", "", into)
		sameDisk(t, h.export(into, nil), data, size)
		h.ok("VDI.destroy", cp)
		h.ok("VDI.destroy", into)
	}
	small := h.createVDI(sr, size/2)
	h.fails("VDI_TOO_SMALL", "VDI.copy", vdi, "", "", small)
	h.ok("VDI.destroy", small)
	h.ok("VDI.destroy", vdi)
}

func suiteDatapath(h *harness, sr string) {
	t := h.t
	vdi := h.createVDI(sr, 8<<20)
	data := randomBytes(1 << 20)
	h.importRaw(vdi, data)
	ctx := h.ctx()
	dp := "vbd/test-vm/" + h.field("VDI", vdi, "uuid").(string)
	d, err := h.svc.Attach(ctx, dp, vdi, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.svc.Activate(ctx, dp, vdi); err != nil {
		t.Fatal(err)
	}
	// What the VM backend would open shows the VDI's data.
	out := filepath.Join(t.TempDir(), "out.raw")
	switch d.Kind {
	case "file":
		if _, err := os.Stat(d.Path); err != nil || d.Format != "qcow2" {
			t.Fatalf("file datapath %+v: %v", d, err)
		}
		run(t, "qemu-img", "dd", "-U", "-f", d.Format, "-O", "raw", "if="+d.Path, "of="+out, "bs=1M", "count=1")
	case "nbd":
		run(t, "qemu-img", "dd", "-f", "raw", "-O", "raw", "if="+d.URI, "of="+out, "bs=1M", "count=1")
	default:
		t.Fatalf("datapath %+v", d)
	}
	if b, _ := os.ReadFile(out); !bytes.Equal(b, data) {
		t.Fatalf("the %s datapath does not show the VDI's data", d.Kind)
	}
	if bd := d.QEMUBlockdev("disk0"); bd["driver"] != d.Format {
		t.Fatalf("blockdev %v", bd)
	}
	if sm := h.record("VDI", vdi)["sm_config"].(map[string]any); sm["host_"+h.host] != "RW" {
		t.Fatalf("sm_config %v", sm)
	}
	// In use: no destroy, no resize, no SR unplug.
	h.fails("VDI_IN_USE", "VDI.destroy", vdi)
	h.fails("VDI_IN_USE", "VDI.resize", vdi, fmt.Sprint(16<<20))
	var pbds []string
	json.Unmarshal(h.ok("SR.get_PBDs", sr), &pbds)
	h.fails("VDI_IN_USE", "PBD.unplug", pbds[0])
	// A second reader shares the attachment; the export works meanwhile.
	if _, err := h.svc.Attach(ctx, "vbd/other/x", vdi, true); err != nil {
		t.Fatal(err)
	}
	sameDisk(t, h.export(vdi, nil), data, 8<<20)
	if err := h.svc.Detach(ctx, dp, vdi); err == nil {
		t.Fatal("detach of an active datapath succeeded")
	}
	if err := h.svc.DestroyDatapath(ctx, dp); err != nil {
		t.Fatal(err)
	}
	if err := h.svc.Detach(ctx, "vbd/other/x", vdi); err != nil {
		t.Fatal(err)
	}
	h.waitNoDatapaths()
	if sm := h.record("VDI", vdi)["sm_config"].(map[string]any); sm["host_"+h.host] != nil {
		t.Fatalf("sm_config %v after detach", sm)
	}
	h.ok("VDI.destroy", vdi)
}

func suiteScanForget(h *harness, sr string) {
	t := h.t
	vdi := h.createVDI(sr, 4<<20)
	uuid := h.field("VDI", vdi, "uuid").(string)
	loc := h.field("VDI", vdi, "location").(string)
	h.ok("VDI.set_name_label", vdi, "kept")
	h.ok("VDI.forget", vdi)
	h.ok("SR.scan", sr)
	var refs []string
	json.Unmarshal(h.ok("SR.get_VDIs", sr), &refs)
	found := ""
	for _, r := range refs {
		if h.field("VDI", r, "location") == loc {
			found = r
		}
	}
	if found == "" {
		t.Fatalf("scan did not find %s again", loc)
	}
	if got := h.field("VDI", found, "uuid"); got != uuid {
		t.Errorf("rescanned VDI has uuid %v, want %s", got, uuid)
	}
	if got := h.field("VDI", found, "name_label"); got != "kept" {
		t.Errorf("rescanned VDI is named %v", got)
	}
	h.ok("VDI.forget", found)
	ref := h.str(h.ok("VDI.introduce", "", "again", "", sr, "user", false, false, map[string]string{}, loc,
		map[string]string{}, map[string]string{}, true, "0", "0", "", false, "19700101T00:00:00Z", ""))
	if n := h.int("VDI", ref, "virtual_size"); n != 4<<20 {
		t.Fatalf("introduced VDI has virtual_size %d", n)
	}
	h.fails("LOCATION_NOT_UNIQUE", "VDI.introduce", "", "twice", "", sr, "user", false, false, map[string]string{}, loc,
		map[string]string{}, map[string]string{}, true, "0", "0", "", false, "19700101T00:00:00Z", "")
	h.fails("VDI_LOCATION_MISSING", "VDI.introduce", "", "none", "", sr, "user", false, false, map[string]string{}, "no-such-volume",
		map[string]string{}, map[string]string{}, true, "0", "0", "", false, "19700101T00:00:00Z", "")
	h.ok("VDI.destroy", ref)
	h.ok("SR.scan", sr)
	json.Unmarshal(h.ok("SR.get_VDIs", sr), &refs)
	var left []string
	for _, r := range refs {
		left = append(left, h.field("VDI", r, "location").(string))
	}
	sort.Strings(left)
	if len(left) != 0 {
		t.Fatalf("VDIs left on the SR: %v", left)
	}
}

// suiteVHD: full and delta transfers as VHD, the format Xen Orchestra's
// backups use: a full backup, then an incremental one against a
// snapshot, restored onto a new VDI.
func suiteVHD(h *harness, sr string) {
	t := h.t
	const size = 24 << 20
	vdi := h.createVDI(sr, size)
	first := randomBytes(size)
	copy(first[8<<20:12<<20], make([]byte, 4<<20)) // a hole
	h.importRaw(vdi, first)
	snap := h.str(h.ok("VDI.snapshot", vdi, map[string]string{}))
	full := h.export(snap, url.Values{"format": {"vhd"}})
	dir := t.TempDir()
	fp := filepath.Join(dir, "full.vhd")
	os.WriteFile(fp, full, 0o600)
	raw := filepath.Join(dir, "full.raw")
	run(t, "qemu-img", "convert", "-f", "vpc", "-O", "raw", fp, raw)
	if b, _ := os.ReadFile(raw); !bytes.Equal(b, first) {
		t.Fatal("QEMU reads the exported VHD differently")
	}
	// Change some of it: a new run of data and a run now zero.
	second := append([]byte{}, first...)
	for i := 2 << 20; i < 5<<20; i++ {
		second[i] = 0x5a
	}
	copy(second[16<<20:18<<20], make([]byte, 2<<20))
	pp := filepath.Join(dir, "patch.qcow2")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", pp, fmt.Sprint(size))
	run(t, "qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 2M 3M", "-c", "write -z 16M 2M", pp)
	pb, _ := os.ReadFile(pp)
	if resp, body := h.upload(vdi, "qcow2", bytes.NewReader(pb), int64(len(pb))); resp.StatusCode != 200 {
		t.Fatalf("patch: %s %s", resp.Status, body)
	}
	sameDisk(t, h.export(vdi, nil), second, size)
	delta := h.export(vdi, url.Values{"format": {"vhd"}, "base": {snap}})
	if len(delta) > 8<<20 {
		t.Errorf("delta VHD is %d bytes for 5 MiB of changes", len(delta))
	}
	restored := h.createVDI(sr, size)
	for _, img := range [][]byte{full, delta} {
		if resp, body := h.upload(restored, "vhd", bytes.NewReader(img), int64(len(img))); resp.StatusCode != 200 {
			t.Fatalf("VHD upload: %s %s", resp.Status, body)
		}
	}
	sameDisk(t, h.export(restored, nil), second, size)
	// Not a VHD, or a VHD of a bigger disk.
	if resp, body := h.upload(restored, "vhd", bytes.NewReader(first[:4096]), 4096); resp.StatusCode != 400 || !strings.HasPrefix(body, "IMPORT_ERROR") {
		t.Fatalf("garbage VHD: %s %s", resp.Status, body)
	}
	small := h.createVDI(sr, size/2)
	if resp, body := h.upload(small, "vhd", bytes.NewReader(full), int64(len(full))); !strings.HasPrefix(body, "VDI_TOO_SMALL") {
		t.Fatalf("VHD bigger than the VDI: %s %s", resp.Status, body)
	}
	for _, v := range []string{small, restored, snap, vdi} {
		h.ok("VDI.destroy", v)
	}
}
