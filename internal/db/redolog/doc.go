// Package redolog is the database's redo log: a copy of the database plus
// the deltas of every commit since, kept on a file or a block device (a
// shared LUN) so that another host can rebuild the coordinator's database
// after a failover (HA) or for disaster recovery ("metadata on LUN"). The
// format is the one xapi's redo_log.ml and block_device_io.ml use.
//
// # Layers
//
//   - Delta / Encode / Decode: the encoding of one database change.
//   - Device (FileDevice): the on-disk format and the I/O, done with
//     O_DSYNC; its calls block for as long as the device does.
//   - Log: the front end the commit path calls. Delta and WriteDB only
//     queue work; a goroutine of the Log does the I/O, with timeouts,
//     degrading and recovering as xapi does.
//   - Recover / ReadState: read back the latest consistent state.
//
// # Delta encoding
//
// Each string is its length as 8 zero-padded ASCII decimal digits followed
// by its bytes; a delta starts with a 9-byte tag:
//
//	CreateRow <tbl> <ref> <count: 8 digits> (<key> <value>)*count
//	DeleteRow <tbl> <ref>
//	WriteFiel <tbl> <ref> <field> <new value>
//
// Decode accepts nothing else: a length must be exactly 8 digits '0'-'9',
// every string must fit in the input, the tag must be one of the three,
// and Decode (unlike DecodeAll) rejects trailing bytes. Since the widths
// are fixed, an accepted input re-encodes to the same bytes.
//
// # On-disk layout
//
//	offset 0        16 bytes  magic "redo-log--------"
//	offset 16        1 byte   NUL
//	offset 17        1 byte   validity: '0' no half valid, '1' first, '2' second
//	offset 18        H bytes  first half
//	offset 18+H      H bytes  second half
//
// H is the half size: 60 MiB by default as in xapi, configurable (all
// readers and writers of one log must agree on it; at least MinHalfSize).
// A half holds one database record followed by zero or more delta records:
//
//	database record:  marker(36) length(16) data(length) generation(16) marker(36)
//	delta record:     length(16) data(length) generation(16) marker(36)
//
// and every record is followed by 16 NUL bytes, the terminator. Lengths
// and generations are zero-padded ASCII decimal ("%016d").
//
// # Decisions where xapi's documentation leaves things open
//
// Numbers. Readers accept exactly 16 ASCII digits; anything else ends the
// record sequence. Generations are therefore at most MaxGeneration
// (10^16-1). A length of zero is not a record: it is what the terminator
// reads as, so an empty database cannot be written (ErrEmptyDB).
//
// Markers. A marker is 36 printable non-space ASCII bytes (a UUID). The Log
// uses a fresh random UUID for every database record, and its deltas carry
// the same marker. (xapi uses one marker per log instance.) A fresh marker
// per record means that stale records left in a half by an earlier use of
// it can never be mistaken for records of the current one.
//
// One record per commit. A delta record's data is the concatenation of
// the encodings of all the deltas of one commit, and its generation is the
// database generation after that commit; a commit is thus all or nothing
// on disk. A record holding one delta is byte for byte xapi's.
//
// Terminator. The 16 NULs go out in the same write as the delta record
// (or, for a database record, with its trailer). When fewer than 16 bytes
// remain in the half, only those are written; a record that fills the half
// exactly has none. Reading stops at the end of the half anyway.
//
// Writing a database. The record goes to the half that does not hold the
// current readable state: normally the half the validity byte does not
// name. The write order is the marker and a blank (NUL) length, the data
// (streamed in writes of up to 8 MiB), the generation, marker and
// terminator, then the length (as in block_device_io, because the length
// of a streamed dump is only known at its end; a dump that fits in one
// chunk is written with its length in a single write), and only then the
// validity byte (written together with the NUL before it, so that the
// header is well formed whatever was there). Every write is O_DSYNC, so when the validity byte changes
// the whole record is on the device; a crash at any earlier point leaves
// the validity byte naming the old half, which no write touched.
//
// Writing a delta. One write appends the record and the terminator at the
// end of the valid half. If it does not fit, the device returns ErrNoSpace
// and changes nothing; the Log then writes the whole database instead (to
// the other half), as xapi does. A writer that opens an existing log
// finds the end of the valid half by scanning it with the reader's rules
// (so it appends exactly where the reader stops, overwriting any torn
// record). After any failed write the device refuses deltas
// (ErrNoDatabase) until a database write succeeds, so nothing is ever
// appended behind a record that might be torn.
//
// Reading. Validity '0', or a header that is not magic+NUL+'0'/'1'/'2',
// means the log is empty. Otherwise the database record of the named half
// is checked (length well formed, non-zero and inside the half, equal
// well-formed markers, generation well formed) and returned, followed by
// its deltas in order. The deltas end at the first record that is not
// complete and consistent: a length that is not 16 digits or is zero (the
// terminator), a record running past the half or the end of the file, a
// marker that is not the database record's, or a generation not above the
// previous record's. xapi's reader skips deltas with an unexpected
// generation; this one stops, so what is returned is always a prefix of
// what was written. If the named half has no readable database record
// (which only corruption can cause), the other half is read instead, as
// xapi's design describes: it holds the state before the last database
// write. If neither has one, Read returns ErrCorrupt. A writer in that
// fallback situation writes its next database over the unreadable half,
// keeping the readable one.
//
// Opening. A writable open of something that does not start with the
// magic initialises it (magic, NUL, '0'), as block_device_io does; a
// read-only open (Recover) returns ErrNotRedoLog instead. Regular files
// are created if missing and grow as written; block devices must hold
// HeaderSize+2*H bytes.
//
// # Crash safety and its limits
//
// A torn write is assumed to leave a prefix of what was written, followed
// by the old contents: this holds when a process dies (the crash test kills
// a writer with SIGKILL at random moments and checks that what is read back
// is always a prefix of what was written, including every write that had
// returned). The trailing marker detects any torn record under that
// assumption; the validity byte is a single byte, which devices write
// atomically. The format has no checksum: after a power failure on a
// device that reorders sector writes, a record whose last sector reached
// the disk but an inner one did not would be accepted with stale bytes
// inside. Adding a checksum would change the format xapi defined.
//
// # Why a goroutine and not a helper process
//
// I/O to a LUN can block indefinitely (a lost iSCSI path), and the commit
// path must not. xapi isolates the I/O in a helper process
// (block_device_io) that it talks to over Unix sockets and kills when it
// stops answering. Go cannot interrupt a blocked write(2) either, but it
// does not need to: Log performs each device call on a goroutine of its
// own and waits at most the call's timeout (delta 2 s, database 30 s,
// open 5 s; Recover reads with 30 s). On timeout the goroutine is
// abandoned, with the device it holds; the Log goes degraded and does no
// further I/O to the device path, not even opening it again, until the
// abandoned call has returned (then the device is closed and reopened).
// So at most one goroutine (and the OS thread under it) is ever stuck, and
// a write that completes late can never land on top of newer records. A
// helper process would give the same guarantees only if it, too, were not
// replaced while stuck (a process in uninterruptible I/O cannot be reaped
// until the I/O ends), and would add a protocol and an executable to ship;
// the Device interface leaves room to implement one over block_device_io's
// control protocol should the isolation be wanted.
//
// # The Log's behaviour
//
// At start, and after any outage, the Log writes the whole database, taken
// from Options.Snapshot, before any delta. Delta encodes the commit's
// deltas on the caller's goroutine and queues them (bounded queue); it
// never waits. A queued delta whose generation is not above the last
// database record's is skipped (the record already holds it).
//
// When a device call fails or times out the Log becomes degraded: Healthy
// reports false, an error is logged (log/slog) and Options.OnAlert is
// called; queued and new deltas are dropped. It retries after 2 s, then
// 4 s, doubling up to 120 s; a retry reopens the device and writes the
// whole database, and only then does the Log take deltas again (an alert
// reports the recovery). Deltas are also dropped when the queue is full;
// the Log remembers the highest dropped generation and, since a record
// after the gap would be wrong, writes the whole database instead of the
// next delta. A delta that does not fit in the half triggers the same.
// Close handles what is queued within a time limit.
package redolog
