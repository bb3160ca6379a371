// Package backend is the contract between the VM lifecycle (xenops) and
// what runs domains: QEMU processes (package qemu), a simulation of them
// (package sim), or both side by side (package mixed).
//
// # The contract
//
// A Backend builds a domain in steps that xenops runs as its micro-ops,
// each cancellable through its context:
//
//	Check        refuse early what this host cannot run (no emulator, no KVM, no firmware)
//	Create       reserve a domain id and the domain's journal
//	Build        prepare boot files (firmware variables, a direct kernel)
//	AddDisk/NIC  describe devices before the device model runs
//	StartDeviceModel   start the emulator, paused unless Spec.AutoStart
//	Unpause      let the guest run
//
// then drives it while it lives (Pause, Unpause, RequestShutdown, Suspend,
// hot-plug of disks, media and NICs, VCPUs and the balloon target) and
// ends it with Destroy, which must leave nothing behind: no process, tap,
// socket or directory. Info and List report domains as the backend sees
// them (DomainState, and why a domain is Gone); SetNotify registers the
// function a backend calls when a domain changes on its own (a guest
// that shuts down, crashes or dies), so that xenops reads Info again.
//
// A backend keeps its own journal of every domain and survives a restart
// of the daemon: New finds domains whose processes still run and manages
// them again, and reports the others as Gone. Every path it builds from a
// journal or a uuid stays inside its state directory (EntryPath).
//
// # Optional capabilities
//
// What not every backend can do is a small interface of its own, which
// xenops discovers by a type assertion: Accelerated (how guests are
// accelerated), LiveSnapshotter (switch a running disk to an overlay),
// StatsReporter (a running domain's counters), Migrator (live migration
// over a stream), DiskMirrorer (copy a running disk to a target while it
// is written), DiskExporter (an incoming domain's disks served for a
// storage migration).
//
// # Formats shared by backends
//
// A suspend image (image.go) is a header naming the domain it was taken
// from (ImageMeta: uuid, memory, VCPUs added while it ran) followed by
// the backend's own record; OpenImageStream refuses an image of another
// backend or domain. A live migration stream (migstream.go) is framed, so
// that a sender's abort and a truncated or hostile stream are told apart
// (MigrateAborted, ErrMigrateStream).
package backend
