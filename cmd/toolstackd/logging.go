package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"

	"toolstackd/internal/journal"
)

// logTarget is --log-target: where the daemon's log goes.
//
//	auto     the journal when systemd connected standard error to it,
//	         else text on standard error (the default)
//	journal  the journal, over its native protocol (internal/journal):
//	         a priority per entry and the attributes as fields
//	stderr   slog's text format on standard error
//	json     slog's JSON format on standard error, one object a line
type logTarget string

var logTargets = []string{"auto", "journal", "stderr", "json"}

func (t *logTarget) String() string {
	if *t == "" {
		return "auto"
	}
	return string(*t)
}

func (t *logTarget) Set(s string) error {
	for _, v := range logTargets {
		if s == v {
			*t = logTarget(s)
			return nil
		}
	}
	return fmt.Errorf("must be one of %s", strings.Join(logTargets, ", "))
}

func (t *logTarget) Type() string { return "target" }

// logTargetHelp is --log-target's help.
const logTargetHelp = "where the log goes: auto (the systemd journal when standard error is connected to it, else text on standard error), journal (native protocol: priorities and fields such as CALL, SESSION, TASK, VM_UUID), stderr (text) or json (JSON lines on standard error)"

// journalSocketEnv, for tests, names the socket the journal target sends
// to instead of the journal's.
const journalSocketEnv = "TOOLSTACKD_JOURNAL_SOCKET"

// newLogger makes the daemon's logger for --log-target and --log-level.
func newLogger(t logTarget, level slog.Level) *slog.Logger {
	return slog.New(logHandler(t, level, os.Stderr, os.Getenv("JOURNAL_STREAM")))
}

// logHandler makes the handler for target t; stderr is the standard error
// and stream the value of $JOURNAL_STREAM.
func logHandler(t logTarget, level slog.Level, stderr *os.File, stream string) slog.Handler {
	opts := &slog.HandlerOptions{Level: level}
	if t == "" || t == "auto" {
		t = "stderr"
		if connectedToJournal(stderr, stream) {
			t = "journal"
		}
	}
	var w io.Writer = stderr
	switch t {
	case "journal":
		return journal.New(journal.Options{Socket: os.Getenv(journalSocketEnv), Level: level, Fallback: w})
	case "json":
		return slog.NewJSONHandler(w, opts)
	default:
		return slog.NewTextHandler(w, opts)
	}
}

// connectedToJournal reports whether f is the stream systemd connected to
// the journal: systemd sets JOURNAL_STREAM to its device and inode,
// "DEV:INODE" in decimal, and a process whose standard error was
// redirected elsewhere since sees a different file.
func connectedToJournal(f *os.File, stream string) bool {
	d, i, ok := strings.Cut(stream, ":")
	if !ok {
		return false
	}
	dev, err1 := strconv.ParseUint(d, 10, 64)
	ino, err2 := strconv.ParseUint(i, 10, 64)
	if err1 != nil || err2 != nil {
		return false
	}
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && uint64(st.Dev) == dev && st.Ino == ino
}
