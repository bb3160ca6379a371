package pooltest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"toolstackd/internal/safepath"
	"toolstackd/internal/testkit/lincheck"
	"toolstackd/internal/xerr"
)

// Workload bounds.
const (
	// MaxKeys bounds Workload.Keys: each key is a VM made at Setup.
	MaxKeys = 1000
	// MaxClients bounds Workload.Clients.
	MaxClients = 256
	// DefaultOpTimeout bounds one operation when Workload.OpTimeout is
	// zero.
	DefaultOpTimeout = 5 * time.Second
	// DefaultFindTimeout bounds one search for the coordinator when
	// Workload.FindTimeout is zero.
	DefaultFindTimeout = 20 * time.Second
)

// KeyPrefix starts the name_label of every VM a Workload makes.
const KeyPrefix = "pooltest-key-"

// Workload is a set of concurrent clients reading and writing a key-value
// register through the XenAPI of a pool, every operation recorded for
// lincheck.
//
// Each key is one VM, made by Setup (a copy of a template's record, not a
// template itself) with an empty name_description, which is the key's
// value: a put is VM.set_name_description(vm, value), a get is
// VM.get_name_description(vm). Both are single database operations on a
// replicated object, as cheap as calls get. There is no compare-and-swap:
// the XenAPI has no call that writes a field only if it holds a given
// value, and faking one from a get and a put would not be atomic, so the
// workload does gets and puts only. Every value written is unique
// ("c<client>-<n>"), so a read names the write it saw.
//
// A client logs in on the coordinator (Pool.FindCoordinator, following
// HOST_IS_SLAVE and trying the other hosts on connection errors, within
// FindTimeout), then loops: pick a key and get or put, Begin before the
// call, End with its answer. After any error it finds the coordinator
// again. Errors are classified by Classify: an answer that proves nothing
// was done (HOST_IS_SLAVE, SESSION_INVALID, a connection that could not
// be made) is a refusal and leaves the history; anything else (a timeout,
// a reset, any other XenAPI error, such as a deposed coordinator's
// retryable failure) leaves the operation with an unknown outcome.
type Workload struct {
	// Clients is how many concurrent clients; 0: 4.
	Clients int
	// Keys is how many keys; 0: 8.
	Keys int
	// Duration is how long Start's clients run; 0: until Run.Stop.
	Duration time.Duration
	// OpTimeout bounds each operation; 0: DefaultOpTimeout.
	OpTimeout time.Duration
	// FindTimeout bounds one search for the coordinator; 0:
	// DefaultFindTimeout.
	FindTimeout time.Duration
	// ReadFraction is the share of gets among operations; 0: one half.
	ReadFraction float64
	// Seed seeds the clients' choices; 0: a random seed.
	Seed uint64
	// Recorder receives the history; nil: NewRecorder(Classify, 0) at
	// Setup.
	Recorder *lincheck.Recorder

	pool *Pool
	keys []string          // "k0", "k1", ...
	refs map[string]string // key → VM ref
}

// Classify is the Recorder's classification of a workload error: a
// refusal when the error proves the call did nothing, ambiguous
// otherwise.
func Classify(err error) lincheck.Outcome {
	switch {
	case errors.Is(err, lincheck.ErrRefused), NotSent(err):
		return lincheck.Refused
	}
	switch Code(err) {
	case xerr.HostIsSlave, xerr.SessionInvalid:
		return lincheck.Refused
	}
	return lincheck.Ambiguous
}

// Setup fills the defaults, checks the bounds and makes one VM per key on
// the pool's coordinator, each with an empty name_description. The pool
// must be able to take writes.
func (w *Workload) Setup(ctx context.Context, p *Pool) error {
	if w.Clients == 0 {
		w.Clients = 4
	}
	if w.Keys == 0 {
		w.Keys = 8
	}
	if w.OpTimeout <= 0 {
		w.OpTimeout = DefaultOpTimeout
	}
	if w.FindTimeout <= 0 {
		w.FindTimeout = DefaultFindTimeout
	}
	if w.ReadFraction == 0 {
		w.ReadFraction = 0.5
	}
	if w.Seed == 0 {
		w.Seed = rand.Uint64() //nolint:gosec // choices of a test workload, not secrets
	}
	if w.Recorder == nil {
		w.Recorder = lincheck.NewRecorder(Classify, 0)
	}
	switch {
	case w.Clients < 1 || w.Clients > MaxClients:
		return fmt.Errorf("pooltest: %d clients (1 to %d)", w.Clients, MaxClients)
	case w.Keys < 1 || w.Keys > MaxKeys:
		return fmt.Errorf("pooltest: %d keys (1 to %d)", w.Keys, MaxKeys)
	case w.Duration < 0:
		return fmt.Errorf("pooltest: negative duration %v", w.Duration)
	case !(w.ReadFraction >= 0 && w.ReadFraction < 1):
		return fmt.Errorf("pooltest: read fraction %v (0 to 1, 1 excluded)", w.ReadFraction)
	}
	c := NewClient(netip.Addr{})
	defer c.CloseIdle()
	c.Timeout = 30 * time.Second
	coor, s, err := p.FindCoordinator(ctx, c)
	if err != nil {
		return err
	}
	addr := p.Addr(coor)
	rec, err := templateRecord(ctx, c, addr, s)
	if err != nil {
		return err
	}
	w.pool, w.refs, w.keys = p, make(map[string]string, w.Keys), nil
	for k := range w.Keys {
		key := "k" + fmt.Sprint(k)
		rec["name_label"] = KeyPrefix + key
		rec["name_description"] = ""
		rec["is_a_template"] = false
		rec["is_default_template"] = false
		ref, err := c.CallString(ctx, addr, "VM.create", s, rec)
		if err != nil {
			return fmt.Errorf("pooltest: making the VM of key %s: %w", key, err)
		}
		w.keys = append(w.keys, key)
		w.refs[key] = ref
	}
	return nil
}

// templateRecord is the record of a template to make key VMs from: the
// first by name_label, for the same choice on every run.
func templateRecord(ctx context.Context, c *Client, addr, s string) (map[string]any, error) {
	raw, err := c.Call(ctx, addr, "VM.get_all_records", s)
	if err != nil {
		return nil, fmt.Errorf("pooltest: VM.get_all_records: %w", err)
	}
	var all map[string]map[string]any
	if err := json.Unmarshal(raw, &all); err != nil {
		return nil, fmt.Errorf("pooltest: VM.get_all_records: %v", err)
	}
	var best map[string]any
	for _, r := range all {
		if r["is_a_template"] != true || r["is_control_domain"] == true {
			continue
		}
		if best == nil || fmt.Sprint(r["name_label"]) < fmt.Sprint(best["name_label"]) {
			best = r
		}
	}
	if best == nil {
		return nil, errors.New("pooltest: no VM template to make key VMs from")
	}
	return best, nil
}

// KeyNames are the workload's keys, after Setup.
func (w *Workload) KeyNames() []string { return append([]string(nil), w.keys...) }

// Ref is the VM that holds key (after Setup).
func (w *Workload) Ref(key string) string { return w.refs[key] }

// Stats counts what a run's clients did.
type Stats struct {
	Ops           int64 // operations sent
	AckedPuts     int64 // puts answered with success
	AckedGets     int64 // gets answered with success
	Errors        int64 // operations that failed (refused or unknown)
	Finds         int64 // searches for the coordinator
	FindFailures  int64 // searches that found none in FindTimeout
	Elapsed       time.Duration
	LongestOutage time.Duration // longest time any client went without an acknowledged operation
}

func (s Stats) String() string {
	return fmt.Sprintf("%d ops in %v (%d puts and %d gets acknowledged, %d failed), %d coordinator searches (%d failed), longest client outage %v",
		s.Ops, s.Elapsed.Round(time.Millisecond), s.AckedPuts, s.AckedGets, s.Errors, s.Finds, s.FindFailures, s.LongestOutage.Round(time.Millisecond))
}

// Run is a workload running in the background.
type Run struct {
	cancel  context.CancelFunc
	done    chan struct{}
	started time.Time

	ops, puts, gets, errs, finds, findFails atomic.Int64
	outageMu                                sync.Mutex
	outage                                  time.Duration
}

// Start runs the clients in the background until Duration has passed
// (when set), ctx ends, or Stop. Setup must have succeeded.
func (w *Workload) Start(ctx context.Context) *Run {
	if w.pool == nil {
		panic("pooltest: Workload.Start before a successful Setup")
	}
	var cancel context.CancelFunc
	if w.Duration > 0 {
		ctx, cancel = context.WithTimeout(ctx, w.Duration)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	r := &Run{cancel: cancel, done: make(chan struct{}), started: time.Now()}
	var wg sync.WaitGroup
	for id := range w.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.client(ctx, r, id)
		}()
	}
	go func() {
		wg.Wait()
		close(r.done)
	}()
	return r
}

// Wait waits until the clients have stopped (Duration passed or the
// context ended) and returns what they did.
func (r *Run) Wait() Stats {
	<-r.done
	r.cancel()
	r.outageMu.Lock()
	defer r.outageMu.Unlock()
	return Stats{Ops: r.ops.Load(), AckedPuts: r.puts.Load(), AckedGets: r.gets.Load(), Errors: r.errs.Load(),
		Finds: r.finds.Load(), FindFailures: r.findFails.Load(), Elapsed: time.Since(r.started), LongestOutage: r.outage}
}

// Stop stops the clients now (an operation in flight ends as unknown) and
// returns what they did.
func (r *Run) Stop() Stats {
	r.cancel()
	return r.Wait()
}

// Acked is how many operations have been acknowledged so far.
func (r *Run) Acked() int64 { return r.puts.Load() + r.gets.Load() }

func (w *Workload) client(ctx context.Context, r *Run, id int) {
	rng := rand.New(rand.NewPCG(w.Seed, uint64(id)+1)) //nolint:gosec // choices of a test workload
	c := NewClient(netip.Addr{})
	defer c.CloseIdle()
	c.Timeout = w.OpTimeout
	c.Originator = fmt.Sprintf("pooltest-client-%d", id)
	target, sess := -1, ""
	n := 0
	lastAck := time.Now()
	noteOutage := func() {
		gap := time.Since(lastAck)
		r.outageMu.Lock()
		r.outage = max(r.outage, gap)
		r.outageMu.Unlock()
	}
	defer noteOutage()
	for ctx.Err() == nil {
		if target < 0 {
			r.finds.Add(1)
			fctx, cancel := context.WithTimeout(ctx, w.FindTimeout)
			var err error
			target, sess, err = w.pool.FindCoordinator(fctx, c)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					r.findFails.Add(1)
				}
				continue
			}
		}
		key := w.keys[rng.IntN(len(w.keys))]
		addr := w.pool.Addr(target)
		var err error
		r.ops.Add(1)
		if rng.Float64() < w.ReadFraction {
			tok := w.Recorder.Begin(id, lincheck.GetOp(key))
			var v string
			v, err = c.CallString(ctx, addr, "VM.get_name_description", sess, w.refs[key])
			w.Recorder.End(tok, lincheck.Result{Value: v}, err)
			if err == nil {
				r.gets.Add(1)
			}
		} else {
			n++
			val := fmt.Sprintf("c%d-%d", id, n)
			tok := w.Recorder.Begin(id, lincheck.PutOp(key, val))
			_, err = c.Call(ctx, addr, "VM.set_name_description", sess, w.refs[key], val)
			w.Recorder.End(tok, lincheck.Result{}, err)
			if err == nil {
				r.puts.Add(1)
			}
		}
		if err == nil {
			noteOutage()
			lastAck = time.Now()
			continue
		}
		r.errs.Add(1)
		// Whatever went wrong, find the coordinator again: it may have
		// moved (FindCoordinator follows HOST_IS_SLAVE), died or
		// restarted (sessions do not survive a restart).
		target = -1
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(10+rng.IntN(40)) * time.Millisecond):
		}
	}
}

// ReadAll reads every key through host i with session s.
func (w *Workload) ReadAll(ctx context.Context, c *Client, i int, s string) (map[string]string, error) {
	out := make(map[string]string, len(w.keys))
	for _, k := range w.keys {
		v, err := c.CallString(ctx, w.pool.Addr(i), "VM.get_name_description", s, w.refs[k])
		if err != nil {
			return nil, fmt.Errorf("reading key %s on host %d: %w", k, i, err)
		}
		out[k] = v
	}
	return out, nil
}

// Final reads every key's value on the coordinator, retrying (a new
// search, a new session) until ctx ends. Call it after the run has stopped
// and every fault has been healed: it is the final state LostWrites
// checks.
func (w *Workload) Final(ctx context.Context) (map[string]string, error) {
	c := NewClient(netip.Addr{})
	defer c.CloseIdle()
	c.Timeout = w.OpTimeout
	var last error
	for ctx.Err() == nil {
		i, s, err := w.pool.FindCoordinator(ctx, c)
		if err != nil {
			last = err
			continue
		}
		m, err := w.ReadAll(ctx, c, i, s)
		if err == nil {
			return m, nil
		}
		last = err
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("pooltest: final state: %w", last)
}

// Check judges the recorded history: final must be the state read after
// the run (Final). It fails the test when the history is not
// linearizable (porcupine's visualization is written to the test's
// artifact directory, see testing's -artifacts), when the check runs out
// of checkTimeout, or when an acknowledged write is lost.
func (w *Workload) Check(t testing.TB, final map[string]string, checkTimeout time.Duration) {
	t.Helper()
	st := w.Recorder.Stats()
	t.Logf("history: %d completed, %d unknown, %d refused, %d open", st.Completed, st.Unknown, st.Refused, st.Open)
	viz, err := safepath.JoinName(t.ArtifactDir(), "linearizability.html")
	if err != nil {
		t.Fatalf("visualization path: %v", err)
	}
	verdict, err := w.Recorder.Check(checkTimeout, viz)
	switch {
	case err != nil:
		t.Errorf("linearizability check: %v (verdict %s)", err, verdict)
	case verdict == lincheck.Illegal:
		t.Errorf("history is not linearizable; porcupine's visualization: %s", viz)
	case verdict != lincheck.Ok:
		t.Errorf("linearizability check: %s within %v", verdict, checkTimeout)
	}
	lost, err := w.Recorder.LostWrites(final)
	if err != nil {
		t.Errorf("lost-write check: %v", err)
	}
	sort.Slice(lost, func(i, j int) bool { return lost[i].Key < lost[j].Key })
	for i, f := range lost {
		if i == 20 {
			t.Errorf("... and %d more lost writes", len(lost)-i)
			break
		}
		t.Errorf("lost write: %v", f)
	}
}
