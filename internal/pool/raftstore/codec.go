package raftstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"time"

	"github.com/hashicorp/raft"
)

// logFormatV1 is the first byte of every stored log entry. A store that
// meets a version it does not know refuses the entry instead of guessing.
const logFormatV1 = 1

// MaxEntryBytes bounds the Data and Extensions of one entry each. Raft
// entries in toolstackd are database batches well under this; the bound
// keeps a corrupt length from asking for an absurd allocation.
const MaxEntryBytes = 64 << 20

// ErrCorrupt is wrapped by every error about stored bytes that do not
// decode: a torn or overwritten value, a bad checksum, an unknown format.
var ErrCorrupt = errors.New("raftstore: corrupt log entry")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Flags of the AppendedAt field.
const (
	timeZero = 0 // AppendedAt is the zero time
	timeSet  = 1 // seconds (zig-zag varint) and nanoseconds (uvarint) follow
)

// encodeLog appends the binary form of l to dst and returns it.
//
// Layout (all integers varints unless said otherwise):
//
//	version byte (1)
//	index, term            uvarint
//	type                   byte
//	appendedAt flag        byte; when 1: unix seconds (varint), nanos (uvarint)
//	len(data), data
//	len(extensions), extensions
//	crc32c of all the above, 4 bytes big-endian
//
// An empty Data or Extensions is stored as length 0 and reads back as nil.
// AppendedAt keeps its instant (nanosecond precision) but not its location
// or monotonic reading.
func encodeLog(dst []byte, l *raft.Log) []byte {
	start := len(dst)
	dst = append(dst, logFormatV1)
	dst = binary.AppendUvarint(dst, l.Index)
	dst = binary.AppendUvarint(dst, l.Term)
	dst = append(dst, byte(l.Type))
	if l.AppendedAt.IsZero() {
		dst = append(dst, timeZero)
	} else {
		dst = append(dst, timeSet)
		dst = binary.AppendVarint(dst, l.AppendedAt.Unix())
		dst = binary.AppendUvarint(dst, uint64(l.AppendedAt.Nanosecond()))
	}
	dst = binary.AppendUvarint(dst, uint64(len(l.Data)))
	dst = append(dst, l.Data...)
	dst = binary.AppendUvarint(dst, uint64(len(l.Extensions)))
	dst = append(dst, l.Extensions...)
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// decoder reads the fields of one entry, remembering the first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrCorrupt, what)
	}
}

func (d *decoder) byte(what string) byte {
	if d.err != nil || len(d.b) < 1 {
		d.fail(what + " missing")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad " + what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad " + what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// bytes reads a length-prefixed byte string and returns a copy of it (nil
// when empty), so the result outlives the bbolt transaction it came from.
func (d *decoder) bytes(what string) []byte {
	n := d.uvarint(what + " length")
	if d.err != nil {
		return nil
	}
	if n > MaxEntryBytes || n > uint64(len(d.b)) {
		d.fail(what + " length out of range")
		return nil
	}
	if n == 0 {
		return nil
	}
	out := make([]byte, n)
	copy(out, d.b[:n])
	d.b = d.b[n:]
	return out
}

// decodeLog fills l from b, which came from the store and is therefore
// treated as possibly damaged: any inconsistency is an error wrapping
// ErrCorrupt, never a panic.
func decodeLog(b []byte, l *raft.Log) error {
	if len(b) < 1+4 {
		return fmt.Errorf("%w: %d bytes is too short", ErrCorrupt, len(b))
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	if body[0] != logFormatV1 {
		return fmt.Errorf("%w: unknown format version %d", ErrCorrupt, body[0])
	}
	d := decoder{b: body[1:]}
	var out raft.Log
	out.Index = d.uvarint("index")
	out.Term = d.uvarint("term")
	out.Type = raft.LogType(d.byte("type"))
	switch d.byte("time flag") {
	case timeZero:
	case timeSet:
		sec := d.varint("time seconds")
		nsec := d.uvarint("time nanoseconds")
		if d.err == nil && nsec >= uint64(time.Second) {
			d.fail("time nanoseconds out of range")
		}
		if d.err == nil && (sec < -math.MaxInt64/2 || sec > math.MaxInt64/2) {
			d.fail("time seconds out of range")
		}
		if d.err == nil {
			out.AppendedAt = time.Unix(sec, int64(nsec))
		}
	default:
		d.fail("unknown time flag")
	}
	out.Data = d.bytes("data")
	out.Extensions = d.bytes("extensions")
	if d.err == nil && len(d.b) != 0 {
		d.fail(fmt.Sprintf("%d trailing bytes", len(d.b)))
	}
	if d.err != nil {
		return d.err
	}
	*l = out
	return nil
}
