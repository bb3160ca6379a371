package wire

import (
	"encoding/base64"
	"io"
	"strconv"
	"time"
	"unicode/utf8"
)

// XMLEncoder writes values in xapi's XML-RPC dialect (see the package
// documentation). Output is buffered; call Flush when done.
type XMLEncoder struct {
	sink
	nest
}

// NewXMLEncoder returns an encoder writing to w.
func NewXMLEncoder(w io.Writer) *XMLEncoder {
	e := &XMLEncoder{}
	e.sink.init(w)
	e.nest.init()
	return e
}

func (e *XMLEncoder) begin() { e.nest.value() }

func (e *XMLEncoder) end() {
	if e.nest.done() {
		e.buf = append(e.buf, "</member>"...)
	}
	e.maybeFlush()
}

// String writes s as a bare <value>.
func (e *XMLEncoder) String(s string) {
	e.begin()
	e.buf = append(e.buf, "<value>"...)
	e.buf = appendXMLText(e.buf, s)
	e.buf = append(e.buf, "</value>"...)
	e.end()
}

// Int writes n as a bare string, as xapi does for int64.
func (e *XMLEncoder) Int(n int64) {
	e.begin()
	e.buf = append(e.buf, "<value>"...)
	e.buf = strconv.AppendInt(e.buf, n, 10)
	e.buf = append(e.buf, "</value>"...)
	e.end()
}

// Int32 writes n as <i4>.
func (e *XMLEncoder) Int32(n int32) {
	e.begin()
	e.buf = append(e.buf, "<value><i4>"...)
	e.buf = strconv.AppendInt(e.buf, int64(n), 10)
	e.buf = append(e.buf, "</i4></value>"...)
	e.end()
}

// Float writes f as <double>.
func (e *XMLEncoder) Float(f float64) {
	e.begin()
	e.buf = append(e.buf, "<value><double>"...)
	var special bool
	if e.buf, special = appendSpecialFloat(e.buf, f); !special {
		e.buf = appendFloat(e.buf, f)
	}
	e.buf = append(e.buf, "</double></value>"...)
	e.end()
}

// Bool writes b as <boolean>1</boolean> or <boolean>0</boolean>.
func (e *XMLEncoder) Bool(b bool) {
	e.begin()
	if b {
		e.buf = append(e.buf, "<value><boolean>1</boolean></value>"...)
	} else {
		e.buf = append(e.buf, "<value><boolean>0</boolean></value>"...)
	}
	e.end()
}

// Time writes t in UTC as <dateTime.iso8601>20060102T15:04:05Z</...>.
func (e *XMLEncoder) Time(t time.Time) {
	e.begin()
	e.buf = append(e.buf, "<value><dateTime.iso8601>"...)
	e.buf = appendDateTime(e.buf, t)
	e.buf = append(e.buf, "</dateTime.iso8601></value>"...)
	e.end()
}

// Bytes writes b as <base64>.
func (e *XMLEncoder) Bytes(b []byte) {
	e.begin()
	e.buf = append(e.buf, "<value><base64>"...)
	e.buf = base64.StdEncoding.AppendEncode(e.buf, b)
	e.buf = append(e.buf, "</base64></value>"...)
	e.end()
}

// Nil writes <nil/>.
func (e *XMLEncoder) Nil() {
	e.begin()
	e.buf = append(e.buf, "<value><nil/></value>"...)
	e.end()
}

// BeginArray opens an array.
func (e *XMLEncoder) BeginArray() {
	e.begin()
	e.buf = append(e.buf, "<value><array><data>"...)
	e.push(inArray)
}

// EndArray closes the innermost array.
func (e *XMLEncoder) EndArray() {
	e.pop(inArray, inArrayMore, "EndArray")
	e.buf = append(e.buf, "</data></array></value>"...)
	e.end()
}

// BeginStruct opens a struct.
func (e *XMLEncoder) BeginStruct() {
	e.begin()
	e.buf = append(e.buf, "<value><struct>"...)
	e.push(inKey)
}

// Member starts a struct member; its value must follow.
func (e *XMLEncoder) Member(name string) {
	e.member()
	e.buf = append(e.buf, "<member><name>"...)
	e.buf = appendXMLText(e.buf, name)
	e.buf = append(e.buf, "</name>"...)
}

// EndStruct closes the innermost struct.
func (e *XMLEncoder) EndStruct() {
	e.pop(inKey, inKeyMore, "EndStruct")
	e.buf = append(e.buf, "</struct></value>"...)
	e.end()
}

// xmlPlain marks the ASCII bytes that appear in XML text as they are.
var xmlPlain = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = true
	}
	t['\t'], t['\n'] = true, true
	t['&'], t['<'], t['>'], t['"'] = false, false, false, false
	return t
}()

// appendXMLText appends s as XML character data. See the package
// documentation for the rules.
func appendXMLText(dst []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if xmlPlain[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '&':
				dst = append(dst, "&amp;"...)
			case '<':
				dst = append(dst, "&lt;"...)
			case '>':
				dst = append(dst, "&gt;"...)
			case '"':
				dst = append(dst, "&quot;"...)
			case '\r':
				dst = append(dst, "&#13;"...)
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || r == 0xFFFE || r == 0xFFFF {
			dst = append(dst, s[start:i]...)
			dst = append(dst, "\uFFFD"...)
			start = i + size
		}
		i += size
	}
	return append(dst, s[start:]...)
}

const (
	xmlHead        = `<?xml version="1.0"?><methodResponse><params><param>`
	xmlTail        = `</param></params></methodResponse>`
	xmlSuccessHead = xmlHead + `<value><struct><member><name>Status</name><value>Success</value></member><member><name>Value</name>`
	xmlFailureHead = xmlHead + `<value><struct><member><name>Status</name><value>Failure</value></member><member><name>ErrorDescription</name>`
	xmlWrapTail    = `</member></struct></value>` + xmlTail
)

// WriteXMLSuccess writes a methodResponse carrying {Status: "Success", Value: v}.
func WriteXMLSuccess(w io.Writer, v any) error {
	e := NewXMLEncoder(w)
	e.raw(xmlSuccessHead)
	Encode(e, v)
	e.raw(xmlWrapTail)
	return e.Flush()
}

// WriteXMLFailure writes a methodResponse carrying
// {Status: "Failure", ErrorDescription: [code, params...]}.
func WriteXMLFailure(w io.Writer, code string, params []string) error {
	e := NewXMLEncoder(w)
	e.raw(xmlFailureHead)
	e.BeginArray()
	e.String(code)
	for _, p := range params {
		e.String(p)
	}
	e.EndArray()
	e.raw(xmlWrapTail)
	return e.Flush()
}

// WriteXMLRaw writes a methodResponse whose single param is v itself, not
// wrapped in Status/Value. xapi answers system.listMethods this way.
func WriteXMLRaw(w io.Writer, v any) error {
	e := NewXMLEncoder(w)
	e.raw(xmlHead)
	Encode(e, v)
	e.raw(xmlTail)
	return e.Flush()
}

// WriteXMLFault writes an XML-RPC fault (faultCode as <i4>, faultString as a
// bare string), for requests too broken to dispatch. code must fit in 32
// bits.
func WriteXMLFault(w io.Writer, code int, msg string) error {
	e := NewXMLEncoder(w)
	e.raw(`<?xml version="1.0"?><methodResponse><fault>`)
	e.BeginStruct()
	e.Member("faultCode")
	e.Int32(int32(code))
	e.Member("faultString")
	e.String(msg)
	e.EndStruct()
	e.raw(`</fault></methodResponse>`)
	return e.Flush()
}

// XMLValueFragment returns v as a lone <value>…</value> fragment, the form
// in which xapi stores task results (e.g. <value>OpaqueRef:…</value>).
func XMLValueFragment(v any) string {
	var e XMLEncoder
	e.nest.init()
	Encode(&e, v)
	return string(e.buf)
}
