package test

// stagefs acp between a test that plays the editor and the real
// claude-agent-acp over the real Claude Code, offline against the
// scripted model.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"stagefs/test/agentsim"
)

// acpEditor is the editor's end of an ACP connection to `stagefs acp`.
type acpEditor struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	stderr *strings.Builder

	mu      sync.Mutex
	nextID  int
	waiting map[string]chan acpMessage
	notes   []acpMessage // notifications, in order
	// perms counts the permission requests the editor granted.
	perms int
	done  chan struct{}
}

type acpMessage struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// startACP starts `stagefs acp ARGS...` from the workspace with env.
func startACP(t *testing.T, dir string, env []string, args ...string) *acpEditor {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	cmd := exec.CommandContext(ctx, stagefsBin, append([]string{"acp"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(append(baseEnv(), env...), "PWD="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	e := &acpEditor{t: t, cmd: cmd, in: in, stderr: &strings.Builder{}, waiting: map[string]chan acpMessage{}, done: make(chan struct{})}
	cmd.Stderr = &lockedWriter{w: e.stderr}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go e.read(out)
	t.Cleanup(func() {
		in.Close()
		select {
		case <-e.done:
		case <-time.After(20 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		cmd.Wait()
		cancel()
		if t.Failed() {
			t.Logf("stagefs acp stderr:\n%s", e.stderrText())
		}
	})
	return e
}

type lockedWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (e *acpEditor) stderrText() string {
	lw := e.cmd.Stderr.(*lockedWriter)
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.w.String()
}

// read takes every message from the proxy: responses go to their caller,
// permission requests are granted, notifications are kept.
func (e *acpEditor) read(out io.Reader) {
	defer close(e.done)
	r := bufio.NewReaderSize(out, 1<<20)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			var m acpMessage
			if json.Unmarshal(line, &m) != nil {
				e.t.Errorf("stagefs acp wrote a line that is not JSON: %q", line)
				continue
			}
			e.handle(m)
		}
		if err != nil {
			return
		}
	}
}

func (e *acpEditor) handle(m acpMessage) {
	switch {
	case m.Method == "session/request_permission":
		var p struct {
			Options []struct {
				OptionID string `json:"optionId"`
				Kind     string `json:"kind"`
			} `json:"options"`
		}
		json.Unmarshal(m.Params, &p)
		// Allow once: "always" would make the agent write its settings
		// into the workspace.
		choice := ""
		for _, o := range p.Options {
			if o.Kind == "allow_once" || (choice == "" && strings.HasPrefix(o.Kind, "allow")) {
				choice = o.OptionID
			}
		}
		e.mu.Lock()
		e.perms++
		e.mu.Unlock()
		e.send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": map[string]any{"outcome": map[string]any{"outcome": "selected", "optionId": choice}}})
	case m.Method != "" && len(m.ID) > 0:
		// The proxy serves fs/* itself and hides the terminal: nothing
		// else should ask the editor.
		e.t.Errorf("the editor was asked %s: %s", m.Method, m.Params)
		e.send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32601, "message": "not in this editor"}})
	case m.Method != "":
		e.mu.Lock()
		e.notes = append(e.notes, m)
		e.mu.Unlock()
	default:
		e.mu.Lock()
		ch := e.waiting[string(m.ID)]
		delete(e.waiting, string(m.ID))
		e.mu.Unlock()
		if ch != nil {
			ch <- m
		} else {
			e.mu.Lock()
			e.notes = append(e.notes, m) // an answer nobody waits for (id null)
			e.mu.Unlock()
		}
	}
}

func (e *acpEditor) send(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		e.t.Fatal(err)
	}
	e.raw(b)
}

func (e *acpEditor) raw(b []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.in.Write(append(b, '\n'))
}

// call sends a request and waits for its answer.
func (e *acpEditor) call(method string, params any) acpMessage {
	e.t.Helper()
	e.mu.Lock()
	e.nextID++
	id := fmt.Sprint(e.nextID)
	ch := make(chan acpMessage, 1)
	e.waiting[id] = ch
	e.mu.Unlock()
	e.send(map[string]any{"jsonrpc": "2.0", "id": e.nextID, "method": method, "params": params})
	select {
	case m := <-ch:
		return m
	case <-e.done:
		e.t.Fatalf("%s: stagefs acp exited before answering; stderr:\n%s", method, e.stderrText())
	case <-time.After(90 * time.Second):
		e.t.Fatalf("%s: no answer in 90 s; stderr:\n%s", method, e.stderrText())
	}
	return acpMessage{}
}

// mustCall is call for a request that must succeed; it decodes the result.
func (e *acpEditor) mustCall(method string, params any, result any) {
	e.t.Helper()
	m := e.call(method, params)
	if m.Error != nil {
		e.t.Fatalf("%s: error %d %s", method, m.Error.Code, m.Error.Message)
	}
	if result != nil {
		if err := json.Unmarshal(m.Result, result); err != nil {
			e.t.Fatalf("%s: result %s: %v", method, m.Result, err)
		}
	}
}

// notifications returns the session/update notifications so far.
func (e *acpEditor) updates() []map[string]any {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []map[string]any
	for _, n := range e.notes {
		if n.Method != "session/update" {
			continue
		}
		var p struct {
			Update map[string]any `json:"update"`
		}
		json.Unmarshal(n.Params, &p)
		out = append(out, p.Update)
	}
	return out
}

// acpAgentEnv is the environment for claude-agent-acp over Claude Code and
// the scripted model.
func acpAgentEnv(t *testing.T, srv *agentsim.Server, home string) []string {
	t.Helper()
	claude, err := filepath.EvalSymlinks(agentsim.NeedAgent(t, "claude"))
	if err != nil {
		t.Fatal(err)
	}
	return append(srv.ClaudeEnv(home), "CLAUDE_CODE_EXECUTABLE="+claude)
}

func TestACPSession(t *testing.T) {
	parallel(t)
	agent := agentsim.NeedAgent(t, "claude-agent-acp")
	m := mountStagefs(t, withFiles(map[string]string{"keep.txt": "keep\n", "dir/a.txt": "a\n"}))
	sh(t, m.ws, "git init -q && git add -A && git commit -qm base")
	srv := agentsim.Start(t, agentsim.Scripts{
		"acp first": {
			agentsim.Call("Bash", map[string]any{"command": "echo one > one.txt", "description": "one"}),
			agentsim.Call("Write", map[string]any{"file_path": filepath.Join(m.ws, "written.txt"), "content": "written\n"}),
			agentsim.Text("first done"),
		},
		"acp second": {
			agentsim.Call("Bash", map[string]any{"command": "rm -rf dir", "description": "remove"}),
			agentsim.Text("second done"),
		},
	})
	home := filepath.Join(m.base, "home")
	os.MkdirAll(home, 0o755)
	before := snapshot(t, m.ws, ".git")
	e := startACP(t, m.ws, acpAgentEnv(t, srv, home), "-m", m.mnt, "--", agent)

	var init struct {
		AgentCapabilities struct {
			SessionCapabilities map[string]any `json:"sessionCapabilities"`
		} `json:"agentCapabilities"`
		Meta struct {
			Stagefs struct {
				Mode         string `json:"mode"`
				PendingCount *int   `json:"pendingCount"`
			} `json:"stagefs"`
		} `json:"_meta"`
	}
	e.mustCall("initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": map[string]any{
		"fs": map[string]any{"readTextFile": true, "writeTextFile": true}, "terminal": true}}, &init)
	for _, c := range []string{"restoreToolCall", "rollback", "redo"} {
		if _, ok := init.AgentCapabilities.SessionCapabilities[c]; !ok {
			t.Errorf("initialize does not advertise %s: %+v", c, init.AgentCapabilities.SessionCapabilities)
		}
	}
	if init.Meta.Stagefs.Mode != "staged" || init.Meta.Stagefs.PendingCount == nil {
		t.Errorf("initialize _meta.stagefs: %+v", init.Meta.Stagefs)
	}
	var sess struct{ SessionID string }
	e.mustCall("session/new", map[string]any{"cwd": m.ws, "mcpServers": []any{}}, &sess)

	prompt := func(text string) string {
		var r struct {
			StopReason string `json:"stopReason"`
			Meta       struct {
				Stagefs struct{ TurnID string } `json:"stagefs"`
			} `json:"_meta"`
		}
		e.mustCall("session/prompt", map[string]any{"sessionId": sess.SessionID, "prompt": []any{map[string]any{"type": "text", "text": text}}}, &r)
		if r.StopReason != "end_turn" || r.Meta.Stagefs.TurnID == "" {
			t.Fatalf("session/prompt %q: %+v", text, r)
		}
		return r.Meta.Stagefs.TurnID
	}
	turn1 := prompt("acp first: write two files")
	ids := srv.ToolUseIDs()
	if len(ids) != 2 {
		t.Fatalf("tool calls: %v", ids)
	}
	assertFile(t, m.in("one.txt"), "one\n")
	assertFile(t, m.in("written.txt"), "written\n")
	assertSameTree(t, "the real workspace after the first prompt", before, snapshot(t, m.ws, ".git"))
	snaps := m.snapshotsByScope()
	assertPaths(t, "the Bash tool call", pendingOnly(m, snaps[ids[0]].Paths), "one.txt")
	assertPaths(t, "the Write tool call", pendingOnly(m, snaps[ids[1]].Paths), "written.txt")

	turn2 := prompt("acp second: remove dir")
	if turn2 == turn1 {
		t.Errorf("two prompts share the turn %s", turn1)
	}
	rm := srv.ToolUseIDs()[2]
	assertMissing(t, m.in("dir"))

	// Rollback of the second prompt and redo.
	e.mustCall("session/rollback", map[string]any{"sessionId": sess.SessionID, "turnId": turn2}, nil)
	assertFile(t, m.in("dir/a.txt"), "a\n")
	e.mustCall("_stagefs/redo", map[string]any{"sessionId": sess.SessionID}, nil)
	assertMissing(t, m.in("dir"))

	// Restoring the rm -rf tool call alone.
	var restored struct{ RestoredPaths []string }
	e.mustCall("session/restore_tool_call", map[string]any{"sessionId": sess.SessionID, "toolCallId": rm}, &restored)
	assertFile(t, m.in("dir/a.txt"), "a\n")
	assertFile(t, m.in("one.txt"), "one\n")
	if !contains(restored.RestoredPaths, filepath.Join(m.ws, "dir/a.txt")) {
		t.Errorf("restoredPaths: %v", restored.RestoredPaths)
	}
	if !waitFor(5*time.Second, func() bool {
		for _, u := range e.updates() {
			meta, _ := u["_meta"].(map[string]any)
			sf, _ := meta["stagefs"].(map[string]any)
			if u["sessionUpdate"] == "tool_call_update" && u["toolCallId"] == rm && u["status"] == "restored" && sf["kind"] == "tool_call_restored" {
				return true
			}
		}
		return false
	}) {
		t.Errorf("no tool_call_update with status restored for %s", rm)
	}
	sawPending := waitFor(5*time.Second, func() bool {
		for _, u := range e.updates() {
			meta, _ := u["_meta"].(map[string]any)
			if sf, _ := meta["stagefs"].(map[string]any); u["sessionUpdate"] == "session_info_update" && sf["kind"] == "staged_writes_pending" && sf["pendingCount"] != nil {
				return true
			}
		}
		return false
	})
	if !sawPending {
		t.Errorf("no staged_writes_pending update reached the editor")
	}

	// Status, diff, commit of chosen paths, discard.
	var st struct{ PendingCount int }
	e.mustCall("session/fs_staged_status", map[string]any{"sessionId": sess.SessionID}, &st)
	if st.PendingCount != 2 {
		t.Errorf("fs_staged_status: %+v, want one.txt and written.txt", st)
	}
	var diff struct{ Diff string }
	e.mustCall("_stagefs/fs_diff", map[string]any{"sessionId": sess.SessionID}, &diff)
	if !strings.Contains(diff.Diff, "+++ b/one.txt") {
		t.Errorf("fs_diff:\n%s", diff.Diff)
	}
	assertSameTree(t, "the real workspace before the commit", before, snapshot(t, m.ws, ".git"))
	e.mustCall("session/fs_commit_staged", map[string]any{"sessionId": sess.SessionID, "paths": []string{"one.txt"}}, nil)
	assertFile(t, m.inWS("one.txt"), "one\n")
	assertMissing(t, m.inWS("written.txt"))
	e.mustCall("session/fs_discard_staged", map[string]any{"sessionId": sess.SessionID, "paths": []string{filepath.Join(m.ws, "written.txt")}}, nil)
	assertMissing(t, m.in("written.txt"))
	var mode struct{ Previous string }
	e.mustCall("session/fs_mode", map[string]any{"sessionId": sess.SessionID, "mode": "staged"}, &mode)
	if mode.Previous != "staged" {
		t.Errorf("fs_mode: %+v", mode)
	}

	// Bad requests get errors, and the relay goes on.
	for _, tc := range []struct {
		method string
		params any
		code   int
	}{
		{"session/fs_staged_status", map[string]any{"sessionId": "no-such-session"}, -32003},
		{"session/restore_tool_call", map[string]any{"sessionId": sess.SessionID, "toolCallId": "no-such-call"}, -32003},
		{"session/restore_tool_call", map[string]any{"sessionId": sess.SessionID}, -32602},
		{"session/fs_commit_staged", map[string]any{"sessionId": sess.SessionID, "paths": []string{"/etc/passwd"}}, -32005},
		{"session/fs_mode", "not an object", -32602},
	} {
		if r := e.call(tc.method, tc.params); r.Error == nil || r.Error.Code != tc.code {
			t.Errorf("%s %v: want error %d, got %+v %s", tc.method, tc.params, tc.code, r.Error, r.Result)
		}
	}
	if r := e.call("no/such_method", map[string]any{}); r.Error == nil {
		t.Errorf("an unknown method got no error: %s", r.Result)
	}
	e.raw([]byte(`{"jsonrpc":"2.0","id":`))
	e.raw([]byte(`{"jsonrpc":"2.0","id":77,"method":"session/fs_staged_status","params":{"sessionId":"` + sess.SessionID + `","pad":"` + strings.Repeat("x", 33<<20) + `"}}`))
	if !waitFor(20*time.Second, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		codes := map[int]bool{}
		for _, n := range e.notes {
			if n.Error != nil {
				codes[n.Error.Code] = true
			}
		}
		return codes[-32700] && codes[-32600]
	}) {
		t.Errorf("malformed JSON and a huge line were not answered with -32700 and -32600")
	}
	e.mustCall("session/fs_staged_status", map[string]any{"sessionId": sess.SessionID}, &st)
	if e.perms == 0 {
		t.Logf("the agent asked no permission (tools ran without asking)")
	}
}

// pendingOnly keeps the paths that have a pending change: a snapshot may
// also name temporary files renamed or removed again.
func pendingOnly(m *stagefsMount, paths []string) []string {
	kinds := statusKinds(m.status())
	var out []string
	for _, p := range paths {
		if _, ok := kinds[p]; ok {
			out = append(out, p)
		}
	}
	return out
}
