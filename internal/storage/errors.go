package storage

import (
	"context"
	"errors"
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
