package storage_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"toolstackd/internal/testkit/testfs"

	"github.com/google/uuid"
	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/storage"
	"toolstackd/internal/xerr"
)

// Issue 10, finding 8: a file SR may not live in the daemon's state (the
// data directory, anything in it, anything containing it, through links)
// nor in a system directory; SR.create, SR.probe and PBD.plug refuse such
// a location with INVALID_VALUE.
func TestSRLocationRefused(t *testing.T) {
	h := newHarness(t)
	link := filepath.Join(t.TempDir(), "to-data")
	if err := os.Symlink(h.dataDir, link); err != nil {
		t.Fatal(err)
	}
	etcLink := filepath.Join(t.TempDir(), "to-etc")
	os.Symlink("/etc", etcLink)
	inside := filepath.Join(h.dataDir, "storage")
	os.MkdirAll(inside, 0o700)
	bad := []string{h.dataDir, filepath.Dir(h.dataDir), link, link + "/storage", inside, "/", "/etc", "/boot", "/proc", "/usr/lib", etcLink}
	for _, typ := range []string{"file", "sharedfs"} {
		for _, loc := range bad {
			data := h.fails("INVALID_VALUE", "SR.create", h.host, map[string]string{"location": loc}, "0", "bad", "", typ, "user", false, map[string]string{})
			if len(data) != 2 || data[0] != "device_config:location" || data[1] != loc {
				t.Errorf("%s %s: INVALID_VALUE params %v", typ, loc, data)
			}
			h.fails("INVALID_VALUE", "SR.probe", h.host, map[string]string{"location": loc}, typ, map[string]string{})
		}
	}
	// Nothing was written into the data dir by the refused calls.
	for _, e := range listDir(t, h.dataDir) {
		if strings.HasPrefix(e, ".toolstackd-sr") || strings.HasPrefix(e, ".tmp-") {
			t.Errorf("a refused SR.create left %s in the data dir", e)
		}
	}
	// PBD.plug of an SR introduced with its PBD pointing at the data dir.
	sr := h.str(h.ok("SR.introduce", uuid.NewString(), "sneaky", "", "file", "user", false, map[string]string{}))
	pbd := h.str(h.ok("PBD.create", map[string]any{"host": h.host, "SR": sr, "device_config": map[string]string{"location": link},
		"other_config": map[string]string{}}))
	h.fails("INVALID_VALUE", "PBD.plug", pbd)
	// The first-boot SR in the data dir still works, and an ordinary
	// directory is fine.
	h.createVDI(h.localSR(), 1<<20)
	h.createSR("file", map[string]string{"location": t.TempDir()}, nil)
}

// Issue 10, finding 8: SR.destroy deletes the volumes the SR made and its
// own files, never files it found in the directory; SR.forget deletes
// nothing.
func TestSRDestroyKeepsFoundFiles(t *testing.T) {
	h := newHarness(t)
	for _, typ := range []string{"file", "sharedfs"} {
		t.Run(typ, func(t *testing.T) {
			dir := t.TempDir()
			found := uuid.NewString() + ".qcow2" // named like one of the SR's own volumes
			run(t, "qemu-img", "create", "-q", "-f", "qcow2", filepath.Join(dir, found), "1M")
			run(t, "qemu-img", "create", "-q", "-f", "qcow2", filepath.Join(dir, "found.qcow2"), "1M")
			os.WriteFile(filepath.Join(dir, "disk.img"), make([]byte, 1<<20), 0o600)
			os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("keep me"), 0o600)
			os.WriteFile(filepath.Join(dir, ".journal"), []byte("my own journal, not JSON"), 0o600)
			os.Mkdir(filepath.Join(dir, ".locks"), 0o700)
			os.WriteFile(filepath.Join(dir, ".locks", "mine"), []byte("x"), 0o600)
			before := listDir(t, dir)

			sr := h.createSR(typ, map[string]string{"location": dir}, nil)
			var vdis []string
			json.Unmarshal(h.ok("SR.get_VDIs", sr), &vdis)
			if len(vdis) != 3 {
				t.Fatalf("found VDIs: %v", vdis)
			}
			own := h.createVDI(sr, 4<<20)
			h.importRaw(own, randomBytes(1<<20))
			h.str(h.ok("VDI.snapshot", own, map[string]string{}))
			h.str(h.ok("VDI.clone", own, map[string]string{}))
			// A snapshot of a found image turns it into an overlay on a
			// base the SR made; the found image must keep its content.
			foundRef := h.refOf(vdis, "found.qcow2")
			h.str(h.ok("VDI.snapshot", foundRef, map[string]string{}))

			var pbds []string
			json.Unmarshal(h.ok("SR.get_PBDs", sr), &pbds)
			h.ok("PBD.unplug", pbds[0])
			// Forget deletes nothing.
			id := h.field("SR", sr, "uuid").(string)
			during := listDir(t, dir)
			h.ok("SR.forget", sr)
			if after := listDir(t, dir); !slices.Equal(after, during) {
				t.Fatalf("SR.forget changed the directory: %v -> %v", during, after)
			}
			sr = h.str(h.ok("SR.introduce", id, "back", "", typ, "user", false, map[string]string{}))
			pbd := h.str(h.ok("PBD.create", map[string]any{"host": h.host, "SR": sr, "device_config": map[string]string{"location": dir},
				"other_config": map[string]string{}}))
			h.ok("PBD.plug", pbd)
			h.ok("PBD.unplug", pbd)
			h.ok("SR.destroy", sr)

			left := listDir(t, dir)
			var extra []string
			for _, f := range left {
				if !slices.Contains(before, f) {
					extra = append(extra, f)
				}
			}
			for _, f := range before {
				if !slices.Contains(left, f) {
					t.Errorf("SR.destroy deleted %s, which it did not make", f)
				}
			}
			// What may remain beyond the found files: the base the found
			// image now depends on.
			for _, f := range extra {
				if !strings.HasSuffix(f, ".base.qcow2") {
					t.Errorf("SR.destroy left %s behind", f)
				}
			}
			if len(extra) > 1 {
				t.Errorf("SR.destroy left %v", extra)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "notes.txt")); string(b) != "keep me" {
				t.Error("notes.txt changed")
			}
			if _, err := os.Stat(filepath.Join(dir, ".locks", "mine")); err != nil {
				t.Error("a file in .locks that the SR did not make is gone")
			}
			run(t, "qemu-img", "check", "-q", filepath.Join(dir, "found.qcow2"))
		})
	}
}

// Issue 10, finding 1: no path built from VDI locations or images leaves
// the SR. VDI.introduce refuses locations that climb out, and an image
// whose backing file lies outside the SR is not handed out (here to an
// export, which would otherwise read the host file).
func TestVolumePathsStayInSR(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	sr := h.createSR("file", map[string]string{"location": dir}, nil)
	for _, loc := range []string{"../x.qcow2", "/etc/shadow", "a/../../b.img", "..", "../" + filepath.Base(dir) + "/x.qcow2"} {
		h.fails("VDI_LOCATION_MISSING", "VDI.introduce", "", "x", "", sr, "user", false, false, map[string]string{}, loc,
			map[string]string{}, map[string]string{}, true, "0", "0", "OpaqueRef:NULL", false, "19700101T00:00:00Z", "OpaqueRef:NULL")
	}
	outside := t.TempDir()
	secret := bytes.Repeat([]byte("SECRET!!"), 512<<7) // 512 KiB
	os.WriteFile(filepath.Join(outside, "secret.raw"), secret, 0o600)
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-b", filepath.Join(outside, "secret.raw"), "-F", "raw", filepath.Join(dir, "abs.qcow2"), "1M")
	rel, _ := filepath.Rel(dir, filepath.Join(outside, "secret.raw"))
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", rel, "-F", "raw", filepath.Join(dir, "rel.qcow2"), "1M")
	os.Symlink(filepath.Join(outside, "secret.raw"), filepath.Join(dir, "link.raw"))
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", "link.raw", "-F", "raw", filepath.Join(dir, "vialink.qcow2"), "1M")
	h.ok("SR.scan", sr)
	var vdis []string
	json.Unmarshal(h.ok("SR.get_VDIs", sr), &vdis)
	for _, name := range []string{"abs.qcow2", "rel.qcow2", "vialink.qcow2"} {
		v := h.refOf(vdis, name)
		q := url.Values{"vdi": {v}}
		resp, err := http.Get(h.xferURL("/export_raw_vdi", q))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || bytes.Contains(b, []byte("SECRET!!")) {
			t.Errorf("%s: export of an image backed by a host file: %s", name, resp.Status)
		}
	}
	h.waitNoDatapaths()
}

// writePlugin installs a shell plugin driver "evil" whose answers the
// test chooses (files next to the executables).
func writePlugin(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	vol := filepath.Join(root, "volume", "evil")
	os.MkdirAll(vol, 0o755)
	script := func(name, body string) {
		os.WriteFile(filepath.Join(vol, name), []byte("#!/bin/sh\ncat >/dev/null\n"+body+"\n"), 0o755)
	}
	script("Plugin.Query", `echo '{"plugin":"evil","name":"evil","description":"","vendor":"","copyright":"","version":"1","required_api_version":"5.0","features":["VDI_CREATE","VDI_INTRODUCE"],"configuration":{}}'`)
	script("SR.create", `echo '{"configuration":{}}'`)
	script("SR.attach", `echo '"evil-sr"'`)
	script("SR.detach", `echo null`)
	script("SR.stat", `echo '{"name":"e","description":"","total_space":1073741824,"free_space":1073741824}'`)
	for _, m := range []string{"SR.ls", "Volume.create", "Volume.stat"} {
		script(m, `cat "$(dirname "$0")/`+m+`.json"`)
	}
	return root
}

// Issue 10, finding 1: plugin output is hostile: a volume key or URI that
// names a path outside the SR is refused with a clear error.
func TestPluginPathsRefused(t *testing.T) {
	plug := writePlugin(t)
	h := newHarness(t, func(c *storage.Config) { c.PluginDirs = append(c.PluginDirs, plug) })
	vol := filepath.Join(plug, "volume", "evil")
	set := func(m, v string) { os.WriteFile(filepath.Join(vol, m+".json"), []byte(v), 0o644) }
	set("SR.ls", `[]`)
	sr := h.createSR("evil", map[string]string{}, nil)
	vol1 := func(key, uri string) string {
		return fmt.Sprintf(`{"key":%q,"uuid":"","name":"v","description":"","virtual_size":1048576,"physical_utilisation":0,"uri":[%q]}`, key, uri)
	}
	for _, c := range []struct{ key, uri string }{
		{"../../etc/shadow", "raw+file:///srv/v1"},
		{"/etc/shadow", "raw+file:///srv/v1"},
		{"a/../../b", "raw+file:///srv/v1"},
		{"v1", "raw+file:///srv/../etc/shadow"},
	} {
		set("SR.ls", "["+vol1(c.key, c.uri)+"]")
		data := h.fails("SM_PLUGIN_COMMUNICATION_FAILURE", "SR.scan", sr)
		if !strings.Contains(strings.Join(data, " "), "SR.ls") {
			t.Errorf("%v: error does not say what failed: %v", c, data)
		}
		set("Volume.create", vol1(c.key, c.uri))
		h.fails("SM_PLUGIN_COMMUNICATION_FAILURE", "VDI.create", map[string]any{"SR": sr, "virtual_size": "1048576", "name_label": "x",
			"type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{}})
	}
	var vdis []string
	json.Unmarshal(h.ok("SR.get_VDIs", sr), &vdis)
	if len(vdis) != 0 {
		t.Fatalf("VDIs made from hostile plugin output: %v", vdis)
	}
	// A sane answer still works.
	set("SR.ls", "["+vol1("v1", "raw+file:///srv/v1")+"]")
	h.ok("SR.scan", sr)
}

func freeBytes(t *testing.T, dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// Issue 10, finding 7: an import that does not fit in what is left above
// the disk reserve of the file system holding the data dir (and here the
// SR) fails with SR_FULL / 507 before the disk fills, whether the length
// is announced, absent or a lie; the space goes back and a small import
// then works.
func TestImportKeepsDiskReserve(t *testing.T) {
	fs := testfs.MountTmpfs(t, "64m")
	const reserve = 16 << 20
	h := newHarness(t, func(c *storage.Config) {
		c.DataDir = filepath.Join(fs, "data")
		c.ReserveBytes, c.ReservePercent = reserve, -1
	})
	sr := h.localSR()
	vdi := h.createVDI(sr, 60<<20)
	free0 := freeBytes(t, fs)
	data := randomBytes(56 << 20)
	check := func(what string, resp *http.Response, body string) {
		t.Helper()
		if resp.StatusCode != http.StatusInsufficientStorage || !strings.HasPrefix(body, "SR_FULL ") {
			t.Fatalf("%s: %s %q, want 507 SR_FULL", what, resp.Status, body)
		}
		h.waitNoDatapaths()
		if free := freeBytes(t, fs); free < reserve {
			t.Fatalf("%s: %d bytes free, below the reserve", what, free)
		}
		if free := freeBytes(t, fs); free < free0-1<<20 {
			t.Fatalf("%s: the failed import kept %d bytes", what, free0-free)
		}
	}
	// Announced: refused before anything is written.
	resp, body := h.upload(vdi, "raw", bytes.NewReader(data), int64(len(data)))
	check("with a length", resp, body)
	// Chunked, no length: stopped while writing.
	resp, body = h.upload(vdi, "raw", bytes.NewReader(data), -1)
	check("chunked", resp, body)
	// A qcow2 upload goes through the spool, on the same file system.
	resp, body = h.upload(vdi, "qcow2", bytes.NewReader(data), -1)
	check("qcow2 spool", resp, body)
	if left := listDir(t, filepath.Join(fs, "data", "storage", "spool")); len(left) != 0 {
		t.Fatalf("spool files left: %v", left)
	}
	// Into a VDI that already has data (written through qemu-nbd).
	small := randomBytes(4 << 20)
	h.importRaw(vdi, small)
	resp, body = h.upload(vdi, "raw", bytes.NewReader(data), -1)
	if resp.StatusCode != http.StatusInsufficientStorage {
		t.Fatalf("into a VDI with data: %s %q", resp.Status, body)
	}
	if free := freeBytes(t, fs); free < reserve {
		t.Fatalf("%d bytes free, below the reserve", free)
	}
	// Small imports still work.
	other := h.createVDI(sr, 8<<20)
	h.importRaw(other, small)
	sameDisk(t, h.export(other, nil), small, 8<<20)
}

// Issue 10, finding 7: spool and temporary files that transfers killed
// mid-way left behind are removed when the service starts; other files
// stay.
func TestStartupRemovesTransferLeftovers(t *testing.T) {
	h := newHarness(t)
	spool := filepath.Join(h.dataDir, "storage", "spool")
	os.MkdirAll(spool, 0o700)
	local := filepath.Join(h.dataDir, "storage", "local")
	state := filepath.Join(h.dataDir, "storage")
	leftovers := []string{filepath.Join(spool, "import-123456.qcow2"), filepath.Join(local, ".tmp-2222"), filepath.Join(state, ".tmp-3333")}
	keep := []string{filepath.Join(spool, "notes.txt"), filepath.Join(local, "notes.txt"), filepath.Join(state, "notes.txt"),
		filepath.Join(h.dataDir, ".tmp-not-storage's")}
	for _, f := range append(slices.Clone(leftovers), keep...) {
		if err := os.WriteFile(f, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	h.svc.Close()
	router := mux.NewRouter()
	h.srv.Routes(router)
	svc, err := storage.Register(h.srv, router, storage.Config{DataDir: h.dataDir, HostRef: h.host, PluginDirs: []string{},
		ReserveBytes: 64 << 20, ReservePercent: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	for _, f := range leftovers {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s survived the restart", f)
		}
	}
	for _, f := range keep {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("%s was removed: %v", f, err)
		}
	}
}

// Issue 10, finding 7: VDI.copy into a file SR on the data dir's file
// system keeps the disk reserve too (the amount to copy is known before
// it starts).
func TestCopyKeepsDiskReserve(t *testing.T) {
	fs := testfs.MountTmpfs(t, "64m")
	const reserve = 16 << 20
	h := newHarness(t, func(c *storage.Config) {
		c.DataDir = filepath.Join(fs, "data")
		c.ReserveBytes, c.ReservePercent = reserve, -1
	})
	sr := h.localSR()
	vdi := h.createVDI(sr, 20<<20)
	h.importRaw(vdi, randomBytes(20<<20))
	h.str(h.ok("VDI.copy", vdi, sr, "OpaqueRef:NULL", "OpaqueRef:NULL")) // 20 MiB of the ~28 left fit
	var before []string
	json.Unmarshal(h.ok("SR.get_VDIs", sr), &before)
	data := h.fails("SR_FULL", "VDI.copy", vdi, sr, "OpaqueRef:NULL", "OpaqueRef:NULL")
	if len(data) != 2 {
		t.Fatalf("SR_FULL params %v", data)
	}
	var after []string
	json.Unmarshal(h.ok("SR.get_VDIs", sr), &after)
	if len(after) != len(before) {
		t.Fatalf("a refused copy left a VDI: %d -> %d", len(before), len(after))
	}
	if free := freeBytes(t, fs); free < reserve {
		t.Fatalf("%d bytes free, below the reserve", free)
	}
}

// A transfer writes the progress and outcome of the task it is given:
// someone else's task is refused (finding 2 of the security issue), the
// owner's own is accepted.
func TestTransferRefusesOthersTask(t *testing.T) {
	h := newHarness(t)
	hash, err := api.HashPassword("va-pw", h.srv.Cfg.PasswordIterations)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Update(func(tx *db.Tx) error {
		_, err := tx.Insert(dm.User.Class, "", (&dm.UserRecord{ShortName: "va", OtherConfig: map[string]string{}, PasswordHash: hash}).Row())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var roles []string
	json.Unmarshal(h.ok("role.get_by_name_label", "vm-admin"), &roles)
	h.ok("subject.create", map[string]any{"subject_identifier": api.LocalSubjectID("va"), "other_config": map[string]any{}, "roles": roles})
	va := h.str(h.ok("session.login_with_password", "va", "va-pw", "1.0", "test"))

	vdi := h.createVDI(h.localSR(), 1<<20)
	rootTask := h.str(h.ok("task.create", "root's", ""))
	data := randomBytes(1 << 20)
	q := url.Values{"vdi": {vdi}, "format": {"raw"}, "task_id": {rootTask}, "session_id": {va}}
	req, _ := http.NewRequest(http.MethodPut, h.http.URL+"/import_raw_vdi?"+q.Encode(), bytes.NewReader(data))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), xerr.RBACPermissionDenied) {
		t.Fatalf("import by vm-admin into root's task: %s %s", resp.Status, body)
	}
	if st := h.field("task", rootTask, "status"); st != "pending" {
		t.Fatalf("root's task was touched: status %v", st)
	}
	// The vm-admin's own task works.
	raw, rerr := h.call("task.create", va, "mine", "")
	if rerr != nil {
		t.Fatal(rerr)
	}
	own := h.str(raw)
	q.Set("task_id", own)
	req, _ = http.NewRequest(http.MethodPut, h.http.URL+"/import_raw_vdi?"+q.Encode(), bytes.NewReader(data))
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("import into own task: %s %s", resp.Status, body)
	}
}
