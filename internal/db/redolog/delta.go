package redolog

import (
	"errors"
	"fmt"
	"strconv"
)

// DeltaKind is the kind of one database change.
type DeltaKind uint8

// The three kinds of change xapi logs. Their 9-byte tags on disk are
// "CreateRow", "DeleteRow" and "WriteFiel".
const (
	CreateRow DeltaKind = iota + 1
	DeleteRow
	WriteField
)

const (
	tagSize      = 9
	shortLenSize = 8
	// MaxStringLen is the longest string a delta can carry: its length is
	// written as 8 decimal digits. The same bound applies to CreateRow's
	// field count.
	MaxStringLen = 99999999
)

var kindTags = [...]string{CreateRow: "CreateRow", DeleteRow: "DeleteRow", WriteField: "WriteFiel"}

func (k DeltaKind) String() string {
	if k >= CreateRow && k <= WriteField {
		return kindTags[k]
	}
	return "DeltaKind(" + strconv.Itoa(int(k)) + ")"
}

// kindOfTag is the kind whose tag is tag, or 0 if none is.
func kindOfTag(tag []byte) DeltaKind {
	for k := CreateRow; k <= WriteField; k++ {
		if string(tag) == kindTags[k] {
			return k
		}
	}
	return 0
}

// Delta is one change to the database, as xapi's redo log records it:
//
//   - CreateRow: Table, Ref and Fields (the new row's (name, value) pairs,
//     in order);
//   - DeleteRow: Table and Ref;
//   - WriteField: Table, Ref, Field and Value (the field's new value).
//
// Members that do not belong to the kind must be empty.
type Delta struct {
	Kind                     DeltaKind
	Table, Ref, Field, Value string
	Fields                   [][2]string
}

// ErrMalformedDelta is wrapped by every decoding error.
var ErrMalformedDelta = errors.New("redolog: malformed delta")

// Encode returns the delta's encoding.
func (d Delta) Encode() ([]byte, error) { return d.AppendEncode(nil) }

// AppendEncode appends the delta's encoding to b. On error b is returned
// unchanged.
func (d Delta) AppendEncode(b []byte) ([]byte, error) {
	if err := d.check(); err != nil {
		return b, err
	}
	b = append(b, kindTags[d.Kind]...)
	b = appendString(b, d.Table)
	b = appendString(b, d.Ref)
	switch d.Kind {
	case CreateRow:
		b = appendNum(b, len(d.Fields))
		for _, kv := range d.Fields {
			b = appendString(b, kv[0])
			b = appendString(b, kv[1])
		}
	case WriteField:
		b = appendString(b, d.Field)
		b = appendString(b, d.Value)
	}
	return b, nil
}

func (d Delta) check() error {
	if d.Kind < CreateRow || d.Kind > WriteField {
		return fmt.Errorf("redolog: cannot encode delta of kind %v", d.Kind)
	}
	strs := []string{d.Table, d.Ref}
	switch d.Kind {
	case CreateRow:
		if d.Field != "" || d.Value != "" {
			return fmt.Errorf("redolog: CreateRow delta with Field or Value set")
		}
		if len(d.Fields) > MaxStringLen {
			return fmt.Errorf("redolog: CreateRow delta with %d fields (at most %d)", len(d.Fields), MaxStringLen)
		}
		for _, kv := range d.Fields {
			strs = append(strs, kv[0], kv[1])
		}
	case DeleteRow:
		if d.Field != "" || d.Value != "" || d.Fields != nil {
			return fmt.Errorf("redolog: DeleteRow delta with Field, Value or Fields set")
		}
	case WriteField:
		if d.Fields != nil {
			return fmt.Errorf("redolog: WriteField delta with Fields set")
		}
		strs = append(strs, d.Field, d.Value)
	}
	for _, s := range strs {
		if len(s) > MaxStringLen {
			return fmt.Errorf("redolog: delta string of %d bytes (at most %d)", len(s), MaxStringLen)
		}
	}
	return nil
}

func appendNum(b []byte, n int) []byte {
	var tmp [shortLenSize]byte
	for i := shortLenSize - 1; i >= 0; i-- {
		tmp[i] = byte('0' + n%10)
		n /= 10
	}
	return append(b, tmp[:]...)
}

func appendString(b []byte, s string) []byte {
	return append(appendNum(b, len(s)), s...)
}

// EncodeAll returns the concatenated encodings of ds: the payload of one
// delta record.
func EncodeAll(ds []Delta) ([]byte, error) {
	var b []byte
	var err error
	for i := range ds {
		if b, err = ds[i].AppendEncode(b); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// Decode decodes exactly one delta: b must hold one encoding and nothing
// else. Any deviation (unknown tag, length not 8 ASCII digits, truncation,
// trailing bytes) is an error wrapping ErrMalformedDelta.
func Decode(b []byte) (Delta, error) {
	d, n, err := decodeOne(b)
	if err != nil {
		return Delta{}, err
	}
	if n != len(b) {
		return Delta{}, fmt.Errorf("%w: %d trailing bytes", ErrMalformedDelta, len(b)-n)
	}
	return d, nil
}

// DecodeAll decodes a concatenation of encodings (the payload of a delta
// record). An empty input gives no deltas.
func DecodeAll(b []byte) ([]Delta, error) {
	var out []Delta
	for off := 0; off < len(b); {
		d, n, err := decodeOne(b[off:])
		if err != nil {
			return nil, fmt.Errorf("at byte %d: %w", off, err)
		}
		out = append(out, d)
		off += n
	}
	return out, nil
}

type deltaParser struct {
	b   []byte
	off int
}

func (p *deltaParser) num() (int, error) {
	if len(p.b)-p.off < shortLenSize {
		return 0, fmt.Errorf("%w: truncated length at byte %d", ErrMalformedDelta, p.off)
	}
	n := 0
	for _, c := range p.b[p.off : p.off+shortLenSize] {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: length %q at byte %d is not 8 decimal digits", ErrMalformedDelta, p.b[p.off:p.off+shortLenSize], p.off)
		}
		n = n*10 + int(c-'0')
	}
	p.off += shortLenSize
	return n, nil
}

func (p *deltaParser) str() (string, error) {
	n, err := p.num()
	if err != nil {
		return "", err
	}
	if len(p.b)-p.off < n {
		return "", fmt.Errorf("%w: string of %d bytes at byte %d truncated", ErrMalformedDelta, n, p.off)
	}
	s := string(p.b[p.off : p.off+n])
	p.off += n
	return s, nil
}

// decodeOne decodes the delta at the start of b and returns how many bytes
// it used.
func decodeOne(b []byte) (Delta, int, error) {
	if len(b) < tagSize {
		return Delta{}, 0, fmt.Errorf("%w: truncated tag", ErrMalformedDelta)
	}
	d := Delta{Kind: kindOfTag(b[:tagSize])}
	if d.Kind == 0 {
		return Delta{}, 0, fmt.Errorf("%w: unknown tag %q", ErrMalformedDelta, b[:tagSize])
	}
	p := &deltaParser{b: b, off: tagSize}
	var err error
	if d.Table, err = p.str(); err != nil {
		return Delta{}, 0, err
	}
	if d.Ref, err = p.str(); err != nil {
		return Delta{}, 0, err
	}
	switch d.Kind {
	case CreateRow:
		n, err := p.num()
		if err != nil {
			return Delta{}, 0, err
		}
		// Each pair takes at least two lengths: reject counts the input
		// cannot hold before allocating anything.
		if n > (len(b)-p.off)/(2*shortLenSize) {
			return Delta{}, 0, fmt.Errorf("%w: %d fields cannot fit in %d bytes", ErrMalformedDelta, n, len(b)-p.off)
		}
		if n > 0 {
			d.Fields = make([][2]string, n)
		}
		for i := range d.Fields {
			if d.Fields[i][0], err = p.str(); err != nil {
				return Delta{}, 0, err
			}
			if d.Fields[i][1], err = p.str(); err != nil {
				return Delta{}, 0, err
			}
		}
	case WriteField:
		if d.Field, err = p.str(); err != nil {
			return Delta{}, 0, err
		}
		if d.Value, err = p.str(); err != nil {
			return Delta{}, 0, err
		}
	}
	return d, p.off, nil
}
