package storage

import (
	"context"
	"errors"
	"regexp"
	"strconv"

	"toolstackd/internal/xerr"
)

// SM error numbers (SM's XE_SR_ERRORCODES), which xapi reports as
// SR_BACKEND_FAILURE_<n> with the driver's message.
const (
	smInvalidArg            = 1
	smVDIInUse              = 24
	smUnimplemented         = 38
	smSRNotEmpty            = 39
	smSRScan                = 40
	smSRExists              = 42
	smVDIExists             = 43
	smSRNoSpace             = 44
	smVDIUnavailable        = 46
	smSRUnavailable         = 47
	smFileSRCreate          = 61
	smFileSRDelete          = 63
	smVDIRemove             = 64
	smVDILoad               = 65
	smVDICreate             = 78
	smVDISize               = 79
	smVDIClone              = 81
	smVDISnapshot           = 82
	smConfigLocationMissing = 94
	smVDIResize             = 110
	smVDIMissing            = 144
	smGeneral               = 202
)

// BackendError is a driver failure as xapi reports SM errors:
// SR_BACKEND_FAILURE_<n> ["", message, ""].
func BackendError(n int, msg string) *xerr.Error {
	return xerr.New(xerr.SRBackendFailure+"_"+strconv.Itoa(n), "", msg, "")
}

// asBackend turns any driver error into a XenAPI error: XenAPI errors
// pass through, a cancelled context is TASK_CANCELLED, and anything else
// becomes SR_BACKEND_FAILURE_<n> with its text.
func asBackend(err error, n int) error {
	if err == nil {
		return nil
	}
	var xe *xerr.Error
	if errors.As(err, &xe) {
		return xe
	}
	if errors.Is(err, context.Canceled) {
		return xerr.New(xerr.TaskCancelled, "")
	}
	return BackendError(n, err.Error())
}

// hostPath finds an absolute path in a message: a slash at the start or
// after a space, quote, bracket, '=' or ',', and what follows it up to
// the next of those or a ':' (an os.PathError's "open /x/y: ...", or
// qemu-img's "Could not open '/x/y': ...").
var hostPath = regexp.MustCompile(`(^|[\s'"(\[=,])/[^\s'"()\[\],:;]+`)

// hidePaths replaces the absolute paths in a message.
func hidePaths(s string) string { return hostPath.ReplaceAllString(s, "${1}(path hidden)") }

// forClient is a transfer's error as its client is told it (the HTTP
// answer and the task's error_info): the same XenAPI error with every
// absolute path in its parameters hidden. Which spool file an upload is
// staged in, where a volume lives, the data dir: none is the client's
// business, and each would show how the host lays out its disks. The
// caller logs err whole before.
func forClient(err error) error {
	if err == nil {
		return nil
	}
	xe := xerr.From(err)
	params := make([]string, len(xe.Params))
	changed := false
	for i, p := range xe.Params {
		params[i] = hidePaths(p)
		changed = changed || params[i] != p
	}
	if !changed && errors.As(err, new(*xerr.Error)) {
		return err
	}
	return xerr.New(xe.Code, params...)
}
