// Package crash kills the real daemon with SIGKILL at random moments while
// clients write, restarts it on the same data dir, and checks that every
// write the daemon acknowledged is there.
package crash

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/testkit/testdaemon"
)

const password = "crash-test"

// call makes a JSON-RPC call; an error means the call was not
// acknowledged (transport error or XenAPI error).
func call(addr, method string, params ...any) (json.RawMessage, error) {
	c := testdaemon.Client{URL: "http://" + addr, Timeout: 10 * time.Second}
	return c.Call(method, params...)
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
	opts := testdaemon.Options{DataDir: t.TempDir(), Listen: testdaemon.FreeAddr(t, ""), Backend: "simulator",
		Password: password, StartTimeout: 20 * time.Second}
	addr := opts.Listen
	rounds := 30
	if v := os.Getenv("CRASH_ROUNDS"); v != "" {
		fmt.Sscan(v, &rounds)
	}
	state := &acked{desc: map[string]string{}, inflight: map[string]string{}}
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	total := 0
	for round := 0; round < rounds; round++ {
		d := testdaemon.Start(t, opts)
		s := d.Login(t)
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
		d.Kill()
		close(stop)
		wg.Wait()
		total += count

		// Restart and check every acknowledged write.
		d = d.Restart()
		s = d.Login(t)
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
				t.Errorf("round %d: acknowledged network %s lost\n%s", round, ref, d.Log())
			case rec.NameDescription != want && rec.NameDescription != state.inflight[ref]:
				t.Errorf("round %d: %s description %q, acknowledged %q", round, ref, rec.NameDescription, want)
			}
			// Whatever the in-flight write did, the state is now settled.
			state.desc[ref] = rec.NameDescription
		}
		clear(state.inflight)
		state.mu.Unlock()
		d.Kill()
		if t.Failed() {
			break
		}
	}
	t.Logf("%d rounds, %d objects checked, %d create+update pairs acknowledged", rounds, len(state.desc), total)
}
