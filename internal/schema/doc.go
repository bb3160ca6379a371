// Package schema is the XenAPI type system and the shape of a datamodel:
// types and their canonical Go values, classes, fields, messages, enums,
// relations, roles and routes. It is hand-written and holds no generated
// code; internal/datamodel (generated from xapi's published datamodel and
// our overlay) builds one Model with Build, and every other layer — the
// database, the RPC codecs, the call pipeline, xe, the docs — reads that
// Model instead of knowing the classes itself.
//
// # Types and canonical values
//
// A Type (ParseType reads the datamodel's spelling: "string set",
// "(string -> int) map", "VM ref", "enum vm_power_state", "VM record") has a Kind and,
// for sets, maps and options, element types. Every XenAPI value has one
// Go form per type, shared by all layers so that nothing converts on the
// way (value.go lists them: int is int64, datetime is a UTC time.Time, a
// string set is []string, a (string -> string) map is map[string]string,
// and so on). Check says whether a value fits a type; Zero is a type's
// empty value; Equal compares canonical values. Values handed to another
// layer are treated as immutable.
//
// Three text forms exist, for three readers:
//   - FormatDB / ParseDB: xapi's database form (state.db, the redo log,
//     get_all_records_where literals): S-expressions for sets and maps,
//     datetimes to the second.
//   - FormatExact / ParseExact: the same, with datetimes to the
//     nanosecond, for the host's own file and raft's entries, which must
//     hold exactly what memory holds.
//   - ParseDefault: the datamodel's default values.
//
// The wire forms (XML-RPC, JSON-RPC) are api/wire's.
//
// # The model
//
// A Model is the datamodel resolved. Each Class has its Fields (a type,
// a default, a qualifier — RW, RO/constructor or RO/runtime — and whether
// the field persists) and its Messages (parameters, result type, the
// Roles allowed as a RoleSet, and whether the message is implicit: a
// getter, setter, constructor or destructor the database serves). The
// Model also has the Enums and the Relations that tie a ref field to the
// inverse set on the other class (VBD.VM and VM.VBDs). Build checks and
// links the specs: a duplicate class, field or message, an unknown enum
// or class in a type, a bad default are errors.
//
// Routes (route.go) say where a message runs in a pool and which objects
// it marks in current_operations; internal/forwarding resolves them.
//
// # Merging
//
// Merge3 applies to a current set or map the change that turned before
// into after: how a member's write to an older copy of a set or map
// column joins the coordinator's copy without undoing another host's
// change to other elements (xapi's add_to_/remove_from_ semantics).
package schema
