package cli

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"toolstackd/internal/cli/xe"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// thousandVMs adds 1,000 halted VMs to the golden fixture.
func thousandVMs(t testing.TB, d *db.DB, hash string) string {
	host := goldenFixture(t, d, hash)
	_, err := d.Update(func(tx *db.Tx) error {
		for i := range 1000 {
			rec := &dm.VMRecord{NameLabel: fmt.Sprintf("vm-%04d", i), PowerState: dm.VMPowerStateHalted,
				MemoryStaticMax: 1 << 30, VCPUsMax: 1, VCPUsAtStartup: 1, OtherConfig: map[string]string{"n": fmt.Sprint(i)},
				DomainType: dm.DomainTypeHVM}
			if _, err := tx.Insert(dm.VM.Class, "", rec.Row()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return host
}

// BenchmarkVMList is xe vm-list over 1,000 VMs through the whole
// protocol (client library, loopback TCP, server), without process start.
func BenchmarkVMList(b *testing.B) {
	for _, c := range []struct {
		name string
		args []string
	}{
		{"default", []string{"vm-list"}},
		{"minimal", []string{"vm-list", "--minimal"}},
		{"filtered", []string{"vm-list", "other-config:n=500"}},
		{"all-fields", []string{"vm-list", "params=all"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := newHarness(b, thousandVMs)
			for b.Loop() {
				if r := h.xeWith(h.local, func(cl *xe.Client) { cl.Stdout = io.Discard }, c.args...); r.code != 0 {
					b.Fatal(r.err)
				}
			}
		})
	}
}

// BenchmarkUpload compares the thin-CLI upload path (vdi-import: the
// server's HttpPut, the client's PUT, the task) with a plain HTTP PUT to
// the same endpoint, which keeps xapi's contract and throws the data
// away, so that only the transfer is measured.
func BenchmarkUpload(b *testing.B) {
	const size = 256 << 20
	h := newHarness(b, goldenFixture)
	h.route("/import_raw_vdi", func(w http.ResponseWriter, r *http.Request) {
		if h.api.HTTPSession(w, r, 0) == nil {
			return
		}
		task := r.URL.Query().Get("task_id")
		rc := http.NewResponseController(w)
		rc.EnableFullDuplex()
		w.WriteHeader(http.StatusOK)
		rc.Flush()
		_, err := io.Copy(io.Discard, r.Body)
		if task != "" {
			h.api.FinishTask(task, schema.Void, nil, err, false)
		}
	}, http.MethodPut)
	dir := b.TempDir()
	file := filepath.Join(dir, "disk.raw")
	os.WriteFile(file, bytes.Repeat([]byte("0123456789abcdef"), size/16), 0o644)
	b.Run("xe-vdi-import", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			r := h.xeWith(h.http, func(cl *xe.Client) { cl.Cwd = dir }, "vdi-import", "uuid="+gVDIUUID, "filename=disk.raw")
			if r.code != 0 {
				b.Fatal(r.err)
			}
		}
	})
	b.Run("raw-http-put", func(b *testing.B) {
		b.SetBytes(size)
		sess := h.api.SessionFor("")
		_ = sess
		s, _, err := h.api.Invoke(b.Context(), "", "session.login_with_password", "root", rootPW, "", "bench")
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			f, _ := os.Open(file)
			req, _ := http.NewRequest(http.MethodPut, h.http.URL+"/import_raw_vdi?session_id="+s.(string), f)
			req.ContentLength = size
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			f.Close()
		}
	})
}
