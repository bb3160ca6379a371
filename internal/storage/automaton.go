package storage

import "fmt"

// The VDI state machine (xapi's Vdi_automaton). Each datapath (a named
// reason a VDI is attached: a VBD, an import, an export) moves through
//
//	Detached -attach(mode)-> Attached(mode) -activate-> Activated(mode)
//	Activated -deactivate-> Attached -detach-> Detached
//
// and the storage backend is driven by the superstate of all of a VDI's
// datapaths: activated if any is, attached if any is, read-write if any
// wants it.

// Mode is how a VDI is attached.
type Mode uint8

const (
	RO Mode = iota
	RW
)

func (m Mode) String() string {
	if m == RW {
		return "RW"
	}
	return "RO"
}

// VDIState is a datapath's (or a VDI's) state.
type VDIState struct {
	Attached  bool
	Activated bool // implies Attached
	Mode      Mode
}

// Detached is the zero state.
var Detached = VDIState{}

func (s VDIState) String() string {
	switch {
	case s.Activated:
		return "Activated " + s.Mode.String()
	case s.Attached:
		return "Attached " + s.Mode.String()
	}
	return "Detached"
}

// VDIOp is an operation on a datapath.
type VDIOp struct {
	Kind string // "attach", "activate", "deactivate", "detach"
	Mode Mode   // for attach
}

var (
	OpActivate   = VDIOp{Kind: "activate"}
	OpDeactivate = VDIOp{Kind: "deactivate"}
	OpDetach     = VDIOp{Kind: "detach"}
)

// OpAttach attaches in a mode.
func OpAttach(m Mode) VDIOp { return VDIOp{Kind: "attach", Mode: m} }

// BadTransition is an operation a state does not allow.
type BadTransition struct {
	From VDIState
	Op   VDIOp
}

func (e *BadTransition) Error() string {
	return fmt.Sprintf("illegal VDI transition: %s from %s", e.Op.Kind, e.From)
}

// joinMode combines a held mode with a requested one: a VDI attached
// read-only cannot be upgraded to read-write in place.
func joinMode(held, want Mode) (Mode, bool) {
	if held == RO && want == RW {
		return RO, false
	}
	return held, true
}

// Transition applies an operation to a state.
func Transition(s VDIState, op VDIOp) (VDIState, error) {
	bad := func() (VDIState, error) { return s, &BadTransition{s, op} }
	switch op.Kind {
	case "attach":
		if !s.Attached {
			return VDIState{Attached: true, Mode: op.Mode}, nil
		}
		m, ok := joinMode(s.Mode, op.Mode)
		if !ok {
			return bad()
		}
		s.Mode = m
		return s, nil
	case "activate":
		if !s.Attached {
			return bad()
		}
		s.Activated = true
		return s, nil
	case "deactivate":
		s.Activated = false
		return s, nil
	case "detach":
		if s.Activated {
			return bad()
		}
		return Detached, nil
	}
	return bad()
}

// Superstate combines the states of a VDI's datapaths.
func Superstate(states []VDIState) VDIState {
	var out VDIState
	for _, s := range states {
		if s.Attached {
			out.Attached = true
		}
		if s.Activated {
			out.Activated = true
		}
		if s.Attached && s.Mode == RW {
			out.Mode = RW
		}
	}
	return out
}
