package backend

import "context"

// DiskMirrorer is the optional interface of a backend that copies a
// running domain's disk to an NBD export while the guest keeps writing
// to it: the storage half of a storage migration (VM.migrate_send,
// VDI.pool_migrate), as xapi's storage_migrate mirrors the leaf of a
// VDI's chain (its parents are copied first, apart).
//
// A mirror goes through these steps, all for one disk (named by
// userdevice) of one domain, at most one mirror per disk at a time:
//
//	StartMirror          the copy starts; guest writes go to both sides
//	WaitMirrorReady      the bulk copy is done: the target is in sync
//	CompleteMirror       pivot=false: the target gets the writes still in
//	                     flight and the mirror ends, the domain keeps its
//	                     disk (the storage-migration flow, with the guest
//	                     paused by the memory migration); pivot=true: the
//	                     domain writes to the target from now on
//	CancelMirror         at any step: the mirror ends, the source disk is
//	                     as it was and the target is garbage
//
// The target is an NBD URI (nbd://host:port/export or
// nbd+unix:///export?socket=PATH, as internal/nbd writes them) that the
// caller provides: in a migration a local Unix socket relaying to the
// destination host's export (internal/storage), so that the backend
// never opens a network port. The target must present at least the
// disk's virtual size; what it holds beyond what the mirror writes (its
// backing chain, for MirrorTop) is the caller's affair.
type DiskMirrorer interface {
	// StartMirror checks the target (it must answer an NBD handshake for
	// its export within the context's deadline, or 30 s) and starts
	// the copy. It returns once the mirror runs; an error leaves
	// nothing behind.
	StartMirror(ctx context.Context, uuid, device string, t MirrorTarget) error
	// MirrorStatus reports where the mirror of the disk is. A disk
	// without one has Active false; a mirror that failed on its own
	// (the target went away, an I/O error) stays reported, with Error
	// set, until CancelMirror clears it.
	MirrorStatus(ctx context.Context, uuid, device string) (MirrorStatus, error)
	// WaitMirrorReady waits until the mirror is in sync, or failed
	// (its error), or ctx ends (ctx's error; the mirror runs on).
	// progress, when not nil, gets the share copied (0 to 1) now and
	// then.
	WaitMirrorReady(ctx context.Context, uuid, device string, progress func(float64)) error
	// CompleteMirror ends a mirror that is in sync (an error otherwise,
	// and the mirror runs on). Without pivot the target holds what the
	// disk holds as the mirror ends: pause the guest first, or the
	// guest's later writes are the source's only. With pivot the
	// domain's disk is the target from now on (the source image is no
	// longer open). The call waits, within the context, for the
	// backend to confirm; on error the caller cancels the mirror.
	CompleteMirror(ctx context.Context, uuid, device string, pivot bool) error
	// CancelMirror stops the mirror of the disk, if there is one, and
	// forgets it: the domain keeps writing to its source disk only. It
	// is idempotent. If the backend cannot end the copy within the
	// context's deadline (a target that stopped answering mid-request),
	// it returns an error: the caller cuts the target connection and
	// calls it again.
	CancelMirror(ctx context.Context, uuid, device string) error
}

// MirrorSync is what a mirror copies before it is in sync.
type MirrorSync string

const (
	// MirrorFull copies everything the disk reads as, its whole chain.
	MirrorFull MirrorSync = "full"
	// MirrorTop copies only what the disk's top image (the leaf VDI)
	// holds: the target must already read as its parents elsewhere
	// (a leaf whose backing chain was copied first).
	MirrorTop MirrorSync = "top"
)

// MirrorTarget is where a mirror writes.
type MirrorTarget struct {
	// URI is the NBD export.
	URI string
	// Sync is MirrorFull (the default) or MirrorTop.
	Sync MirrorSync
	// Bandwidth caps the bulk copy in bytes per second (0: no cap).
	Bandwidth int64
	// WriteBlocking makes every guest write wait until the target has
	// it too, so that a guest writing faster than the copy goes still
	// converges (slower writes while the mirror runs).
	WriteBlocking bool

	// A target on this host may be given instead as an image the
	// backend opens itself, as it opens a disk: Path (a file or block
	// device) in Format, with URI empty. VDI.pool_migrate mirrors so,
	// so that the domain pivoted onto it holds the image directly and
	// not through an export that lives only as long as the daemon.
	Path, Format string
	// VDI is the target's VDI ref: after a pivot the backend records it
	// as the disk's (with the target's path and format), so that later
	// operations and a restarted daemon see the disk the domain uses.
	VDI string
}

// MirrorStatus is where one disk's mirror is.
type MirrorStatus struct {
	// Active is true from StartMirror until the mirror is completed or
	// cancelled.
	Active bool
	// Ready is true while the target is in sync.
	Ready bool
	// Done and Total are the copy's progress in bytes (Total grows as
	// the guest dirties what was already copied).
	Done, Total int64
	// Error is why the mirror stopped on its own ("" while it runs).
	Error string
}

// Progress is the share copied, 0 to 1.
func (s MirrorStatus) Progress() float64 {
	if s.Ready {
		return 1
	}
	if s.Total <= 0 {
		return 0
	}
	return min(1, float64(s.Done)/float64(s.Total))
}
