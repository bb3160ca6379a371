package rrd

import (
	"math"
	"strconv"
)

// appendFloat writes a float the way xapi's dumps do: %0.15g for ordinary
// numbers, "0.0" for zero of either sign, and the .NET/JavaScript spellings
// NaN, Infinity and -Infinity that XenCenter reads.
func appendFloat(dst []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, "NaN"...)
	case math.IsInf(f, 1):
		return append(dst, "Infinity"...)
	case math.IsInf(f, -1):
		return append(dst, "-Infinity"...)
	case f == 0:
		return append(dst, "0.0"...)
	}
	return strconv.AppendFloat(dst, f, 'g', 15, 64)
}

// parseFloat reads what appendFloat writes and the other spellings OCaml's
// float_of_string accepts that an rrdtool dump may carry (nan, inf,
// infinity in any case, exponents).
func parseFloat(s string) (float64, error) {
	return strconv.ParseFloat(s, 64)
}

// appendXMLText escapes character data as xapi's XML writer (Xmlm) does:
// the markup characters and the double quote are escaped, and control
// characters other than tab, newline and carriage return, which XML cannot
// carry, become U+FFFD.
func appendXMLText(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '<':
			dst = append(dst, "&lt;"...)
		case '>':
			dst = append(dst, "&gt;"...)
		case '&':
			dst = append(dst, "&amp;"...)
		case '"':
			dst = append(dst, "&quot;"...)
		case '\t', '\n', '\r':
			dst = append(dst, c)
		default:
			if c < ' ' {
				dst = append(dst, "\uFFFD"...)
			} else {
				dst = append(dst, c)
			}
		}
	}
	return dst
}

// appendJSONString writes a JSON string as xapi's JSON writer (Yojson) does:
// quote, backslash and the control characters escaped, everything else,
// including non-ASCII UTF-8 and '/', as is.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			dst = append(dst, '\\', '"')
		case '\\':
			dst = append(dst, '\\', '\\')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			if c < 0x20 || c == 0x7f {
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
			} else {
				dst = append(dst, c)
			}
		}
	}
	return append(dst, '"')
}

// xmlDecl is the prolog every xapi XML document starts with.
const xmlDecl = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"

// xmlOut builds an XML document the way Xmlm writes one without
// indentation: an element with no content is written <name/>.
type xmlOut struct {
	b       []byte
	pending string // an open tag not yet written, so that <x/> is possible
	hasOpen bool
}

func (o *xmlOut) flush() {
	if o.hasOpen {
		o.b = append(o.b, '<')
		o.b = append(o.b, o.pending...)
		o.b = append(o.b, '>')
		o.hasOpen = false
	}
}

func (o *xmlOut) start(name string) {
	o.flush()
	o.pending, o.hasOpen = name, true
}

func (o *xmlOut) end(name string) {
	if o.hasOpen {
		o.b = append(o.b, '<')
		o.b = append(o.b, name...)
		o.b = append(o.b, '/', '>')
		o.hasOpen = false
		return
	}
	o.b = append(o.b, '<', '/')
	o.b = append(o.b, name...)
	o.b = append(o.b, '>')
}

// text writes character data; even empty data closes the pending start tag,
// as in Xmlm, so <name></name> rather than <name/>.
func (o *xmlOut) text(s string) {
	o.flush()
	o.b = appendXMLText(o.b, s)
}

func (o *xmlOut) float(f float64) {
	o.flush()
	o.b = appendFloat(o.b, f)
}

func (o *xmlOut) int(i int64) {
	o.flush()
	o.b = strconv.AppendInt(o.b, i, 10)
}

func (o *xmlOut) elText(name, s string) { o.start(name); o.text(s); o.end(name) }
func (o *xmlOut) elFloat(name string, f float64) {
	o.start(name)
	o.float(f)
	o.end(name)
}
func (o *xmlOut) elInt(name string, i int64) { o.start(name); o.int(i); o.end(name) }
