package wire

import (
	"fmt"
	"io"
	"time"

	"toolstackd/internal/schema"
)

// Int32 is an integer that must be sent as a 32-bit XML-RPC <i4> rather than
// as xapi's usual string-encoded int64 (for example event.from's
// valid_ref_counts). In JSON it is a plain number.
type Int32 int32

// Encoder receives a value as a stream of events. Each scalar call writes
// one complete value. Arrays are BeginArray, the element values, EndArray.
// Structs are BeginStruct, then for each member Member(name) followed by
// exactly one value, then EndStruct. Calls must balance; misuse panics.
type Encoder interface {
	String(s string)
	Int(n int64)
	Int32(n int32)
	Float(f float64)
	Bool(b bool)
	Time(t time.Time)
	Bytes(b []byte)
	Nil()
	BeginArray()
	EndArray()
	BeginStruct()
	Member(name string)
	EndStruct()
}

// Marshaler is implemented by values that write themselves to an Encoder.
// MarshalXenAPI must write exactly one value.
type Marshaler interface {
	MarshalXenAPI(e Encoder)
}

// Encode writes the neutral value v (see the package documentation) to e.
// It panics on a type outside the neutral value model.
func Encode(e Encoder, v any) {
	switch x := v.(type) {
	case nil:
		e.Nil()
	case string:
		e.String(x)
	case int64:
		e.Int(x)
	case int:
		e.Int(int64(x))
	case Int32:
		e.Int32(int32(x))
	case float64:
		e.Float(x)
	case bool:
		e.Bool(x)
	case time.Time:
		e.Time(x)
	case []byte:
		e.Bytes(x)
	case []any:
		e.BeginArray()
		for _, el := range x {
			Encode(e, el)
		}
		e.EndArray()
	case []string:
		e.BeginArray()
		for _, s := range x {
			e.String(s)
		}
		e.EndArray()
	case map[string]any:
		e.BeginStruct()
		for _, k := range schema.SortedKeys(x) {
			e.Member(k)
			Encode(e, x[k])
		}
		e.EndStruct()
	case map[string]string:
		e.BeginStruct()
		for _, k := range schema.SortedKeys(x) {
			e.Member(k)
			e.String(x[k])
		}
		e.EndStruct()
	case Marshaler:
		x.MarshalXenAPI(e)
	default:
		panic(fmt.Sprintf("wire: cannot encode a value of type %T", v))
	}
}

// frame is the state of one open container in an encoder.
type frame uint8

const (
	inArray     frame = iota + 1 // array, no element yet
	inArrayMore                  // array, at least one element written
	inKey                        // struct, expecting the first Member
	inKeyMore                    // struct, expecting a further Member or EndStruct
	inVal                        // struct, expecting the value of the last Member
)

// nest tracks open containers so encoders know where separators go and so
// misuse fails loudly instead of producing garbage.
type nest struct {
	stack  []frame
	inline [16]frame
}

func (n *nest) init() { n.stack = n.inline[:0] }

// value is called before a value (scalar or container) is written. It
// reports whether a separator is needed (JSON arrays).
func (n *nest) value() (sep bool) {
	if len(n.stack) == 0 {
		return false
	}
	top := &n.stack[len(n.stack)-1]
	switch *top {
	case inArray:
		*top = inArrayMore
		return false
	case inArrayMore:
		return true
	case inVal:
		return false
	}
	panic("wire: value written inside a struct without Member")
}

// done is called after a value is complete. It reports whether the value
// ended a struct member.
func (n *nest) done() (endMember bool) {
	if len(n.stack) == 0 {
		return false
	}
	top := &n.stack[len(n.stack)-1]
	if *top == inVal {
		*top = inKeyMore
		return true
	}
	return false
}

// member is called for Member; it reports whether a separator is needed.
func (n *nest) member() (sep bool) {
	if len(n.stack) > 0 {
		top := &n.stack[len(n.stack)-1]
		switch *top {
		case inKey:
			*top = inVal
			return false
		case inKeyMore:
			*top = inVal
			return true
		}
	}
	panic("wire: Member called outside a struct or twice in a row")
}

func (n *nest) push(f frame) { n.stack = append(n.stack, f) }

func (n *nest) pop(a, b frame, what string) {
	if l := len(n.stack); l > 0 && (n.stack[l-1] == a || n.stack[l-1] == b) {
		n.stack = n.stack[:l-1]
		return
	}
	panic("wire: unbalanced " + what)
}

// Encoders hand their buffer to the writer once it holds flushAt bytes. The
// buffer starts with a little slack beyond that, so that it rarely grows.
const (
	flushAt = 8 << 10
	bufSize = flushAt + 1<<10
)

// sink is the buffered output shared by both encoders. With a nil writer
// everything stays in buf.
type sink struct {
	w   io.Writer
	buf []byte
	err error
}

func (s *sink) init(w io.Writer) {
	s.w = w
	s.buf = make([]byte, 0, bufSize)
}

func (s *sink) raw(str string) { s.buf = append(s.buf, str...) }

func (s *sink) maybeFlush() {
	if len(s.buf) >= flushAt && s.w != nil {
		_ = s.Flush() // sticky: kept in s.err and returned by the final Flush
	}
}

// Flush writes any buffered output and returns the first write error.
func (s *sink) Flush() error {
	if s.w != nil && len(s.buf) > 0 {
		if s.err == nil {
			_, s.err = s.w.Write(s.buf)
		}
		s.buf = s.buf[:0]
	}
	return s.err
}
