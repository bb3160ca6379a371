package cli

import (
	"strings"

	"toolstackd/internal/cli/proto"
)

// field is one line of a record: the key as printed (name and marker)
// and the value.
type field struct{ key, val string }

// printer is xapi's CLI output: records as aligned key/value blocks,
// lists one item per line, and in --minimal mode only the first value of
// each record (or each list item), joined with commas and sent once at
// the end.
type printer struct {
	conn    *proto.Conn
	minimal bool
	buf     []string
}

// formatRecord lays a record out as xapi does: keys padded to the longest
// key plus four, the first on the right and the rest on the left, each
// followed by ": " and the value; the block ends with a newline.
func formatRecord(r []field) string {
	w := 0
	for _, f := range r {
		w = max(w, len(f.key))
	}
	w += 4
	var b strings.Builder
	for i, f := range r {
		pad := strings.Repeat(" ", w-len(f.key))
		if i == 0 {
			b.WriteString(f.key + pad)
		} else {
			b.WriteString(pad + f.key)
		}
		b.WriteString(": ")
		b.WriteString(f.val)
		b.WriteByte('\n')
	}
	return b.String()
}

// escapeMinimal escapes a value for --minimal output: backslash and
// comma get a backslash.
func escapeMinimal(s string) string {
	if !strings.ContainsAny(s, ",\\") {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if r == ',' || r == '\\' {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// table prints records. Each is one Print message ending in a blank
// line (the client adds one more newline).
func (p *printer) table(recs [][]field) {
	if p.minimal {
		if len(recs) > 0 && len(recs[0]) > 0 {
			vals := make([]string, len(recs))
			for i, r := range recs {
				if len(r) > 0 {
					vals[i] = escapeMinimal(r[0].val)
				}
			}
			p.buf = append(p.buf, strings.Join(vals, ","))
		}
		return
	}
	for _, r := range recs {
		p.conn.Send(proto.Print(formatRecord(r) + "\n"))
	}
}

// list prints items one per line.
func (p *printer) list(items ...string) {
	if p.minimal {
		esc := make([]string, len(items))
		for i, s := range items {
			esc[i] = escapeMinimal(s)
		}
		p.buf = append(p.buf, strings.Join(esc, ","))
		return
	}
	for _, s := range items {
		p.conn.Send(proto.Print(s))
	}
}

// msg prints a message (dropped in --minimal mode).
func (p *printer) msg(s string) {
	if !p.minimal {
		p.conn.Send(proto.Print(s))
	}
}

// flush sends the --minimal output.
func (p *printer) flush() {
	if p.minimal {
		p.conn.Send(proto.Print(strings.Join(p.buf, ",")))
		p.buf = nil
	}
}
