// Package crash kills the real daemon with SIGKILL at random moments while
// clients write, restarts it on the same data dir, and checks that every
// write the daemon acknowledged is there.
package crash

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

const password = "crash-test"

func buildDaemon(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := filepath.Join(t.TempDir(), "toolstackd")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/toolstackd")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

type daemon struct {
	cmd  *exec.Cmd
	addr string
	log  *bytes.Buffer
}

func start(t *testing.T, bin, dir, addr string) *daemon {
	t.Helper()
	cmd := exec.Command(bin, "--data-dir", dir, "--listen", addr, "--backend", "simulator")
	cmd.Env = append(os.Environ(), "TOOLSTACKD_ROOT_PASSWORD="+password)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return &daemon{cmd, addr, &log}
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Kill()
	t.Fatalf("daemon did not start:\n%s", log.String())
	return nil
}

func (d *daemon) kill() {
	d.cmd.Process.Signal(syscall.SIGKILL)
	d.cmd.Wait()
}

var client = &http.Client{Timeout: 10 * time.Second}

// call makes a JSON-RPC call; ok is false when the call was not
// acknowledged (transport error or XenAPI error).
func call(addr, method string, params ...any) (json.RawMessage, error) {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	resp, err := client.Post("http://"+addr+"/jsonrpc", "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Result json.RawMessage
		Error  *struct{ Message string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	if out.Error != nil {
		return nil, fmt.Errorf("%s", out.Error.Message)
	}
	return out.Result, nil
}

func login(t *testing.T, addr string) string {
	r, err := call(addr, "session.login_with_password", "root", password)
	if err != nil {
		t.Fatal(err)
	}
	var s string
	json.Unmarshal(r, &s)
	return s
}

// acked is what the daemon acknowledged: network ref -> the last
// description it confirmed, plus writes that were in flight (which may or
// may not have landed).
type acked struct {
	mu       sync.Mutex
	desc     map[string]string
	inflight map[string]string
}

func TestAcknowledgedWritesSurviveSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test is long")
	}
	bin := buildDaemon(t)
	dir := t.TempDir()
	addr := freePort(t)
	rounds := 30
	if v := os.Getenv("CRASH_ROUNDS"); v != "" {
		fmt.Sscan(v, &rounds)
	}
	state := &acked{desc: map[string]string{}, inflight: map[string]string{}}
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	total := 0
	for round := 0; round < rounds; round++ {
		d := start(t, bin, dir, addr)
		s := login(t, addr)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var n sync.Mutex
		count := 0
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					// Create a network, then update its description.
					name := fmt.Sprintf("r%d-w%d-%d", round, w, i)
					r, err := call(addr, "network.create", s, map[string]any{"name_label": name, "name_description": "v0", "other_config": map[string]any{}})
					if err != nil {
						return // the daemon died
					}
					var ref string
					json.Unmarshal(r, &ref)
					state.mu.Lock()
					state.desc[ref] = "v0"
					state.inflight[ref] = "v1"
					state.mu.Unlock()
					_, err = call(addr, "network.set_name_description", s, ref, "v1")
					state.mu.Lock()
					if err == nil {
						state.desc[ref] = "v1"
						delete(state.inflight, ref)
					}
					state.mu.Unlock()
					if err != nil {
						return
					}
					n.Lock()
					count++
					n.Unlock()
				}
			}()
		}
		time.Sleep(time.Duration(20+rng.IntN(300)) * time.Millisecond)
		d.kill()
		close(stop)
		wg.Wait()
		total += count

		// Restart and check every acknowledged write.
		d = start(t, bin, dir, addr)
		s = login(t, addr)
		r, err := call(addr, "network.get_all_records", s)
		if err != nil {
			t.Fatal(err)
		}
		var recs map[string]struct {
			NameDescription string `json:"name_description"`
		}
		json.Unmarshal(r, &recs)
		state.mu.Lock()
		for ref, want := range state.desc {
			rec, ok := recs[ref]
			switch {
			case !ok:
				t.Errorf("round %d: acknowledged network %s lost\n%s", round, ref, d.log.String())
			case rec.NameDescription != want && rec.NameDescription != state.inflight[ref]:
				t.Errorf("round %d: %s description %q, acknowledged %q", round, ref, rec.NameDescription, want)
			}
			// Whatever the in-flight write did, the state is now settled.
			state.desc[ref] = rec.NameDescription
		}
		clear(state.inflight)
		state.mu.Unlock()
		d.kill()
		if t.Failed() {
			break
		}
	}
	t.Logf("%d rounds, %d objects checked, %d create+update pairs acknowledged", rounds, len(state.desc), total)
}
