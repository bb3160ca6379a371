// Package lincheck records what concurrent clients did to a key-value
// register and checks it: that the history is linearizable (with
// porcupine), and that no acknowledged write was lost. It is the judge of
// the pool fault tests, where clients keep reading and writing while hosts
// are killed, paused and partitioned.
//
// # Recording
//
// One Recorder is shared by all the clients of a run. Around every call a
// client asks the Recorder for a token before it sends the request and
// hands it back with the answer:
//
//	tok := rec.Begin(client, lincheck.PutOp("k1", "c3-17"))
//	err := store.Put(ctx, "k1", "c3-17")
//	rec.End(tok, lincheck.Result{}, err)
//
// Begin and End take their timestamps from one counter, so the order of
// calls and answers as the test saw them is kept exactly (porcupine treats
// [call, return] as a closed interval: operations that overlap may take
// effect in either order).
//
// What End does with an error depends on what the error says about the
// operation. A refusal (the server answered that it did nothing: wrong
// host, session invalid, a validation error) is dropped from the history.
// Anything else (a timeout, a reset connection, a coordinator that died
// before answering, a deposed leader's retryable failure) may have taken
// effect: the operation is kept with no known return, as porcupine expects
// it (return time infinity), so the checker tries both outcomes. A Get
// with an unknown outcome tells nothing and is dropped. Which errors are
// refusals is the caller's to say (NewRecorder's classify); by default
// only errors wrapping ErrRefused are. When in doubt, call an error
// ambiguous: that can only make the check more lenient, never raise a
// false alarm. An operation begun and never ended (its client gave up or
// crashed) counts as ambiguous too.
//
// # Checking
//
// Check runs porcupine on the history with RegisterModel (partitioned by
// key, so each key is checked on its own) and, when the history is not
// linearizable, writes porcupine's HTML visualization to the path given:
// open it in a browser to see the longest linearizable prefix of each key
// and the operation that could not be placed. Tests can keep it with
// testing.T.ArtifactDir. Checking is NP-hard in general; keep the number
// of concurrent clients per key small (a handful) and the number of keys
// large, and give Check a timeout: Unknown means it ran out of time.
//
// LostWrites is the simpler and cheaper check: given the final value of
// every key, read after all faults were healed and all writers stopped, it
// reports each acknowledged write that a later final state cannot explain.
package lincheck

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"
)

// ErrRefused marks an error as a definite refusal: the operation did not
// take effect. Wrap it (fmt.Errorf("...: %w", lincheck.ErrRefused)) or
// classify errors with NewRecorder's classify.
var ErrRefused = errors.New("lincheck: operation refused")

// Outcome is what an error says about whether its operation took effect.
type Outcome uint8

const (
	// Ambiguous: the operation may or may not have taken effect.
	Ambiguous Outcome = iota
	// Refused: the operation certainly did not take effect.
	Refused
)

// DefaultClassify calls errors wrapping ErrRefused refusals and every
// other error ambiguous.
func DefaultClassify(err error) Outcome {
	if errors.Is(err, ErrRefused) {
		return Refused
	}
	return Ambiguous
}

// Pending is the Return of an Entry whose outcome is unknown: later than
// everything, as porcupine expects it.
const Pending int64 = math.MaxInt64

// An Entry is one operation of a history. Hand-made histories for
// CheckHistory and LostWrites are lists of them.
type Entry struct {
	Client int // the client that invoked it, 0 or more
	Op     Op
	Result Result // meaningful only when !Unknown
	Call   int64  // when it was invoked
	Return int64  // when it returned; Pending when Unknown
	// Unknown says the operation may or may not have taken effect and
	// its result is not known.
	Unknown bool
}

func (e Entry) String() string {
	switch {
	case e.Unknown:
		return fmt.Sprintf("client %d [%d, ∞) %v → ?", e.Client, e.Call, e.Op)
	case e.Op.Kind == Get:
		return fmt.Sprintf("client %d [%d, %d] %v → %q", e.Client, e.Call, e.Return, e.Op, e.Result.Value)
	case e.Op.Kind == CAS:
		return fmt.Sprintf("client %d [%d, %d] %v → %v", e.Client, e.Call, e.Return, e.Op, e.Result.OK)
	}
	return fmt.Sprintf("client %d [%d, %d] %v", e.Client, e.Call, e.Return, e.Op)
}

// Token names one operation between Begin and End.
type Token struct{ id int64 }

// DefaultMaxEntries bounds a Recorder's history unless NewRecorder is told
// otherwise: about a hundred bytes each, so some hundred megabytes at most.
const DefaultMaxEntries = 1 << 20

// A Recorder collects the history of concurrent clients. Its methods are
// safe for concurrent use.
type Recorder struct {
	classify func(error) Outcome
	max      int
	clock    atomic.Int64

	mu       sync.Mutex
	nextID   int64
	open     map[int64]Entry
	done     []Entry
	refused  int
	overflow bool
	misuse   int
}

// NewRecorder returns an empty Recorder. classify says which errors are
// refusals (nil: DefaultClassify); maxEntries bounds the operations
// recorded (0: DefaultMaxEntries), beyond which Begin still works but the
// history is marked incomplete and Check fails.
func NewRecorder(classify func(error) Outcome, maxEntries int) *Recorder {
	if classify == nil {
		classify = DefaultClassify
	}
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	return &Recorder{classify: classify, max: maxEntries, open: make(map[int64]Entry)}
}

// Begin records that client invokes op now and returns the token End
// needs. Call it immediately before sending the request.
func (r *Recorder) Begin(client int, op Op) Token {
	now := r.clock.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextID++
	id := r.nextID
	if client < 0 || op.Kind < Get || op.Kind > CAS {
		r.misuse++
		return Token{}
	}
	if len(r.open)+len(r.done) >= r.max {
		r.overflow = true
		return Token{}
	}
	r.open[id] = Entry{Client: client, Op: op, Call: now}
	return Token{id: id}
}

// End records the answer to tok's operation: its result when err is nil;
// otherwise, by the Recorder's classify, nothing (a refusal) or an unknown
// outcome. Call it as soon as the answer (or the error) arrives. Ending a
// token twice, or one Begin did not give, is counted as misuse and makes
// Check fail.
func (r *Recorder) End(tok Token, res Result, err error) {
	now := r.clock.Add(1)
	outcome := Ambiguous
	if err != nil {
		outcome = r.classify(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.open[tok.id]
	if !ok {
		if tok.id == 0 && r.overflow {
			return // Begin had no room; already reported as overflow
		}
		r.misuse++
		return
	}
	delete(r.open, tok.id)
	switch {
	case err == nil:
		e.Result, e.Return = res, now
	case outcome == Refused:
		r.refused++
		return
	default:
		e.Unknown, e.Return = true, Pending
	}
	r.done = append(r.done, e)
}

// Stats counts a Recorder's operations.
type Stats struct {
	Completed int // ended with a result
	Unknown   int // ended with an ambiguous error
	Refused   int // ended with a refusal (not in the history)
	Open      int // begun and not ended
}

// Stats returns the counts so far.
func (r *Recorder) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Stats{Refused: r.refused, Open: len(r.open)}
	for _, e := range r.done {
		if e.Unknown {
			s.Unknown++
		} else {
			s.Completed++
		}
	}
	return s
}

// History returns the operations recorded so far in the order they were
// invoked, operations still open counted as unknown.
func (r *Recorder) History() []Entry {
	r.mu.Lock()
	h := make([]Entry, 0, len(r.done)+len(r.open))
	h = append(h, r.done...)
	for _, e := range r.open {
		e.Unknown, e.Return = true, Pending
		h = append(h, e)
	}
	r.mu.Unlock()
	sort.Slice(h, func(i, j int) bool { return h[i].Call < h[j].Call })
	return h
}

// err reports a history the Recorder could not keep whole.
func (r *Recorder) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.overflow:
		return fmt.Errorf("lincheck: history over %d operations, incomplete", r.max)
	case r.misuse > 0:
		return fmt.Errorf("lincheck: %d invalid Begin/End calls (bad op, token ended twice or never begun)", r.misuse)
	}
	return nil
}

// Verdict is the result of a linearizability check.
type Verdict string

// The verdicts of Check.
const (
	Ok      Verdict = "ok"      // linearizable
	Illegal Verdict = "illegal" // not linearizable
	Unknown Verdict = "unknown" // the checker ran out of time
)

// Check checks the Recorder's history; see CheckHistory.
func (r *Recorder) Check(timeout time.Duration, vizPath string) (Verdict, error) {
	if err := r.err(); err != nil {
		return Unknown, err
	}
	return CheckHistory(r.History(), timeout, vizPath)
}

// CheckHistory checks that h is linearizable for the register model, in
// at most timeout (0: no limit). When it is Illegal and vizPath is not
// empty, porcupine's HTML visualization is written there (the directory
// must exist); an error writing it is returned with the verdict. A
// malformed entry (negative client, unknown kind, Return before Call) is
// an error.
func CheckHistory(h []Entry, timeout time.Duration, vizPath string) (Verdict, error) {
	ops, err := operations(h)
	if err != nil {
		return Unknown, err
	}
	model := RegisterModel()
	var res porcupine.CheckResult
	if timeout > 0 {
		res = porcupine.CheckOperationsTimeout(model, ops, timeout)
	} else if porcupine.CheckOperations(model, ops) {
		res = porcupine.Ok
	} else {
		res = porcupine.Illegal
	}
	switch res {
	case porcupine.Ok:
		return Ok, nil
	case porcupine.Illegal:
		if vizPath == "" {
			return Illegal, nil
		}
		// Run again, verbosely, for the partial linearizations the
		// visualization shows; the fast run above needs none.
		_, info := porcupine.CheckOperationsVerbose(model, ops, timeout)
		if err := porcupine.VisualizePath(model, info, vizPath); err != nil {
			return Illegal, fmt.Errorf("lincheck: writing the visualization: %w", err)
		}
		return Illegal, nil
	}
	return Unknown, nil
}

// operations turns a history into porcupine's form, dropping unknown
// reads and numbering clients densely (the visualization draws one lane
// per client).
func operations(h []Entry) ([]porcupine.Operation, error) {
	lanes := make(map[int]int)
	ops := make([]porcupine.Operation, 0, len(h))
	for i, e := range h {
		if e.Client < 0 || e.Op.Kind < Get || e.Op.Kind > CAS {
			return nil, fmt.Errorf("lincheck: entry %d (%v) malformed", i, e)
		}
		ret := e.Return
		if e.Unknown {
			if e.Op.Kind == Get {
				continue
			}
			ret = Pending
		}
		if ret < e.Call {
			return nil, fmt.Errorf("lincheck: entry %d (%v) returns before it is called", i, e)
		}
		lane, ok := lanes[e.Client]
		if !ok {
			lane = len(lanes)
			lanes[e.Client] = lane
		}
		ops = append(ops, porcupine.Operation{
			ClientId: lane,
			Input:    e.Op,
			Call:     e.Call,
			Output:   output{Result: e.Result, Unknown: e.Unknown},
			Return:   ret,
		})
	}
	return ops, nil
}
