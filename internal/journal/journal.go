// Package journal is a log/slog handler that writes to the systemd journal
// over its native protocol, so that every entry arrives with a priority
// and with its attributes as fields that journalctl can match on.
//
// # Using it
//
//	h := journal.New(journal.Options{Level: slog.LevelInfo})
//	log := slog.New(h)
//	log.Info("VM started", "vm", vmUUID)
//
// The daemon picks this handler with --log-target journal, or with the
// default --log-target auto when systemd connected its standard error to
// the journal (cmd/toolstackd/logging.go).
//
// # Reading the entries back
//
//	journalctl -u toolstackd -p warning          # warnings and errors only
//	journalctl -u toolstackd CALL=VM.start       # one API call's entries
//	journalctl -u toolstackd VM_UUID=<uuid>      # one VM's entries
//	journalctl -u toolstackd -o verbose          # every field of each entry
//
// # Fields
//
// Every entry has
//
//	MESSAGE            the record's message
//	PRIORITY           syslog's: debug 7, info 6, warn 4, error 3 (a level
//	                   between two of slog's takes the lower one's, so
//	                   slog.LevelInfo+2 is 6 and anything from
//	                   slog.LevelError up is 3)
//	SYSLOG_IDENTIFIER  "toolstackd" (Options.Identifier)
//
// and, when the record knows where it was logged from (slog.Logger always
// does), CODE_FILE, CODE_LINE and CODE_FUNC. The record's time is not sent:
// the journal stamps each entry as it receives it.
//
// Each attribute becomes one field. Its name is the attribute's key in
// upper case, with each character outside [A-Z0-9_] replaced by "_"; the
// keys of groups (slog.Group, Logger.WithGroup) come first, each followed
// by "_", so "addr" in the group "http" is HTTP_ADDR. The journal's rules
// for a name are then enforced: a name that would begin with "_" (the
// journal's own trusted fields) loses its leading underscores, one that
// would begin with a digit or be empty gets "X_" in front, and the name is
// cut to 64 characters. An attribute whose name would be one of the
// fields above, or another field the journal gives a meaning to (MESSAGE_ID,
// ERRNO, SYSLOG_PID, ...), gets "X_" in front too, so that no attribute can
// pass itself off as, say, the entry's priority.
//
// The daemon's attributes that name what an entry is about keep these
// names everywhere (internal/api, internal/xenops):
//
//	key       field     value
//	call      CALL      the API call's wire name, e.g. VM.start
//	session   SESSION   the session's uuid, never its reference: a
//	                    session's OpaqueRef is the bearer secret of XenAPI
//	task      TASK      the task's uuid
//	vm        VM_UUID   the VM's uuid
//
// "vm" is the one key renamed (outside any group) rather than upper-cased,
// because VM_UUID is what one types to find a VM's entries.
//
// A value is the attribute's value as text: a time in RFC 3339 with
// nanoseconds, a duration as Go prints it (1.5s), an error its Error(), a
// slog.LogValuer what it resolves to, anything else what fmt prints.
//
// # The protocol
//
// An entry is one datagram sent to a Unix datagram socket, by default
// /run/systemd/journal/socket (Options.Socket; tests listen on their own).
// It holds one field per line, NAME=value. A value holding a newline is
// sent in the protocol's binary form instead: the name, a newline, the
// value's length as a little-endian 64-bit number, the value, a newline.
// An entry too big for one datagram (the kernel says EMSGSIZE or ENOBUFS)
// is written to a sealed memfd whose descriptor is sent alone instead, as
// the protocol allows; nothing is truncated.
//
// # Never stalling the caller
//
// The socket is non-blocking. When the journal is slow and the socket's
// queue is full, the entry is dropped, counted (Handler.Dropped), and the
// next entry that does get through is followed by a warning saying how
// many were lost (its field JOURNAL_DROPPED holds the count). Logging
// never waits for the journal.
//
// When there is no journal to talk to (no socket at the path, nobody
// listening on it, or any other error sending), the entry is written as
// slog's text format to Options.Fallback (standard error by default)
// instead, and the next entry tries the journal again: a journal that
// restarts gets the entries again as soon as it is back.
package journal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultSocket is where systemd-journald listens for native entries.
const DefaultSocket = "/run/systemd/journal/socket"

// DefaultIdentifier is the SYSLOG_IDENTIFIER of every entry.
const DefaultIdentifier = "toolstackd"

// Options configure a Handler. The zero value is the journal's socket at
// info level.
type Options struct {
	// Socket is the journal's socket; "" is DefaultSocket.
	Socket string
	// Identifier is SYSLOG_IDENTIFIER; "" is DefaultIdentifier.
	Identifier string
	// Level is the lowest level logged; nil is slog.LevelInfo.
	Level slog.Leveler
	// Fallback receives entries as text when the journal cannot be
	// reached; nil is os.Stderr.
	Fallback io.Writer
}

// Handler is a slog.Handler writing to the journal. It is safe for
// concurrent use; handlers made from it by WithAttrs and WithGroup share
// its socket and its counters.
type Handler struct {
	s      *sink
	level  slog.Leveler
	prefix string // the open groups' field prefix, "HTTP_" ...
	pre    []byte // fields encoded by WithAttrs
	fb     slog.Handler
}

// sink is what a handler and those made from it share.
type sink struct {
	fd    int
	path  string // a unix.SockaddrUnix is made per send: it is not safe to share
	ident string

	closed     atomic.Bool
	dropped    atomic.Uint64 // ever
	unreported atomic.Uint64 // dropped since the last warning
	fellBack   atomic.Uint64
}

// New makes a handler. It does not fail: when the socket cannot even be
// made, every entry goes to the fallback.
func New(o Options) *Handler {
	if o.Socket == "" {
		o.Socket = DefaultSocket
	}
	if o.Identifier == "" {
		o.Identifier = DefaultIdentifier
	}
	if o.Level == nil {
		o.Level = slog.LevelInfo
	}
	if o.Fallback == nil {
		o.Fallback = os.Stderr
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		fd = -1
	}
	s := &sink{fd: fd, path: o.Socket, ident: o.Identifier}
	return &Handler{s: s, level: o.Level,
		fb: slog.NewTextHandler(o.Fallback, &slog.HandlerOptions{Level: o.Level})}
}

// Close closes the handler's socket; entries logged afterwards go to the
// fallback. It closes the socket of every handler made from this one.
func (h *Handler) Close() error {
	if h.s.fd < 0 || h.s.closed.Swap(true) {
		return nil
	}
	return unix.Close(h.s.fd)
}

// Dropped is how many entries were lost because the journal's socket was
// full.
func (h *Handler) Dropped() uint64 { return h.s.dropped.Load() }

// FellBack is how many entries went to the fallback writer.
func (h *Handler) FellBack() uint64 { return h.s.fellBack.Load() }

// Enabled reports whether level is at or above the handler's.
func (h *Handler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.level.Level()
}

// WithAttrs returns a handler whose entries carry attrs too.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	h2 := *h
	h2.pre = append([]byte(nil), h.pre...)
	for _, a := range attrs {
		h2.pre = appendAttr(h2.pre, h.prefix, a)
	}
	h2.fb = h.fb.WithAttrs(attrs)
	return &h2
}

// WithGroup returns a handler whose later attributes are in group name.
func (h *Handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	h2 := *h
	h2.prefix = h.prefix + segment(name) + "_"
	h2.fb = h.fb.WithGroup(name)
	return &h2
}

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// Handle sends one entry.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	bp := bufs.Get().(*[]byte)
	b := h.encode((*bp)[:0], r)
	err := h.s.send(b)
	if cap(b) <= 64<<10 {
		*bp = b[:0]
		bufs.Put(bp)
	}
	if err != nil {
		h.s.fellBack.Add(1)
		return h.fb.Handle(ctx, r)
	}
	return nil
}

// encode appends r's entry to b.
func (h *Handler) encode(b []byte, r slog.Record) []byte {
	b = appendField(b, "MESSAGE", r.Message)
	b = appendField(b, "PRIORITY", strconv.Itoa(Priority(r.Level)))
	b = appendField(b, "SYSLOG_IDENTIFIER", h.s.ident)
	if r.PC != 0 {
		f, _ := runtime.CallersFrames([]uintptr{r.PC}).Next()
		if f.File != "" {
			b = appendField(b, "CODE_FILE", f.File)
			b = appendField(b, "CODE_LINE", strconv.Itoa(f.Line))
		}
		if f.Function != "" {
			b = appendField(b, "CODE_FUNC", f.Function)
		}
	}
	b = append(b, h.pre...)
	r.Attrs(func(a slog.Attr) bool {
		b = appendAttr(b, h.prefix, a)
		return true
	})
	return b
}

// Priority is the syslog priority of a slog level.
func Priority(l slog.Level) int {
	switch {
	case l >= slog.LevelError:
		return 3 // err
	case l >= slog.LevelWarn:
		return 4 // warning
	case l >= slog.LevelInfo:
		return 6 // info
	default:
		return 7 // debug
	}
}

// errNoJournal says an entry must go to the fallback.
var errNoJournal = errors.New("journal: no journal")

// send sends one encoded entry; an error means it did not get there and
// should go to the fallback (a dropped entry is no error: it is counted).
func (s *sink) send(b []byte) error {
	if s.fd < 0 || s.closed.Load() {
		return errNoJournal
	}
	err := unix.Sendto(s.fd, b, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, s.addr())
	if errors.Is(err, unix.EMSGSIZE) || errors.Is(err, unix.ENOBUFS) {
		err = s.sendFD(b)
	}
	switch {
	case err == nil:
		if n := s.unreported.Swap(0); n > 0 {
			s.reportDrops(n)
		}
		return nil
	case errors.Is(err, unix.EAGAIN):
		s.dropped.Add(1)
		s.unreported.Add(1)
		return nil
	default:
		return err
	}
}

func (s *sink) addr() *unix.SockaddrUnix { return &unix.SockaddrUnix{Name: s.path} }

// reportDrops tells the journal that n entries were dropped.
func (s *sink) reportDrops(n uint64) {
	var b []byte
	b = appendField(b, "MESSAGE", fmt.Sprintf("%d log entries dropped: the journal was not keeping up", n))
	b = appendField(b, "PRIORITY", "4")
	b = appendField(b, "SYSLOG_IDENTIFIER", s.ident)
	b = appendField(b, "JOURNAL_DROPPED", strconv.FormatUint(n, 10))
	if err := unix.Sendto(s.fd, b, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, s.addr()); err != nil {
		s.unreported.Add(n) // the next entry tries again
	}
}

// sendFD sends an entry too large for a datagram: written to a memfd,
// sealed, and its descriptor sent in an otherwise empty datagram.
func (s *sink) sendFD(b []byte) error {
	fd, err := unix.MemfdCreate("journal-entry", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(fd) }() // a memfd: nothing to lose
	for p := b; len(p) > 0; {
		n, err := unix.Write(fd, p)
		if err != nil {
			return err
		}
		p = p[n:]
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS,
		unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE|unix.F_SEAL_SEAL); err != nil {
		return err
	}
	return unix.Sendmsg(s.fd, nil, unix.UnixRights(fd), s.addr(), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
}

// appendField appends one field in the protocol's text form, or its
// binary form when the value holds a newline.
func appendField(b []byte, name, value string) []byte {
	b = append(b, name...)
	for i := 0; i < len(value); i++ {
		if value[i] == '\n' {
			b = append(b, '\n')
			b = binary.LittleEndian.AppendUint64(b, uint64(len(value)))
			b = append(b, value...)
			return append(b, '\n')
		}
	}
	b = append(b, '=')
	b = append(b, value...)
	return append(b, '\n')
}

// appendAttr appends attribute a's fields; prefix is the open groups'.
func appendAttr(b []byte, prefix string, a slog.Attr) []byte {
	a.Value = a.Value.Resolve()
	if a.Value.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += segment(a.Key) + "_"
		}
		for _, g := range a.Value.Group() {
			b = appendAttr(b, p, g)
		}
		return b
	}
	if a.Equal(slog.Attr{}) {
		return b // slog's rule: an empty attribute is ignored
	}
	var name string
	if prefix == "" && a.Key == "vm" {
		name = "VM_UUID"
	} else {
		name = fieldName(prefix + segment(a.Key))
	}
	return appendField(b, name, valueText(a.Value))
}

// valueText is a value as text.
func valueText(v slog.Value) string {
	switch v.Kind() {
	case slog.KindTime:
		return v.Time().Format(time.RFC3339Nano)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok && err != nil {
			return err.Error()
		}
	}
	return v.String()
}

// segment is a key in upper case with every character outside
// [A-Z0-9_] replaced by "_".
func segment(key string) string {
	ok := true
	for i := 0; i < len(key); i++ {
		if c := key[i]; !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			ok = false
			break
		}
	}
	if ok {
		return key
	}
	out := make([]byte, 0, len(key))
	for _, r := range key {
		switch {
		case r >= 'a' && r <= 'z':
			out = append(out, byte(r-'a'+'A'))
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_':
			out = append(out, byte(r))
		default:
			out = append(out, '_')
		}
	}
	return string(out)
}

// reserved are the fields the handler sets, and others the journal gives
// a meaning to: an attribute may not pose as one.
var reserved = map[string]bool{
	"MESSAGE": true, "MESSAGE_ID": true, "PRIORITY": true,
	"CODE_FILE": true, "CODE_LINE": true, "CODE_FUNC": true,
	"ERRNO": true, "INVOCATION_ID": true, "USER_INVOCATION_ID": true,
	"SYSLOG_FACILITY": true, "SYSLOG_IDENTIFIER": true, "SYSLOG_PID": true,
	"SYSLOG_TIMESTAMP": true, "SYSLOG_RAW": true, "DOCUMENTATION": true,
	"TID": true, "UNIT": true, "USER_UNIT": true, "JOURNAL_DROPPED": true,
	"OBJECT_PID": true, "COREDUMP_UNIT": true, "COREDUMP_USER_UNIT": true,
}

// maxName is the journal's longest field name.
const maxName = 64

// fieldName makes an upper-cased name valid for the journal: no leading
// "_", no leading digit, not empty, at most 64 characters, not reserved.
func fieldName(n string) string {
	for len(n) > 0 && n[0] == '_' {
		n = n[1:]
	}
	if n == "" || n[0] >= '0' && n[0] <= '9' || reserved[n] {
		n = "X_" + n
	}
	if len(n) > maxName {
		n = n[:maxName]
	}
	return n
}

// FieldName is the journal field an attribute with key gets outside any
// group (see the package documentation).
func FieldName(key string) string {
	if key == "vm" {
		return "VM_UUID"
	}
	return fieldName(segment(key))
}
