// Package db is toolstackd's database: every object of every XenAPI class
// in memory, with the rules xapi's database keeps (refs, uuids, relations,
// the change feed event.from reads), made durable through a persister
// the daemon chooses.
//
// # What it holds
//
// One table per class of the datamodel (a *schema.Model). An object is a
// Row: its ref (OpaqueRef:uuid), the generations at which it was created
// and last modified, and its field values in canonical Go form
// (schema/value.go). Rows are immutable, so a row can be shared by every
// snapshot that holds it and used as a cache key (api's encoded records).
// A row stores only the values that differ from the class's defaults.
// The inverse side of a relation (VM.VBDs from VBD.VM) is never stored:
// Reader.Value derives it from the relation index.
//
// Every commit bumps one 64-bit generation, global to the database; a
// row's Modified is the generation that last wrote it.
//
// # Reading
//
// Snapshot returns the latest committed state: an immutable view built of
// copy-on-write B-trees, taken with one atomic load. A reader never waits
// for the writer and the writer never waits for readers. A Snapshot is a
// Reader: Get and Lookup by ref, ByUUID, ByNameLabel (indexed), All and
// Ascend in ref order, Count, Where (the get_all_records_where language,
// package where, compiled once per expression). Memo computes derived
// data once per snapshot however many readers ask. Done is closed when a
// newer snapshot is published: event.from's long polls wait on it.
//
// # Writing
//
// Update runs a function as one transaction on a Tx: Create, Insert, Set,
// Delete, Touch, and the set and map operations (AddToSet, AddToMap, ...).
// Writers run one at a time; a transaction sees its own writes; an error
// from the function discards them all. The Tx keeps the datamodel's
// rules: both ends of a relation in step, a relation field that names a
// missing row refused (HANDLE_INVALID), a uuid made for a row given
// none, defaults for omitted fields.
//
// # Durability: the Persister seam
//
// A committed transaction becomes a Batch (its changes, from and to
// generations) handed to the Persister in generation order. The commit is
// published (readers see it, Update returns, event.from wakes) only when
// the persister calls Durable for its generation, so no reader ever sees
// a write a crash could lose. Commits are prepared under the writer lock
// and published later in order, so a persister can group many commits
// into one sync (group commit: 64 writers share one fsync). A persister
// that cannot make a batch durable calls Abort (the pending commits fail
// and are undone; a full disk that frees up is survived) or Fail (the
// database keeps serving its last durable state and refuses writes).
// Commits that touch only in-memory classes (sessions, tasks) need no
// disk but keep their place in the order.
//
// The daemon's persister is internal/pool/dbraft, which passes batches to
// the host's file (db/persist) when the host is alone and sends them
// through raft first in a pool. docs/architecture.md, "The database, from
// memory to disk", draws the stack.
//
// # The change feed
//
// ChangesSince returns the batches after a generation (at most
// Options.FeedLength are kept, and always the newest); deleted rows are
// remembered for Options.DeletedWindow deletions per table. event.from
// and the caches built on the feed read it; a generation older than the
// feed keeps is an error the caller answers with a full resync.
//
// # Loading
//
// Load fills an empty database at start (from the host's file, a raft
// snapshot or a redo log) through a Loader, row by row, and builds the
// indexes and relations once at the end. Replace swaps every persistent
// table at once, leaving sessions and tasks (a restored database dump, a
// raft snapshot installed on a member); every replaced row gets a new
// generation, so clients holding event tokens see it.
//
// Subpackages: persist (bbolt with group commit), redolog (xapi's redo log
// on a file or shared LUN), xmldb (xapi's state.db format), where (the
// filter language).
package db
