package storage

import "testing"

func TestTransitions(t *testing.T) {
	aRO, aRW := VDIState{Attached: true, Mode: RO}, VDIState{Attached: true, Mode: RW}
	actRO, actRW := VDIState{Attached: true, Activated: true, Mode: RO}, VDIState{Attached: true, Activated: true, Mode: RW}
	cases := []struct {
		from VDIState
		op   VDIOp
		to   VDIState
		bad  bool
	}{
		{Detached, OpAttach(RO), aRO, false},
		{Detached, OpAttach(RW), aRW, false},
		{Detached, OpActivate, Detached, true},
		{Detached, OpDetach, Detached, false},
		{Detached, OpDeactivate, Detached, false},
		{aRO, OpAttach(RO), aRO, false},
		{aRO, OpAttach(RW), aRO, true},
		{aRW, OpAttach(RO), aRW, false},
		{aRW, OpActivate, actRW, false},
		{aRO, OpDetach, Detached, false},
		{aRW, OpDeactivate, aRW, false},
		{actRO, OpAttach(RO), actRO, false},
		{actRW, OpAttach(RO), actRW, false},
		{actRO, OpAttach(RW), actRO, true},
		{actRW, OpActivate, actRW, false},
		{actRW, OpDeactivate, aRW, false},
		{actRO, OpDetach, actRO, true},
	}
	for _, c := range cases {
		got, err := Transition(c.from, c.op)
		if (err != nil) != c.bad || got != c.to {
			t.Errorf("%s + %s(%s) = %s, %v; want %s bad=%v", c.from, c.op.Kind, c.op.Mode, got, err, c.to, c.bad)
		}
	}
}

func TestSuperstate(t *testing.T) {
	aRO, aRW := VDIState{Attached: true, Mode: RO}, VDIState{Attached: true, Mode: RW}
	actRO := VDIState{Attached: true, Activated: true, Mode: RO}
	if s := Superstate(nil); s != Detached {
		t.Fatal(s)
	}
	if s := Superstate([]VDIState{aRO, Detached}); s != aRO {
		t.Fatal(s)
	}
	if s := Superstate([]VDIState{actRO, aRW}); s != (VDIState{Attached: true, Activated: true, Mode: RW}) {
		t.Fatal(s)
	}
}
