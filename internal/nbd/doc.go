// Package nbd speaks the Network Block Device protocol as a client and
// reads the URIs that name NBD exports.
//
// # URIs
//
// An export is named the way QEMU and qemu-nbd name it:
//
//	nbd://HOST[:PORT]/EXPORT          over TCP (port 10809 by default)
//	nbd+unix:///EXPORT?socket=PATH    over a Unix socket
//
// ParseURI reads one strictly into a URI and URI.String writes it back;
// the two round-trip. Storage checks the URIs SR plugins return with it,
// dials them with Dial, and the QEMU backend builds its "nbd" block node
// from the same URI, so both read an address the same way.
//
// # The client
//
// Client is a minimal client of the protocol as github.com/NetworkBlockDevice/nbd
// doc/proto.md describes it: fixed newstyle negotiation with NBD_OPT_GO
// (nothing older), then simple replies. Everything the server sends is
// checked (magic numbers, lengths, sizes), so a hostile server gets an
// error, never a crash or an unbounded allocation. Requests from several
// goroutines are pipelined on the one connection and matched to replies
// by handle; reads and writes longer than MaxRequest are split.
//
// Errors the server returns for a request are ServerError values;
// errors.Is(err, syscall.ENOSPC) is true for the server's "no space".
// When the connection fails, every pending and later request fails with
// the same error.
package nbd
