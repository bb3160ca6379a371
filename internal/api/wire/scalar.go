package wire

import (
	"math"
	"strconv"
	"time"
)

// DateTimeLayout is xapi's wire form of a date: UTC, no dashes, trailing Z.
const DateTimeLayout = "20060102T15:04:05Z"

func appendDateTime(dst []byte, t time.Time) []byte {
	return t.UTC().AppendFormat(dst, DateTimeLayout)
}

// appendSpecialFloat writes NaN, Infinity or -Infinity and reports whether
// f was one of them.
func appendSpecialFloat(dst []byte, f float64) ([]byte, bool) {
	switch {
	case math.IsNaN(f):
		return append(dst, "NaN"...), true
	case math.IsInf(f, 1):
		return append(dst, "Infinity"...), true
	case math.IsInf(f, -1):
		return append(dst, "-Infinity"...), true
	}
	return dst, false
}

// appendFloat writes a finite f the way C's "%.16g" does, using 17
// significant digits instead when 16 would not read back as f.
func appendFloat(dst []byte, f float64) []byte {
	var tmp [32]byte
	shortest := strconv.AppendFloat(tmp[:0], f, 'e', -1, 64)
	digits := 0
	for _, c := range shortest {
		if c == 'e' {
			break
		}
		if c >= '0' && c <= '9' {
			digits++
		}
	}
	prec := 16
	if digits > 16 {
		prec = 17
	}
	return strconv.AppendFloat(dst, f, 'g', prec, 64)
}

func isXMLSpace(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return false
		}
	}
	return true
}

func trimXMLSpace(s string) string {
	i, j := 0, len(s)
	for i < j && isSpaceByte(s[i]) {
		i++
	}
	for j > i && isSpaceByte(s[j-1]) {
		j--
	}
	return s[i:j]
}

func isSpaceByte(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// parseDateTime reads the date forms XML-RPC clients send:
//
//	20060102T15:04:05      (Python's xmlrpc.client; no zone means UTC)
//	20060102T15:04:05Z     (xapi)
//	20060102T150405
//	2006-01-02T15:04:05.000Z, RFC 3339 generally (Xen Orchestra)
//
// with an optional fraction (. or ,) and an optional zone (Z, ±hh, ±hhmm,
// ±hh:mm). The result is in UTC.
func parseDateTime(s string) (time.Time, bool) {
	p := dtParser{s: s}
	year := p.digits(4)
	dashes := p.eat('-')
	month := p.digits(2)
	if dashes && !p.eat('-') {
		return time.Time{}, false
	}
	day := p.digits(2)
	if !p.eat('T') && !p.eat('t') {
		return time.Time{}, false
	}
	hour := p.digits(2)
	colons := p.eat(':')
	minute := p.digits(2)
	if colons && !p.eat(':') {
		return time.Time{}, false
	}
	sec := p.digits(2)
	nsec := 0
	if p.eat('.') || p.eat(',') {
		n := 0
		for scale := 100000000; p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9'; p.i++ {
			nsec += int(p.s[p.i]-'0') * scale
			scale /= 10
			n++
		}
		if n == 0 {
			p.bad = true
		}
	}
	offset := 0
	switch {
	case p.i == len(p.s):
	case p.eat('Z') || p.eat('z'):
	case p.i < len(p.s) && (p.s[p.i] == '+' || p.s[p.i] == '-'):
		sign := 1
		if p.s[p.i] == '-' {
			sign = -1
		}
		p.i++
		oh := p.digits(2)
		om := 0
		if p.i < len(p.s) {
			p.eat(':')
			om = p.digits(2)
		}
		if oh > 23 || om > 59 {
			return time.Time{}, false
		}
		offset = sign * (oh*3600 + om*60)
	default:
		return time.Time{}, false
	}
	if p.bad || p.i != len(p.s) || month < 1 || month > 12 || day < 1 ||
		hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	if t.Day() != day { // e.g. 31 February
		return time.Time{}, false
	}
	return t.Add(-time.Duration(offset) * time.Second), true
}

type dtParser struct {
	s   string
	i   int
	bad bool
}

func (p *dtParser) digits(n int) int {
	v := 0
	for k := 0; k < n; k++ {
		if p.i >= len(p.s) || p.s[p.i] < '0' || p.s[p.i] > '9' {
			p.bad = true
			return 0
		}
		v = v*10 + int(p.s[p.i]-'0')
		p.i++
	}
	return v
}

func (p *dtParser) eat(c byte) bool {
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}
