package xmldb

import (
	"bufio"
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"toolstackd/internal/ioerr"
	"toolstackd/internal/schema"
)

// Decode reads a state.db file for model m. See the package comment for
// what it accepts; every refusal is an *Error. An I/O error from r is
// returned wrapped, and is not an *Error.
func Decode(r io.Reader, m *schema.Model) (*Dump, error) {
	if m == nil {
		return nil, errors.New("xmldb: Decode needs a model")
	}
	src := &ioerr.Reader{R: r}
	d := &decoder{
		x:     xml.NewDecoder(bufio.NewReaderSize(src, 32<<10)),
		src:   src,
		m:     m,
		dump:  &Dump{Tables: map[*schema.Class][]Row{}},
		keys:  map[string]string{},
		lay:   layoutOf(m),
		major: -1, minor: -1, gen: -2,
	}
	if err := d.run(); err != nil {
		return nil, err
	}
	return d.dump, nil
}

// Where the decoder is in the document.
type state uint8

const (
	stTop      state = iota // before the root element
	stDatabase              // inside database
	stManifest              // inside manifest
	stPair                  // inside a manifest pair
	stTable                 // inside a table
	stRow                   // inside a row
	stEnd                   // after the root element
)

type decoder struct {
	x    *xml.Decoder
	src  *ioerr.Reader // tells a failed read from a syntax error
	m    *schema.Model
	dump *Dump

	st           state
	haveManifest bool
	major, minor int
	gen          int64

	table    *schema.Class // the current table
	tname    string        // its name as written
	skip     bool          // its rows are not kept (a non-persistent class)
	rows     []Row
	seen     map[string]bool   // tables already read
	keys     map[string]string // every ref and uuid -> the ref of its row
	lay      *layout
	slab     []any // backing store for row values
	slabSize int
	colSet   map[string]bool // columns of the current row (duplicate check)
}

func (d *decoder) fail(kind error, table, ref, column, value string, cause error) *Error {
	line, col := d.x.InputPos()
	return &Error{Kind: kind, Line: line, Col: col, Table: table, Ref: ref, Column: column, Value: shorten(value), Err: cause}
}

func (d *decoder) run() error {
	for {
		tok, err := d.x.Token()
		if err != nil {
			return d.tokenError(err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if err := d.start(t); err != nil {
				return err
			}
		case xml.EndElement:
			if err := d.end(t); err != nil {
				return err
			}
		case xml.CharData:
			if len(bytes.TrimLeft(t, " \t\r\n")) != 0 {
				if d.st == stTop || d.st == stEnd {
					return d.fail(ErrSyntax, "", "", "", string(t), errors.New("text outside the database element"))
				}
				return d.fail(ErrStructure, d.tname, "", "", string(t), errors.New("text outside attributes"))
			}
		case xml.Comment:
		case xml.ProcInst:
			if t.Target != "xml" || d.st != stTop {
				return d.fail(ErrStructure, "", "", "", "<?"+t.Target, errors.New("unexpected processing instruction"))
			}
		case xml.Directive:
			return d.fail(ErrStructure, "", "", "", "<!"+string(t), errors.New("unexpected directive"))
		}
	}
}

func (d *decoder) tokenError(err error) error {
	if err == io.EOF {
		if d.st == stEnd {
			return nil
		}
		if d.st == stTop {
			return d.fail(ErrTruncated, "", "", "", "", errors.New("no database element"))
		}
		return d.fail(ErrTruncated, d.tname, "", "", "", nil)
	}
	if d.src.Err != nil && errors.Is(err, d.src.Err) {
		return fmt.Errorf("xmldb: reading: %w", err)
	}
	var se *xml.SyntaxError
	if errors.As(err, &se) && strings.Contains(se.Msg, "unexpected EOF") {
		return d.fail(ErrTruncated, d.tname, "", "", "", err)
	}
	return d.fail(ErrSyntax, d.tname, "", "", "", err)
}

func (d *decoder) unexpected(name xml.Name) *Error {
	n := name.Local
	if name.Space != "" {
		n = name.Space + ":" + n
	}
	return d.fail(ErrStructure, d.tname, "", "", "<"+n+">", errors.New("unexpected element"))
}

func (d *decoder) start(t xml.StartElement) error {
	if t.Name.Space != "" {
		return d.unexpected(t.Name)
	}
	switch {
	case d.st == stTop && t.Name.Local == "database":
		d.st = stDatabase
	case d.st == stDatabase && t.Name.Local == "manifest":
		if d.haveManifest {
			return d.fail(ErrManifest, "", "", "", "", errors.New("more than one manifest"))
		}
		d.haveManifest = true
		d.st = stManifest
	case d.st == stManifest && t.Name.Local == "pair":
		if err := d.pair(t.Attr); err != nil {
			return err
		}
		d.st = stPair
	case d.st == stDatabase && t.Name.Local == "table":
		if !d.haveManifest {
			return d.fail(ErrManifest, "", "", "", "", errors.New("the manifest must come before the tables"))
		}
		if err := d.openTable(t.Attr); err != nil {
			return err
		}
		d.st = stTable
	case d.st == stTable && t.Name.Local == "row":
		if err := d.row(t.Attr); err != nil {
			return err
		}
		d.st = stRow
	default:
		return d.unexpected(t.Name)
	}
	return nil
}

func (d *decoder) end(t xml.EndElement) error {
	// encoding/xml has already checked that t matches its start element.
	switch d.st {
	case stDatabase:
		if !d.haveManifest {
			return d.fail(ErrManifest, "", "", "", "", errors.New("no manifest"))
		}
		d.st = stEnd
	case stManifest:
		if err := d.checkManifest(); err != nil {
			return err
		}
		d.st = stDatabase
	case stPair:
		d.st = stManifest
	case stTable:
		if !d.skip {
			d.dump.Tables[d.table] = d.rows
		}
		d.table, d.tname, d.rows = nil, "", nil
		d.st = stDatabase
	case stRow:
		d.st = stTable
	}
	return nil
}

func (d *decoder) pair(attrs []xml.Attr) error {
	var key, val string
	var haveKey, haveVal bool
	for _, a := range attrs {
		switch {
		case a.Name.Space == "" && a.Name.Local == "key" && !haveKey:
			key, haveKey = a.Value, true
		case a.Name.Space == "" && a.Name.Local == "value" && !haveVal:
			val, haveVal = a.Value, true
		default:
			return d.fail(ErrManifest, "", "", "", a.Name.Local, errors.New("unexpected attribute of pair"))
		}
	}
	if !haveKey || !haveVal {
		return d.fail(ErrManifest, "", "", "", key, errors.New("pair needs key and value"))
	}
	bad := func(err error) error { return d.fail(ErrManifest, "", "", key, val, err) }
	switch key {
	case "schema_major_vsn", "schema_minor_vsn":
		n, err := strconv.Atoi(val)
		if err != nil || n < 0 {
			return bad(errors.New("not a version number"))
		}
		p := &d.major
		if key == "schema_minor_vsn" {
			p = &d.minor
		}
		if *p >= 0 {
			return bad(errors.New("given twice"))
		}
		*p = n
	case "generation_count":
		g, err := strconv.ParseInt(val, 10, 64)
		if err != nil || g < -1 {
			return bad(errors.New("not a generation"))
		}
		if d.gen != -2 {
			return bad(errors.New("given twice"))
		}
		d.gen = g
	}
	// Other keys are ignored, as xapi does.
	return nil
}

func (d *decoder) checkManifest() error {
	var missing []string
	if d.major < 0 {
		missing = append(missing, "schema_major_vsn")
	}
	if d.minor < 0 {
		missing = append(missing, "schema_minor_vsn")
	}
	if d.gen == -2 {
		missing = append(missing, "generation_count")
	}
	if missing != nil {
		return d.fail(ErrManifest, "", "", "", "", fmt.Errorf("missing %s", strings.Join(missing, ", ")))
	}
	if d.major > d.m.SchemaMajor || d.major == d.m.SchemaMajor && d.minor > d.m.SchemaMinor {
		return d.fail(ErrSchemaTooNew, "", "", "", fmt.Sprintf("%d.%d", d.major, d.minor),
			fmt.Errorf("this toolstack's schema is %d.%d", d.m.SchemaMajor, d.m.SchemaMinor))
	}
	d.dump.SchemaMajor, d.dump.SchemaMinor = d.major, d.minor
	if d.gen > 0 {
		d.dump.Generation = uint64(d.gen)
	}
	return nil
}

func (d *decoder) openTable(attrs []xml.Attr) error {
	if len(attrs) != 1 || attrs[0].Name.Space != "" || attrs[0].Name.Local != "name" {
		return d.fail(ErrStructure, "", "", "", "", errors.New("a table has exactly one attribute, name"))
	}
	name := attrs[0].Value
	c := d.m.Class(name)
	if c == nil || !c.InDB {
		return d.fail(ErrUnknownTable, name, "", "", "", nil)
	}
	if d.seen == nil {
		d.seen = map[string]bool{}
	}
	if d.seen[name] {
		return d.fail(ErrStructure, name, "", "", "", errors.New("table appears twice"))
	}
	d.seen[name] = true
	d.table, d.tname, d.skip, d.rows = c, name, !c.Persist, nil
	return nil
}

// Shared boxed values, so that the commonest values cost no allocation
// and keep no copy of the input alive.
var (
	boxedEmpty any = ""
	boxedNull  any = schema.NullRef
	boxedTrue  any = true
	boxedFalse any = false
)

// parse reads one column's value: ParseDB then Check where needed, with
// the common scalar kinds done here without allocating.
func (d *decoder) parse(ci colInfo, s string) (any, error) {
	t := ci.field.Type
	switch t.Kind {
	case schema.KString:
		if s == "" {
			return boxedEmpty, nil
		}
		return s, nil
	case schema.KRef:
		if s == "" || s == schema.NullRef {
			return boxedNull, nil
		}
		if !schema.IsRef(s) {
			return nil, &schema.TypeError{Type: t, Value: s, Msg: "not a reference"}
		}
		return s, nil
	case schema.KEnum:
		if v, ok := ci.enum[s]; ok {
			return v, nil
		}
		if t.Enum == nil {
			return s, nil
		}
		return nil, &schema.TypeError{Type: t, Value: s, Msg: "not a value of enum " + t.Name}
	case schema.KBool:
		switch s {
		case "true":
			return boxedTrue, nil
		case "false":
			return boxedFalse, nil
		}
	}
	v, err := schema.ParseDB(t, s)
	if err == nil && ci.check {
		err = schema.Check(t, v)
	}
	if tm, ok := v.(time.Time); ok && err == nil && (tm.Year() < 0 || tm.Year() > 9999) {
		// In UTC it has no four-digit year: it could not be written back.
		err = &schema.TypeError{Type: t, Value: s, Msg: "year out of range"}
	}
	return v, err
}

// values returns a fresh slice of n nils, carved from a larger block.
func (d *decoder) values(n int) []any {
	if len(d.slab) < n {
		// Blocks grow with the file, so that a small file stays small.
		d.slabSize = min(max(2*d.slabSize, 1<<10), 64<<10)
		d.slab = make([]any, max(n, d.slabSize))
	}
	v := d.slab[:n:n]
	d.slab = d.slab[n:]
	return v
}

func (d *decoder) row(attrs []xml.Attr) error {
	c, tn := d.table, d.tname
	// The ref first, so that every later error can name the row.
	ref, haveRef := "", false
	for _, a := range attrs {
		if a.Name.Space == "" && a.Name.Local == "ref" {
			if haveRef {
				return d.fail(ErrSyntax, tn, ref, "ref", "", errors.New("attribute given twice"))
			}
			ref, haveRef = a.Value, true
		}
	}
	if !haveRef {
		return d.fail(ErrMissingRef, tn, "", "", "", nil)
	}
	if d.skip {
		return nil
	}
	if !schema.IsRef(ref) {
		return d.fail(ErrBadValue, tn, ref, "ref", ref, errors.New("not a reference"))
	}
	cols := d.lay.dec[c.Index]
	row := Row{Ref: ref, Values: d.values(len(c.Fields))}
	if d.colSet == nil {
		d.colSet = map[string]bool{}
	}
	clear(d.colSet)
	for _, a := range attrs {
		name := a.Name.Local
		if a.Name.Space != "" {
			return d.fail(ErrUnknownColumn, tn, ref, a.Name.Space+":"+name, "", nil)
		}
		if name == "ref" {
			continue
		}
		if d.colSet[name] {
			return d.fail(ErrSyntax, tn, ref, name, "", errors.New("attribute given twice"))
		}
		d.colSet[name] = true
		switch name {
		case "__ctime", "__mtime":
			g, err := strconv.ParseUint(a.Value, 10, 64)
			if err != nil {
				return d.fail(ErrBadValue, tn, ref, name, a.Value, errors.New("not a generation"))
			}
			if name == "__ctime" {
				row.Created = g
			} else {
				row.Modified = g
			}
			continue
		case "_ref":
			if v := unprotect(a.Value); v != ref {
				return d.fail(ErrBadValue, tn, ref, name, v, errors.New("does not match the row's ref"))
			}
			continue
		}
		ci, ok := cols[name]
		if !ok {
			return d.fail(ErrUnknownColumn, tn, ref, name, "", nil)
		}
		if ci.skip {
			continue
		}
		f := ci.field
		s := unprotect(a.Value)
		v, err := d.parse(ci, s)
		if err != nil {
			if f.Lifecycle == schema.Removed {
				continue
			}
			return d.fail(ErrBadValue, tn, ref, name, s, fmt.Errorf("want %s", f.Type))
		}
		row.Values[f.Index] = v
	}
	if prev, dup := d.keys[ref]; dup {
		return d.fail(ErrDuplicateRef, tn, ref, "", ref, fmt.Errorf("already used by row %s", prev))
	}
	d.keys[ref] = ref
	if c.UUID != nil {
		if id, _ := row.Values[c.UUID.Index].(string); id != "" {
			if prev, dup := d.keys[id]; dup {
				return d.fail(ErrDuplicateUUID, tn, ref, "uuid", id, fmt.Errorf("already used by row %s", prev))
			}
			d.keys[id] = ref
		}
	}
	d.rows = append(d.rows, row)
	return nil
}
