package xmldb

import (
	"bufio"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"

	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// Encode writes snap as a state.db file in xapi's format: the manifest
// (the model's schema version and the snapshot's generation), then one
// table element for each database class, in byte order of class names.
// Rows are in ref order. Every column of a persistent table is written,
// including derived one-to-many sets, which are read through the
// snapshot's relation index.
func Encode(w io.Writer, m *schema.Model, snap *db.Snapshot) error {
	if m == nil || snap == nil {
		return errors.New("xmldb: Encode needs a model and a snapshot")
	}
	e := newEncoder(w, m)
	e.header(m.SchemaMajor, m.SchemaMinor, snap.Generation())
	for _, c := range e.lay.tables {
		if !c.Persist || snap.Count(c) == 0 {
			e.emptyTable(c)
			continue
		}
		e.openTable(c)
		snap.Ascend(c, func(row *db.Row) bool {
			e.row(c, row.Ref, row.Created, row.Modified, func(f *schema.Field) any { return snap.Value(row, f) })
			return e.err == nil
		})
		e.closeTable()
	}
	return e.finish()
}

// EncodeDump writes a Dump, as Decode returns it, back in the same format:
// its own schema version and generation, rows in ref order, and a column
// only for each non-nil value. Tables of m that the dump lacks are written
// empty. Tables of non-persistent classes are written empty.
func EncodeDump(w io.Writer, m *schema.Model, d *Dump) error {
	if m == nil || d == nil {
		return errors.New("xmldb: EncodeDump needs a model and a dump")
	}
	e := newEncoder(w, m)
	e.skipNil = true
	e.header(d.SchemaMajor, d.SchemaMinor, d.Generation)
	for _, c := range e.lay.tables {
		rows := d.Tables[c]
		if !c.Persist || len(rows) == 0 {
			e.emptyTable(c)
			continue
		}
		order := make([]int, len(rows))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(rows[a].Ref, rows[b].Ref) })
		e.openTable(c)
		for _, i := range order {
			r := &rows[i]
			e.row(c, r.Ref, r.Created, r.Modified, func(f *schema.Field) any {
				if f.Index < len(r.Values) {
					return r.Values[f.Index]
				}
				return nil
			})
			if e.err != nil {
				break
			}
		}
		e.closeTable()
	}
	return e.finish()
}

type encoder struct {
	w       *bufio.Writer
	lay     *layout
	buf     []byte // the row being built
	err     error  // the first write error
	skipNil bool   // EncodeDump: leave nil values out
}

func newEncoder(w io.Writer, m *schema.Model) *encoder {
	return &encoder{w: bufio.NewWriterSize(w, 256<<10), lay: layoutOf(m), buf: make([]byte, 0, 16<<10)}
}

func (e *encoder) write(b []byte) {
	if e.err == nil {
		_, e.err = e.w.Write(b)
	}
}

func (e *encoder) writeString(s string) {
	if e.err == nil {
		_, e.err = e.w.WriteString(s)
	}
}

func (e *encoder) header(major, minor int, gen uint64) {
	b := append(e.buf[:0], `<?xml version="1.0" encoding="UTF-8"?>`+"\n<database><manifest>"...)
	b = appendPair(b, "schema_major_vsn", strconv.Itoa(major))
	b = appendPair(b, "schema_minor_vsn", strconv.Itoa(minor))
	b = appendPair(b, "generation_count", strconv.FormatUint(gen, 10))
	b = append(b, "</manifest>"...)
	e.buf = b
	e.write(b)
}

func appendPair(b []byte, k, v string) []byte {
	b = append(b, `<pair key="`...)
	b, _ = appendValue(b, k, false)
	b = append(b, `" value="`...)
	b, _ = appendValue(b, v, false)
	return append(b, `"/>`...)
}

func (e *encoder) tableStart(c *schema.Class) []byte {
	b := append(e.buf[:0], `<table name="`...)
	b, _ = appendValue(b, xmlPrefix(c.Name), false)
	return append(b, '"')
}

func (e *encoder) emptyTable(c *schema.Class) {
	e.buf = append(e.tableStart(c), "/>"...)
	e.write(e.buf)
}

func (e *encoder) openTable(c *schema.Class) {
	e.buf = append(e.tableStart(c), '>')
	e.write(e.buf)
}

func (e *encoder) closeTable() { e.writeString("</table>") }

func (e *encoder) finish() error {
	e.writeString("</database>")
	if e.err != nil {
		return e.err
	}
	return e.w.Flush()
}

// row writes one row element; get gives each field's value.
func (e *encoder) row(c *schema.Class, ref string, created, modified uint64, get func(*schema.Field) any) {
	b := append(e.buf[:0], `<row ref="`...)
	var ok bool
	if b, ok = appendValue(b, ref, false); !ok {
		ref = xmlPrefix(ref)
		b, _ = appendValue(b, ref, false)
	}
	b = append(b, `" __ctime="`...)
	b = strconv.AppendUint(b, created, 10)
	b = append(b, `" __mtime="`...)
	b = strconv.AppendUint(b, modified, 10)
	b = append(b, '"')
	for _, col := range e.lay.enc[c.Index] {
		f := col.field
		if f == nil {
			b = append(b, col.attr...)
			b, _ = appendValue(b, ref, true)
			b = append(b, '"')
			continue
		}
		v := get(f)
		if v == nil && e.skipNil {
			continue
		}
		b = append(b, col.attr...)
		b = appendField(b, f, v)
		b = append(b, '"')
	}
	b = append(b, "/>"...)
	e.buf = b
	e.write(b)
}

// appendField appends a value in its stored, protected and escaped form.
func appendField(b []byte, f *schema.Field, v any) []byte {
	switch x := v.(type) {
	case int64:
		return strconv.AppendInt(b, x, 10)
	case bool:
		return strconv.AppendBool(b, x)
	case string:
		if out, ok := appendValue(b, x, true); ok {
			return out
		}
	default:
		if out, ok := appendValue(b, schema.FormatDB(f.Type, v), true); ok {
			return out
		}
	}
	// Something XML cannot carry: cut each string, as xapi does.
	out, _ := appendValue(b, schema.FormatDB(f.Type, sanitize(v)), true)
	return out
}
