package backend

import (
	"context"
	"io"
	"time"
)

// Migrator is the optional interface of a backend that moves a running
// domain to another host's backend while the guest runs (live
// migration). The two halves meet over a byte stream the caller carries
// between the hosts (the intra-pool connection); neither half opens a
// network port.
//
// On the destination the caller builds the domain as for a start, with
// Spec.Incoming set (Create, Build, AddDisk, AddNIC, StartDeviceModel),
// then calls ReceiveLive with the stream. On the source it calls
// SendLive with the other end. When both have returned nil the domain
// runs on neither host: the destination's is paused with the guest's
// state (Unpause starts it), the source's is stopped for good (Destroy
// removes it).
//
// The stream is framed (migstream.go): ReceiveLive reads exactly up to
// the sender's end frame, never past it, so the carrier can go on with
// other traffic; a truncated, foreign or hostile stream is an error
// wrapping ErrMigrateStream, and a sender that gave up says so
// (*MigrateAborted). A call that fails or whose ctx ends unblocks its
// copy of the carrier with a deadline in the past (InterruptIO) when
// the carrier has SetDeadline, SetReadDeadline or SetWriteDeadline;
// give it one, or break the carrier on failure, as a copy blocked on a
// carrier without deadlines ends only with the carrier.
//
// Recovery: until the destination's domain has run, a source whose
// SendLive returned nil can still take the guest back: Unpause resumes
// it there. The source's DomainInfo.Migrated says its state has been
// sent (also after a daemon restart, for the manager to decide); a
// backend restarted with a domain whose ReceiveLive never completed
// destroys it, while one that holds the received state (ReceiveLive
// returned nil, MarkComplete not called yet) is kept paused where the
// backend can (DomainInfo.Received), for the manager to adopt or
// destroy. MarkComplete an incoming domain only once ReceiveLive has
// returned nil.
type Migrator interface {
	// SendLive streams the domain's memory and device state into to while
	// the guest keeps running, until the remaining dirty memory fits in
	// the downtime limit; the guest is then stopped and the rest sent.
	// It returns once everything is written. On an error, or when ctx
	// ends, the migration is cancelled and the guest runs here as before
	// (a paused one stays paused). progress gets the share of memory sent
	// (0 to 1) now and then; it may be nil.
	SendLive(ctx context.Context, uuid string, to io.Writer, o MigrateOptions, progress func(float64)) error

	// ReceiveLive loads the state SendLive streams from from into the
	// domain uuid, made with Spec.Incoming, and returns when the domain
	// holds it, paused. An error (a broken or truncated stream, ctx
	// ending) leaves the domain unusable: the caller destroys it.
	ReceiveLive(ctx context.Context, uuid string, from io.Reader) error
}

// MigrateOptions tune a live migration. Zero values mean the defaults.
type MigrateOptions struct {
	// Downtime is the longest the guest may be stopped at the end
	// (default DefaultDowntime).
	Downtime time.Duration
	// Bandwidth caps the stream in bytes per second (default: none that
	// matters, 8 GiB/s).
	Bandwidth int64
	// NoAutoConverge turns off the throttling of a guest whose memory is
	// dirtied faster than it can be sent.
	NoAutoConverge bool
	// BeforeSwitchover, when set, runs once the guest is stopped for the
	// end of the migration and before its device state is sent and its
	// disks let go (QEMU's pause-before-switchover): a storage
	// migration completes its disk mirrors there. An error cancels the
	// migration (the guest runs on here).
	BeforeSwitchover func(ctx context.Context) error
}

// DefaultDowntime is MigrateOptions.Downtime's default.
const DefaultDowntime = 300 * time.Millisecond
