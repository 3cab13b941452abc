package control

import (
	"errors"
	"fmt"
)

// Standard JSON-RPC 2.0 error codes.
const (
	CodeParseError     = -32700
	CodeInvalidRequest = -32600
	CodeMethodNotFound = -32601
	CodeInvalidParams  = -32602
	CodeInternal       = -32603
)

// stagefs error codes. They live in the JSON-RPC "server error" range
// (-32000 to -32099) so that generic JSON-RPC clients still treat them as
// errors, and each has a stable kind string that is sent in error.data.kind
// for clients that prefer names over numbers.
const (
	CodeStaleBase            = -32001
	CodeConflict             = -32002
	CodeNotFound             = -32003
	CodeBusy                 = -32004
	CodePathOutsideWorkspace = -32005
	CodeInvalidState         = -32006
)

// codeKinds maps each stagefs code to its kind string.
var codeKinds = map[int]string{
	CodeStaleBase:            "stale_base",
	CodeConflict:             "conflict",
	CodeNotFound:             "not_found",
	CodeBusy:                 "busy",
	CodePathOutsideWorkspace: "path_outside_workspace",
	CodeInvalidState:         "invalid_state",
}

// CodeKind returns the kind string of a stagefs error code ("stale_base",
// "conflict", ...), or "" for any other code.
func CodeKind(code int) string {
	return codeKinds[code]
}

// Error is a JSON-RPC error object. A Backend returns one to choose the code,
// message and data sent to the client; the Client returns one when the
// server answers with an error.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

// Error implements the error interface.
func (e *Error) Error() string {
	return fmt.Sprintf("%s (code %d)", e.Message, e.Code)
}

// Errorf builds an *Error with a formatted message. For stagefs codes the
// data is set to {"kind": "<kind>"}; more fields can be added with With.
func Errorf(code int, format string, args ...any) *Error {
	e := &Error{Code: code, Message: fmt.Sprintf(format, args...)}
	if kind := CodeKind(code); kind != "" {
		e.Data = map[string]any{"kind": kind}
	}
	return e
}

// With adds one field to the error's data object and returns e, so that
// extra details read naturally: Errorf(CodeConflict, "...").With("path", p).
// Data that is not a map[string]any is replaced by a new map, because the
// protocol only defines object-shaped data.
func (e *Error) With(key string, value any) *Error {
	m, ok := e.Data.(map[string]any)
	if !ok {
		m = map[string]any{}
		if kind := CodeKind(e.Code); kind != "" {
			m["kind"] = kind
		}
		e.Data = m
	}
	m[key] = value
	return e
}

// Kind returns the error's kind: data.kind when the data carries one (as
// decoded by the client), otherwise the kind of its code, otherwise "".
func (e *Error) Kind() string {
	if m, ok := e.Data.(map[string]any); ok {
		if k, ok := m["kind"].(string); ok {
			return k
		}
	}
	return CodeKind(e.Code)
}

// IsCode reports whether err is, or wraps, an *Error with the given code.
func IsCode(err error, code int) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// wireError turns any error returned by a handler into the *Error that is
// sent. *Error values (found with errors.As, so wrapping is fine) are sent as
// they are, with the kind filled in for stagefs codes when the backend left
// the data empty; everything else is an internal error carrying its message.
func wireError(err error) *Error {
	var e *Error
	if !errors.As(err, &e) {
		return &Error{Code: CodeInternal, Message: err.Error()}
	}
	out := *e
	if out.Message == "" {
		out.Message = defaultMessage(out.Code)
	}
	if kind := CodeKind(out.Code); kind != "" {
		switch d := out.Data.(type) {
		case nil:
			out.Data = map[string]any{"kind": kind}
		case map[string]any:
			if _, ok := d["kind"]; !ok {
				// Copy rather than mutate: the backend may reuse its error value.
				m := make(map[string]any, len(d)+1)
				for k, v := range d {
					m[k] = v
				}
				m["kind"] = kind
				out.Data = m
			}
		}
	}
	return &out
}

// defaultMessage gives a message for an error sent without one; JSON-RPC
// requires a message string and an empty one helps nobody.
func defaultMessage(code int) string {
	switch code {
	case CodeParseError:
		return "parse error"
	case CodeInvalidRequest:
		return "invalid request"
	case CodeMethodNotFound:
		return "method not found"
	case CodeInvalidParams:
		return "invalid params"
	case CodeInternal:
		return "internal error"
	}
	if kind := CodeKind(code); kind != "" {
		return kind
	}
	return "error"
}
