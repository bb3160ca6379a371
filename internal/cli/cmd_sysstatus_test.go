package cli

import (
	"archive/tar"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"toolstackd/internal/cli/xe"
	"toolstackd/internal/sysstatus"
)

// sysStatusHarness is the golden harness with the bug report commands and
// their endpoint and messages.
func sysStatusHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t, goldenFixture)
	h.cli.addSysStatusCommands()
	sysstatus.Register(h.api, h.router, sysstatus.Config{DataDir: t.TempDir()})
	return h
}

func TestHostGetSystemStatus(t *testing.T) {
	h := sysStatusHarness(t)
	dir := t.TempDir()
	r := h.xeWith(h.http, func(cl *xe.Client) { cl.Cwd = dir }, "host-get-system-status", "filename=report.tar",
		"output=tar", "entries=toolstackd-config,system-info")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.err)
	}
	f, err := os.Open(filepath.Join(dir, "report.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var names []string
	tr := tar.NewReader(f)
	for {
		hd, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hd.Name)
	}
	joined := strings.Join(names, "\n")
	for _, want := range []string{"/toolstackd-config/effective-settings.txt", "/system-info/version.txt"} {
		if !strings.Contains(joined, want) {
			t.Errorf("archive lacks %s:\n%s", want, joined)
		}
	}
	if strings.Contains(joined, "toolstackd-db") {
		t.Errorf("archive holds what was not asked for:\n%s", joined)
	}

	// An unknown entry fails with the server's reason, and no file is kept.
	r = h.xeWith(h.http, func(cl *xe.Client) { cl.Cwd = dir }, "host-get-system-status", "filename=bad.tar",
		"entries=nonsense")
	if r.code == 0 || !strings.Contains(r.err, "VALUE_NOT_SUPPORTED") {
		t.Errorf("unknown entry: exit %d: %q", r.code, r.err)
	}
	r = h.xe("host-get-system-status", "filename=x", "output=rar")
	if r.code == 0 || !strings.Contains(r.err, "Invalid output format") {
		t.Errorf("bad output: exit %d: %q", r.code, r.err)
	}
}

func TestHostGetSystemStatusCapabilities(t *testing.T) {
	h := sysStatusHarness(t)
	r := h.xe("host-get-system-status-capabilities")
	if r.code != 0 || !strings.Contains(r.out, "<system-status-capabilities>") || !strings.Contains(r.out, `key="toolstackd-db"`) {
		t.Errorf("exit %d: %q %q", r.code, r.out, r.err)
	}
}

func TestHostBugreportUpload(t *testing.T) {
	h := sysStatusHarness(t)
	var mu sync.Mutex
	var puts []string
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		mu.Lock()
		if n > 0 {
			puts = append(puts, r.Method+" "+r.URL.Path)
		}
		mu.Unlock()
	}))
	defer us.Close()
	r := h.xe("host-bugreport-upload", "url="+us.URL+"/up.tar.gz")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(puts) != 1 || puts[0] != "PUT /up.tar.gz" {
		t.Errorf("uploads: %v", puts)
	}
	r = h.xe("host-bugreport-upload", "url=ftp://example.com/")
	if r.code == 0 || !strings.Contains(r.err, "VALUE_NOT_SUPPORTED") {
		t.Errorf("ftp: exit %d: %q", r.code, r.err)
	}
}
