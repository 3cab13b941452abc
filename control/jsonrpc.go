package control

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// MaxDepth is the deepest JSON nesting (objects and arrays, the request
// object itself counting as 1) the server accepts in a request line.
const MaxDepth = 64

// request is one decoded JSON-RPC request or notification.
type request struct {
	// ID is the request id as JSON (a number or a string), or nil for a
	// notification, which gets no reply.
	ID     json.RawMessage
	Method string
	// Params is the raw params value, or nil when absent or null.
	Params json.RawMessage
}

// response is one JSON-RPC response line. Exactly one of Result and Error
// is set; ID is JSON null when the request's id could not be determined.
type response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *Error          `json:"error,omitempty"`
}

// notification is a server-to-client message without id.
type notification struct {
	JSONRPC string `json:"jsonrpc"`
	Method  string `json:"method"`
	Params  any    `json:"params"`
}

var jsonNull = json.RawMessage("null")

// errLineTooLong is returned by readLine for a line over the limit.
var errLineTooLong = errors.New("line too long")

// errorResponse builds an error reply. A nil id becomes JSON null.
func errorResponse(id json.RawMessage, code int, format string, args ...any) *response {
	if id == nil {
		id = jsonNull
	}
	return &response{JSONRPC: "2.0", ID: id, Error: &Error{Code: code, Message: fmt.Sprintf(format, args...)}}
}

// encodeResponse turns a response into one line, newline included. It only
// fails if the error data cannot be marshalled; the reply then degrades to
// an internal error without data so the client still gets an answer.
func encodeResponse(r *response) []byte {
	b, err := json.Marshal(r)
	if err != nil {
		id := r.ID
		if id == nil {
			id = jsonNull
		}
		b, _ = json.Marshal(errorResponse(id, CodeInternal, "cannot encode response: %v", err))
	}
	return append(b, '\n')
}

// decodeRequest turns one request line (without or with its trailing
// newline) into a request, or into the error reply to send instead. Both
// results are nil for a blank line, which is ignored.
//
// The checks run cheapest first: nesting depth by a byte scan (so hostile
// input never reaches a recursive or deep parser), then well-formedness,
// then shape.
func decodeRequest(line []byte) (*request, *response) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return nil, nil
	}
	if jsonDepthExceeds(line, MaxDepth) {
		return nil, errorResponse(nil, CodeInvalidRequest, "request nested deeper than %d levels", MaxDepth)
	}
	if !json.Valid(line) {
		return nil, errorResponse(nil, CodeParseError, "parse error: request is not valid JSON")
	}
	switch line[0] {
	case '{':
	case '[':
		return nil, errorResponse(nil, CodeInvalidRequest, "batches are not supported")
	default:
		return nil, errorResponse(nil, CodeInvalidRequest, "request must be a JSON object")
	}

	// A map rather than a struct: encoding/json matches struct fields case
	// insensitively, and "ID" or "Method" should not pass for the real keys.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(line, &fields); err != nil {
		return nil, errorResponse(nil, CodeParseError, "parse error: %v", err)
	}

	// The id first, so that later errors can be sent with it.
	var id json.RawMessage
	if raw, ok := fields["id"]; ok {
		norm, ok := normalizeID(raw)
		if !ok {
			return nil, errorResponse(nil, CodeInvalidRequest, "id must be a number or a string")
		}
		id = norm
	}

	var version string
	if raw, ok := fields["jsonrpc"]; !ok || json.Unmarshal(raw, &version) != nil || version != "2.0" {
		return nil, errorResponse(id, CodeInvalidRequest, `jsonrpc must be "2.0"`)
	}

	var method string
	if raw, ok := fields["method"]; !ok || json.Unmarshal(raw, &method) != nil || method == "" {
		return nil, errorResponse(id, CodeInvalidRequest, "method must be a non-empty string")
	}

	req := &request{ID: id, Method: method}
	if raw, ok := fields["params"]; ok && !bytes.Equal(raw, jsonNull) {
		req.Params = raw
	}
	return req, nil
}

// normalizeID checks that raw is a JSON number or string and returns it in
// a form safe to echo: strings are re-encoded so that invalid UTF-8 in the
// request never reaches the reply.
func normalizeID(raw json.RawMessage) (json.RawMessage, bool) {
	if len(raw) == 0 {
		return nil, false
	}
	switch c := raw[0]; {
	case c == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, false
		}
		b, err := json.Marshal(s)
		if err != nil {
			return nil, false
		}
		return b, true
	case c == '-' || (c >= '0' && c <= '9'):
		// Already validated as JSON, so this is a well-formed number.
		return append(json.RawMessage(nil), raw...), true
	}
	return nil, false
}

// jsonDepthExceeds reports whether the nesting of objects and arrays in b
// goes deeper than max. It is a flat byte scan that only tracks whether it
// is inside a string, so it costs nothing on any input and cannot recurse.
// Malformed input is left to json.Valid.
func jsonDepthExceeds(b []byte, max int) bool {
	depth := 0
	inString := false
	escaped := false
	for _, c := range b {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
			if depth > max {
				return true
			}
		case '}', ']':
			depth--
		}
	}
	return false
}

// readLine reads one '\n'-terminated line of at most max bytes (newline not
// counted). It returns errLineTooLong as soon as the line is known to be too
// long, without buffering the rest of it. A final line without newline is
// returned with io.EOF.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		n := len(line) + len(chunk)
		if err == nil {
			n-- // the newline itself does not count
		}
		if n > max {
			return nil, errLineTooLong
		}
		// ReadSlice's buffer is reused by the next read, so copy.
		line = append(line, chunk...)
		if err == bufio.ErrBufferFull {
			continue
		}
		return line, err
	}
}
