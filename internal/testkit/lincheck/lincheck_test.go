package lincheck

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// done is a completed operation for hand-made histories.
func done(client int, op Op, res Result, call, ret int64) Entry {
	return Entry{Client: client, Op: op, Result: res, Call: call, Return: ret}
}

// unknown is an operation with an unknown outcome.
func unknown(client int, op Op, call int64) Entry {
	return Entry{Client: client, Op: op, Call: call, Return: Pending, Unknown: true}
}

func got(v string) Result { return Result{Value: v} }

func TestHandMadeHistories(t *testing.T) {
	cases := []struct {
		name string
		h    []Entry
		want Verdict
	}{
		{"sequential", []Entry{
			done(0, PutOp("x", "a"), Result{}, 0, 1),
			done(1, GetOp("x"), got("a"), 2, 3),
			done(0, PutOp("x", "b"), Result{}, 4, 5),
			done(1, GetOp("x"), got("b"), 6, 7),
		}, Ok},
		{"concurrent read may see old or new", []Entry{
			done(0, PutOp("x", "a"), Result{}, 0, 1),
			done(0, PutOp("x", "b"), Result{}, 2, 8),
			done(1, GetOp("x"), got("a"), 3, 4),
			done(2, GetOp("x"), got("b"), 5, 6),
			done(1, GetOp("x"), got("b"), 9, 10),
		}, Ok},
		{"never written reads empty", []Entry{
			done(0, GetOp("x"), got(""), 0, 1),
		}, Ok},
		{"stale read after acknowledged write", []Entry{
			done(0, PutOp("x", "a"), Result{}, 0, 1),
			done(0, PutOp("x", "b"), Result{}, 2, 3),
			done(1, GetOp("x"), got("a"), 4, 5),
		}, Illegal},
		{"lost write", []Entry{
			done(0, PutOp("x", "a"), Result{}, 0, 1),
			done(1, GetOp("x"), got(""), 2, 3),
		}, Illegal},
		{"read goes back in time", []Entry{
			done(0, PutOp("x", "a"), Result{}, 0, 10),
			done(1, GetOp("x"), got("a"), 1, 2),
			done(2, GetOp("x"), got(""), 3, 4),
		}, Illegal},
		{"unknown write seen", []Entry{
			unknown(0, PutOp("x", "a"), 0),
			done(1, GetOp("x"), got("a"), 2, 3),
		}, Ok},
		{"unknown write not seen", []Entry{
			unknown(0, PutOp("x", "a"), 0),
			done(1, GetOp("x"), got(""), 2, 3),
			done(1, GetOp("x"), got(""), 4, 5),
		}, Ok},
		{"unknown write seen then unseen", []Entry{
			unknown(0, PutOp("x", "a"), 0),
			done(1, GetOp("x"), got("a"), 2, 3),
			done(1, GetOp("x"), got(""), 4, 5),
		}, Illegal},
		{"unknown write cannot precede its call", []Entry{
			done(1, GetOp("x"), got("a"), 0, 1),
			unknown(0, PutOp("x", "a"), 2),
		}, Illegal},
		{"unknown read tells nothing", []Entry{
			done(0, PutOp("x", "a"), Result{}, 0, 1),
			unknown(1, GetOp("x"), 2),
		}, Ok},
		{"cas", []Entry{
			done(0, CASOp("x", "", "a"), Result{OK: true}, 0, 1),
			done(1, CASOp("x", "", "b"), Result{OK: false}, 2, 3),
			done(1, CASOp("x", "a", "b"), Result{OK: true}, 4, 5),
			done(0, GetOp("x"), got("b"), 6, 7),
		}, Ok},
		{"cas succeeds twice from the same value", []Entry{
			done(0, CASOp("x", "", "a"), Result{OK: true}, 0, 1),
			done(1, CASOp("x", "", "b"), Result{OK: true}, 2, 3),
		}, Illegal},
		{"unknown cas either way", []Entry{
			unknown(0, CASOp("x", "", "a"), 0),
			done(1, CASOp("x", "", "b"), Result{OK: true}, 2, 3),
			done(1, GetOp("x"), got("b"), 4, 5),
		}, Ok},
		{"keys are independent", []Entry{
			done(0, PutOp("x", "a"), Result{}, 0, 1),
			done(1, GetOp("y"), got(""), 2, 3),
			done(1, GetOp("x"), got("a"), 4, 5),
		}, Ok},
		{"one bad key spoils the history", []Entry{
			done(0, PutOp("x", "a"), Result{}, 0, 1),
			done(1, PutOp("y", "b"), Result{}, 0, 1),
			done(1, GetOp("y"), got(""), 2, 3),
			done(0, GetOp("x"), got("a"), 4, 5),
		}, Illegal},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			viz := filepath.Join(t.TempDir(), "viz.html")
			v, err := CheckHistory(c.h, 10*time.Second, viz)
			if err != nil {
				t.Fatal(err)
			}
			if v != c.want {
				t.Fatalf("verdict %v, want %v", v, c.want)
			}
			data, err := os.ReadFile(viz)
			if c.want == Illegal {
				if err != nil || !strings.Contains(string(data), "<html") {
					t.Fatalf("no visualization written: %v", err)
				}
			} else if err == nil {
				t.Fatal("visualization written for a linearizable history")
			}
		})
	}
}

func TestMalformedHistory(t *testing.T) {
	for _, h := range [][]Entry{
		{done(-1, GetOp("x"), got(""), 0, 1)},
		{done(0, Op{Kind: 9, Key: "x"}, Result{}, 0, 1)},
		{done(0, PutOp("x", "a"), Result{}, 5, 1)},
	} {
		if _, err := CheckHistory(h, time.Second, ""); err == nil {
			t.Errorf("malformed %v accepted", h)
		}
	}
	// A directory that does not exist for the visualization: the verdict
	// stands and the error says why nothing was written.
	h := []Entry{done(0, PutOp("x", "a"), Result{}, 0, 1), done(0, GetOp("x"), got("b"), 2, 3)}
	v, err := CheckHistory(h, time.Second, filepath.Join(t.TempDir(), "missing", "viz.html"))
	if v != Illegal || err == nil {
		t.Fatalf("got %v, %v", v, err)
	}
}

var errTimeout = errors.New("i/o timeout")

func TestRecorder(t *testing.T) {
	r := NewRecorder(nil, 0)
	tok := r.Begin(0, PutOp("x", "a"))
	r.End(tok, Result{}, nil)
	tok = r.Begin(1, PutOp("x", "b"))
	r.End(tok, Result{}, fmt.Errorf("HOST_IS_SLAVE: %w", ErrRefused)) // dropped
	tok = r.Begin(1, PutOp("x", "c"))
	r.End(tok, Result{}, errTimeout) // may have happened
	tok = r.Begin(2, GetOp("x"))
	r.End(tok, got("c"), nil)
	r.Begin(3, PutOp("x", "d")) // never ends
	if s := r.Stats(); s != (Stats{Completed: 2, Unknown: 1, Refused: 1, Open: 1}) {
		t.Fatalf("stats %+v", s)
	}
	h := r.History()
	if len(h) != 4 || !h[1].Unknown || h[1].Return != Pending || !h[3].Unknown || h[2].Result.Value != "c" {
		t.Fatalf("history %v", h)
	}
	for i := 1; i < len(h); i++ {
		if h[i].Call <= h[i-1].Call {
			t.Fatalf("history not in call order: %v", h)
		}
	}
	if v, err := r.Check(5*time.Second, ""); v != Ok || err != nil {
		t.Fatalf("check %v, %v", v, err)
	}
	// Reading "b", the refused write, is illegal.
	tok = r.Begin(2, GetOp("x"))
	r.End(tok, got("b"), nil)
	if v, err := r.Check(5*time.Second, ""); v != Illegal || err != nil {
		t.Fatalf("check %v, %v", v, err)
	}

	// A custom classification.
	r2 := NewRecorder(func(err error) Outcome {
		if strings.Contains(err.Error(), "refused") {
			return Refused
		}
		return Ambiguous
	}, 0)
	tok = r2.Begin(0, PutOp("x", "a"))
	r2.End(tok, Result{}, errors.New("connection refused"))
	if s := r2.Stats(); s.Refused != 1 {
		t.Fatalf("custom classify: %+v", s)
	}

	// Misuse and overflow make the check fail rather than lie.
	r3 := NewRecorder(nil, 0)
	tok = r3.Begin(0, GetOp("x"))
	r3.End(tok, got(""), nil)
	r3.End(tok, got(""), nil)
	if _, err := r3.Check(time.Second, ""); err == nil {
		t.Fatal("token ended twice: no error")
	}
	r4 := NewRecorder(nil, 2)
	for range 3 {
		r4.End(r4.Begin(0, PutOp("x", "a")), Result{}, nil)
	}
	if _, err := r4.Check(time.Second, ""); err == nil {
		t.Fatal("overflow: no error")
	}
	if _, err := r4.LostWrites(nil); err == nil {
		t.Fatal("overflow: LostWrites gave no error")
	}
	r5 := NewRecorder(nil, 0)
	r5.Begin(-1, GetOp("x"))
	if _, err := r5.Check(time.Second, ""); err == nil {
		t.Fatal("negative client: no error")
	}
}

func TestLostWrites(t *testing.T) {
	h := []Entry{
		done(0, PutOp("a", "a1"), Result{}, 0, 1),
		done(0, PutOp("a", "a2"), Result{}, 2, 3),
		done(1, PutOp("b", "b1"), Result{}, 0, 10),
		done(2, PutOp("b", "b2"), Result{}, 1, 9), // concurrent with b1
		done(0, PutOp("c", "c1"), Result{}, 4, 5),
		unknown(1, PutOp("c", "c2"), 6),
		done(0, PutOp("d", "d1"), Result{}, 0, 1),
		done(0, CASOp("e", "", "e1"), Result{OK: true}, 0, 1),
		done(0, CASOp("e", "e0", "e2"), Result{OK: false}, 2, 3),
		unknown(0, PutOp("f", "f1"), 0),
	}
	final := map[string]string{
		"a": "a2", // the last write: fine
		"b": "b1", // concurrent writes, either may win
		"c": "c2", // the unknown write after c1 landed
		// "d" missing: d1 acknowledged and lost
		"e": "e1", // the failed CAS wrote nothing
		// "f" missing: its only write had an unknown outcome
		"g": "ghost", // nobody wrote this
	}
	findings := LostWrites(h, final)
	var lines []string
	for _, f := range findings {
		lines = append(lines, f.String())
	}
	if len(findings) != 2 ||
		findings[0].Key != "d" || findings[0].Write.Op.Value != "d1" || findings[0].Phantom ||
		findings[1].Key != "g" || !findings[1].Phantom {
		t.Fatalf("findings:\n%s", strings.Join(lines, "\n"))
	}

	// An older value after a newer acknowledged write: the newer is lost.
	final["a"] = "a1"
	findings = LostWrites(h, final)
	if len(findings) != 3 || findings[0].Key != "a" || findings[0].Write.Op.Value != "a2" {
		t.Fatalf("stale final value: %v", findings)
	}
}

// store is an in-memory register store for the randomized tests. With
// stale set, reads go to a replica copied from the primary only every
// few writes; with lossy set, from the tenth put on a key's writes are
// acknowledged and not applied (as after a failover to a replica that
// missed them).
type store struct {
	mu       sync.Mutex
	primary  map[string]string
	replica  map[string]string
	writes   int
	stale    bool
	lossy    bool
	poisoned map[string]bool
	failRand *rand.Rand
}

func newStore(seed uint64) *store {
	return &store{primary: map[string]string{}, replica: map[string]string{}, poisoned: map[string]bool{}, failRand: rand.New(rand.NewPCG(seed, 1))}
}

// fault picks what goes wrong with one call: nothing, refused before
// doing anything, lost before doing anything, or lost after doing it.
func (s *store) fault() (refuse, before, after bool) {
	switch s.failRand.IntN(20) {
	case 0:
		return true, false, false
	case 1:
		return false, true, false
	case 2:
		return false, false, true
	}
	return false, false, false
}

func (s *store) do(op Op) (Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	refuse, before, after := s.fault()
	if refuse {
		return Result{}, fmt.Errorf("not the coordinator: %w", ErrRefused)
	}
	if before {
		return Result{}, errTimeout
	}
	var res Result
	switch op.Kind {
	case Get:
		src := s.primary
		if s.stale {
			src = s.replica
		}
		res.Value = src[op.Key]
	case Put:
		s.writes++
		if s.lossy && s.writes%10 == 0 {
			s.poisoned[op.Key] = true
		}
		if !s.poisoned[op.Key] {
			s.primary[op.Key] = op.Value
		}
	case CAS:
		if s.primary[op.Key] == op.Expect {
			s.writes++
			if !s.poisoned[op.Key] {
				s.primary[op.Key] = op.Value
			}
			res.OK = true
		}
	}
	if s.writes%7 == 0 {
		for k, v := range s.primary {
			s.replica[k] = v
		}
	}
	if after {
		return Result{}, errTimeout
	}
	return res, nil
}

func (s *store) final() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.primary))
	for k, v := range s.primary {
		out[k] = v
	}
	return out
}

// run drives clients concurrent clients against s, each doing ops random
// operations on keys keys, and returns the recorder.
func run(s *store, clients, ops, keys int) *Recorder {
	r := NewRecorder(nil, 0)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 42))
			last := map[string]string{}
			for i := range ops {
				key := fmt.Sprintf("k%d", rng.IntN(keys))
				val := fmt.Sprintf("c%d-%d", c, i)
				var op Op
				switch n := rng.IntN(10); {
				case n < 4:
					op = PutOp(key, val)
				case n < 5:
					op = CASOp(key, last[key], val)
				default:
					op = GetOp(key)
				}
				tok := r.Begin(c, op)
				res, err := s.do(op)
				r.End(tok, res, err)
				if err == nil && op.Kind == Get {
					last[key] = res.Value
				}
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				}
			}
		}()
	}
	wg.Wait()
	return r
}

func TestRandomLinearizableStore(t *testing.T) {
	s := newStore(1)
	r := run(s, 5, 300, 8)
	st := r.Stats()
	t.Logf("operations: %+v", st)
	if st.Unknown == 0 || st.Refused == 0 {
		t.Fatalf("the run injected no failures: %+v", st)
	}
	viz := filepath.Join(t.ArtifactDir(), "linearizable.html")
	start := time.Now()
	v, err := r.Check(30*time.Second, viz)
	if err != nil || v != Ok {
		t.Fatalf("linearizable store: %v, %v (see %s)", v, err, viz)
	}
	t.Logf("checked %d operations in %v", st.Completed+st.Unknown, time.Since(start))
	findings, err := r.LostWrites(s.final())
	if err != nil || len(findings) != 0 {
		t.Fatalf("lost writes in a correct store: %v, %v", findings, err)
	}
}

func TestRandomStaleReplicaFails(t *testing.T) {
	s := newStore(2)
	s.stale = true
	r := run(s, 5, 300, 8)
	viz := filepath.Join(t.ArtifactDir(), "stale.html")
	v, err := r.Check(30*time.Second, viz)
	if err != nil || v != Illegal {
		t.Fatalf("stale replica reads: %v, %v", v, err)
	}
	if fi, err := os.Stat(viz); err != nil || fi.Size() == 0 {
		t.Fatalf("visualization: %v", err)
	}
	// Stale reads lose no write: the primary has them all.
	if findings, _ := r.LostWrites(s.final()); len(findings) != 0 {
		t.Fatalf("stale reads reported as lost writes: %v", findings)
	}
}

func TestRandomLossyStoreFails(t *testing.T) {
	s := newStore(3)
	s.lossy = true
	r := run(s, 5, 300, 8)
	findings, err := r.LostWrites(s.final())
	if err != nil || len(findings) == 0 {
		t.Fatalf("lossy store: no lost write found (%v)", err)
	}
	t.Logf("%d findings, first: %v", len(findings), findings[0])
	if v, err := r.Check(30*time.Second, filepath.Join(t.ArtifactDir(), "lossy.html")); err != nil || v != Illegal {
		t.Fatalf("lossy store: %v, %v", v, err)
	}
}
