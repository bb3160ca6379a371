// Package rrd keeps round-robin databases the way xapi's xcp-rrdd does, and
// reads and writes them in xapi's formats.
//
// # Model
//
// An RRD has a step (5 seconds in rrdd), a list of data sources (DS) and a
// list of round-robin archives (RRA). Every archive keeps, for every data
// source, a ring of Rows consolidated values; each value stands for
// PDPPerRow steps, combined by the archive's consolidation function
// (AVERAGE, MIN, MAX or LAST).
//
// Readings arrive through Update (all sources) or UpdateSome (some of them,
// as rrdd does plugin by plugin), with the time they were taken. A reading is
// turned into a rate according to the source's type:
//
//   - GAUGE: the value itself (a memory size, a temperature);
//   - ABSOLUTE: the value divided by the seconds since the previous reading
//     (a count of events since the last reading);
//   - DERIVE: the difference from the previous reading divided by the
//     seconds between them (an ever-growing counter). Integer counters are
//     subtracted in 64-bit two's complement, so a counter that wraps past
//     2^64 still gives the right rate; one that goes backwards (a reset)
//     gives a negative rate, which the usual min of 0 turns into unknown.
//
// A reading taken more than Heartbeat seconds after the previous one is
// unknown. A rate outside [Min, Max] is unknown, except that a DERIVE rate
// less than 5% over Max is stored as Max. Each completed step gives one
// primary data point (PDP) per source; a row of an archive is complete when
// PDPPerRow of them have been consolidated. An AVERAGE row with some
// unknown points is the mean of the known ones; a row is unknown when more
// than XFF x PDPPerRow of its points were unknown. When one update covers
// several rows, the rows after the first all hold the update's point.
//
// These are xapi's rules to the bit, including its quirks, because xapi's
// clients compare numbers (golden_test.go works an example through by
// hand):
//
//   - values are kept in single precision, as xapi keeps them;
//   - a GAUGE or ABSOLUTE point is the latest rate rather than a
//     time-weighted mean, and an unknown GAUGE reading repeats the previous
//     rate for one point;
//   - the DERIVE point divides by the time since the previous update;
//   - an unknown point is counted against XFF only if the row has points
//     left to renormalise over, so in a one-step archive (and for a whole
//     row of unknown points arriving in one update) the row keeps its
//     starting value: 0 for AVERAGE, Max for MIN, Min for MAX (each clamped
//     to the source's bounds) rather than NaN;
//   - renormalisation rescales only what was accumulated before an unknown
//     point, so an AVERAGE row whose unknown points come first is the sum
//     of the known points divided by PDPPerRow;
//   - MIN and MAX rows are renormalised for unknown points like AVERAGE
//     ones, and a new row's MIN, MAX or LAST starts from the last point of
//     the row before.
//
// # Layouts
//
// StandardArchives gives rrdd's four timescales (120 x 5 s, 120 x 1 min,
// 168 x 1 h, 366 x 1 day). The host RRD has AVERAGE, MIN and MAX archives
// for all but the 5 s timescale; a VM or SR RRD has only AVERAGE unless the
// pool enables min/max. Sources get DefaultHeartbeat (300 s). Only a
// source's "default" sources go into a new RRD; AddDS records another one
// later, RemoveDS forgets one.
//
// # Formats
//
//   - WriteXML/AppendXML: the rrdtool XML dump of /host_rrd, /vm_rrd and
//     /sr_rrd; ParseXML reads it back (PUT /rrd), bounded and checked.
//   - WriteJSON/AppendJSON: the same in xapi's JSON form.
//   - Save/Load: the archive form, the gzip of the XML dump with each
//     source's last_updated, which xapi writes to
//     /var/lib/xcp/blobs/rrds/<uuid>.gz so that RRDs survive a restart.
//   - Export: the /rrd_updates selection (which archive answers a start and
//     interval, rows newest first on row boundaries) over several RRDs
//     with their legend prefixes; Xport.WriteXML and Xport.WriteJSON encode
//     it. SelectOwners, SelectHost and ParseCFQuery read its parameters.
//
// Output is byte for byte what xapi writes: the XML declaration followed by
// compact XML (empty elements as <x/>), numbers as C's %.15g with NaN,
// Infinity and -Infinity, and JSON with every number as a string.
//
// The package does no I/O of its own beyond the io.Writer and io.Reader it
// is given, starts no goroutines, keeps no global state and takes the time
// as an argument. An RRD is not safe for concurrent use.
//
// Subpackage plugin reads rrdd's plugin protocol v2.
package rrd
