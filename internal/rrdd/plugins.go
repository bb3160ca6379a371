package rrdd

import (
	"bytes"
	"context"
	"crypto/md5" // #nosec G501 -- protocol v1 names MD5 as its checksum; it detects torn writes, it protects nothing
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"toolstackd/internal/rrd"
	"toolstackd/internal/rrd/plugin"
	"toolstackd/internal/safepath"
)

// Bounds on what PluginSampler reads at each tick.
const (
	// MaxPluginFiles is how many plugin files one directory may hold;
	// beyond it the files are taken in name order and the rest ignored.
	MaxPluginFiles = 256
	// MaxPluginFileSize bounds one plugin file. The largest well-formed
	// protocol v2 file (plugin.MaxDatasources values and
	// plugin.MaxMetadata bytes of metadata) is a little over 1 MiB.
	MaxPluginFileSize = 2 << 20
	// maxDirScan bounds the directory entries looked at per tick, so
	// that a directory flooded with files costs a bounded listing.
	maxDirScan = 16 * MaxPluginFiles
	// maxPluginSkip is the longest back-off, in ticks, after a plugin
	// file fails to read: xapi's skip_max (about 21 minutes).
	maxPluginSkip = 256
)

// PluginSampler reads the metrics plugins' files in dir, as xcp-rrdd reads
// those under /dev/shm/metrics: each regular file whose name does not start
// with a dot is one plugin, written in protocol v2 (binary, CRC-32) or v1
// (JSON, MD5), told apart by their headers. At each tick every file is read
// afresh (its size bounded by MaxPluginFileSize, at most MaxPluginFiles of
// them, symbolic links and other non-regular files ignored) and the union
// of their readings is returned.
//
// One parser is kept per file name, so unchanged metadata is not parsed
// again and a file the plugin has not rewritten since the last tick
// (plugin.ErrNoUpdate) is skipped silently; the parser of a file that
// disappears is dropped. A file that does not read (bad header, checksum
// mismatch from a torn write, truncation, oversized or malformed metadata,
// an implausible timestamp) is skipped for the tick, logged once at warn
// until it reads well again (then once at info), and, as in xcp-rrdd, not
// read again for 1, 3, 7, ... up to 255 ticks while it keeps failing.
//
// Readings are recorded at the service's tick time: Reading carries no
// time of its own, so the timestamp a plugin writes is only checked for
// plausibility. (xcp-rrdd, since CA-391651, updates each plugin's sources
// at the plugin's own timestamp instead.)
//
// Sample fails only when dir exists but cannot be listed; a missing dir
// has no readings.
func PluginSampler(dir string, log *slog.Logger) Sampler {
	if log == nil {
		log = slog.Default()
	}
	return &pluginDir{dir: dir, log: log, files: map[string]*pluginFile{}}
}

// pluginDir is PluginSampler's state. Sample is never called concurrently
// with itself (see Sampler), so it needs no lock.
type pluginDir struct {
	dir   string
	log   *slog.Logger
	files map[string]*pluginFile
	// tooMany says the directory's overflow was logged.
	tooMany bool
	// buf is reused to read each file; the parsers copy what they keep.
	buf []byte
}

// pluginFile is what is kept of one plugin file between ticks.
type pluginFile struct {
	v2 plugin.Reader
	v1 v1Reader
	// failing says a failure was logged and recovery is still to log.
	failing bool
	// skipInit and skip are xcp-rrdd's back-off: after a failure the
	// file is not read for skip-1 ticks, skipInit doubling (up to
	// maxPluginSkip) at each failure in a row.
	skipInit, skip int
}

func (p *pluginDir) Sample(ctx context.Context, now time.Time) ([]Reading, error) {
	names, err := p.list()
	if err != nil {
		return nil, err
	}
	for name := range p.files {
		if !slices.Contains(names, name) {
			delete(p.files, name)
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	root, err := os.OpenRoot(p.dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("metrics plugins: %w", err)
	}
	defer func() { _ = root.Close() }() // read-only: nothing to lose
	var out []Reading
	for _, name := range names {
		if ctx.Err() != nil {
			break // the tick's time is up: what was read so far is used
		}
		pf := p.files[name]
		if pf == nil {
			pf = &pluginFile{skipInit: 1}
			p.files[name] = pf
		}
		if pf.skip > 0 {
			pf.skip--
		}
		if pf.skip > 0 {
			continue
		}
		r, err := p.readOne(root, name, pf)
		switch {
		case errors.Is(err, plugin.ErrNoUpdate):
			// Not rewritten since the last tick: its sources get no
			// reading this time. Unlike xcp-rrdd this does not start a
			// back-off: our plugins are not told when rrdd reads, so a
			// plugin whose period drifts against the tick would
			// otherwise lose several ticks each time.
			continue
		case err != nil:
			pf.skipInit = min(2*pf.skipInit, maxPluginSkip)
			pf.skip = pf.skipInit
			if !pf.failing {
				pf.failing = true
				p.log.Warn("metrics plugin: file skipped until it reads well again", "plugin", name, "err", err)
			} else {
				p.log.Debug("metrics plugin: file still does not read", "plugin", name, "err", err, "skip_ticks", pf.skip-1)
			}
			continue
		}
		pf.skipInit, pf.skip = 1, 0
		if pf.failing {
			pf.failing = false
			p.log.Info("metrics plugin: file reads well again", "plugin", name)
		}
		for i, src := range r.Sources {
			out = append(out, Reading{Source: src, Value: r.Values[i]})
		}
	}
	return out, nil
}

// list returns the plugin files' names, sorted, at most MaxPluginFiles of
// them.
func (p *pluginDir) list() ([]string, error) {
	d, err := os.Open(p.dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("metrics plugins: %w", err)
	}
	defer func() { _ = d.Close() }() // read-only: nothing to lose
	var names []string
	seen, truncated := 0, false
	for seen < maxDirScan {
		ents, err := d.ReadDir(min(MaxPluginFiles, maxDirScan-seen))
		for _, e := range ents {
			name := e.Name()
			// The entry's type is lstat's: a symbolic link is never a
			// regular file here, whatever it points to.
			if strings.HasPrefix(name, ".") || !e.Type().IsRegular() || safepath.Name(name) != nil {
				continue
			}
			names = append(names, name)
		}
		seen += len(ents)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("metrics plugins: %w", err)
		}
		if seen >= maxDirScan {
			truncated = true
		}
	}
	slices.Sort(names)
	if truncated || len(names) > MaxPluginFiles {
		if !p.tooMany {
			p.tooMany = true
			p.log.Warn("metrics plugin: too many files; only the first ones by name are read",
				"dir", p.dir, "max", MaxPluginFiles)
		}
		names = names[:min(len(names), MaxPluginFiles)]
	} else if p.tooMany {
		p.tooMany = false
		p.log.Info("metrics plugin: the number of files is within bounds again", "dir", p.dir)
	}
	return names, nil
}

// errTooLarge is a plugin file over MaxPluginFileSize.
var errTooLarge = fmt.Errorf("%w: file larger than %d bytes", plugin.ErrPayload, MaxPluginFileSize)

// readOne reads and parses one plugin file.
func (p *pluginDir) readOne(root *os.Root, name string, pf *pluginFile) (plugin.Reading, error) {
	// O_NOFOLLOW: a file swapped for a link since the listing is not
	// followed (and os.Root would refuse one leaving the directory
	// anyway); O_NONBLOCK: nor does a FIFO put there block the tick.
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return plugin.Reading{}, err
	}
	defer func() { _ = f.Close() }() // read-only: nothing to lose
	fi, err := f.Stat()
	if err != nil {
		return plugin.Reading{}, err
	}
	if !fi.Mode().IsRegular() {
		return plugin.Reading{}, errors.New("not a regular file")
	}
	if fi.Size() > MaxPluginFileSize {
		return plugin.Reading{}, errTooLarge
	}
	if cap(p.buf) < int(fi.Size())+1 {
		p.buf = make([]byte, 0, min(MaxPluginFileSize+1, int(fi.Size())+512))
	}
	b := bytes.NewBuffer(p.buf[:0])
	n, err := b.ReadFrom(io.LimitReader(f, MaxPluginFileSize+1))
	if err != nil {
		return plugin.Reading{}, err
	}
	if n > MaxPluginFileSize {
		return plugin.Reading{}, errTooLarge
	}
	data := b.Bytes()
	if cap(data) <= MaxPluginFileSize+1 {
		p.buf = data
	}
	var r plugin.Reading
	if isV1(data) {
		r, err = pf.v1.read(data)
	} else {
		r, err = pf.v2.Read(data)
	}
	if err != nil {
		return plugin.Reading{}, err
	}
	if _, err := r.Time(); err != nil {
		return plugin.Reading{}, err
	}
	return r, nil
}

// Protocol v1: "DATASOURCES\n", the JSON's length as 8 hex digits, "\n",
// its MD5 as 32 hex digits, "\n", then the JSON
// {"timestamp": <seconds>, "datasources": {"<name>": {...}}} in which each
// source carries its "value" (a number, or a number as text) and the same
// properties as v2's metadata, value_type defaulting to "float" and
// transform not read.
const (
	v1Header   = "DATASOURCES\n"
	v1LenEnd   = len(v1Header) + 8   // the newline after the length
	v1SumStart = v1LenEnd + 1        // 21
	v1Payload  = v1SumStart + 32 + 1 // 54
)

// isV1 tells the two versions apart. A v2 file has a CRC byte at offset
// 11 and the second byte of its source count at 20: a newline (10) there
// would mean at least 10<<16 sources, more than any valid file holds.
func isV1(b []byte) bool {
	return len(b) > v1LenEnd && string(b[:len(v1Header)]) == v1Header && b[v1LenEnd] == '\n'
}

// v1Reader reads successive protocol v1 snapshots of one file.
type v1Reader struct {
	lastSum string
}

func (r *v1Reader) read(b []byte) (plugin.Reading, error) {
	if len(b) < v1Payload {
		return plugin.Reading{}, plugin.ErrTruncated
	}
	if string(b[:len(v1Header)]) != v1Header || b[v1Payload-1] != '\n' {
		return plugin.Reading{}, plugin.ErrInvalidHeader
	}
	n, err := strconv.ParseUint(string(b[len(v1Header):v1LenEnd]), 16, 32)
	if err != nil {
		return plugin.Reading{}, fmt.Errorf("%w: bad length", plugin.ErrPayload)
	}
	if uint64(len(b)-v1Payload) < n {
		return plugin.Reading{}, plugin.ErrTruncated
	}
	payload := b[v1Payload : v1Payload+int(n)]
	sum := strings.ToLower(string(b[v1SumStart : v1Payload-1]))
	got := md5.Sum(payload) // #nosec G401 -- the protocol's checksum
	if hex.EncodeToString(got[:]) != sum {
		return plugin.Reading{}, plugin.ErrChecksum
	}
	if sum == r.lastSum {
		return plugin.Reading{}, plugin.ErrNoUpdate
	}
	out, err := parseV1(payload)
	if err != nil {
		return plugin.Reading{}, err
	}
	// Remembered once parsed, as the v2 Reader does, so that a bad
	// payload is reported again rather than taken for no update.
	r.lastSum = sum
	return out, nil
}

// parseV1 reads a v1 payload. The sources' properties are checked by the
// v2 metadata parser, given each source's properties without its value
// and with value_type filled in.
func parseV1(payload []byte) (plugin.Reading, error) {
	bad := func(format string, args ...any) (plugin.Reading, error) {
		return plugin.Reading{}, v1Bad(format, args...)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return bad("not a JSON object")
	}
	var (
		out       plugin.Reading
		haveTime  bool
		haveDSs   bool
		meta      []byte
		rawValues []json.RawMessage
	)
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return bad("%v", err)
		}
		key, _ := t.(string)
		switch {
		case key == "timestamp" && !haveTime:
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return bad("timestamp: %v", err)
			}
			f, err := v1Number(raw)
			if err != nil {
				return bad("timestamp: %v", err)
			}
			out.Timestamp, haveTime = f, true
		case key == "datasources" && !haveDSs:
			haveDSs = true
			if meta, rawValues, err = v1Datasources(dec); err != nil {
				return plugin.Reading{}, err
			}
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return bad("%v", err)
			}
		}
	}
	if _, err := dec.Token(); err != nil {
		return bad("%v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return bad("junk after the payload")
	}
	if !haveTime || !haveDSs {
		return bad("timestamp or datasources missing")
	}
	srcs, err := plugin.ParseMetadata(meta)
	if err != nil {
		return plugin.Reading{}, err
	}
	if len(srcs) != len(rawValues) {
		return bad("%d sources for %d values", len(srcs), len(rawValues))
	}
	out.Sources = srcs
	if out.Values, err = v1Values(srcs, rawValues); err != nil {
		return plugin.Reading{}, err
	}
	return out, nil
}

// v1Bad is an error about a v1 payload.
func v1Bad(format string, args ...any) error {
	return fmt.Errorf("%w: v1: "+format, append([]any{plugin.ErrPayload}, args...)...)
}

// v1Datasources reads a v1 payload's "datasources" object (dec is at its
// value) into the v2 metadata ParseMetadata reads, each source without
// its value, and the values apart, in the same order.
func v1Datasources(dec *json.Decoder) ([]byte, []json.RawMessage, error) {
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, v1Bad("datasources is not an object")
	}
	var meta bytes.Buffer
	var rawValues []json.RawMessage
	meta.WriteString(`{"datasources":{`)
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil, v1Bad("datasources: %v", err)
		}
		name, _ := t.(string)
		if len(rawValues) >= plugin.MaxDatasources {
			return nil, nil, v1Bad("more than %d data sources", plugin.MaxDatasources)
		}
		var props map[string]json.RawMessage
		if err := dec.Decode(&props); err != nil {
			return nil, nil, v1Bad("data source %q: %v", name, err)
		}
		v, ok := props["value"]
		if !ok {
			return nil, nil, v1Bad("data source %q: no value", name)
		}
		rawValues = append(rawValues, v)
		delete(props, "value")
		delete(props, "transform")
		vt := "float"
		if raw, ok := props["value_type"]; ok {
			if err := json.Unmarshal(raw, &vt); err != nil {
				return nil, nil, v1Bad("data source %q: value_type must be a string", name)
			}
		}
		props["value_type"], _ = json.Marshal(strings.ToLower(vt))
		if len(rawValues) > 1 {
			meta.WriteByte(',')
		}
		k, _ := json.Marshal(name)
		p, err := json.Marshal(props)
		if err != nil {
			return nil, nil, v1Bad("data source %q: %v", name, err)
		}
		meta.Write(k)
		meta.WriteByte(':')
		meta.Write(p)
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, v1Bad("datasources: %v", err)
	}
	meta.WriteString("}}")
	return meta.Bytes(), rawValues, nil
}

// v1Values reads each source's value as its type says: an int64 exactly
// when its text is an integer.
func v1Values(srcs []plugin.Source, rawValues []json.RawMessage) ([]rrd.Value, error) {
	values := make([]rrd.Value, len(srcs))
	for i, s := range srcs {
		v := rrd.Value{Transform: rrd.Identity}
		f, err := v1Number(rawValues[i])
		if err != nil {
			return nil, v1Bad("data source %q: value: %v", s.Name, err)
		}
		if s.ValueType == plugin.Int64 {
			if !(f >= math.MinInt64 && f < math.MaxInt64) {
				return nil, v1Bad("data source %q: value %v out of range", s.Name, f)
			}
			v.Kind, v.I = rrd.Int, int64(f)
			// Exact when the text is an integer (a float64 loses
			// digits past 2^53).
			if i, err := strconv.ParseInt(v1Text(rawValues[i]), 10, 64); err == nil {
				v.I = i
			}
		} else {
			v.Kind, v.F = rrd.Float, f
		}
		values[i] = v
	}
	return values, nil
}

// v1Text is a JSON number's text, or a JSON string's contents.
func v1Text(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return strings.TrimSpace(s)
	}
	return strings.TrimSpace(string(raw))
}

// v1Number reads a value written as a JSON number or as a number in a
// string (xapi's writer formats values with %.2f into strings).
func v1Number(raw json.RawMessage) (float64, error) {
	f, err := strconv.ParseFloat(v1Text(raw), 64)
	if err != nil {
		return 0, fmt.Errorf("%s is not a number", raw)
	}
	return f, nil
}
