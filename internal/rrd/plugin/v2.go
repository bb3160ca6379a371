// Package plugin reads and writes the files of xcp-rrdd's plugin protocol,
// version 2: how a metrics plugin hands its readings to the daemon.
//
// A plugin keeps one file (in xapi, a shared-memory file under
// /dev/shm/metrics) that it rewrites every tick, and the daemon reads a
// snapshot of its bytes every tick. The layout, with N data sources and M
// bytes of metadata, all integers big-endian:
//
//	offset  size  field
//	0       11    "DATASOURCES"
//	11      4     CRC-32 (IEEE) of bytes 23 to 31+8N: timestamp and values
//	15      4     CRC-32 (IEEE) of the M metadata bytes
//	19      4     N
//	23      8     timestamp: Unix seconds as an IEEE-754 double (older
//	              writers put an integer number of seconds here)
//	31      8N    values: int64 or double bit patterns, per value_type
//	31+8N   4     M
//	35+8N   M     metadata: JSON {"datasources": {"<name>": {...}, ...}}
//
// The i-th value belongs to the i-th key of the "datasources" object, so the
// metadata is read in order (never through a map). Every property is a JSON
// string: value_type ("int64" or "float", required), type ("absolute",
// "derive" or "gauge"; default absolute), owner ("host", "vm <uuid>" or
// "sr <uuid>"; default host), default ("true"/"false"; default false),
// description, units, min and max (numbers as text; default -infinity and
// infinity) and transform ("identity" or "inverse"). Trailing NUL bytes,
// which the C writer library includes in the length and the CRC, are
// ignored.
//
// A Reader keeps the CRCs of the previous snapshot: a snapshot whose data CRC
// has not changed is ErrNoUpdate, and when the metadata CRC has not changed
// the cached metadata is used without parsing it again. The writer fills in
// the data CRC last, so a snapshot read during a write (a torn read) fails
// its checksum. Whatever is wrong with a snapshot (bad header, bad CRC,
// truncation, oversized or malformed metadata) comes back as an error and
// the caller skips that plugin for the tick; nothing panics and allocation
// is bounded by the snapshot's size and MaxMetadata.
package plugin

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"toolstackd/internal/rrd"
)

// Header opens every protocol v2 file.
const Header = "DATASOURCES"

const (
	offDataCRC  = 11
	offMetaCRC  = 15
	offCount    = 19
	offTime     = 23
	offValues   = 31
	fixedLength = 35 // everything but the values and the metadata
)

// Bounds on a snapshot. xapi's own plugins report tens of sources and a few
// KiB of metadata.
const (
	MaxDatasources = 1 << 14
	MaxMetadata    = 1 << 20
)

// Errors a snapshot can fail with; the caller skips the tick on any of them.
var (
	ErrInvalidHeader = errors.New("plugin: not a protocol v2 file (bad header)")
	ErrNoUpdate      = errors.New("plugin: no update since the last read")
	ErrChecksum      = errors.New("plugin: checksum mismatch (torn or corrupt write)")
	ErrTruncated     = errors.New("plugin: file shorter than its header says")
	ErrPayload       = errors.New("plugin: invalid payload")
)

// ValueType is how a source's 8 value bytes are read.
type ValueType uint8

const (
	// Float values are IEEE-754 doubles.
	Float ValueType = iota
	// Int64 values are two's complement integers.
	Int64
)

// OwnerKind says what a source measures.
type OwnerKind uint8

const (
	// Host sources go into the host's RRD.
	Host OwnerKind = iota
	// VM sources go into the RRD of the VM with Owner.UUID.
	VM
	// SR sources go into the RRD of the SR with Owner.UUID.
	SR
)

// Owner is the RRD a source belongs to.
type Owner struct {
	Kind OwnerKind
	UUID string // lower case; empty for Host
}

// Source is one data source's metadata.
type Source struct {
	Name        string
	Description string
	Units       string
	Owner       Owner
	ValueType   ValueType
	Type        rrd.DSType
	Default     bool
	Min, Max    float64
	Transform   rrd.Transform
}

// Reading is one parsed snapshot.
type Reading struct {
	// Timestamp is in Unix seconds.
	Timestamp float64
	Sources   []Source
	// Values[i] is Sources[i]'s reading, with its transform.
	Values []rrd.Value
}

// Time is the snapshot's timestamp as a time, or an error when the plugin
// wrote something that is not a plausible time (NaN, negative, or past the
// year 9999), which the caller treats like any other bad snapshot.
func (r Reading) Time() (time.Time, error) {
	const maxSeconds = 253402300800 // 10000-01-01
	ts := r.Timestamp
	if !(ts >= 0 && ts < maxSeconds) {
		return time.Time{}, fmt.Errorf("%w: timestamp %v out of range", ErrPayload, ts)
	}
	sec, frac := math.Modf(ts)
	return time.Unix(int64(sec), int64(frac*1e9)), nil
}

// Reader reads successive snapshots of one plugin's file. The zero Reader is
// ready to use. It is not safe for concurrent use.
type Reader struct {
	lastDataCRC uint32
	lastMetaCRC uint32
	cached      []Source
}

// Read parses one snapshot. The returned Reading does not alias b; its
// Sources slice is shared with later Readings while the metadata does not
// change and must not be modified.
func (r *Reader) Read(b []byte) (Reading, error) {
	if len(b) < offValues {
		if len(b) >= len(Header) && string(b[:len(Header)]) != Header {
			return Reading{}, ErrInvalidHeader
		}
		return Reading{}, ErrTruncated
	}
	if string(b[:len(Header)]) != Header {
		return Reading{}, ErrInvalidHeader
	}
	dataCRC := binary.BigEndian.Uint32(b[offDataCRC:])
	if dataCRC == r.lastDataCRC {
		return Reading{}, ErrNoUpdate
	}
	metaCRC := binary.BigEndian.Uint32(b[offMetaCRC:])
	n := int(binary.BigEndian.Uint32(b[offCount:]))
	if n > MaxDatasources {
		return Reading{}, fmt.Errorf("%w: %d data sources (at most %d)", ErrPayload, n, MaxDatasources)
	}
	valuesEnd := offValues + 8*n
	if len(b) < valuesEnd {
		return Reading{}, ErrTruncated
	}
	if crc32.ChecksumIEEE(b[offTime:valuesEnd]) != dataCRC {
		return Reading{}, ErrChecksum
	}
	r.lastDataCRC = dataCRC

	srcs := r.cached
	if metaCRC != r.lastMetaCRC || len(srcs) != n {
		if len(b) < valuesEnd+4 {
			return Reading{}, ErrTruncated
		}
		m := int(binary.BigEndian.Uint32(b[valuesEnd:]))
		if m > MaxMetadata {
			return Reading{}, fmt.Errorf("%w: %d bytes of metadata (at most %d)", ErrPayload, m, MaxMetadata)
		}
		start := valuesEnd + 4
		if len(b)-start < m {
			return Reading{}, ErrTruncated
		}
		meta := b[start : start+m]
		if crc32.ChecksumIEEE(meta) != metaCRC {
			return Reading{}, ErrChecksum
		}
		parsed, err := ParseMetadata(bytes.Trim(meta, "\x00"))
		if err != nil {
			return Reading{}, err
		}
		if len(parsed) != n {
			return Reading{}, fmt.Errorf("%w: metadata describes %d data sources, the file has %d values", ErrPayload, len(parsed), n)
		}
		// Unlike xapi, remember the metadata CRC only once the metadata
		// has parsed, so that bad metadata is not cached as good.
		r.lastMetaCRC = metaCRC
		r.cached = parsed
		srcs = parsed
	}

	out := Reading{Timestamp: decodeTimestamp(binary.BigEndian.Uint64(b[offTime:])), Sources: srcs}
	out.Values = make([]rrd.Value, n)
	for i := range n {
		bits := binary.BigEndian.Uint64(b[offValues+8*i:])
		v := rrd.Value{Transform: srcs[i].Transform}
		if srcs[i].ValueType == Int64 {
			v.Kind, v.I = rrd.Int, int64(bits)
		} else {
			v.Kind, v.F = rrd.Float, math.Float64frombits(bits)
		}
		out.Values[i] = v
	}
	return out, nil
}

// decodeTimestamp reads the timestamp field. xapi now writes a double;
// writers from before its CA-391651 wrote an integer number of seconds. A
// bit pattern below 2^52 is a subnormal double, never a real time, so it
// is read as such an integer.
func decodeTimestamp(bits uint64) float64 {
	if bits < 1<<52 {
		return float64(bits)
	}
	return math.Float64frombits(bits)
}

// ParseMetadata reads the metadata JSON (without trailing NULs), keeping the
// order of the data sources.
func ParseMetadata(meta []byte) ([]Source, error) {
	if len(meta) > MaxMetadata {
		return nil, fmt.Errorf("%w: metadata too large", ErrPayload)
	}
	dec := json.NewDecoder(bytes.NewReader(meta))
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrPayload}, args...)...)
	}
	if err := expectDelim(dec, '{'); err != nil {
		return nil, bad("metadata is not a JSON object")
	}
	var srcs []Source
	found := false
	for dec.More() {
		key, err := stringToken(dec)
		if err != nil {
			return nil, bad("metadata: %v", err)
		}
		if key != "datasources" || found {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, bad("metadata: %v", err)
			}
			continue
		}
		found = true
		if err := expectDelim(dec, '{'); err != nil {
			return nil, bad("datasources is not an object")
		}
		for dec.More() {
			name, err := stringToken(dec)
			if err != nil {
				return nil, bad("datasources: %v", err)
			}
			if len(srcs) >= MaxDatasources {
				return nil, bad("more than %d data sources", MaxDatasources)
			}
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return nil, bad("data source %q: %v", name, err)
			}
			// Within one source a map is fine: the keys are property
			// names, not an order.
			props, err := firstProps(raw)
			if err != nil {
				return nil, bad("data source %q: %v", name, err)
			}
			s, err := sourceOf(name, props)
			if err != nil {
				return nil, bad("data source %q: %v", name, err)
			}
			srcs = append(srcs, s)
		}
		if err := expectDelim(dec, '}'); err != nil {
			return nil, bad("datasources: %v", err)
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return nil, bad("metadata: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, bad("junk after the metadata")
	}
	if !found {
		return nil, bad("no datasources")
	}
	return srcs, nil
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := t.(json.Delim); !ok || d != want {
		return fmt.Errorf("expected %q", want)
	}
	return nil
}

func stringToken(dec *json.Decoder) (string, error) {
	t, err := dec.Token()
	if err != nil {
		return "", err
	}
	s, ok := t.(string)
	if !ok {
		return "", errors.New("expected a key")
	}
	return s, nil
}

// firstProps reads one source's property object, keeping the first value of
// a repeated key.
func firstProps(raw json.RawMessage) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := expectDelim(dec, '{'); err != nil {
		return nil, errors.New("not an object")
	}
	props := map[string]json.RawMessage{}
	for dec.More() {
		k, err := stringToken(dec)
		if err != nil {
			return nil, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		if _, dup := props[k]; !dup {
			props[k] = v
		}
	}
	return props, nil
}

func sourceOf(name string, props map[string]json.RawMessage) (Source, error) {
	s := Source{Name: name}
	if name == "" || len(name) > rrd.MaxNameLen {
		return s, fmt.Errorf("name must have 1 to %d bytes", rrd.MaxNameLen)
	}
	get := func(key, def string) (string, error) {
		raw, ok := props[key]
		if !ok {
			return def, nil
		}
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			return "", fmt.Errorf("%s must be a string", key)
		}
		return v, nil
	}
	var err error
	if s.Description, err = get("description", ""); err != nil {
		return s, err
	}
	if s.Units, err = get("units", ""); err != nil {
		return s, err
	}
	ty, err := get("type", "absolute")
	if err != nil {
		return s, err
	}
	switch strings.ToLower(ty) {
	case "gauge":
		s.Type = rrd.Gauge
	case "absolute":
		s.Type = rrd.Absolute
	case "derive":
		s.Type = rrd.Derive
	default:
		return s, fmt.Errorf("unknown type %q", ty)
	}
	if _, ok := props["value_type"]; !ok {
		return s, errors.New("value_type missing")
	}
	vt, err := get("value_type", "")
	if err != nil {
		return s, err
	}
	switch vt {
	case "float":
		s.ValueType = Float
	case "int64":
		s.ValueType = Int64
	default:
		return s, fmt.Errorf("unknown value_type %q", vt)
	}
	for _, b := range []struct {
		key, def string
		dst      *float64
	}{{"min", "-infinity", &s.Min}, {"max", "infinity", &s.Max}} {
		v, err := get(b.key, b.def)
		if err != nil {
			return s, err
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return s, fmt.Errorf("%s %q is not a number", b.key, v)
		}
		*b.dst = f
	}
	owner, err := get("owner", "host")
	if err != nil {
		return s, err
	}
	if s.Owner, err = parseOwner(owner); err != nil {
		return s, err
	}
	def, err := get("default", "false")
	if err != nil {
		return s, err
	}
	switch def {
	case "true":
		s.Default = true
	case "false":
	default:
		return s, fmt.Errorf("default %q is neither true nor false", def)
	}
	tr, err := get("transform", "identity")
	if err != nil {
		return s, err
	}
	switch tr {
	case "identity":
		s.Transform = rrd.Identity
	case "inverse":
		s.Transform = rrd.Inverse
	default:
		return s, fmt.Errorf("unknown transform %q", tr)
	}
	return s, nil
}

// parseOwner reads "host", "vm <uuid>" or "sr <uuid>", case-insensitively,
// words separated by exactly one space.
func parseOwner(s string) (Owner, error) {
	parts := strings.Split(strings.ToLower(s), " ")
	switch {
	case len(parts) == 1 && parts[0] == "host":
		return Owner{Kind: Host}, nil
	case len(parts) == 2 && parts[0] == "vm" && parts[1] != "":
		return Owner{Kind: VM, UUID: parts[1]}, nil
	case len(parts) == 2 && parts[0] == "sr" && parts[1] != "":
		return Owner{Kind: SR, UUID: parts[1]}, nil
	}
	return Owner{}, fmt.Errorf("bad owner %q", s)
}

// Encode writes a protocol v2 file for the given readings, as a plugin
// would: metadata in the given order, the timestamp as a double, the data
// CRC computed over the finished timestamp and values.
func Encode(timestamp float64, srcs []Source, values []rrd.Value) ([]byte, error) {
	if len(srcs) != len(values) {
		return nil, errors.New("plugin: one value per source is needed")
	}
	if len(srcs) > MaxDatasources {
		return nil, fmt.Errorf("plugin: more than %d data sources", MaxDatasources)
	}
	meta, err := EncodeMetadata(srcs)
	if err != nil {
		return nil, err
	}
	n := len(srcs)
	b := make([]byte, fixedLength+8*n+len(meta))
	copy(b, Header)
	binary.BigEndian.PutUint32(b[offMetaCRC:], crc32.ChecksumIEEE(meta))
	binary.BigEndian.PutUint32(b[offCount:], uint32(n)) // #nosec G115 -- n <= MaxDatasources
	binary.BigEndian.PutUint64(b[offTime:], math.Float64bits(timestamp))
	for i, v := range values {
		var bits uint64
		switch srcs[i].ValueType {
		case Int64:
			bits = uint64(v.I) // #nosec G115 -- two's complement bit pattern, as on the wire
		default:
			bits = math.Float64bits(v.F)
		}
		binary.BigEndian.PutUint64(b[offValues+8*i:], bits)
	}
	binary.BigEndian.PutUint32(b[offValues+8*n:], uint32(len(meta))) // #nosec G115 -- bounded by MaxMetadata
	copy(b[fixedLength+8*n:], meta)
	binary.BigEndian.PutUint32(b[offDataCRC:], crc32.ChecksumIEEE(b[offTime:offValues+8*n]))
	return b, nil
}

// EncodeMetadata writes the metadata JSON for srcs, in order, every property
// a string as the protocol requires.
func EncodeMetadata(srcs []Source) ([]byte, error) {
	var b bytes.Buffer
	str := func(s string) {
		enc, _ := json.Marshal(s) // a string always marshals
		b.Write(enc)
	}
	prop := func(k, v string) {
		b.WriteByte(',')
		str(k)
		b.WriteByte(':')
		str(v)
	}
	b.WriteString(`{"datasources":{`)
	for i, s := range srcs {
		if i > 0 {
			b.WriteByte(',')
		}
		str(s.Name)
		b.WriteString(`:{"description":`)
		str(s.Description)
		owner := "host"
		switch s.Owner.Kind {
		case VM:
			owner = "vm " + s.Owner.UUID
		case SR:
			owner = "sr " + s.Owner.UUID
		}
		prop("owner", owner)
		if s.Transform == rrd.Inverse {
			prop("transform", "inverse")
		}
		vt := "float"
		if s.ValueType == Int64 {
			vt = "int64"
		}
		prop("value_type", vt)
		prop("type", strings.ToLower(s.Type.String()))
		prop("default", strconv.FormatBool(s.Default))
		prop("units", s.Units)
		prop("min", formatBound(s.Min))
		prop("max", formatBound(s.Max))
		b.WriteByte('}')
	}
	b.WriteString("}}")
	if b.Len() > MaxMetadata {
		return nil, fmt.Errorf("plugin: metadata larger than %d bytes", MaxMetadata)
	}
	return b.Bytes(), nil
}

func formatBound(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}
