package events

import (
	"strconv"
	"strings"

	"toolstackd/internal/xerr"
)

// FormatToken is the event.from token for database generation gen, in
// xapi's "%020d,%020d" form: two zero-padded decimals so that tokens
// compare as strings in the order of their generations. The second part is
// xapi's message-store generation; toolstackd keeps messages in the
// database, so it is always 0.
func FormatToken(gen uint64) string {
	const width = 20
	var b [2*width + 1]byte
	for i := range b {
		b[i] = '0'
	}
	b[width] = ','
	d := strconv.AppendUint(nil, gen, 10)
	if len(d) > width { // cannot happen below 10^20; keep every digit
		return string(d) + "," + strings.Repeat("0", width)
	}
	copy(b[width-len(d):width], d)
	return string(b[:])
}

// ParseToken reads an event.from token and returns its database
// generation. It accepts what xapi accepts: "" (from the beginning), or two
// comma-separated integers as OCaml's Int64.of_string reads them (unpadded,
// an optional sign, 0x/0o/0b/0u prefixes, '_' separators). The message part
// is checked and ignored. A negative generation reads as 0, which selects
// the same rows. Anything else is EVENT_FROM_TOKEN_PARSE_FAILURE [token].
func ParseToken(tok string) (uint64, error) {
	if tok == "" {
		return 0, nil
	}
	db, msg, ok := strings.Cut(tok, ",")
	if !ok || strings.IndexByte(msg, ',') >= 0 {
		return 0, xerr.New(xerr.EventFromTokenParseFailure, tok)
	}
	gen, ok1 := parseInt64(db)
	_, ok2 := parseInt64(msg)
	if !ok1 || !ok2 {
		return 0, xerr.New(xerr.EventFromTokenParseFailure, tok)
	}
	if gen < 0 {
		return 0, nil
	}
	return uint64(gen), nil
}

// parseInt64 follows OCaml's Int64.of_string (runtime/ints.c
// parse_intnat): [-+]? then an optional base prefix, then at least one
// digit, then digits and underscores. Signed decimals must fit an int64;
// the other bases (and 0u) may use all 64 bits and wrap.
func parseInt64(s string) (int64, bool) {
	i, neg := 0, false
	if i < len(s) && (s[i] == '-' || s[i] == '+') {
		neg = s[i] == '-'
		i++
	}
	base, signed := uint64(10), true
	if i+1 < len(s) && s[i] == '0' {
		switch s[i+1] {
		case 'x', 'X':
			base, signed = 16, false
		case 'o', 'O':
			base, signed = 8, false
		case 'b', 'B':
			base, signed = 2, false
		case 'u', 'U':
			signed = false
		}
		if base != 10 || !signed {
			i += 2
		}
	}
	if i >= len(s) || digit(s[i]) >= base {
		return 0, false
	}
	var v uint64
	for first := true; i < len(s); i, first = i+1, false {
		c := s[i]
		if c == '_' && !first {
			continue
		}
		d := digit(c)
		if d >= base {
			return 0, false
		}
		if v > ^uint64(0)/base {
			return 0, false
		}
		v *= base
		if v+d < v {
			return 0, false
		}
		v += d
	}
	if signed {
		if (!neg && v > 1<<63-1) || (neg && v > 1<<63) {
			return 0, false
		}
	}
	if neg {
		return -int64(v), true
	}
	return int64(v), true
}

func digit(c byte) uint64 {
	switch {
	case '0' <= c && c <= '9':
		return uint64(c - '0')
	case 'a' <= c && c <= 'z':
		return uint64(c-'a') + 10
	case 'A' <= c && c <= 'Z':
		return uint64(c-'A') + 10
	}
	return 99
}
