// Package qmp speaks the QEMU Machine Protocol to one emulator's monitor
// socket: JSON objects, one per line, over a Unix socket.
//
// # The connection
//
// Dial connects, reads QEMU's greeting and negotiates capabilities. A
// Conn then carries any number of commands at once: each is sent with an
// id and its reply is matched by that id, so a slow command (a
// blockdev-mirror setting up, a query while the guest migrates) does not
// hold up another. Every command takes a context: a QEMU that stops
// answering costs the caller its deadline, not a goroutine for ever.
// Asynchronous events (SHUTDOWN, DEVICE_DELETED, JOB_STATUS_CHANGE, ...)
// go to the callback given to Dial, from the moment the connection is
// made, so that none falls between connecting and listening. A file
// descriptor can ride along with a command (SCM_RIGHTS): that is how
// add-fd and getfd hand QEMU the files a jailed emulator cannot open
// itself.
//
// Bounds: one message is at most 16 MiB (a larger one ends the
// connection: it is not QEMU talking any more); a command's write has the
// context's deadline, or 30 s without one.
//
// # Typed commands
//
// Every command the backend sends is a type here (QueryStatus,
// BlockdevMirror, BlockExportAdd, ...) whose fields are the command's
// arguments, by QEMU's own member names, and which names its return type:
//
//	st, err := qmp.Run(ctx, conn, qmp.QueryStatus{})    // st is a StatusInfo
//	err = qmp.Do(ctx, conn, qmp.JobDismiss{ID: "mirror-xvda"})
//
// The package's tests start the installed QEMU and read its schema
// (query-qmp-schema): every command Commands lists must exist, every
// argument field must be one the command takes and every member a return
// type decodes must be one QEMU sends. A misspelt member is then a test
// failure, not a refusal at run time or a silent zero. Commands whose
// arguments QEMU itself leaves open (device_add's properties are the
// driver's; blockdev-add and netdev_add are unions on the driver) are
// maps. Execute and ExecuteFD remain for what has no type yet.
//
// # Why not go-qemu
//
// github.com/digitalocean/go-qemu (qmp and the generated qmp/raw, at
// v0.0.0-20250212194115-ee9b0668d242) was weighed against this package:
// its commands are generated from QEMU 2.11's schema and lack five this
// backend sends to QEMU 7.2 (block-export-add, block-export-del,
// query-block-exports, job-dismiss, query-cpus-fast; query-cpus, which it
// has, left QEMU in 6.0); its SocketMonitor runs one command at a time
// with no context or deadline, drops events until Events is called and
// stalls replies behind an unread event, reads replies with a 64 KiB
// line limit, and passes a descriptor only when QEMU advertises the oob
// capability. docs/performance.md ("A QMP round trip") has the
// measurement.
package qmp
