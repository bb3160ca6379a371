package lincheck

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// Kind is the kind of a register operation.
type Kind uint8

// The operations of the key-value register workload.
const (
	// Get reads a key; Result.Value is what was read ("" for a key never
	// written).
	Get Kind = iota + 1
	// Put writes Op.Value to a key.
	Put
	// CAS writes Op.Value to a key if its value is Op.Expect at that
	// moment; Result.OK says whether it did.
	CAS
)

func (k Kind) String() string {
	switch k {
	case Get:
		return "get"
	case Put:
		return "put"
	case CAS:
		return "cas"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// An Op is one operation a client invokes. Every key starts as "", so a
// workload should write non-empty values, and unique ones (a client ID and
// a counter) so that a read names the write it saw.
type Op struct {
	Kind   Kind
	Key    string
	Value  string // Put, CAS: the value written
	Expect string // CAS: the value compared against
}

// GetOp reads key.
func GetOp(key string) Op { return Op{Kind: Get, Key: key} }

// PutOp writes value to key.
func PutOp(key, value string) Op { return Op{Kind: Put, Key: key, Value: value} }

// CASOp writes value to key if it holds expect.
func CASOp(key, expect, value string) Op {
	return Op{Kind: CAS, Key: key, Expect: expect, Value: value}
}

func (o Op) String() string {
	switch o.Kind {
	case Get:
		return fmt.Sprintf("get(%q)", o.Key)
	case Put:
		return fmt.Sprintf("put(%q, %q)", o.Key, o.Value)
	case CAS:
		return fmt.Sprintf("cas(%q, %q→%q)", o.Key, o.Expect, o.Value)
	}
	return fmt.Sprintf("%v(%q)", o.Kind, o.Key)
}

// Result is what an operation returned.
type Result struct {
	Value string // Get: the value read
	OK    bool   // CAS: whether the value was swapped
}

// output is what the checker sees as an operation's output: its result,
// or that nobody knows it.
type output struct {
	Result
	Unknown bool
}

// RegisterModel is the porcupine model of the key-value register: per key
// a single string starting as "", partitioned by key so that each key is
// checked on its own. An operation whose output is unknown may have taken
// effect or not; the checker may place it after everything else, which is
// the same as not at all.
func RegisterModel() porcupine.Model {
	return porcupine.Model{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byKey := make(map[string]int)
			var parts [][]porcupine.Operation
			for _, op := range history {
				k := op.Input.(Op).Key
				i, ok := byKey[k]
				if !ok {
					i = len(parts)
					byKey[k] = i
					parts = append(parts, nil)
				}
				parts[i] = append(parts[i], op)
			}
			return parts
		},
		Init: func() any { return "" },
		Step: func(state, input, out any) (bool, any) {
			st := state.(string)
			op := input.(Op)
			o := out.(output)
			switch op.Kind {
			case Get:
				return o.Unknown || o.Value == st, st
			case Put:
				return true, op.Value
			case CAS:
				swapped := st == op.Expect
				next := st
				if swapped {
					next = op.Value
				}
				return o.Unknown || o.OK == swapped, next
			}
			return false, st
		},
		DescribeOperation: func(input, out any) string {
			op := input.(Op)
			o := out.(output)
			switch {
			case o.Unknown:
				return op.String() + " → ?"
			case op.Kind == Get:
				return fmt.Sprintf("%v → %q", op, o.Value)
			case op.Kind == CAS:
				return fmt.Sprintf("%v → %v", op, o.OK)
			}
			return op.String()
		},
		DescribeState: func(state any) string { return fmt.Sprintf("%q", state) },
	}
}
