// Package hoststat reads the host's own counters for the metrics module
// (internal/rrdd): CPU time, memory, load, network interfaces and disks,
// as a stats.Host. It reads the kernel's text interfaces under a root
// directory, "/" in the daemon and a fixture tree in tests, and needs no
// cgo and no privileges.
//
// # What is read
//
// /proc/stat gives CPUBusy and CPUTotal from its per-CPU lines
// ("cpu0", "cpu1", ...; the aggregate "cpu" line is ignored). Their
// columns are user, nice, system, idle, iowait, irq, softirq, steal,
// guest and guest_nice, in clock ticks of USER_HZ, which is 100 per
// second on every architecture Go supports. Busy time is user + nice +
// system + irq + softirq + steal; guest and guest_nice are not added,
// because the kernel already counts them inside user and nice. Total time
// is busy + idle + iowait. Old kernels print only the first four to eight
// columns; the missing ones count as zero, and columns after the tenth
// are ignored. The slices are indexed by CPU number: a CPU that is offline
// has no line, and its place before the last online CPU holds zeros, so
// that index n always means the kernel's cpu<n>.
//
// /proc/meminfo gives MemoryTotal (MemTotal) and MemoryFree
// (MemAvailable, or MemFree + Buffers + Cached on kernels older than 3.14
// that lack it), converted from kB (KiB) to bytes. MemoryFree is capped
// at MemoryTotal.
//
// /proc/loadavg gives LoadAverage, its first field (the one-minute load
// average).
//
// /sys/class/net/<dev>/statistics/{rx,tx}_{bytes,errors} give NICs, one
// per interface but the loopback "lo", sorted by name. Entries of
// /sys/class/net that are plain files (bonding_masters) are not
// interfaces and are passed over.
//
// /proc/diskstats gives Disks, one per whole disk, sorted by name: reads
// and writes completed become ReadOps and WriteOps, sectors read and
// written become ReadBytes and WriteBytes (a diskstats sector is always
// 512 bytes, whatever the device's own sector size), and the milliseconds
// spent reading and writing become ReadTime and WriteTime. Partitions are
// skipped: when <root>/sys/block exists a device is a whole disk exactly
// if it has an entry there, otherwise partitions are told by their names
// (sda1, vdb2, xvda3, hdc4; nvme0n1p1, mmcblk0p2, md0p1). Devices that are
// not physical disks are skipped by name: loop*, ram*, zram*, sr*, fd*,
// nbd* and dm-*. The 14-, 18- and 20-field formats (kernels before 4.18,
// before 5.5, and since) are all read; only the first fourteen fields are
// used.
//
// # Errors
//
// /proc/stat and /proc/meminfo must exist: without them Read fails, with
// an error that names the path (and wraps fs.ErrNotExist). The other
// sources are optional: a missing /proc/loadavg, /proc/diskstats or
// /sys/class/net leaves that part zero or empty. An interface that
// disappears between listing /sys/class/net and reading its counters is
// skipped.
//
// Every file is read whole with a bound of 1 MiB, and a bigger one is an
// error. Lines that are parsed may be at most 4096 bytes long (the long
// "intr" and "softirq" lines of /proc/stat are not parsed and so not
// bounded but by the file). A counter that is not a decimal number, or
// that would overflow its field, is an error naming the file and the line
// number; so is a line with too few fields, and /proc/stat without per-CPU
// lines or /proc/meminfo without MemTotal. Read never panics on what it
// reads, and what it allocates is bounded by the size of its input (CPU
// numbers above 16383 are refused).
//
// The parsers work on byte slices and do not touch the file system, so
// that they can be tested and fuzzed on their own.
package hoststat
