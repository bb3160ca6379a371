// Package xmldb reads and writes xapi's state.db: the XML form in which
// xapi keeps its whole database on disk, so that a database can move
// between xapi and toolstackd in either direction.
//
// # The format
//
// The file is an XML declaration line, then the whole document on a single
// line, with no indentation (shown here broken up):
//
//	<?xml version="1.0" encoding="UTF-8"?>
//	<database><manifest><pair key="schema_major_vsn" value="5"/>...</manifest>
//	<table name="Bond"/>...<table name="VM"><row ref="OpaqueRef:..."
//	__ctime="12" __mtime="40" VBDs="(...)" _ref="OpaqueRef:..." .../>
//	</table>...</database>
//
// The manifest holds three pairs: schema_major_vsn, schema_minor_vsn and
// generation_count.
//
// There is one table element per database class, in byte order of the
// class names. Tables of classes that are not persisted (session, task,
// message, ...) are written as empty elements, as xapi does.
//
// Each row's attributes are ref, __ctime and __mtime (the generations at
// which the row was created and last changed), then one attribute per
// column in byte order of the column names. Among the columns is _ref, a
// second copy of the row's ref. Column names join namespaced field names
// with a double underscore (name__label).
//
// A column's value is the field's stored string form (schema.FormatDB:
// scalars as text, sets and maps as S-expressions). It is then protected
// against attribute-value normalisation: space becomes %., tab %t, LF %n,
// CR %r and % becomes %%. Finally it is escaped as an XML attribute value
// (&lt; &gt; &amp; &quot;). The ref attribute and the manifest are not
// %-protected.
//
// # Decisions
//
//   - Columns that are not persisted are written, and ignored when read.
//     xapi writes every column of a persistent table and blanks the
//     non-persistent ones at load. In toolstackd's model the only
//     non-persistent columns of persistent tables are derived one-to-many
//     sets (VM.VBDs, host.resident_VMs, ...). Encode computes them from the
//     snapshot's relation index so that xapi finds every column it expects.
//     Decode leaves them nil: the database rebuilds them from the child
//     side.
//   - Fields whose lifecycle is Removed are still columns in xapi's schema,
//     so they are written and read like any other. A value of a removed
//     field that does not parse is dropped (nil) rather than refused.
//   - The columns xapi uses for its own bookkeeping (ref, __ctime, __mtime,
//     _ref) are always accepted. _ref must match ref when both are present.
//   - Rows in tables that are not persisted are skipped without being
//     checked. xapi never writes them.
//   - Strings that XML cannot carry (invalid UTF-8, control characters other
//     than tab, LF and CR, U+FFFE and U+FFFF) are cut to their longest valid
//     prefix when written. xapi does the same to every string it stores
//     (ensure_utf8_xml), and failing the whole dump would leave the
//     database unsaved.
//   - Decode is lenient where xapi's reader is. Manifest keys it does not
//     know are ignored. A generation_count of -1 (xapi's null generation)
//     reads as 0. An empty ref value reads as the null ref. Empty uuids are
//     not checked for uniqueness. The legacy protection %_ reads as two
//     spaces, and a % followed by any other character is kept as it stands.
//   - An older schema is accepted: upgrading it is the caller's job.
//
// # What Decode refuses
//
// Every refusal is an *Error that names the table, row and column, and the
// line and column of the input. Decode refuses:
//
//   - input that is not well-formed XML, duplicate attributes included;
//   - elements other than database, manifest, pair, table and row, and
//     text, directives or processing instructions among them;
//   - a missing or incomplete manifest, or one that comes after a table;
//   - a schema version newer than the model's;
//   - unknown tables, classes that are not database tables, and tables
//     that appear twice;
//   - unknown columns, API field names used as column names included;
//   - rows without ref, and refs that are not OpaqueRef:...;
//   - values that do not parse for their column's type, enum values the
//     model does not know included;
//   - duplicate refs or uuids anywhere in the file (a uuid may not equal
//     any ref either, as in the database's key index).
//
// # Streaming
//
// Both directions stream. Encode writes through a buffered writer, one row
// at a time. Decode reads tokens from encoding/xml, so it holds only the
// Dump it returns, one row, and an index of refs and uuids.
//
// EncodeDump writes a Dump back out without a database: it is what a
// conversion tool, or a test of Decode, needs.
package xmldb

import (
	"errors"
	"fmt"
	"strings"

	"toolstackd/internal/schema"
)

// Row is one row of a table as read from a file.
type Row struct {
	Ref               string
	Created, Modified uint64 // __ctime and __mtime (0 when absent)
	// Values holds one canonical value per field of the class, indexed by
	// schema.Field.Index (len(Values) == len(Class.Fields)). It is nil
	// where the file had no column for the field, and for derived and
	// other non-persistent fields. The caller fills in defaults.
	Values []any
}

// Dump is a whole database file.
type Dump struct {
	SchemaMajor, SchemaMinor int
	Generation               uint64
	// Tables holds the rows of each persistent table in file order. Every
	// persistent table element present in the file has an entry, even
	// when it has no rows.
	Tables map[*schema.Class][]Row
}

// Kinds of decoding error, for errors.Is.
var (
	ErrSyntax        = errors.New("not well-formed XML")
	ErrTruncated     = errors.New("truncated file")
	ErrStructure     = errors.New("unexpected content")
	ErrManifest      = errors.New("bad manifest")
	ErrSchemaTooNew  = errors.New("schema newer than this toolstack's")
	ErrUnknownTable  = errors.New("unknown table")
	ErrUnknownColumn = errors.New("unknown column")
	ErrMissingRef    = errors.New("row without ref")
	ErrBadValue      = errors.New("bad value")
	ErrDuplicateRef  = errors.New("duplicate ref")
	ErrDuplicateUUID = errors.New("duplicate uuid")
)

// Error is a decoding failure: what went wrong, where in the input, and in
// which table, row and column.
type Error struct {
	Kind      error // one of the Err* values above
	Line, Col int   // position in the input (1-based; 0 when unknown)
	Table     string
	Ref       string
	Column    string
	Value     string // the offending text, shortened
	Err       error  // the underlying cause, if any
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("state.db")
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", e.Line, e.Col)
	}
	b.WriteString(": ")
	b.WriteString(e.Kind.Error())
	sep := ": "
	for _, p := range [...]struct{ what, v string }{{"table", e.Table}, {"row", e.Ref}, {"column", e.Column}} {
		if p.v != "" {
			b.WriteString(sep + p.what + " " + p.v)
			sep = ", "
		}
	}
	if e.Value != "" {
		fmt.Fprintf(&b, ": %q", e.Value)
	}
	if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	}
	return b.String()
}

// Unwrap gives both the kind and the cause to errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	if e.Err != nil {
		return []error{e.Kind, e.Err}
	}
	return []error{e.Kind}
}

// shorten keeps error messages readable when a value is huge.
func shorten(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
