// Package imageformat reads and writes the disk image formats toolstackd
// handles itself, without QEMU: qcow2 (version 3, as QEMU makes them with
// 64 KiB clusters and 16-bit refcounts) and VHD (dynamic and
// differencing), per QEMU's docs/interop/qcow2.txt and Microsoft's
// Virtual Hard Disk Image Format Specification.
//
// What it offers:
//
//   - qcow2 headers: ParseQcow2Header, ReadQcow2Header and
//     ReadQcow2HeaderFrom decode and check a header (every offset and
//     length against the buffer and sane limits); Qcow2IsEmpty tells an
//     image with nothing of its own; CreateQcow2 writes a new empty image,
//     optionally over a backing file, the same bytes qemu-img would.
//   - qcow2 fill: an Appender fills an empty image from data arriving in
//     guest order (an upload), appending clusters and writing the L1
//     table last, so an interrupted fill still leaves a consistent image.
//   - streamed export: PlanQcow2 and PlanVHD lay out an image of a disk's
//     extents that can be written front to back to a socket (no seeking),
//     with its exact length known before the first byte; WriteTo writes
//     it, reading the disk through a RangeReader the caller chooses.
//   - streamed import: ApplyVHD reads a VHD from a stream and writes the
//     blocks it carries to a Disk.
//
// Everything read from an image or a stream is untrusted: sizes, offsets
// and table lengths are bounded before use, so a hostile image gets an
// error, never a crash or an unbounded allocation. Data that does not
// fit its target is a TooBigError. The package knows nothing of SRs,
// VDIs or the XenAPI; internal/storage uses it for file SRs and disk
// transfers.
package imageformat
