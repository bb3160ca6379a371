// Package diskfull runs the real daemon with its data dir on a small
// tmpfs, fills that file system while clients write over XML-RPC, and
// checks that a full disk is a condition the daemon lives through: failing
// writes get a clear XenAPI error and change nothing, reads and logins go
// on, writes resume by themselves once space is freed, and every write
// that was acknowledged survives a SIGKILL and restart.
package diskfull

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"toolstackd/internal/testkit/testfs"

	"toolstackd/internal/testkit/testdaemon"
)

const password = "diskfull-test"

// start runs the daemon on dir and addr and waits until root can log in.
func start(t *testing.T, dir, addr string, extra ...string) *testdaemon.Daemon {
	t.Helper()
	return testdaemon.Start(t, testdaemon.Options{DataDir: dir, Listen: addr, Backend: "simulator", ExtraArgs: extra,
		Password: password, StartTimeout: 20 * time.Second, Ready: func(d *testdaemon.Daemon) bool {
			_, err := call(addr, "session.login_with_password", "root", password)
			return err == nil
		}})
}

// call makes one XML-RPC call. A transport error means the outcome is
// unknown; a *testdaemon.Error means the daemon answered with a failure.
func call(addr, method string, params ...any) (any, error) {
	c := testdaemon.Client{URL: "http://" + addr, Timeout: 15 * time.Second}
	return c.CallXML(method, params...)
}

func isAPIError(err error) (*testdaemon.Error, bool) { return testdaemon.AsError(err) }

// outcome is what the daemon said about one write.
type outcome int

const (
	acked   outcome = iota // success reply: must be durable
	refused                // XenAPI error reply: must not be visible
	unknown                // no reply: either is allowed
)

// ledger records every write the clients made and what they were told.
type ledger struct {
	mu      sync.Mutex
	creates map[string]outcome // network name_label -> outcome
	refs    map[string]string  // name_label -> ref, for acknowledged creates
	counter map[int]outcome    // description value -> outcome of setting it
	lastAck int                // the newest acknowledged description
	// errors seen, by text, for the report
	errs map[string]int
	// acknowledgements per writer after the disk was freed
	ackAfterFree []int
	freed        bool
}

func (l *ledger) note(err error) {
	if e, ok := isAPIError(err); ok {
		l.errs[e.Error()]++
	}
}

func outcomeOf(err error) outcome {
	if err == nil {
		return acked
	}
	if _, ok := isAPIError(err); ok {
		return refused
	}
	return unknown
}

func TestDiskFullIsRecoverable(t *testing.T) {
	mnt := testfs.MountTmpfs(t, "16m")
	t0 := time.Now()
	bin := testdaemon.Build(t)
	t.Logf("built the daemon in %v", time.Since(t0).Round(time.Millisecond))
	dataDir := filepath.Join(mnt, "data")
	// The redo log shares the full disk: it must degrade and catch up,
	// never hang or stop the daemon.
	redo := filepath.Join(mnt, "redo.log")
	addr := testdaemon.FreeAddr(t, "")
	d := start(t, dataDir, addr, "--redo-log", redo)

	sess := login(t, addr)
	counterNet := mustString(t, must(t, addr, "network.create", sess, map[string]any{
		"name_label": "counter", "name_description": "0", "other_config": map[string]string{}}))

	const creators = 3
	l := &ledger{creates: map[string]outcome{}, refs: map[string]string{}, counter: map[int]outcome{},
		errs: map[string]int{}, ackAfterFree: make([]int, creators+1)}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < creators; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("w%d-%05d", w, i)
				v, err := call(addr, "network.create", sess, map[string]any{"name_label": name,
					"name_description": strings.Repeat("x", 200), "other_config": map[string]string{"writer": strconv.Itoa(w)}})
				l.mu.Lock()
				l.creates[name] = outcomeOf(err)
				l.note(err)
				if err == nil {
					l.refs[name], _ = v.(string)
					if l.freed {
						l.ackAfterFree[w]++
					}
				}
				l.mu.Unlock()
				if err != nil {
					time.Sleep(2 * time.Millisecond) // a refused client retries, but not in a tight loop
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_, err := call(addr, "network.set_name_description", sess, counterNet, strconv.Itoa(i))
			l.mu.Lock()
			l.counter[i] = outcomeOf(err)
			l.note(err)
			if err == nil {
				l.lastAck = i
				if l.freed {
					l.ackAfterFree[creators]++
				}
			}
			l.mu.Unlock()
			if err != nil {
				time.Sleep(2 * time.Millisecond)
			}
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	// Let some writes land, then take every free byte.
	time.Sleep(300 * time.Millisecond)
	filler := filepath.Join(mnt, "filler")
	testfs.Fill(t, filler)
	filledAt := time.Now()
	t.Logf("filled the tmpfs")

	// Writes must start failing with a clear error, and the daemon live on.
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		n := 0
		for _, o := range l.creates {
			if o == refused {
				n++
			}
		}
		l.mu.Unlock()
		if n >= 20 {
			break
		}
		if time.Now().After(deadline) || !d.Alive() {
			t.Fatalf("writes did not fail on a full disk (%d refused; daemon alive: %v)\n%s", n, d.Alive(), d.LogTail(4000))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d creates refused %v after the disk filled", 20, time.Since(filledAt).Round(time.Millisecond))
	// Every refusal is a XenAPI error that says what is wrong.
	l.mu.Lock()
	for text := range l.errs {
		if !strings.HasPrefix(text, "INTERNAL_ERROR ") || !strings.Contains(strings.ToLower(text), "no space left on device") {
			t.Errorf("a write on a full disk: want INTERNAL_ERROR saying the disk is full, got %s", text)
		}
		if strings.Contains(text, mnt) {
			t.Errorf("a client was told the host's paths: %s", text)
		}
	}
	l.mu.Unlock()
	// Stay full a while, clients pushing, so that the daemon is well into
	// its back-off when space returns.
	time.Sleep(700 * time.Millisecond)
	if !d.Alive() {
		t.Fatalf("the daemon died on a full disk:\n%s", d.LogTail(4000))
	}
	// Reads go on, and so do logins (sessions are not written to disk).
	if _, err := call(addr, "network.get_all_records", sess); err != nil {
		t.Errorf("a read on a full disk: %v", err)
	}
	if _, err := call(addr, "session.login_with_password", "root", password); err != nil {
		t.Errorf("a login on a full disk: %v", err)
	}

	// Free the space: writes must resume without a restart.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freedAt := time.Now()
	l.mu.Lock()
	l.freed = true
	l.mu.Unlock()
	var resumed time.Duration
	for i := 0; ; i++ {
		_, err := call(addr, "network.create", sess, map[string]any{"name_label": fmt.Sprintf("probe-%d", i), "name_description": "", "other_config": map[string]string{}})
		l.mu.Lock()
		l.creates[fmt.Sprintf("probe-%d", i)] = outcomeOf(err)
		l.mu.Unlock()
		if err == nil {
			resumed = time.Since(freedAt)
			break
		}
		if time.Since(freedAt) > 10*time.Second {
			t.Fatalf("writes did not resume within 10s of freeing the disk; last error: %v\n%s", err, d.LogTail(4000))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("first write succeeded %v after space returned", resumed.Round(time.Millisecond))
	if _, err := call(addr, "session.login_with_password", "root", password); err != nil {
		t.Errorf("a login after space returned: %v", err)
	}
	// Every client gets writes through again.
	deadline = time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		all := true
		for _, n := range l.ackAfterFree {
			all = all && n >= 3
		}
		l.mu.Unlock()
		if all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every writer resumed after the disk was freed: acknowledgements per writer %v", l.ackAfterFree)
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	l.mu.Lock()
	defer l.mu.Unlock()
	counts := map[outcome]int{}
	for _, o := range l.creates {
		counts[o]++
	}
	t.Logf("creates: %d acknowledged, %d refused, %d unknown; counter acknowledged up to %d; errors seen: %v",
		counts[acked], counts[refused], counts[unknown], l.lastAck, l.errs)
	if counts[refused] == 0 {
		t.Fatal("no write was refused: the disk never looked full")
	}

	check := func(when string) {
		t.Helper()
		s := login(t, addr)
		recs, err := call(addr, "network.get_all_records", s)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		byName := map[string]string{}
		var desc string
		for ref, r := range recs.(map[string]any) {
			rec := r.(map[string]any)
			name, _ := rec["name_label"].(string)
			byName[name] = ref
			if ref == counterNet {
				desc, _ = rec["name_description"].(string)
			}
		}
		lost, phantom := 0, 0
		for name, o := range l.creates {
			_, there := byName[name]
			switch {
			case o == acked && !there:
				lost++
				if lost <= 5 {
					t.Errorf("%s: acknowledged create %s is missing", when, name)
				}
			case o == refused && there:
				phantom++
				if phantom <= 5 {
					t.Errorf("%s: create %s was refused but is in the database", when, name)
				}
			}
		}
		for name, ref := range l.refs {
			if byName[name] != ref {
				t.Errorf("%s: %s has ref %s, the daemon acknowledged %s", when, name, byName[name], ref)
				break
			}
		}
		got, _ := strconv.Atoi(desc)
		if got != l.lastAck && (got <= l.lastAck || l.counter[got] != unknown) {
			t.Errorf("%s: the counter reads %q; the last acknowledged value is %d (that one's outcome: %v)", when, desc, l.lastAck, l.counter[got])
		}
		if lost+phantom > 0 {
			t.Errorf("%s: %d acknowledged writes lost, %d refused writes visible", when, lost, phantom)
		}
	}
	check("live, after space returned")
	if !d.Alive() {
		t.Fatalf("the daemon exited:\n%s", d.LogTail(4000))
	}
	// The redo log catches up by itself (its first retry is 2s after it
	// failed) and then holds every acknowledged write too.
	redoOK := false
	if strings.Contains(d.Log(), "redo log degraded") {
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(d.Log(), "redo log recovered") {
			if time.Now().After(deadline) {
				t.Fatalf("the redo log did not recover after space returned:\n%s", d.LogTail(4000))
			}
			time.Sleep(20 * time.Millisecond)
		}
		redoOK = true
	}
	d.Kill()
	if strings.Contains(d.Log(), "panic") {
		t.Errorf("the daemon panicked:\n%s", d.LogTail(4000))
	}
	d = start(t, dataDir, addr, "--redo-log", redo)
	check("after SIGKILL and restart")
	d.Kill()

	if redoOK {
		recovered := filepath.Join(t.TempDir(), "recovered")
		if out, err := exec.Command(bin, "recover", "--redo-log", redo, "--data-dir", recovered).CombinedOutput(); err != nil {
			t.Fatalf("recover from the redo log: %v\n%s", err, out)
		}
		d = start(t, recovered, addr)
		check("rebuilt from the redo log")
		d.Kill()
		t.Log("the redo log degraded on the full disk, recovered by itself, and holds every acknowledged write")
	} else {
		t.Log("the redo log never failed (its writes fit in space it already had)")
	}
}

func login(t *testing.T, addr string) string {
	t.Helper()
	return mustString(t, must(t, addr, "session.login_with_password", "root", password))
}

func must(t *testing.T, addr, method string, params ...any) any {
	t.Helper()
	v, err := call(addr, method, params...)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	return v
}

func mustString(t *testing.T, v any) string {
	t.Helper()
	s, ok := v.(string)
	if !ok {
		t.Fatalf("want a string, got %T %v", v, v)
	}
	return s
}
