// Package stats holds the raw counters a host, its VMs and its SRs report
// to the metrics module at every tick (internal/rrdd), in the form the
// parts that measure them can give without knowing about round-robin
// archives or data-source names: cumulative counters as they are read
// (bytes, operations, CPU time since the domain started) and gauges in
// bytes. The rrdd module names them as xapi does and turns them into
// rates.
//
// The package is a leaf: it imports nothing of the project, so that the
// VM backends (internal/xenops) and the host sampler can fill it in and
// rrdd can read it without depending on each other.
package stats

import "time"

// Unknown marks a gauge that could not be read this tick.
const Unknown = -1

// VM is one running VM's counters at one tick.
type VM struct {
	// UUID names the VM (lower case).
	UUID string
	// VCPUTime is, per virtual CPU in order, the CPU time it has used
	// since the domain started.
	VCPUTime []time.Duration
	// Memory is the memory the domain has now, in bytes (the balloon's
	// actual size where there is one); MemoryTarget what the toolstack
	// asked the balloon for; MemoryInternalFree what the guest reports
	// free. Each is Unknown when it cannot be read.
	Memory, MemoryTarget, MemoryInternalFree int64
	// Disks are the VM's virtual disks, by device.
	Disks []Disk
	// NICs are the VM's virtual network interfaces, by device.
	NICs []NIC
}

// Disk is one block device's cumulative I/O counters.
type Disk struct {
	// Device is the device name xapi uses in data-source names: "xvda",
	// "hdd" and so on for a VBD (vbd_<device>_read), sda or nvme0n1 for a
	// host's physical disk.
	Device string
	// ReadBytes and WriteBytes count the bytes transferred; ReadOps and
	// WriteOps the requests completed.
	ReadBytes, WriteBytes uint64
	ReadOps, WriteOps     uint64
	// ReadTime and WriteTime are the total time requests took (zero when
	// the device does not say).
	ReadTime, WriteTime time.Duration
}

// NIC is one network interface's cumulative counters, seen from the
// guest for a VIF (Rx is what the guest received) and from the host for
// a PIF.
type NIC struct {
	// Device names the interface in data-source names: the VIF's device
	// number ("0") for a VM, the PIF's device ("eth0") for a host.
	Device           string
	RxBytes, TxBytes uint64
	RxErrors         uint64
	TxErrors         uint64
}

// Host is the host's own counters at one tick.
type Host struct {
	// CPUBusy and CPUTotal are, per physical CPU, the time it spent
	// busy and in all (busy plus idle) since boot; cpu<n> is the first's
	// rate over the second's.
	CPUBusy, CPUTotal []time.Duration
	// MemoryTotal and MemoryFree are in bytes.
	MemoryTotal, MemoryFree int64
	// LoadAverage is the one-minute load average.
	LoadAverage float64
	// NICs are the host's network interfaces, by device.
	NICs []NIC
	// Disks are its physical block devices.
	Disks []Disk
}
