package wire

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"strconv"
	"time"
	"unicode/utf8"
)

// JSONEncoder writes values as xapi's JSON-RPC does (see the package
// documentation). Output is buffered; call Flush when done.
type JSONEncoder struct {
	sink
	nest
}

// NewJSONEncoder returns an encoder writing to w.
func NewJSONEncoder(w io.Writer) *JSONEncoder {
	e := &JSONEncoder{}
	e.sink.init(w)
	e.nest.init()
	return e
}

func (e *JSONEncoder) begin() {
	if e.nest.value() {
		e.buf = append(e.buf, ',')
	}
}

func (e *JSONEncoder) end() {
	e.nest.done()
	e.maybeFlush()
}

// String writes s as a JSON string.
func (e *JSONEncoder) String(s string) {
	e.begin()
	e.buf = appendJSONString(e.buf, s)
	e.end()
}

// Int writes n as a JSON number.
func (e *JSONEncoder) Int(n int64) {
	e.begin()
	e.buf = strconv.AppendInt(e.buf, n, 10)
	e.end()
}

// Int32 writes n as a JSON number.
func (e *JSONEncoder) Int32(n int32) { e.Int(int64(n)) }

// Float writes f as a JSON number that always has a fraction or exponent;
// NaN and ±Inf become the strings "NaN", "Infinity" and "-Infinity".
func (e *JSONEncoder) Float(f float64) {
	e.begin()
	n := len(e.buf)
	e.buf = append(e.buf, '"')
	var special bool
	if e.buf, special = appendSpecialFloat(e.buf, f); special {
		e.buf = append(e.buf, '"')
	} else {
		e.buf = appendFloat(e.buf[:n], f)
		if !hasFloatMark(e.buf[n:]) {
			e.buf = append(e.buf, ".0"...)
		}
	}
	e.end()
}

func hasFloatMark(b []byte) bool {
	for _, c := range b {
		if c == '.' || c == 'e' {
			return true
		}
	}
	return false
}

// Bool writes true or false.
func (e *JSONEncoder) Bool(b bool) {
	e.begin()
	e.buf = strconv.AppendBool(e.buf, b)
	e.end()
}

// Time writes t as a string in xapi's 20060102T15:04:05Z form.
func (e *JSONEncoder) Time(t time.Time) {
	e.begin()
	e.buf = append(e.buf, '"')
	e.buf = appendDateTime(e.buf, t)
	e.buf = append(e.buf, '"')
	e.end()
}

// Bytes writes b as a base64 string.
func (e *JSONEncoder) Bytes(b []byte) {
	e.begin()
	e.buf = append(e.buf, '"')
	e.buf = base64.StdEncoding.AppendEncode(e.buf, b)
	e.buf = append(e.buf, '"')
	e.end()
}

// Nil writes null.
func (e *JSONEncoder) Nil() {
	e.begin()
	e.buf = append(e.buf, "null"...)
	e.end()
}

// BeginArray opens an array.
func (e *JSONEncoder) BeginArray() {
	e.begin()
	e.buf = append(e.buf, '[')
	e.push(inArray)
}

// EndArray closes the innermost array.
func (e *JSONEncoder) EndArray() {
	e.pop(inArray, inArrayMore, "EndArray")
	e.buf = append(e.buf, ']')
	e.end()
}

// BeginStruct opens an object.
func (e *JSONEncoder) BeginStruct() {
	e.begin()
	e.buf = append(e.buf, '{')
	e.push(inKey)
}

// Member writes an object key; its value must follow.
func (e *JSONEncoder) Member(name string) {
	if e.member() {
		e.buf = append(e.buf, ',')
	}
	e.buf = appendJSONString(e.buf, name)
	e.buf = append(e.buf, ':')
}

// EndStruct closes the innermost object.
func (e *JSONEncoder) EndStruct() {
	e.pop(inKey, inKeyMore, "EndStruct")
	e.buf = append(e.buf, '}')
	e.end()
}

// jsonPlain marks the ASCII bytes that appear in a JSON string as they are.
var jsonPlain = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = true
	}
	t['"'], t['\\'] = false, false
	return t
}()

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string literal. Invalid UTF-8
// becomes \ufffd; U+2028 and U+2029 are escaped for JavaScript's sake.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if jsonPlain[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			start = i + size
		} else if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\u202`...)
			dst = append(dst, hexDigits[r&0xf])
			start = i + size
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// JSONRequest is a decoded JSON-RPC call.
type JSONRequest struct {
	Method string
	Params []any
	// ID is the request's id exactly as sent: a JSON integer or string.
	// Empty means 0.
	ID json.RawMessage
	// V2 is set when the request carried "jsonrpc": "2.0".
	V2 bool
}

func (e *JSONEncoder) id(req *JSONRequest) {
	if req == nil || len(req.ID) == 0 {
		e.buf = append(e.buf, '0')
		return
	}
	e.buf = append(e.buf, req.ID...)
}

// WriteJSONSuccess writes the reply to req carrying v: for 2.0
// {"jsonrpc":"2.0","result":v,"id":id}, for 1.0 {"result":v,"error":null,"id":id}.
// A nil req answers 2.0-style with id 0.
func WriteJSONSuccess(w io.Writer, req *JSONRequest, v any) error {
	e := NewJSONEncoder(w)
	if req == nil || req.V2 {
		e.raw(`{"jsonrpc":"2.0","result":`)
		Encode(e, v)
	} else {
		e.raw(`{"result":`)
		Encode(e, v)
		e.raw(`,"error":null`)
	}
	e.raw(`,"id":`)
	e.id(req)
	e.raw(`}`)
	return e.Flush()
}

// WriteJSONFailure writes the XenAPI error [code, params...] as the reply to
// req: for 2.0 {"jsonrpc":"2.0","error":{"code":1,"message":code,
// "data":params},"id":id} (xapi always uses code 1), for 1.0
// {"result":null,"error":[code,params...],"id":id}. A nil req answers
// 2.0-style with id 0.
func WriteJSONFailure(w io.Writer, req *JSONRequest, code string, params []string) error {
	e := NewJSONEncoder(w)
	if req == nil || req.V2 {
		e.raw(`{"jsonrpc":"2.0","error":{"code":1,"message":`)
		e.buf = appendJSONString(e.buf, code)
		e.raw(`,"data":`)
		e.BeginArray()
	} else {
		e.raw(`{"result":null,"error":`)
		e.BeginArray()
		e.String(code)
	}
	for _, p := range params {
		e.String(p)
	}
	e.EndArray()
	if req == nil || req.V2 {
		e.raw(`}`)
	}
	e.raw(`,"id":`)
	e.id(req)
	e.raw(`}`)
	return e.Flush()
}

// WriteJSONParseFailure answers a body that could not be decoded as a
// JSON-RPC request: 2.0-style, id 0, as xapi does.
func WriteJSONParseFailure(w io.Writer, code string, params []string) error {
	return WriteJSONFailure(w, nil, code, params)
}
