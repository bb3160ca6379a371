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

// XenAPI error codes the storage layer raises (all in errors.json).
const (
	errSRBackendFailure        = "SR_BACKEND_FAILURE"
	errSRUnknownDriver         = "SR_UNKNOWN_DRIVER"
	errSRHasPBD                = "SR_HAS_PBD"
	errSRHasNoPBDs             = "SR_HAS_NO_PBDS"
	errSRNotAttached           = "SR_NOT_ATTACHED"
	errSRFull                  = "SR_FULL"
	errSRUUIDExists            = "SR_UUID_EXISTS"
	errSROperationNotSupported = "SR_OPERATION_NOT_SUPPORTED"
	errSRNotEmpty              = "SR_NOT_EMPTY"
	errPBDExists               = "PBD_EXISTS"
	errVDIInUse                = "VDI_IN_USE"
	errVDITooSmall             = "VDI_TOO_SMALL"
	errVDITooLarge             = "VDI_TOO_LARGE"
	errVDIReadOnly             = "VDI_READONLY"
	errVDIMissing              = "VDI_MISSING"
	errVDILocationMissing      = "VDI_LOCATION_MISSING"
	errLocationNotUnique       = "LOCATION_NOT_UNIQUE"
	errVDIIncompatibleType     = "VDI_INCOMPATIBLE_TYPE"
	errVDIOnBootIncompatible   = "VDI_ON_BOOT_MODE_INCOMPATIBLE_WITH_OPERATION"
	errOperationNotAllowed     = "OPERATION_NOT_ALLOWED"
	errOtherOperation          = "OTHER_OPERATION_IN_PROGRESS"
	errUnimplementedInSM       = "UNIMPLEMENTED_IN_SM_BACKEND"
	errSMPluginComm            = "SM_PLUGIN_COMMUNICATION_FAILURE"
	errImportPrematureEOF      = "IMPORT_ERROR_PREMATURE_EOF"
	errImportError             = "IMPORT_ERROR"
	errTaskCancelled           = "TASK_CANCELLED"
	errVDICopyFailed           = "VDI_COPY_FAILED"
	errValueNotSupported       = "VALUE_NOT_SUPPORTED"
	errHostOffline             = "HOST_OFFLINE"
)

// BackendError is a driver failure as xapi reports SM errors:
// SR_BACKEND_FAILURE_<n> ["", message, ""].
func BackendError(n int, msg string) *xerr.Error {
	return xerr.New(errSRBackendFailure+"_"+strconv.Itoa(n), "", msg, "")
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
		return xerr.New(errTaskCancelled, "")
	}
	return BackendError(n, err.Error())
}
