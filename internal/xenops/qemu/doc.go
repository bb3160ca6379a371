// Package qemu is the backend that runs each domain as a
// qemu-system-x86_64 process and drives it over QMP.
//
// # A domain's life
//
// Create reserves the domain's directory in the state directory
// (StateDir/UUID: its journal domain.json, its log, its UEFI variables
// and, when the path allows, its QMP, VNC and serial sockets; otherwise
// those go in a short directory under the system's temporary directory).
// StartDeviceModel builds the command line (qemu_args.go) from the
// journal: the machine, CPUs and memory; fixed PCI slots for every device
// so that a resumed domain finds its devices where its saved state says;
// disks as -blockdev nodes named after their userdevice; NICs on taps
// made on their network's bridge (qemu_net.go) or on user-mode
// networking. The process runs in a session of its own and outlives the
// daemon; a restarted daemon finds it again from the journal (New,
// reattach) and tells a process it started from one that merely has the
// same pid by its start time.
//
// Accel "auto" probes once at start whether QEMU can run a VCPU under KVM
// (nested KVM may abort) and falls back to TCG; "kvm" refuses with
// VM_HVM_REQUIRED where KVM cannot be had.
//
// # The jail
//
// As root, every emulator runs as a user of its own under QEMU's seccomp
// sandbox and is handed, as descriptors, the files it needs (jail.go;
// docs/security.md, "The emulator's jail").
//
// # Operations over QMP
//
// qmp.go is the monitor client (commands, events, descriptor passing).
// Suspend and live migration send the guest's state through a socket
// handed to QEMU (migrate.go, framed as package backend's stream); disk
// mirrors (mirror.go) run blockdev-mirror to an image or an NBD export;
// an incoming domain exports its disks over NBD (export.go); live
// snapshots stack an overlay with blockdev-snapshot; stats.go reads
// counters for RRDs.
package qemu
