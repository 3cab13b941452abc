package control

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeBackend answers from its inputs, so a round trip shows that params
// made it across intact. Some paths trigger failures on purpose.
type fakeBackend struct {
	mu   sync.Mutex
	mode string
}

func (f *fakeBackend) Initialize(ctx context.Context) (InitializeResult, error) {
	return InitializeResult{
		Version:      "test-1",
		SessionID:    "sess-42",
		Mode:         ModeStaged,
		Workspace:    "/ws",
		Mount:        "/mnt",
		Capabilities: map[string]bool{"diff": true, "snapshots": false},
	}, nil
}

func (f *fakeBackend) SetMode(ctx context.Context, mode string) (SetModeResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	prev := f.mode
	if prev == "" {
		prev = ModeStaged
	}
	f.mode = mode
	return SetModeResult{Previous: prev, Mode: mode}, nil
}

func (f *fakeBackend) Status(ctx context.Context, paths []string) (StatusResult, error) {
	var r StatusResult
	for i, p := range paths {
		r.Entries = append(r.Entries, StatusEntry{Path: p, Kind: KindModified, Bytes: int64(10 * (i + 1)), AgeMs: 5, PID: 100 + i, Comm: "vim"})
		r.TotalBytes += int64(10 * (i + 1))
	}
	r.PendingCount = len(paths)
	r.OldestPendingAgeMs = 5
	r.Mode = ModeStaged
	return r, nil
}

func (f *fakeBackend) Commit(ctx context.Context, p CommitParams) (CommitResult, error) {
	var r CommitResult
	for _, path := range p.Paths {
		switch {
		case strings.HasPrefix(path, "conflict") && !p.Force:
			r.Conflicts = append(r.Conflicts, Conflict{Path: path, Reason: "base changed", Expected: "aaa", Actual: "bbb"})
		case strings.HasPrefix(path, "fail"):
			r.Failed = append(r.Failed, Failure{Path: path, Reason: "EIO"})
		default:
			r.Committed = append(r.Committed, path)
		}
	}
	return r, nil
}

func (f *fakeBackend) Discard(ctx context.Context, paths []string) (DiscardResult, error) {
	return DiscardResult{Discarded: paths}, nil
}

func (f *fakeBackend) Diff(ctx context.Context, paths []string) (DiffResult, error) {
	var b strings.Builder
	for _, p := range paths {
		fmt.Fprintf(&b, "--- a/%s\n+++ b/%s\n", p, p)
	}
	return DiffResult{Diff: b.String(), Files: len(paths)}, nil
}

func (f *fakeBackend) ReadText(ctx context.Context, path string) (ReadTextResult, error) {
	switch path {
	case "panic":
		panic("backend exploded")
	case "missing":
		return ReadTextResult{}, Errorf(CodeNotFound, "%s does not exist", path).With("path", path)
	case "plain-error":
		return ReadTextResult{}, errors.New("disk on fire")
	case "wrapped":
		return ReadTextResult{}, fmt.Errorf("reading: %w", Errorf(CodeBusy, "commit in progress"))
	case "bare":
		return ReadTextResult{}, &Error{Code: CodeInvalidState}
	case "block":
		<-ctx.Done()
		return ReadTextResult{}, ctx.Err()
	}
	content := "content of " + path
	return ReadTextResult{Path: path, Content: content, SHA256: strings.Repeat("ab", 32), Size: int64(len(content)), Exists: true}, nil
}

func (f *fakeBackend) SafeTextPatch(ctx context.Context, p SafeTextPatchParams) (SafeTextPatchResult, error) {
	if p.ExpectedHash == strings.Repeat("0", 64) {
		return SafeTextPatchResult{Result: PatchStaleBase}, nil
	}
	size := int64(0)
	if p.Content != nil {
		size = int64(len(*p.Content))
	}
	for _, e := range p.Edits {
		size += int64(len(e.NewText) - len(e.OldText))
	}
	return SafeTextPatchResult{Result: PatchApplied, SHA256: strings.Repeat("cd", 32), Size: size}, nil
}

func (f *fakeBackend) Log(ctx context.Context, p LogParams) (LogResult, error) {
	var r LogResult
	n := p.Limit
	if n == 0 {
		n = 3
	}
	for i := 0; i < n; i++ {
		e := LogEntry{Seq: p.Since + uint64(i) + 1, Time: "2025-01-02T03:04:05.000000006Z", Op: "write", PID: 7, Comm: "sh", Size: 12}
		if len(p.Paths) > 0 {
			e.Path = p.Paths[0]
		}
		r.Records = append(r.Records, e)
	}
	return r, nil
}

// startServer runs a server on a fresh socket and returns it with the
// socket path. Cleanup closes it and checks that Serve returned nil.
func startServer(t *testing.T, b Backend, opts ServerOptions) (*Server, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.sock")
	l, err := Listen(path)
	require.NoError(t, err)
	s := NewServer(b, opts)
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	t.Cleanup(func() {
		require.NoError(t, s.Close())
		select {
		case err := <-served:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return s, path
}

func dialClient(t *testing.T, path string) *Client {
	t.Helper()
	c, err := Dial(path)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// rawConn speaks the wire protocol by hand, for the malformed cases the
// Client can never produce.
type rawConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, path string) *rawConn {
	t.Helper()
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, r: bufio.NewReaderSize(c, 1<<20)}
}

func (rc *rawConn) send(line string) {
	rc.t.Helper()
	require.NoError(rc.t, rc.c.SetWriteDeadline(time.Now().Add(5*time.Second)))
	_, err := io.WriteString(rc.c, line+"\n")
	require.NoError(rc.t, err)
}

// recvLine reads one line with a deadline, returning the read error.
func (rc *rawConn) recvLine() ([]byte, error) {
	rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	return rc.r.ReadBytes('\n')
}

func (rc *rawConn) recv() map[string]any {
	rc.t.Helper()
	line, err := rc.recvLine()
	require.NoError(rc.t, err)
	var m map[string]any
	require.NoError(rc.t, json.Unmarshal(line, &m), "line: %s", line)
	require.Equal(rc.t, "2.0", m["jsonrpc"], "line: %s", line)
	return m
}

func (rc *rawConn) call(line string) map[string]any {
	rc.t.Helper()
	rc.send(line)
	return rc.recv()
}

// requireError checks that m is an error response with the given code and
// returns its error object.
func requireError(t *testing.T, m map[string]any, code int) map[string]any {
	t.Helper()
	require.NotContains(t, m, "result")
	e, ok := m["error"].(map[string]any)
	require.True(t, ok, "not an error response: %v", m)
	require.Equal(t, float64(code), e["code"], "response: %v", m)
	msg, ok := e["message"].(string)
	require.True(t, ok)
	require.NotEmpty(t, msg)
	return e
}

func TestRoundTripEveryMethod(t *testing.T) {
	_, path := startServer(t, &fakeBackend{}, ServerOptions{})
	c := dialClient(t, path)
	ctx := testCtx(t)

	ini, err := c.Initialize(ctx)
	require.NoError(t, err)
	require.Equal(t, InitializeResult{
		Version: "test-1", SessionID: "sess-42", Mode: ModeStaged, Workspace: "/ws", Mount: "/mnt",
		Capabilities: map[string]bool{"diff": true, "snapshots": false},
	}, ini)

	sm, err := c.SetMode(ctx, ModeImmediate)
	require.NoError(t, err)
	require.Equal(t, SetModeResult{Previous: ModeStaged, Mode: ModeImmediate}, sm)
	sm, err = c.SetMode(ctx, ModeStaged)
	require.NoError(t, err)
	require.Equal(t, SetModeResult{Previous: ModeImmediate, Mode: ModeStaged}, sm)

	st, err := c.Status(ctx, []string{"a.txt", "dir/b.go"})
	require.NoError(t, err)
	require.Equal(t, StatusResult{
		Entries: []StatusEntry{
			{Path: "a.txt", Kind: KindModified, Bytes: 10, AgeMs: 5, PID: 100, Comm: "vim"},
			{Path: "dir/b.go", Kind: KindModified, Bytes: 20, AgeMs: 5, PID: 101, Comm: "vim"},
		},
		PendingCount: 2, TotalBytes: 30, OldestPendingAgeMs: 5, Mode: ModeStaged,
	}, st)

	// No paths: the backend returns nil entries, which must arrive as [].
	st, err = c.Status(ctx, nil)
	require.NoError(t, err)
	require.NotNil(t, st.Entries)
	require.Empty(t, st.Entries)

	cr, err := c.Commit(ctx, CommitParams{Paths: []string{"ok.txt", "conflict.txt", "fail.txt"}})
	require.NoError(t, err)
	require.Equal(t, CommitResult{
		Committed: []string{"ok.txt"},
		Conflicts: []Conflict{{Path: "conflict.txt", Reason: "base changed", Expected: "aaa", Actual: "bbb"}},
		Failed:    []Failure{{Path: "fail.txt", Reason: "EIO"}},
	}, cr)
	cr, err = c.Commit(ctx, CommitParams{Paths: []string{"conflict.txt"}, Force: true})
	require.NoError(t, err)
	require.Equal(t, []string{"conflict.txt"}, cr.Committed)
	require.NotNil(t, cr.Conflicts)
	require.NotNil(t, cr.Failed)

	dr, err := c.Discard(ctx, []string{"x", "y"})
	require.NoError(t, err)
	require.Equal(t, DiscardResult{Discarded: []string{"x", "y"}}, dr)

	df, err := c.Diff(ctx, []string{"a.txt"})
	require.NoError(t, err)
	require.Equal(t, DiffResult{Diff: "--- a/a.txt\n+++ b/a.txt\n", Files: 1}, df)

	rt, err := c.ReadText(ctx, "notes.md")
	require.NoError(t, err)
	require.Equal(t, ReadTextResult{Path: "notes.md", Content: "content of notes.md", SHA256: strings.Repeat("ab", 32), Size: 19, Exists: true}, rt)

	content := "hello\n"
	pr, err := c.SafeTextPatch(ctx, SafeTextPatchParams{Path: "n.md", ExpectedHash: "", Content: &content})
	require.NoError(t, err)
	require.Equal(t, SafeTextPatchResult{Result: PatchApplied, SHA256: strings.Repeat("cd", 32), Size: 6}, pr)
	pr, err = c.SafeTextPatch(ctx, SafeTextPatchParams{Path: "n.md", ExpectedHash: strings.Repeat("1", 64), Edits: []TextEdit{{OldText: "hello", NewText: "goodbye"}}})
	require.NoError(t, err)
	require.Equal(t, SafeTextPatchResult{Result: PatchApplied, SHA256: strings.Repeat("cd", 32), Size: 2}, pr)
	pr, err = c.SafeTextPatch(ctx, SafeTextPatchParams{Path: "n.md", ExpectedHash: strings.Repeat("0", 64), Content: &content})
	require.NoError(t, err)
	require.Equal(t, PatchStaleBase, pr.Result)

	lr, err := c.Log(ctx, LogParams{Since: 40, Paths: []string{"a.txt"}, Limit: 2})
	require.NoError(t, err)
	require.Equal(t, LogResult{Records: []LogEntry{
		{Seq: 41, Time: "2025-01-02T03:04:05.000000006Z", Op: "write", Path: "a.txt", PID: 7, Comm: "sh", Size: 12},
		{Seq: 42, Time: "2025-01-02T03:04:05.000000006Z", Op: "write", Path: "a.txt", PID: 7, Comm: "sh", Size: 12},
	}}, lr)

	// Generic Call with a raw map result, to see the wire names.
	var raw map[string]any
	require.NoError(t, c.Call(ctx, MethodStagedStatus, map[string]any{"paths": []string{"p"}}, &raw))
	require.Equal(t, []any{"entries", "mode", "oldestPendingAgeMs", "pendingCount", "policy", "totalBytes"}, sortedKeys(raw))
	entry := raw["entries"].([]any)[0].(map[string]any)
	require.Equal(t, []any{"ageMs", "bytes", "comm", "kind", "path", "pid"}, sortedKeys(entry))
}

func sortedKeys(m map[string]any) []any {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	// A tiny insertion sort keeps the test free of extra imports.
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	out := make([]any, len(keys))
	for i, k := range keys {
		out[i] = k
	}
	return out
}

func TestMalformedJSON(t *testing.T) {
	_, path := startServer(t, &fakeBackend{}, ServerOptions{})
	rc := dialRaw(t, path)
	for _, line := range []string{
		`{"jsonrpc":"2.0","id":1,"method":`,
		`{"jsonrpc":"2.0","id":1,"method":"fs/diff"} trailing`,
		`not json at all`,
		`{'single':'quotes'}`,
	} {
		m := rc.call(line)
		requireError(t, m, CodeParseError)
		require.Nil(t, m["id"], "line %q", line)
		require.Contains(t, m, "id")
	}
	// The connection survives parse errors.
	m := rc.call(`{"jsonrpc":"2.0","id":"after","method":"fs/diff"}`)
	require.Equal(t, "after", m["id"])
	require.Contains(t, m, "result")
}

func TestInvalidRequests(t *testing.T) {
	_, path := startServer(t, &fakeBackend{}, ServerOptions{})
	rc := dialRaw(t, path)
	cases := []struct {
		line   string
		wantID any
	}{
		{`"just a string"`, nil},
		{`42`, nil},
		{`null`, nil},
		{`[{"jsonrpc":"2.0","id":1,"method":"fs/diff"}]`, nil},
		{`{"jsonrpc":"2.0","id":1}`, float64(1)},
		{`{"jsonrpc":"2.0","id":2,"method":""}`, float64(2)},
		{`{"jsonrpc":"2.0","id":3,"method":7}`, float64(3)},
		{`{"jsonrpc":"1.0","id":4,"method":"fs/diff"}`, float64(4)},
		{`{"id":"five","method":"fs/diff"}`, "five"},
		{`{"jsonrpc":2.0,"id":6,"method":"fs/diff"}`, float64(6)},
		{`{"jsonrpc":"2.0","id":{"a":1},"method":"fs/diff"}`, nil},
		{`{"jsonrpc":"2.0","id":[1],"method":"fs/diff"}`, nil},
		{`{"jsonrpc":"2.0","id":true,"method":"fs/diff"}`, nil},
		{`{"jsonrpc":"2.0","id":null,"method":"fs/diff"}`, nil},
		// Keys are matched exactly, not case-insensitively.
		{`{"JSONRPC":"2.0","id":7,"METHOD":"fs/diff"}`, float64(7)},
	}
	for _, tc := range cases {
		m := rc.call(tc.line)
		requireError(t, m, CodeInvalidRequest)
		require.Contains(t, m, "id")
		require.Equal(t, tc.wantID, m["id"], "line %s", tc.line)
	}
	m := rc.call(`[]`)
	e := requireError(t, m, CodeInvalidRequest)
	require.Equal(t, "batches are not supported", e["message"])
}

func TestUnknownMethodAndNotifications(t *testing.T) {
	_, path := startServer(t, &fakeBackend{}, ServerOptions{})
	rc := dialRaw(t, path)

	e := requireError(t, rc.call(`{"jsonrpc":"2.0","id":1,"method":"fs/nope"}`), CodeMethodNotFound)
	require.Contains(t, e["message"], "fs/nope")

	// Notifications, known or not, valid params or not, get no reply: the
	// next line read must be the answer to the request that follows them.
	rc.send(`{"jsonrpc":"2.0","method":"fs/nope"}`)
	rc.send(`{"jsonrpc":"2.0","method":"fs/set_mode","params":{"mode":"bogus"}}`)
	rc.send(`{"jsonrpc":"2.0","method":"fs/diff"}`)
	rc.send(``)
	rc.send(`   `)
	m := rc.call(`{"jsonrpc":"2.0","id":"x","method":"fs/diff","params":null}`)
	require.Equal(t, "x", m["id"])
	require.Equal(t, map[string]any{"diff": "", "files": float64(0)}, m["result"])
}

func TestInvalidParams(t *testing.T) {
	_, path := startServer(t, &fakeBackend{}, ServerOptions{})
	rc := dialRaw(t, path)
	cases := []struct {
		method, params, field string
	}{
		{MethodStagedStatus, `{"paths":"a.txt"}`, "paths"},
		{MethodStagedStatus, `{"paths":[1,2]}`, "paths"},
		{MethodStagedStatus, `{"paths":[""]}`, "paths[0]"},
		{MethodSetMode, `{"mode":5}`, "mode"},
		{MethodSetMode, `{"mode":"bogus"}`, "mode"},
		{MethodSetMode, `{}`, "mode"},
		{MethodCommitStaged, `{"force":"yes"}`, "force"},
		{MethodLog, `{"since":-1}`, "since"},
		{MethodLog, `{"limit":-1}`, "limit"},
		{MethodLog, `{"limit":1.5}`, "limit"},
		{MethodReadText, `{}`, "path"},
		{MethodReadText, `{"path":["a"]}`, "path"},
		{MethodSafeTextPatch, `{"path":"a","expectedHash":""}`, "content"},
		{MethodSafeTextPatch, `{"path":"a","expectedHash":"","content":"x","edits":[{"oldText":"a","newText":"b"}]}`, "content"},
		{MethodSafeTextPatch, `{"path":"a","expectedHash":"","edits":[]}`, "edits"},
		{MethodSafeTextPatch, `{"path":"a","expectedHash":"","edits":[{"oldText":"","newText":"b"}]}`, "edits[0].oldText"},
		{MethodSafeTextPatch, `{"path":"a","expectedHash":"xyz","content":"x"}`, "expectedHash"},
		{MethodSafeTextPatch, `{"path":"a","expectedHash":"","edits":[{"oldText":3}]}`, "edits.oldText"},
		{MethodSafeTextPatch, `{"expectedHash":"","content":"x"}`, "path"},
	}
	for i, tc := range cases {
		m := rc.call(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, i, tc.method, tc.params))
		require.Equal(t, float64(i), m["id"])
		e := requireError(t, m, CodeInvalidParams)
		data, ok := e["data"].(map[string]any)
		require.True(t, ok, "%s %s: no data in %v", tc.method, tc.params, e)
		require.Equal(t, tc.field, data["field"], "%s %s: %v", tc.method, tc.params, e)
		require.Contains(t, e["message"], tc.field)
	}

	// Params that are not an object at all.
	for _, params := range []string{`[1]`, `"staged"`, `7`} {
		m := rc.call(`{"jsonrpc":"2.0","id":1,"method":"fs/set_mode","params":` + params + `}`)
		e := requireError(t, m, CodeInvalidParams)
		require.Contains(t, e["message"], "params must be an object")
	}

	// Unknown fields are fine.
	m := rc.call(`{"jsonrpc":"2.0","id":1,"method":"fs/set_mode","params":{"mode":"immediate","future":{"x":[1]}}}`)
	require.Equal(t, map[string]any{"previous": "staged", "mode": "immediate"}, m["result"])
}

func TestOverlongLine(t *testing.T) {
	_, path := startServer(t, &fakeBackend{}, ServerOptions{MaxLineBytes: 1024})

	// A line of exactly the limit is still accepted.
	rc := dialRaw(t, path)
	req := `{"jsonrpc":"2.0","id":1,"method":"fs/diff"}`
	m := rc.call(req + strings.Repeat(" ", 1024-len(req)))
	require.Equal(t, float64(1), m["id"])
	require.Contains(t, m, "result")

	// One byte more is refused, and the connection is closed.
	rc.send(req + strings.Repeat(" ", 1025-len(req)))
	e := requireError(t, rc.recv(), CodeInvalidRequest)
	require.Contains(t, e["message"], "1024")
	_, err := rc.recvLine()
	require.ErrorIs(t, err, io.EOF)

	// A much longer line, sent from a goroutine since the server stops
	// reading partway through and the write may fail.
	rc = dialRaw(t, path)
	go io.WriteString(rc.c, `{"x":"`+strings.Repeat("y", 1<<20)+`"}`+"\n")
	requireError(t, rc.recv(), CodeInvalidRequest)
	_, err = rc.recvLine()
	require.Error(t, err)

	// Other connections are unaffected.
	m = dialRaw(t, path).call(req)
	require.Contains(t, m, "result")
}

func TestDeepNestingRefused(t *testing.T) {
	_, path := startServer(t, &fakeBackend{}, ServerOptions{})
	rc := dialRaw(t, path)
	for _, depth := range []int{65, 1000, 1_000_000} {
		params := strings.Repeat("[", depth) + strings.Repeat("]", depth)
		m := rc.call(`{"jsonrpc":"2.0","id":1,"method":"fs/diff","params":` + params + `}`)
		e := requireError(t, m, CodeInvalidRequest)
		require.Contains(t, e["message"], "nested")
	}
	// Unbalanced garbage is refused the same way, without any parsing.
	requireError(t, rc.call(strings.Repeat("{", 100_000)), CodeInvalidRequest)

	// Brackets inside strings do not count.
	m := rc.call(`{"jsonrpc":"2.0","id":2,"method":"fs/read_text","params":{"path":"` + strings.Repeat("[{", 500) + `"}}`)
	require.Contains(t, m, "result")

	// 64 levels in total (the request object is level 1) are allowed.
	nested := strings.Repeat(`{"a":`, 61) + "1" + strings.Repeat("}", 61)
	m = rc.call(`{"jsonrpc":"2.0","id":3,"method":"fs/diff","params":{"x":[` + nested + `]}}`)
	require.Contains(t, m, "result", "%v", m)
}

func TestBackendPanicIsInternalError(t *testing.T) {
	var logged []string
	var logMu sync.Mutex
	_, path := startServer(t, &fakeBackend{}, ServerOptions{Logf: func(format string, args ...any) {
		logMu.Lock()
		logged = append(logged, fmt.Sprintf(format, args...))
		logMu.Unlock()
	}})
	c := dialClient(t, path)
	ctx := testCtx(t)

	for i := 0; i < 3; i++ {
		_, err := c.ReadText(ctx, "panic")
		var e *Error
		require.ErrorAs(t, err, &e)
		require.Equal(t, CodeInternal, e.Code)
		require.Contains(t, e.Message, "backend exploded")

		// Same connection still served.
		rt, err := c.ReadText(ctx, "ok.txt")
		require.NoError(t, err)
		require.True(t, rt.Exists)
	}
	logMu.Lock()
	defer logMu.Unlock()
	require.Len(t, logged, 3)
	require.Contains(t, logged[0], "panic in fs/read_text")
}

func TestBackendErrors(t *testing.T) {
	_, path := startServer(t, &fakeBackend{}, ServerOptions{})
	c := dialClient(t, path)
	ctx := testCtx(t)

	_, err := c.ReadText(ctx, "missing")
	var e *Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, CodeNotFound, e.Code)
	require.Equal(t, "missing does not exist", e.Message)
	require.Equal(t, map[string]any{"kind": "not_found", "path": "missing"}, e.Data)
	require.Equal(t, "not_found", e.Kind())
	require.True(t, IsCode(err, CodeNotFound))

	// Wrapped *Error is found with errors.As on the server side.
	_, err = c.ReadText(ctx, "wrapped")
	require.ErrorAs(t, err, &e)
	require.Equal(t, CodeBusy, e.Code)
	require.Equal(t, "commit in progress", e.Message)
	require.Equal(t, map[string]any{"kind": "busy"}, e.Data)

	// A bare *Error gets its kind and a message filled in.
	_, err = c.ReadText(ctx, "bare")
	require.ErrorAs(t, err, &e)
	require.Equal(t, CodeInvalidState, e.Code)
	require.Equal(t, "invalid_state", e.Message)
	require.Equal(t, map[string]any{"kind": "invalid_state"}, e.Data)

	// Any other error is internal, with its text.
	_, err = c.ReadText(ctx, "plain-error")
	require.ErrorAs(t, err, &e)
	require.Equal(t, CodeInternal, e.Code)
	require.Equal(t, "disk on fire", e.Message)
	require.Nil(t, e.Data)
}

func TestErrorHelpers(t *testing.T) {
	codes := map[int]string{
		CodeStaleBase: "stale_base", CodeConflict: "conflict", CodeNotFound: "not_found",
		CodeBusy: "busy", CodePathOutsideWorkspace: "path_outside_workspace", CodeInvalidState: "invalid_state",
	}
	want := map[string]int{
		"stale_base": -32001, "conflict": -32002, "not_found": -32003,
		"busy": -32004, "path_outside_workspace": -32005, "invalid_state": -32006,
	}
	for code, kind := range codes {
		require.Equal(t, want[kind], code)
		e := Errorf(code, "x %d", 1)
		require.Equal(t, "x 1", e.Message)
		require.Equal(t, map[string]any{"kind": kind}, e.Data)
		require.Equal(t, kind, e.Kind())
	}
	e := Errorf(CodeInvalidParams, "bad")
	require.Nil(t, e.Data)
	require.Equal(t, "", e.Kind())
	require.Equal(t, map[string]any{"field": "f"}, e.With("field", "f").Data)
	require.Equal(t, "bad (code -32602)", e.Error())

	// wireError leaves a backend's data map alone and sends a copy.
	data := map[string]any{"path": "p"}
	in := &Error{Code: CodeConflict, Message: "m", Data: data}
	out := wireError(fmt.Errorf("ctx: %w", in))
	require.Equal(t, map[string]any{"kind": "conflict", "path": "p"}, out.Data)
	require.Equal(t, map[string]any{"path": "p"}, data)
}

func TestConcurrentClients(t *testing.T) {
	_, path := startServer(t, &fakeBackend{}, ServerOptions{})
	ctx := testCtx(t)

	const clients = 50
	errs := make(chan error, clients*2)
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, err := Dial(path)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for j := 0; j < 20; j++ {
				p := fmt.Sprintf("c%d/f%d", i, j)
				st, err := c.Status(ctx, []string{p})
				if err != nil {
					errs <- err
					return
				}
				if len(st.Entries) != 1 || st.Entries[0].Path != p {
					errs <- fmt.Errorf("client %d: status for %s: %+v", i, p, st)
					return
				}
				rt, err := c.ReadText(ctx, p)
				if err != nil || rt.Content != "content of "+p {
					errs <- fmt.Errorf("client %d: read %s: %+v %v", i, p, rt, err)
					return
				}
			}
		}(i)
	}

	// And 50 goroutines sharing one Client, so ids must be matched right.
	shared := dialClient(t, path)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < 20; j++ {
				p := fmt.Sprintf("shared%d/%d", i, j)
				dr, err := shared.Discard(ctx, []string{p})
				if err != nil || len(dr.Discarded) != 1 || dr.Discarded[0] != p {
					errs <- fmt.Errorf("shared %d: discard %s: %+v %v", i, p, dr, err)
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// readEvents reads session/update notifications from rc until want events
// (counting each missed marker's Missed) are accounted for. It checks that
// seqs increase and returns the events.
func readEvents(t *testing.T, rc *rawConn, want int) []Event {
	t.Helper()
	var events []Event
	var lastSeq uint64
	total := 0
	for total < want {
		m := rc.recv()
		require.Equal(t, MethodSessionUpdate, m["method"])
		require.NotContains(t, m, "id")
		b, err := json.Marshal(m["params"])
		require.NoError(t, err)
		var ev Event
		require.NoError(t, json.Unmarshal(b, &ev))
		require.Greater(t, ev.Seq, lastSeq, "seq must increase")
		lastSeq = ev.Seq
		if ev.Kind == EventMissed {
			require.Positive(t, ev.Missed)
			total += ev.Missed
		} else {
			total++
		}
		events = append(events, ev)
	}
	require.Equal(t, want, total)
	return events
}

func TestSlowSubscriberDoesNotBlockPublish(t *testing.T) {
	s, path := startServer(t, &fakeBackend{}, ServerOptions{})
	rc := dialRaw(t, path)
	m := rc.call(`{"jsonrpc":"2.0","id":1,"method":"events/subscribe"}`)
	require.Equal(t, map[string]any{"subscribed": true}, m["result"])

	// The subscriber reads nothing while 10,000 events are published.
	const n = 10_000
	published := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		for i := 0; i < n; i++ {
			s.Publish(Event{Kind: "file_changed", Paths: []string{fmt.Sprintf("f%d", i)}})
		}
		published <- time.Since(start)
	}()
	select {
	case d := <-published:
		require.Less(t, d, 5*time.Second)
	case <-time.After(10 * time.Second):
		t.Fatal("Publish blocked on a subscriber that does not read")
	}

	// Now the subscriber resumes: every event is either delivered or
	// counted in a missed marker, and there is at least one marker.
	events := readEvents(t, rc, n)
	var missed int
	for _, ev := range events {
		if ev.Kind == EventMissed {
			missed += ev.Missed
			require.NotEmpty(t, ev.Time)
		} else {
			require.Equal(t, "file_changed", ev.Kind)
			require.Len(t, ev.Paths, 1)
			require.Equal(t, fmt.Sprintf("f%d", ev.Seq-1), ev.Paths[0])
		}
	}
	require.Positive(t, missed)
	require.Less(t, missed, n)

	// The queue works normally again afterwards.
	s.Publish(Event{Kind: "after"})
	got := readEvents(t, rc, 1)
	require.Equal(t, "after", got[0].Kind)
	require.Equal(t, uint64(n+1), got[0].Seq)

	// Requests still work on the subscribed connection.
	m = rc.call(`{"jsonrpc":"2.0","id":2,"method":"fs/diff"}`)
	require.Equal(t, float64(2), m["id"])
}

func TestSubscribeReplyComesBeforeEvents(t *testing.T) {
	s, path := startServer(t, &fakeBackend{}, ServerOptions{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				s.Publish(Event{Kind: "tick"})
			}
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
	}()
	for i := 0; i < 20; i++ {
		rc := dialRaw(t, path)
		m := rc.call(`{"jsonrpc":"2.0","id":"sub","method":"events/subscribe"}`)
		require.Equal(t, "sub", m["id"])
		m = rc.recv()
		require.Equal(t, MethodSessionUpdate, m["method"])
		rc.c.Close()
	}
}

func TestClientSubscribe(t *testing.T) {
	s, path := startServer(t, &fakeBackend{}, ServerOptions{EventQueue: 16})
	c := dialClient(t, path)
	ctx, cancel := context.WithCancel(testCtx(t))
	events, err := c.Subscribe(ctx)
	require.NoError(t, err)

	s.Publish(Event{Kind: "committed", Paths: []string{"a", "b"}, ToolCallID: "tc1", Detail: "d"})
	ev := <-events
	require.Equal(t, "committed", ev.Kind)
	require.Equal(t, []string{"a", "b"}, ev.Paths)
	require.Equal(t, "tc1", ev.ToolCallID)
	require.Equal(t, "d", ev.Detail)
	require.NotZero(t, ev.Seq)
	_, err = time.Parse(time.RFC3339Nano, ev.Time)
	require.NoError(t, err)

	// A consumer that stops reading: the client's channel and the server
	// queue fill up, Publish goes on, and the consumer later sees "missed".
	for i := 0; i < 5000; i++ {
		s.Publish(Event{Kind: "file_changed"})
	}
	sawMissed := false
	total := 0
	for total < 5000 {
		select {
		case ev := <-events:
			if ev.Kind == EventMissed {
				sawMissed = true
				total += ev.Missed
			} else {
				total++
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("only %d of 5000 events accounted for", total)
		}
	}
	require.True(t, sawMissed)
	require.Equal(t, 5000, total)

	// The plain client keeps working, and notifications never reach it.
	_, err = c.Diff(ctx, nil)
	require.NoError(t, err)

	// Cancelling the context closes the channel.
	cancel()
	select {
	case _, ok := <-events:
		for ok {
			_, ok = <-events
		}
	case <-time.After(5 * time.Second):
		t.Fatal("events channel not closed after cancel")
	}
}

func TestSubscriberQueuePolicy(t *testing.T) {
	q := newSubscriber(4)
	pending := func(seq uint64, count int) Event {
		return Event{Kind: EventStagedWritesPending, Seq: seq, PendingCount: count}
	}
	var got []Event
	pop := func() {
		ev, ok := q.pop()
		require.True(t, ok)
		got = append(got, ev)
	}
	q.push(pending(1, 1))
	q.push(pending(2, 2)) // replaces 1
	q.push(Event{Kind: "committed", Seq: 3})
	q.push(pending(4, 0))
	q.push(pending(5, 5)) // replaces 4
	q.push(Event{Kind: "x", Seq: 6})
	require.Len(t, q.queue, 4)
	q.push(Event{Kind: "x", Seq: 7}) // dropped: queue full
	q.push(Event{Kind: "x", Seq: 8}) // dropped
	pop()
	q.push(Event{Kind: "x", Seq: 9}) // room again: marker first, then 9
	pop()
	pop()
	q.push(pending(10, 1))
	q.push(pending(11, 2)) // replaces 10
	for {
		ev, ok := q.pop()
		if !ok {
			break
		}
		got = append(got, ev)
	}
	var summary []string
	for _, ev := range got {
		s := fmt.Sprintf("%s:%d", ev.Kind, ev.Seq)
		if ev.Kind == EventMissed {
			s += fmt.Sprintf("/%d", ev.Missed)
		}
		if ev.Kind == EventStagedWritesPending {
			s += fmt.Sprintf("/%d", ev.PendingCount)
		}
		summary = append(summary, s)
	}
	require.Equal(t, []string{
		"staged_writes_pending:2/2", "committed:3", "staged_writes_pending:5/5", "x:6",
		"missed:8/2", "x:9", "staged_writes_pending:11/2",
	}, summary)

	// Drops with nothing after them: the marker comes once the queue is empty.
	q = newSubscriber(1)
	q.push(Event{Kind: "a", Seq: 1})
	q.push(Event{Kind: "b", Seq: 2})
	q.push(Event{Kind: "c", Seq: 3})
	ev, _ := q.pop()
	require.Equal(t, "a", ev.Kind)
	ev, _ = q.pop()
	require.Equal(t, Event{Kind: EventMissed, Seq: 3, Time: ev.Time, Missed: 2}, ev)
	_, ok := q.pop()
	require.False(t, ok)

	// A pending event is not coalesced across a pending marker.
	q = newSubscriber(1)
	q.push(pending(1, 1))
	q.push(Event{Kind: "b", Seq: 2}) // dropped
	q.push(pending(3, 3))            // dropped too, not merged into 1
	ev, _ = q.pop()
	require.Equal(t, uint64(1), ev.Seq)
	ev, _ = q.pop()
	require.Equal(t, EventMissed, ev.Kind)
	require.Equal(t, 2, ev.Missed)
}

func TestSocketModeAndStaleSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.sock")

	// A stale socket file (nobody listening) is replaced.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	stale.SetUnlinkOnClose(false)
	require.NoError(t, stale.Close())
	_, err = os.Lstat(path)
	require.NoError(t, err)

	l, err := Listen(path)
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.NotZero(t, fi.Mode()&os.ModeSocket)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	// A live socket is not taken over.
	_, err = Listen(path)
	require.ErrorContains(t, err, "already listening")
	require.NoError(t, l.Close())

	// Something that is not a socket is never removed.
	file := filepath.Join(dir, "regular")
	require.NoError(t, os.WriteFile(file, []byte("keep"), 0o644))
	_, err = Listen(file)
	require.ErrorContains(t, err, "not a socket")
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, "keep", string(b))
}

func TestPeerUIDRefused(t *testing.T) {
	var asked []uint32
	var mu sync.Mutex
	_, path := startServer(t, &fakeBackend{}, ServerOptions{AllowUID: func(uid uint32) bool {
		mu.Lock()
		asked = append(asked, uid)
		mu.Unlock()
		return false
	}})

	rc := dialRaw(t, path)
	e := requireError(t, rc.recv(), CodeInvalidRequest)
	require.Equal(t, fmt.Sprintf("peer uid %d not allowed", os.Getuid()), e["message"])
	_, err := rc.recvLine()
	require.ErrorIs(t, err, io.EOF)

	c := dialClient(t, path)
	_, err = c.Initialize(testCtx(t))
	var rpcErr *Error
	require.ErrorAs(t, err, &rpcErr)
	require.Equal(t, CodeInvalidRequest, rpcErr.Code)
	require.Contains(t, rpcErr.Message, "not allowed")

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, asked)
	require.Equal(t, uint32(os.Getuid()), asked[0])
}

func TestDialErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.sock")
	_, err := Dial(missing)
	require.ErrorContains(t, err, "no stagefs daemon at "+missing)

	// A socket file whose daemon died: connection refused.
	dead := filepath.Join(t.TempDir(), "dead.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: dead, Net: "unix"})
	require.NoError(t, err)
	l.SetUnlinkOnClose(false)
	l.Close()
	_, err = Dial(dead)
	require.ErrorContains(t, err, "no stagefs daemon at "+dead)
}

func TestCloseStopsEverything(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.sock")
	l, err := Listen(path)
	require.NoError(t, err)
	s := NewServer(&fakeBackend{}, ServerOptions{})
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()

	c, err := Dial(path)
	require.NoError(t, err)
	defer c.Close()
	ctx := testCtx(t)
	_, err = c.Initialize(ctx)
	require.NoError(t, err)
	events, err := c.Subscribe(ctx)
	require.NoError(t, err)

	// A handler blocked in the backend is cancelled by Close.
	blocked := make(chan error, 1)
	go func() {
		_, err := c.ReadText(ctx, "block")
		blocked <- err
	}()
	time.Sleep(50 * time.Millisecond)

	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	require.NoError(t, <-served)
	require.Error(t, <-blocked)
	for range events {
	}
	_, err = c.Initialize(ctx)
	require.Error(t, err)
	require.NoError(t, s.Close(), "Close is idempotent")
	_, err = os.Lstat(path)
	require.ErrorIs(t, err, os.ErrNotExist, "the socket file goes away with the listener")
}

func TestHandleAndTyped(t *testing.T) {
	type snapParams struct {
		Name string `json:"name"`
	}
	type snapResult struct {
		ID string `json:"id"`
	}
	s, path := startServer(t, nil, ServerOptions{})
	s.Handle("snapshot/create", Typed(func(ctx context.Context, p snapParams) (snapResult, error) {
		return snapResult{ID: "snap-" + p.Name}, nil
	}))
	require.Equal(t, []string{"events/subscribe", "snapshot/create"}, s.Methods())

	c := dialClient(t, path)
	var r snapResult
	require.NoError(t, c.Call(testCtx(t), "snapshot/create", snapParams{Name: "one"}, &r))
	require.Equal(t, "snap-one", r.ID)

	// Without a backend the built-in fs methods are simply absent.
	_, err := c.Diff(testCtx(t), nil)
	require.True(t, IsCode(err, CodeMethodNotFound), "%v", err)

	// A handler can be removed again.
	s.Handle("snapshot/create", nil)
	err = c.Call(testCtx(t), "snapshot/create", nil, nil)
	require.True(t, IsCode(err, CodeMethodNotFound), "%v", err)

	full := NewServer(&fakeBackend{}, ServerOptions{})
	defer full.Close()
	want := append([]string(nil), Methods...)
	require.ElementsMatch(t, want, full.Methods())
}

func TestClientContextCancel(t *testing.T) {
	_, path := startServer(t, &fakeBackend{}, ServerOptions{})
	c := dialClient(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.ReadText(ctx, "block")
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// An already-cancelled context fails fast and leaves the client usable.
	done, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	_, err = c.Diff(done, nil)
	require.ErrorIs(t, err, context.Canceled)
}

// TestPeerFromContext checks that a handler learns which process sent the
// request: the backend journals commits and discards under that pid.
func TestPeerFromContext(t *testing.T) {
	type peerResult struct {
		Pid int    `json:"pid"`
		Uid uint32 `json:"uid"`
		OK  bool   `json:"ok"`
	}
	s, path := startServer(t, nil, ServerOptions{})
	s.Handle("test/peer", Typed(func(ctx context.Context, _ struct{}) (peerResult, error) {
		p, ok := PeerFrom(ctx)
		return peerResult{Pid: p.Pid, Uid: p.Uid, OK: ok}, nil
	}))
	c := dialClient(t, path)
	var r peerResult
	require.NoError(t, c.Call(testCtx(t), "test/peer", nil, &r))
	// The client is this test process.
	require.Equal(t, peerResult{Pid: os.Getpid(), Uid: uint32(os.Getuid()), OK: true}, r)

	// A context that did not come from the server has no peer.
	_, ok := PeerFrom(context.Background())
	require.False(t, ok)
}
