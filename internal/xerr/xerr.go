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

// The constants for the published error codes, the table of their
// documented parameters (published) and Codes are generated from
// internal/datamodel/errors.json into zz_codes.go.
//go:generate go run ./gen -in ../datamodel/errors.json -out zz_codes.go

// Codes toolstackd raises that are not in errors.json, each with why; the
// table unpublished gives their parameters. (xapi's SR_BACKEND_FAILURE_<n>
// family is built at run time from SR_BACKEND_FAILURE and takes its
// parameters.)
const (
	// MissingParameter is what xapi's CLI server answers for a param-name
	// the class does not have: its own error, outside the API's list.
	MissingParameter = "Missing parameter" // name
)

var unpublished = map[string][]string{
	MissingParameter: {"name"},
}

// Published reports whether code is in the published list (or is one of
// the unpublished codes above).
func Published(code string) bool {
	if _, ok := published[code]; ok {
		return true
	}
	_, ok := unpublished[code]
	return ok
}

// ParamNames returns the names of code's parameters, in order, and
// whether they are known: false for a code that is not published and for
// one whose parameters errors.json leaves undocumented.
func ParamNames(code string) (names []string, ok bool) {
	if p, ok := published[code]; ok {
		return p, p != nil
	}
	p, ok := unpublished[code]
	return p, ok
}
