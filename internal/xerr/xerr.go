// Package xerr is the typed error that crosses the XenAPI: a code from the
// published error list and its parameters, as strings. Every layer returns
// these for anything a client should see; the RPC layer writes them as
// ErrorDescription [code, params...].
package xerr

import (
	"errors"
	"strings"
)

// Error is a XenAPI error.
type Error struct {
	Code   string
	Params []string
}

// New makes an error from a code and its parameters.
func New(code string, params ...string) *Error {
	if params == nil {
		params = []string{}
	}
	return &Error{Code: code, Params: params}
}

func (e *Error) Error() string {
	if len(e.Params) == 0 {
		return e.Code
	}
	return e.Code + ": [" + strings.Join(e.Params, "; ") + "]"
}

// Is matches errors by code, so errors.Is(err, xerr.New(xerr.HandleInvalid))
// works whatever the parameters.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// From returns err as a XenAPI error: itself when it is one (possibly
// wrapped), otherwise INTERNAL_ERROR carrying its text.
func From(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return New(InternalError, err.Error())
}

// HasCode reports whether err is a XenAPI error with the given code.
func HasCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// Codes used by toolstackd, with the parameters errors.json gives them.
// datamodel's tests check each against the published list.
const (
	DBUniquenessConstraintViolation = "DB_UNIQUENESS_CONSTRAINT_VIOLATION" // table, field, value
	EventFromTokenParseFailure      = "EVENT_FROM_TOKEN_PARSE_FAILURE"     // token
	EventsLost                      = "EVENTS_LOST"                        //
	EventSubscriptionParseFailure   = "EVENT_SUBSCRIPTION_PARSE_FAILURE"   // subscription
	FieldTypeError                  = "FIELD_TYPE_ERROR"                   // field
	HandleInvalid                   = "HANDLE_INVALID"                     // class, handle
	InternalError                   = "INTERNAL_ERROR"                     // message
	InvalidValue                    = "INVALID_VALUE"                      // field, value
	MapDuplicateKey                 = "MAP_DUPLICATE_KEY"                  // type, param_name, uuid, key
	MessageMethodUnknown            = "MESSAGE_METHOD_UNKNOWN"             // method
	MessageParameterCountMismatch   = "MESSAGE_PARAMETER_COUNT_MISMATCH"   // method, expected, received
	NotImplemented                  = "NOT_IMPLEMENTED"                    // function
	PermissionDenied                = "PERMISSION_DENIED"                  // message
	RBACPermissionDenied            = "RBAC_PERMISSION_DENIED"             // permission, message
	SessionAuthenticationFailed     = "SESSION_AUTHENTICATION_FAILED"      //
	SessionInvalid                  = "SESSION_INVALID"                    // handle
	SessionNotRegistered            = "SESSION_NOT_REGISTERED"             // handle
	TooManyPendingTasks             = "TOO_MANY_PENDING_TASKS"             //
	UUIDInvalid                     = "UUID_INVALID"                       // type, uuid
)

// Codes of account and role management.
const (
	ChangePasswordRejected  = "CHANGE_PASSWORD_REJECTED"    // msg
	RoleAlreadyExists       = "ROLE_ALREADY_EXISTS"         //
	RoleNotFound            = "ROLE_NOT_FOUND"              //
	SubjectAlreadyExists    = "SUBJECT_ALREADY_EXISTS"      //
	UserIsNotLocalSuperuser = "USER_IS_NOT_LOCAL_SUPERUSER" // msg
)

// Codes lists the constants above, for the test that checks them.
var Codes = []string{DBUniquenessConstraintViolation, EventFromTokenParseFailure, EventsLost,
	EventSubscriptionParseFailure, FieldTypeError, HandleInvalid, InternalError, InvalidValue, MapDuplicateKey,
	MessageMethodUnknown, MessageParameterCountMismatch, NotImplemented, PermissionDenied, RBACPermissionDenied,
	SessionAuthenticationFailed, SessionInvalid, SessionNotRegistered, TooManyPendingTasks, UUIDInvalid,
	ChangePasswordRejected, RoleAlreadyExists, RoleNotFound, SubjectAlreadyExists, UserIsNotLocalSuperuser}
