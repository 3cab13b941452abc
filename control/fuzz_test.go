package control

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeRequest feeds arbitrary lines to the decoder the server uses
// for every request line. It must never panic, and whatever it decides must
// be well-formed: an error reply that is valid JSON-RPC, or a request with
// a method and a usable id.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":"a","method":"fs/read_text","params":{"path":"x"}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":-1.5e3,"method":"m","params":null}`))
	f.Add([]byte("{\"jsonrpc\":\"2.0\",\"id\":\"\xff\xfe\",\"method\":\"\xc3\"}"))
	f.Add([]byte(`{"jsonrpc":"2.0","method":"n"}` + "\r\n"))
	f.Add([]byte("  \t\n"))
	f.Fuzz(func(t *testing.T, line []byte) {
		req, reply := decodeRequest(line)
		switch {
		case req != nil && reply != nil:
			t.Fatalf("both a request and an error reply for %q", line)
		case req == nil && reply == nil:
			if len(bytes.TrimSpace(line)) != 0 {
				t.Fatalf("non-blank line %q ignored", line)
			}
		case reply != nil:
			checkErrorResponse(t, encodeResponse(reply))
		default:
			if req.Method == "" {
				t.Fatalf("request without method from %q", line)
			}
			if req.ID != nil && !validID(req.ID) {
				t.Fatalf("request id %q is not a JSON number or string", req.ID)
			}
			if req.Params != nil && !json.Valid(req.Params) {
				t.Fatalf("params %q are not valid JSON", req.Params)
			}
			// A success reply echoing this id must be valid too.
			checkLine(t, encodeResponse(&response{JSONRPC: "2.0", ID: req.ID, Result: jsonNull}))
		}
	})
}

func validID(id json.RawMessage) bool {
	var v any
	if err := json.Unmarshal(id, &v); err != nil {
		return false
	}
	switch v.(type) {
	case string, float64:
		return true
	}
	return false
}

// checkLine checks framing: one line of valid UTF-8 JSON.
func checkLine(t *testing.T, line []byte) map[string]json.RawMessage {
	t.Helper()
	if len(line) == 0 || line[len(line)-1] != '\n' || bytes.Count(line, []byte("\n")) != 1 {
		t.Fatalf("reply %q is not exactly one line", line)
	}
	if !utf8.Valid(line) {
		t.Fatalf("reply %q is not valid UTF-8", line)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		t.Fatalf("reply %q is not a JSON object: %v", line, err)
	}
	if string(m["jsonrpc"]) != `"2.0"` {
		t.Fatalf("reply %q lacks jsonrpc 2.0", line)
	}
	return m
}

// checkErrorResponse checks an error reply against JSON-RPC 2.0: exactly
// jsonrpc, id (null, number or string) and error {code, message}.
func checkErrorResponse(t *testing.T, line []byte) {
	t.Helper()
	m := checkLine(t, line)
	if len(m) != 3 {
		t.Fatalf("error reply %q must have exactly jsonrpc, id and error", line)
	}
	id, ok := m["id"]
	if !ok || (string(id) != "null" && !validID(id)) {
		t.Fatalf("error reply %q has a bad id", line)
	}
	var e struct {
		Code    *int    `json:"code"`
		Message *string `json:"message"`
	}
	if err := json.Unmarshal(m["error"], &e); err != nil || e.Code == nil || e.Message == nil {
		t.Fatalf("error reply %q has a bad error object", line)
	}
	switch *e.Code {
	case CodeParseError, CodeInvalidRequest:
	default:
		t.Fatalf("decoder produced unexpected code %d in %q", *e.Code, line)
	}
	if *e.Message == "" {
		t.Fatalf("error reply %q has an empty message", line)
	}
	if *e.Code == CodeParseError && string(id) != "null" {
		t.Fatalf("parse error %q must have a null id", line)
	}
}
