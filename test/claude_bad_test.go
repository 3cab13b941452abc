package test

// stagefs claude against what goes wrong: a tool call that tries to take
// the controls, a missing claude, hook payloads that do not parse, and the
// daemon killed in the middle of a session.

import (
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

var (
	rawrpcOnce sync.Once
	rawrpcBin  string
	rawrpcErr  error
)

// rawrpc builds test/rawrpc once: a client that sends any JSON-RPC method
// to a socket, run inside the sandbox.
func rawrpc(t *testing.T) string {
	t.Helper()
	rawrpcOnce.Do(func() {
		rawrpcBin = filepath.Join(filepath.Dir(stagefsBin), "rawrpc")
		out, err := exec.Command(goBin, "build", "-o", rawrpcBin, "./rawrpc").CombinedOutput()
		if err != nil {
			rawrpcErr = err
			t.Logf("go build ./rawrpc: %s", out)
		}
	})
	if rawrpcErr != nil {
		t.Fatalf("building rawrpc: %v", rawrpcErr)
	}
	return rawrpcBin
}

// A tool call that runs stagefs commit, discard, restore, mode or rollback,
// or sends those requests to the hook channel itself, changes nothing.
func TestClaudeToolCallCannotTakeTheControls(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}), withTestBinaries())
	rpc := rawrpc(t)
	attempts := strings.Join([]string{
		`S=` + stagefsBin + ` M=` + m.mnt,
		`$S commit -m $M; echo "commit=$?"`,
		`$S commit --socket ` + m.sock + `; echo "commit-socket=$?"`,
		`$S discard -m $M; echo "discard=$?"`,
		`$S restore -m $M toolu_sim0001; echo "restore=$?"`,
		`$S mode immediate -m $M; echo "mode=$?"`,
		`$S rollback -m $M; echo "rollback=$?"`,
		rpc + ` "$STAGEFS_HOOK_SOCKET" fs/commit_staged fs/discard_staged fs/restore '{"scopeId":"toolu_sim0001"}' fs/set_mode '{"mode":"immediate"}' session/rollback session/redo fs/read_text '{"path":"f.txt"}' session/initialize`,
		`true`,
	}, "\n")
	s := newClaudeSession(t, m, agentsim.Scripts{
		"escape prompt": {
			agentsim.Call("Bash", map[string]any{"command": "echo staged > s.txt", "description": "stage"}),
			agentsim.Call("Bash", map[string]any{"command": attempts, "description": "escape"}),
			agentsim.Text("escape done"),
		},
	})
	before := snapshot(t, m.ws)
	r := s.prompt("escape prompt")
	if r.code != 0 || !strings.Contains(r.stdout, "escape done") {
		t.Fatalf("stagefs claude: %s", r)
	}
	results := s.srv.ToolResults()
	if len(results) != 2 {
		t.Fatalf("tool results: %+v", results)
	}
	out := results[1].Output
	for _, want := range []string{"commit=4", "commit-socket=4", "discard=4", "restore=4", "mode=4", "rollback=4"} {
		if !strings.Contains(out, want) {
			t.Errorf("inside the tool call, want %q (no daemon reachable); the tool call printed:\n%s", want, out)
		}
	}
	for _, method := range []string{"fs/commit_staged", "fs/discard_staged", "fs/restore", "fs/set_mode", "session/rollback", "session/redo", "fs/read_text", "session/initialize"} {
		if !strings.Contains(out, method+` {"jsonrpc":"2.0","id"`) || !strings.Contains(out, method+" ") {
			t.Errorf("the hook channel did not answer %s:\n%s", method, out)
		}
	}
	if n := strings.Count(out, `"code":-32601`); n != 8 {
		t.Errorf("the hook channel refused %d of 8 methods with -32601:\n%s", n, out)
	}
	assertSameTree(t, "the real workspace", before, snapshot(t, m.ws))
	assertFile(t, m.in("s.txt"), "staged\n")
	if kinds := statusKinds(m.status()); kinds["s.txt"] != "create" || len(kinds) != 1 {
		t.Errorf("pending after the attempts: %v", kinds)
	}
	if out := m.mustCLI("mode"); !strings.Contains(out, "staged") {
		t.Errorf("mode after the attempts: %s", out)
	}
	if snap := m.snapshotInfo("toolu_sim0001"); len(snap.Paths) != 1 || snap.Paths[0] != "s.txt" {
		t.Errorf("the first tool call's snapshot after the attempts: %+v", snap)
	}
}

// Without claude, stagefs claude names the npm package and mounts nothing.
func TestClaudeMissing(t *testing.T) {
	parallel(t)
	requireFUSE(t)
	base := shortTempDir(t)
	ws := filepath.Join(base, "ws")
	os.Mkdir(ws, 0o755)
	env := []string{"XDG_STATE_HOME=" + filepath.Join(base, "state"), "PATH=/usr/bin:/bin"}
	for _, args := range [][]string{{"claude"}, {"claude", "--claude", filepath.Join(base, "no-such-claude")}} {
		r := runIn(t, cmdSpec{dir: ws, env: env}, stagefsBin, args...)
		if r.code != 1 || !strings.Contains(r.stderr, "npm install -g @anthropic-ai/claude-code") {
			t.Errorf("stagefs %v without claude: want exit 1 naming the npm package, got %s", args, r)
		}
	}
	if _, err := os.Stat(filepath.Join(base, "state")); err == nil {
		t.Errorf("stagefs claude without claude made a state dir")
	}
}

// A hook payload that does not parse refuses the event and says why; so
// does a tool call when no daemon answers, while the end of one only
// warns.
func TestClaudeHookBadInput(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	hookSock := hookSocketOf(t, m)
	for _, tc := range []struct {
		name, sock, payload string
		code                int
		want                string
	}{
		{"not JSON", hookSock, "not json", 2, "does not parse"},
		{"not an object", hookSock, "[1,2]", 2, "does not parse"},
		{"truncated", hookSock, `{"hook_event_name":"PreToolUse","tool_name":"Bash"`, 2, "does not parse"},
		{"no daemon, before a tool", "@stagefs-hooks-0000000000000000", `{"hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":{"command":"true"},"tool_use_id":"toolu_x"}`, 2, "is not being served"},
		{"no daemon, a prompt", "@stagefs-hooks-0000000000000000", `{"hook_event_name":"UserPromptSubmit","prompt":"hi","prompt_id":"p1"}`, 2, "is not being served"},
		{"no daemon, after a tool", "@stagefs-hooks-0000000000000000", `{"hook_event_name":"PostToolUse","tool_use_id":"toolu_x"}`, 1, "is not being served"},
		{"no socket set", "", `{"hook_event_name":"PreToolUse","tool_name":"Write","tool_input":{},"tool_use_id":"toolu_x"}`, 2, "STAGEFS_HOOK_SOCKET is not set"},
		{"not a hook socket", "/tmp/x.sock", `{"hook_event_name":"PreToolUse","tool_name":"Write","tool_input":{},"tool_use_id":"toolu_x"}`, 2, "is not a stagefs hook channel"},
		{"an event stagefs ignores", "@stagefs-hooks-0000000000000000", `{"hook_event_name":"Notification"}`, 0, ""},
	} {
		r := runIn(t, cmdSpec{stdin: tc.payload, env: []string{"STAGEFS_HOOK_SOCKET=" + tc.sock}}, stagefsBin, "hook", "claude")
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s: want exit %d and %q, got %s", tc.name, tc.code, tc.want, r)
		}
	}
	// The same daemon answers a well-formed tool call.
	r := runIn(t, cmdSpec{stdin: `{"hook_event_name":"PreToolUse","session_id":"s","tool_name":"Write","tool_input":{"file_path":"/x"},"tool_use_id":"toolu_ok"}`, env: []string{"STAGEFS_HOOK_SOCKET=" + hookSock}}, stagefsBin, "hook", "claude")
	if r.code != 0 {
		t.Errorf("a well-formed PreToolUse: %s", r)
	}
	if s := m.snapshotInfo("toolu_ok"); !s.Open || s.Label != "Write: /x" {
		t.Errorf("the snapshot it opened: %+v", s)
	}
}

// hookSocketOf asks the daemon for its hook channel's name.
func hookSocketOf(t *testing.T, m *stagefsMount) string {
	t.Helper()
	c := m.dial()
	defer c.Close()
	init, err := c.Initialize(t.Context())
	if err != nil || !strings.HasPrefix(init.HookSocket, "@stagefs-hooks-") {
		t.Fatalf("session/initialize: hookSocket %q, %v", init.HookSocket, err)
	}
	return init.HookSocket
}

// The daemon killed in the middle of a session: the next tool call is
// refused with a message, and after a new mount nothing staged is lost.
func TestClaudeDaemonKilled(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}))
	s := newClaudeSession(t, m, agentsim.Scripts{
		"kill prompt": {
			agentsim.Call("Bash", map[string]any{"command": "echo one > one.txt; touch marker; sleep 3", "description": "one"}),
			agentsim.Call("Bash", map[string]any{"command": "echo two > two.txt", "description": "two"}),
			agentsim.Text("kill done"),
		},
	})
	before := snapshot(t, m.ws)
	done := make(chan result, 1)
	go func() { done <- s.prompt("kill prompt") }()
	if !waitFor(30*time.Second, func() bool { _, err := os.Stat(m.in("marker")); return err == nil }) {
		t.Fatalf("the first tool call never ran: %s", <-done)
	}
	syscall.Kill(m.daemonPid(), syscall.SIGKILL)
	waitProcessGone(m.daemonPid(), 10*time.Second)
	r := <-done
	var refused bool
	for _, res := range s.srv.ToolResults() {
		if strings.Contains(res.Output, "is not being served") && strings.Contains(res.Output, "Refused, so that nothing runs unprotected") {
			refused = true
		}
	}
	if !refused {
		t.Errorf("no tool call was refused with the message; tool results: %+v\nstagefs claude: %s", s.srv.ToolResults(), r)
	}
	if !strings.Contains(r.stderr, "the daemon did not answer") {
		t.Errorf("the summary does not say the daemon is gone:\n%s", r.stderr)
	}
	assertSameTree(t, "the real workspace", before, snapshot(t, m.ws))
	m.mount()
	assertFile(t, m.in("one.txt"), "one\n")
	assertMissing(t, m.in("two.txt"))
	if kinds := statusKinds(m.status()); kinds["one.txt"] != "create" {
		t.Errorf("pending after the new mount: %v", kinds)
	}
}

// With --no-bind (STAGEFS_NO_BIND) a Bash call is not rewritten: its
// snapshot opens at once, covering every process.
func TestClaudeNoBind(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	env := []string{"STAGEFS_HOOK_SOCKET=" + hookSocketOf(t, m)}
	pre := `{"hook_event_name":"PreToolUse","session_id":"s","tool_name":"Bash","tool_input":{"command":"make"},"tool_use_id":"toolu_`
	r := runIn(t, cmdSpec{stdin: pre + `bind"}`, env: env}, stagefsBin, "hook", "claude")
	if r.code != 0 || !strings.Contains(r.stdout, "hook bind") {
		t.Errorf("a Bash PreToolUse: want the command rewritten, got %s", r)
	}
	r = runIn(t, cmdSpec{stdin: pre + `plain"}`, env: append(env, "STAGEFS_NO_BIND=1")}, stagefsBin, "hook", "claude")
	if r.code != 0 || r.stdout != "" {
		t.Errorf("a Bash PreToolUse with STAGEFS_NO_BIND: want no output, got %s", r)
	}
	if s := m.snapshotInfo("toolu_plain"); !s.Open || s.Pid != 0 || s.Label != "Bash: make" {
		t.Errorf("the unbound snapshot: %+v", s)
	}
}
