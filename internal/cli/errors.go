package cli

import (
	"errors"
	"fmt"
	"strings"

	"toolstackd/internal/cli/proto"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// usageError is one of the errors xe follows with a pointer to help:
// "Unknown command: X", "Syntax error: X", "Required parameter not
// found: X", or a bare message (kind "").
type usageError struct{ kind, msg string }

func (e *usageError) Error() string {
	if e.kind == "" {
		return e.msg
	}
	return e.kind + ": " + e.msg
}

func unknownCommand(name string) error { return &usageError{"Unknown command", name} }
func syntaxError(msg string) error     { return &usageError{"Syntax error", msg} }
func missingParam(name string) error   { return &usageError{"Required parameter not found", name} }
func unknownParam(name string) error   { return &usageError{"Unknown parameter", name} }

// failure is a command's own complaint, printed as "Error: <msg>".
type failure struct{ msg string }

func (e *failure) Error() string { return e.msg }

func failf(format string, args ...any) error { return &failure{fmt.Sprintf(format, args...)} }

// multipleFailure collects the errors of a --multiple operation: each is
// printed as "operation failed on <uuid>: <msg>".
type multipleFailure struct{ fails [][2]string }

func (e *multipleFailure) Error() string { return fmt.Sprintf("%d operations failed", len(e.fails)) }

// exitError ends a command with a status after it printed its own words.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// report writes an error the way xapi's CLI server does, and returns
// the exit status.
func (c *Ctx) report(err error) int {
	conn := c.conn
	var ue *usageError
	var fe *failure
	var mf *multipleFailure
	var ee *exitError
	var pe *proto.TooLargeError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		conn.Send(proto.PrintStderr(ue.Error() + "\n"))
		conn.Send(proto.PrintStderr("For usage run: 'xe help'\n"))
	case errors.As(err, &fe):
		conn.Send(proto.PrintStderr("Error: " + fe.msg + "\n"))
	case errors.As(err, &pe):
		conn.Send(proto.PrintStderr("Error: " + pe.Error() + "\n"))
	case errors.As(err, &mf):
		for _, f := range mf.fails {
			conn.Send(proto.Print("operation failed on " + f[0] + ": " + f[1]))
		}
	default:
		xe := xerr.From(err)
		if xe.Code == xerr.SessionAuthenticationFailed {
			msg := "Authentication failed"
			if c.user == "" {
				msg = "Username/password must be specified"
			}
			conn.Send(proto.PrintStderr(msg + "\n"))
			conn.Send(proto.PrintStderr("For usage run: 'xe help'\n"))
			break
		}
		conn.Send(proto.Error(xe.Code, c.s.readableParams(xe.Params)))
	}
	return 1
}

// readableParams shows the refs among an error's parameters as their
// objects' uuids, with the name where there is one, as xapi does.
func (s *Server) readableParams(params []string) []string {
	var snap *db.Snapshot
	out := make([]string, len(params))
	for i, p := range params {
		out[i] = p
		if !schema.IsRef(p) || p == schema.NullRef {
			continue
		}
		if snap == nil {
			snap = s.api.DB.Snapshot()
		}
		row, ok := snap.Lookup(p)
		if !ok || row.UUID() == "" {
			continue
		}
		out[i] = row.UUID()
		if f := row.Class.NameLabel; f != nil {
			out[i] += " (" + row.String(f) + ")"
		}
	}
	return out
}

// errorText is an error as one line, for "operation failed on" reports.
func errorText(err error) string {
	var fe *failure
	if errors.As(err, &fe) {
		return fe.msg
	}
	var ue *usageError
	if errors.As(err, &ue) {
		return ue.Error()
	}
	xe := xerr.From(err)
	if len(xe.Params) == 0 {
		return xe.Code
	}
	return xe.Code + ": [ " + strings.Join(xe.Params, "; ") + " ]"
}
