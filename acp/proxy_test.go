package acp

import (
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"testing"

	"stagefs/control"
)

// fakeDaemon answers every control method with an empty result, so the
// proxy's own parsing is what a test exercises.
func fakeDaemon(t testing.TB) *control.Client {
	t.Helper()
	path := filepath.Join(t.TempDir(), "control.sock")
	s := control.NewServer(nil, control.ServerOptions{})
	for _, m := range []string{"session/initialize", "fs/staged_status", "fs/snapshot", "fs/close_snapshot", "fs/drop_snapshot",
		"fs/restore", "session/turn", "session/rollback", "session/redo", "fs/set_mode", "fs/commit_staged", "fs/discard_staged",
		"fs/diff", "fs/read_text", "fs/safe_text_patch"} {
		s.Handle(m, func(context.Context, json.RawMessage) (any, error) { return map[string]any{}, nil })
	}
	l, err := control.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	c, err := control.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newTestProxy(t testing.TB) *Proxy {
	p := New(fakeDaemon(t), "/ws", t.TempDir(), nil)
	p.client = &writer{w: io.Discard}
	p.agent = &writer{w: io.Discard}
	p.addSession("s1")
	return p
}

// FuzzRelay: no message from either side makes the proxy panic.
func FuzzRelay(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"clientCapabilities":{"terminal":true,"fs":{"readTextFile":true}}}}`,
		`{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s1","prompt":[{"type":"text","text":"hi"}]}}`,
		`{"jsonrpc":"2.0","id":3,"method":"session/restore_tool_call","params":{"sessionId":"s1","toolCallId":"t"}}`,
		`{"jsonrpc":"2.0","id":4,"method":"_stagefs/fs_commit_staged","params":{"sessionId":"s1","paths":["a",7]}}`,
		`{"jsonrpc":"2.0","method":"session/update","params":{"update":{"sessionUpdate":"tool_call","toolCallId":"x","status":"completed","locations":[{"path":5}]}}}`,
		`{"jsonrpc":"2.0","id":9,"method":"fs/read_text_file","params":{"path":"/ws/../etc","line":-1,"limit":-5}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"agentCapabilities":[]}}`,
		`{"jsonrpc":"2.0","id":2,"result":{"_meta":"x"}}`,
		`[]`, `null`, `{`, `"`, `{"id":{}}`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	p := newTestProxy(f)
	f.Fuzz(func(t *testing.T, line []byte, fromClient bool) {
		if fromClient {
			p.fromClient(line)
		} else {
			p.fromAgent(line)
		}
	})
}

func TestSliceLines(t *testing.T) {
	one, two, zero := 1, 2, 0
	s := "a\nb\nc\n"
	for _, tc := range []struct {
		line, limit *int
		want        string
	}{{nil, nil, s}, {&two, nil, "b\nc\n"}, {&two, &one, "b\n"}, {nil, &two, "a\nb\n"}, {&one, &zero, ""}} {
		if got := sliceLines(s, tc.line, tc.limit); got != tc.want {
			t.Errorf("sliceLines(%v, %v) = %q, want %q", tc.line, tc.limit, got, tc.want)
		}
	}
	if got := sliceLines("a", &two, nil); got != "" {
		t.Errorf("a line past the end: %q", got)
	}
}
