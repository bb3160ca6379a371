package xmldb

import (
	"strings"
	"unicode/utf8"
)

// What a byte needs when written into an attribute value.
const (
	plain   = iota
	special // a %-protected byte or an XML markup character
	badCtl  // a control character XML cannot carry
	multi   // the first byte of a multi-byte (or invalid) UTF-8 sequence
)

var byteClass = func() (t [256]uint8) {
	for b := 0; b < 0x20; b++ {
		t[b] = badCtl
	}
	for b := 0x80; b < 0x100; b++ {
		t[b] = multi
	}
	for _, b := range []byte{' ', '\t', '\n', '\r', '%', '<', '>', '&', '"'} {
		t[b] = special
	}
	return
}()

// appendValue appends s, %-protected (if protect) and escaped for a
// double-quoted XML attribute. It reports false, with dst unchanged, if s
// holds something XML cannot carry.
func appendValue(dst []byte, s string, protect bool) ([]byte, bool) {
	start := len(dst)
	run := 0 // start of the pending run of plain bytes
	for i := 0; i < len(s); {
		c := s[i]
		switch byteClass[c] {
		case plain:
			i++
			continue
		case multi:
			r, n := utf8.DecodeRuneInString(s[i:])
			if (r == utf8.RuneError && n == 1) || r == 0xFFFE || r == 0xFFFF {
				return dst[:start], false
			}
			i += n
			continue
		case badCtl:
			return dst[:start], false
		}
		dst = append(dst, s[run:i]...)
		dst = appendSpecial(dst, c, protect)
		i++
		run = i
	}
	return append(dst, s[run:]...), true
}

func appendSpecial(dst []byte, c byte, protect bool) []byte {
	if protect {
		switch c {
		case ' ':
			return append(dst, '%', '.')
		case '\t':
			return append(dst, '%', 't')
		case '\n':
			return append(dst, '%', 'n')
		case '\r':
			return append(dst, '%', 'r')
		case '%':
			return append(dst, '%', '%')
		}
	}
	switch c {
	case '<':
		return append(dst, "&lt;"...)
	case '>':
		return append(dst, "&gt;"...)
	case '&':
		return append(dst, "&amp;"...)
	case '"':
		return append(dst, "&quot;"...)
	case '\t':
		return append(dst, "&#9;"...) // unprotected text only (refs): kept
	case '\n': // through attribute-value normalisation
		return append(dst, "&#10;"...)
	case '\r':
		return append(dst, "&#13;"...)
	}
	return append(dst, c) // an unprotected space or %
}

// unprotect undoes the whitespace protection, as xapi's reader does: %.
// %t %n %r %% are space, tab, LF, CR and %; the legacy %_ is two spaces; a
// % before anything else is kept.
func unprotect(s string) string {
	i := strings.IndexByte(s, '%')
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	b.WriteString(s[:i])
	for ; i < len(s); i++ {
		c := s[i]
		if c != '%' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		switch s[i+1] {
		case '.':
			b.WriteByte(' ')
		case 't':
			b.WriteByte('\t')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case '%':
			b.WriteByte('%')
		case '_':
			b.WriteString("  ")
		default:
			b.WriteByte('%')
			continue
		}
		i++
	}
	return b.String()
}

// xmlPrefix cuts s to its longest prefix that XML can carry (tab, LF and
// CR included: they are %-protected).
func xmlPrefix(s string) string {
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c < 0x20 && c != '\t' && c != '\n' && c != '\r':
			return s[:i]
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRuneInString(s[i:])
			if (r == utf8.RuneError && n == 1) || r == 0xFFFE || r == 0xFFFF {
				return s[:i]
			}
			i += n
		}
	}
	return s
}

// sanitize returns v with every string in it cut by xmlPrefix. It is only
// called once a value has been found that XML cannot carry.
func sanitize(v any) any {
	switch x := v.(type) {
	case string:
		return xmlPrefix(x)
	case []string:
		out := make([]string, len(x))
		for i, s := range x {
			out[i] = xmlPrefix(s)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = sanitize(e)
		}
		return out
	case map[string]string:
		out := make(map[string]string, len(x))
		for k, e := range x {
			out[xmlPrefix(k)] = xmlPrefix(e)
		}
		return out
	case map[string]int64:
		return sanitizeKeys(x, func(e int64) int64 { return e })
	case map[string]float64:
		return sanitizeKeys(x, func(e float64) float64 { return e })
	case map[string][]string:
		return sanitizeKeys(x, func(e []string) []string { return sanitize(e).([]string) })
	case map[string]any:
		return sanitizeKeys(x, sanitize)
	}
	return v
}

func sanitizeKeys[V any](m map[string]V, val func(V) V) map[string]V {
	out := make(map[string]V, len(m))
	for k, e := range m {
		out[xmlPrefix(k)] = val(e)
	}
	return out
}
