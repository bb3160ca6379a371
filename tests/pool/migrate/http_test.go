package migrate

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/tests/pool/suite"
)

// A disk on a member's local SR is written and read through the
// coordinator: the coordinator passes the transfers on to the member,
// whose file holds the bytes; a task the client made on the coordinator
// carries the outcome of an upload without a length (xapi's HTTP/1.0
// form).
func TestDiskTransferReachesTheMember(t *testing.T) {
	ctx, p, c, s := suite.JoinedPool(t)
	r := suite.RPC{T: t, Ctx: ctx, C: c, At: p.Addr(0), S: s}
	member := suite.HostRefs(t, ctx, c, p, 0, s)[1]
	sr := r.LocalSR(member)
	const size = 4 << 20
	vdi := r.Str("VDI.create", map[string]any{"name_label": "on-a-member", "name_description": "", "SR": sr,
		"virtual_size": size, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	data := make([]byte, size)
	if _, err := rand.Read(data[:1<<20]); err != nil {
		t.Fatal(err)
	}
	copy(data[3<<20:], data[:1<<20])
	q := url.Values{"session_id": {s}, "vdi": {vdi}, "format": {"raw"}}
	if st, msg := suite.Transfer(t, http.MethodPut, p.Addr(0), "/import_raw_vdi", q, data); st != http.StatusOK {
		t.Fatalf("import through the coordinator: %d %s", st, msg)
	}
	st, got := suite.Transfer(t, http.MethodGet, p.Addr(0), "/export_raw_vdi", q, nil)
	if st != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("export through the coordinator: %d, %d bytes, equal %v", st, len(got), bytes.Equal(got, data))
	}
	// The bytes are in the member's files, not the coordinator's.
	uuid := r.Str("VDI.get_uuid", vdi)
	if !hasFileNamed(t, p.Hosts[1].DataDir, uuid) || hasFileNamed(t, p.Hosts[0].DataDir, uuid) {
		t.Fatalf("the VDI's volume should be on the member only (member %v, coordinator %v)",
			hasFileNamed(t, p.Hosts[1].DataDir, uuid), hasFileNamed(t, p.Hosts[0].DataDir, uuid))
	}

	// xapi's legacy upload: no length, the body runs to the end of the
	// connection, the task on the coordinator tells the outcome.
	task := r.Str("task.create", "upload", "")
	rand.Read(data[:1<<20]) //nolint:errcheck // never fails
	q.Set("task_id", task)
	conn, err := net.Dial("tcp", p.Addr(0))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "PUT /import_raw_vdi?%s HTTP/1.0\r\n\r\n", q.Encode())
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(status, " 200 ") {
		t.Fatalf("legacy upload's answer: %q %v", status, err)
	}
	if _, err := conn.Write(data); err != nil {
		t.Fatal(err)
	}
	conn.(*net.TCPConn).CloseWrite()
	deadline := time.Now().Add(30 * time.Second)
	for r.Str("task.get_status", task) == "pending" {
		if time.Now().After(deadline) {
			t.Fatal("the upload's task is still pending")
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn.Close()
	if st := r.Str("task.get_status", task); st != "success" {
		t.Fatalf("upload task: %s %s", st, r.Call("task.get_error_info", task))
	}
	q.Del("task_id")
	if st, got := suite.Transfer(t, http.MethodGet, p.Addr(0), "/export_raw_vdi", q, nil); st != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("export after the legacy upload: %d, equal %v", st, bytes.Equal(got, data))
	}

	// A refusal on the member comes back as the member's XenAPI error.
	r.Call("VDI.set_read_only", vdi, true)
	if st, msg := suite.Transfer(t, http.MethodPut, p.Addr(0), "/import_raw_vdi", q, data[:4096]); st != http.StatusForbidden || !strings.HasPrefix(string(msg), "VDI_READONLY") {
		t.Fatalf("import into a read-only VDI on the member: %d %s", st, msg)
	}
	// A session the coordinator does not hold is refused before anything
	// is passed on.
	q.Set("session_id", "OpaqueRef:00000000-0000-0000-0000-000000000000")
	if st, _ := suite.Transfer(t, http.MethodGet, p.Addr(0), "/export_raw_vdi", q, nil); st != http.StatusUnauthorized {
		t.Fatalf("export with a bad session: %d", st)
	}
	// A member asked directly with the coordinator's session serves its
	// own disk (it asks the coordinator about the session).
	q.Set("session_id", s)
	if st, got := suite.Transfer(t, http.MethodGet, p.Addr(1), "/export_raw_vdi", q, nil); st != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("export from the member with the coordinator's session: %d, equal %v", st, bytes.Equal(got, data))
	}
	// A forged identity without the pool secret is refused.
	req, _ := http.NewRequest(http.MethodGet, "http://"+p.Addr(1)+"/export_raw_vdi?vdi="+vdi+"&format=raw", nil)
	req.Header.Set("X-Toolstackd-Identity", `{"Session":"x","User":"root","Roles":1,"Superuser":true}`)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("forged identity: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}

// hasFileNamed reports whether a file whose name contains part is under
// dir.
func hasFileNamed(t *testing.T, dir, part string) bool {
	t.Helper()
	found := false
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(d.Name(), part) {
			found = true
		}
		return nil
	})
	return found
}

// A VM made on the coordinator starts on a member with real QEMU; its
// console is reached through the coordinator and at the address its
// record gives (the member's), with the coordinator's session.
func TestQEMUConsoleOnAMember(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64")
	}
	p, r, hosts := suite.Joined(t, suite.Ctx(t), pooltest.Options{Hosts: 2, Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg"}}})
	c, s, member := r.C, r.S, hosts[1]
	vm := r.Str("VM.create", testdaemon.VMRecord("qemu-on-a-member"))
	r.Call("VM.start_on", vm, member, false, false)
	t.Cleanup(func() { _, _ = c.Call(context.Background(), p.Addr(0), "VM.hard_shutdown", s, vm) })
	uuid := r.Str("VM.get_uuid", vm)
	// One QEMU runs the VM, and its state is the member's.
	if pids := suite.QEMUOf(uuid); len(pids) != 1 {
		t.Fatalf("QEMU processes of the VM: %v", pids)
	}
	if !suite.IsDir(filepath.Join(p.Hosts[1].DataDir, "xenops", "qemu", uuid)) || suite.IsDir(filepath.Join(p.Hosts[0].DataDir, "xenops", "qemu", uuid)) {
		t.Fatal("the VM's QEMU state should be in the member's directory only")
	}
	var loc string
	var consoles []string
	if err := json.Unmarshal(r.Call("VM.get_consoles", vm), &consoles); err != nil {
		t.Fatal(err)
	}
	for _, con := range consoles {
		if r.Str("console.get_protocol", con) == "rfb" {
			loc = r.Str("console.get_location", con)
		}
	}
	u, err := url.Parse(loc)
	if err != nil || loc == "" {
		t.Fatalf("rfb console location %q: %v", loc, err)
	}
	if !strings.HasPrefix(u.Host, strings.Split(p.Addr(1), ":")[0]) {
		t.Errorf("the console's location %s is not the member's address %s", loc, p.Addr(1))
	}
	for _, at := range []string{p.Addr(0), p.Addr(1)} {
		if banner := rfbBanner(t, at, u, s); !strings.HasPrefix(banner, "RFB 003.") {
			t.Fatalf("console through %s: %q", at, banner)
		}
	}
	r.Call("VM.hard_shutdown", vm)
	if pids := suite.QEMUOf(uuid); len(pids) != 0 {
		t.Fatalf("QEMU still runs after hard_shutdown: %v", pids)
	}
}

// rfbBanner opens the console at u through the host at addr and returns
// the first bytes the VNC server sends.
func rfbBanner(t *testing.T, addr string, u *url.URL, s string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "CONNECT %s?%s&session_id=%s HTTP/1.0\r\n\r\n", u.Path, u.RawQuery, s)
	br := bufio.NewReader(conn)
	status, err := br.ReadString('\n')
	if err != nil || !strings.Contains(status, " 200 ") {
		t.Fatalf("CONNECT through %s: %q %v", addr, status, err)
	}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line == "\r\n" {
			break
		}
	}
	banner := make([]byte, 12)
	if _, err := io.ReadFull(br, banner); err != nil {
		t.Fatalf("console through %s: %v", addr, err)
	}
	return string(banner)
}
