package test

// stagefs acp against what goes wrong: the editor cancels a prompt while a
// tool call runs, the agent dies in the middle of a prompt, the agent
// command does not exist; and how the agent's file reads and writes are
// served with the client's fs capability on: by claude-agent-acp over
// Claude Code (which does not send fs/*), and by a stand-in /bin/sh agent
// that sends fs/read_text_file and fs/write_text_file itself.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"stagefs/control"
	"stagefs/test/agentsim"
)

// callAsync sends a request and returns the channel its answer arrives on
// (buffered, so an answer nobody collects is not lost).
func (e *acpEditor) callAsync(method string, params any) <-chan acpMessage {
	e.t.Helper()
	e.mu.Lock()
	e.nextID++
	id := e.nextID
	ch := make(chan acpMessage, 1)
	e.waiting[fmt.Sprint(id)] = ch
	e.mu.Unlock()
	e.send(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	return ch
}

// await waits up to d for the answer on ch. An answer the proxy wrote just
// before it exited still counts: the reader hands it over before it sees
// the end of the output. ok is false if no answer came.
func (e *acpEditor) await(ch <-chan acpMessage, d time.Duration) (m acpMessage, ok bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case m := <-ch:
		return m, true
	case <-e.done:
		select {
		case m := <-ch:
			return m, true
		default:
			return acpMessage{}, false
		}
	case <-timer.C:
		return acpMessage{}, false
	}
}

// acpOpen initializes the connection with the client capabilities caps
// and opens a session in ws; it returns the session id.
func acpOpen(t *testing.T, e *acpEditor, ws string, caps map[string]any) string {
	t.Helper()
	e.mustCall("initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": caps}, nil)
	var sess struct {
		SessionID string `json:"sessionId"`
	}
	e.mustCall("session/new", map[string]any{"cwd": ws, "mcpServers": []any{}}, &sess)
	if sess.SessionID == "" {
		t.Fatalf("session/new gave no sessionId; stderr:\n%s", e.stderrText())
	}
	return sess.SessionID
}

func promptParams(session, text string) map[string]any {
	return map[string]any{"sessionId": session, "prompt": []any{map[string]any{"type": "text", "text": text}}}
}

// fullCaps is what a full editor offers: fs and a terminal.
func fullCaps() map[string]any {
	return map[string]any{"fs": map[string]any{"readTextFile": true, "writeTextFile": true}, "terminal": true}
}

// assertNoOpenSnapshot fails the test for every snapshot still open.
func assertNoOpenSnapshot(t *testing.T, m *stagefsMount, what string) {
	t.Helper()
	for scope, s := range m.snapshotsByScope() {
		if s.Open {
			t.Errorf("%s: snapshot %s (%s) is still open", what, scope, s.Label)
		}
	}
}

// turnLabelled returns the turn whose label is label.
func turnLabelled(m *stagefsMount, label string) (control.TurnInfo, bool) {
	for _, ti := range m.checkpoints() {
		if ti.Label == label {
			return ti, true
		}
	}
	return control.TurnInfo{}, false
}

// mountsUnder lists the mount points under dir in /proc/self/mountinfo.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			p := unescapeMountinfo(fields[4])
			if p == dir || strings.HasPrefix(p, dir+"/") {
				out = append(out, p)
			}
		}
	}
	return out
}

// journal returns the daemon's journal records (stagefs log --json).
func (m *stagefsMount) journal() []control.LogEntry {
	m.t.Helper()
	out := m.mustCLI("log", "--json")
	var res control.LogResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		m.t.Fatalf("log --json: %v\n%s", err, out)
	}
	return res.Records
}

// The editor cancels a prompt while its tool call runs: the prompt is
// answered at once, the tool call's snapshot is closed, what it staged
// stays pending and the turn stays; the relay goes on.
func TestACPCancel(t *testing.T) {
	parallel(t)
	agent := agentsim.NeedAgent(t, "claude-agent-acp")
	m := mountStagefs(t, withFiles(map[string]string{"keep.txt": "keep\n"}))
	const slow = "acp-cancel-slow"
	srv := agentsim.Start(t, agentsim.Scripts{
		// The call never ends by itself: the test cancels it.
		slow: {
			agentsim.Call("Bash", map[string]any{"command": "touch started; sleep 30", "description": "slow"}),
			agentsim.Text("slow done"),
		},
	})
	home := filepath.Join(m.base, "home")
	os.MkdirAll(home, 0o755)
	before := snapshot(t, m.ws)
	e := startACP(t, m.ws, acpAgentEnv(t, srv, home), "-m", m.mnt, "--", agent)
	session := acpOpen(t, e, m.ws, fullCaps())

	label := slow + ": run something slow"
	answer := e.callAsync("session/prompt", promptParams(session, label))
	if !waitFor(60*time.Second, func() bool { _, err := os.Lstat(m.in("started")); return err == nil }) {
		t.Fatalf("the tool call did not start in 60 s; stderr:\n%s", e.stderrText())
	}
	ids := srv.ToolUseIDs()
	if len(ids) != 1 {
		t.Fatalf("tool calls: %v", ids)
	}
	cancelled := time.Now()
	e.send(map[string]any{"jsonrpc": "2.0", "method": "session/cancel", "params": map[string]any{"sessionId": session}})
	r, ok := e.await(answer, 20*time.Second)
	if !ok {
		t.Fatalf("session/prompt: no answer within 20 s of session/cancel; stderr:\n%s", e.stderrText())
	}
	t.Logf("session/prompt answered %v after session/cancel: result %s, error %+v", time.Since(cancelled).Round(time.Millisecond), r.Result, r.Error)
	turnID := ""
	if r.Error == nil {
		var res struct {
			StopReason string `json:"stopReason"`
			Meta       struct {
				Stagefs struct {
					TurnID string `json:"turnId"`
				} `json:"stagefs"`
			} `json:"_meta"`
		}
		json.Unmarshal(r.Result, &res)
		if res.StopReason != "cancelled" {
			t.Errorf("session/prompt after session/cancel: stopReason %q, want cancelled (%s)", res.StopReason, r.Result)
		}
		turnID = res.Meta.Stagefs.TurnID
		if turnID == "" {
			t.Errorf("the cancelled prompt's answer names no turn: %s", r.Result)
		}
	}

	// Nothing stays open; the turn and what the tool call staged stay.
	assertNoOpenSnapshot(t, m, "after session/cancel")
	// The tool call's own snapshot, or the gap before it, which restoring
	// the tool call restores too.
	var held []string
	for scope, s := range m.snapshotsByScope() {
		if scope == ids[0] || strings.HasPrefix(scope, "acp-gap-") {
			held = append(held, s.Paths...)
		}
	}
	if !contains(held, "started") {
		t.Errorf("the cancelled tool call's snapshots hold %v, want started", held)
	}
	ti, ok := turnLabelled(m, label)
	if !ok {
		t.Errorf("no turn labelled %q in checkpoints: %+v", label, m.checkpoints())
	} else if turnID != "" && ti.TurnID != turnID {
		t.Errorf("the prompt's turn is %s, checkpoints has %s", turnID, ti.TurnID)
	}
	if k := statusKinds(m.status()); k["started"] == "" {
		t.Errorf("started is not pending after the cancel: %v", k)
	}
	assertFile(t, m.in("started"), "")
	assertSameTree(t, "the real workspace after the cancel", before, snapshot(t, m.ws))

	// The relay goes on. (A next prompt is not tried: claude-agent-acp
	// 0.23.1 answers the first prompt after a cancel at once with a stale
	// stop reason and reports its work only with the prompt after that,
	// upstream issue agentclientprotocol/claude-agent-acp#551.)
	var st struct {
		PendingCount int `json:"pendingCount"`
	}
	e.mustCall("session/fs_staged_status", map[string]any{"sessionId": session}, &st)
	if st.PendingCount != 1 {
		t.Errorf("fs_staged_status after the cancel: %+v, want started alone", st)
	}
}

// killAgent is a shell script that SIGKILLs every ancestor of the tool's
// shell whose command line names claude-agent-acp: the ACP agent itself
// (the sandbox's PID namespace shows no process outside the agent's
// tree). The bracket keeps the script's own shell from matching. It says
// whom it kills first: once the agent is gone the sandbox ends the shell
// too.
const killAgent = `p=$PPID
targets=
while [ -n "$p" ] && [ "$p" -gt 1 ]; do
  if tr '\0' ' ' </proc/$p/cmdline 2>/dev/null | grep -q 'claude-agent-ac[p]'; then
    targets="$targets $p"
  fi
  p=$(sed 's/.*) [A-Za-z] \([0-9]*\) .*/\1/' /proc/$p/stat 2>/dev/null)
done
echo "killing:$targets" > killed.txt
kill -9 $targets
sleep 20
`

// The agent dies in the middle of a prompt: the editor's prompt is
// answered with an error that says so, the proxy exits by itself, nothing
// is left open or mounted, and what the agent staged stays pending.
func TestACPAgentExitsMidPrompt(t *testing.T) {
	parallel(t)
	agent := agentsim.NeedAgent(t, "claude-agent-acp")
	m := mountStagefs(t, withFiles(map[string]string{"keep.txt": "keep\n"}))
	const key = "acp-agent-dies"
	srv := agentsim.Start(t, agentsim.Scripts{
		key: {
			agentsim.Call("Bash", map[string]any{"command": "echo staged > staged.txt", "description": "stage"}),
			agentsim.Call("Bash", map[string]any{"command": killAgent, "description": "kill the agent"}),
			agentsim.Text("not reached"),
		},
	})
	home := filepath.Join(m.base, "home")
	os.MkdirAll(home, 0o755)
	before := snapshot(t, m.ws)
	e := startACP(t, m.ws, acpAgentEnv(t, srv, home), "-m", m.mnt, "--", agent)
	session := acpOpen(t, e, m.ws, fullCaps())

	label := key + ": stage, then die"
	start := time.Now()
	r, ok := e.await(e.callAsync("session/prompt", promptParams(session, label)), 90*time.Second)
	if !ok {
		t.Fatalf("session/prompt: no answer when the agent died (%v); stderr:\n%s", time.Since(start).Round(time.Millisecond), e.stderrText())
	}
	if r.Error == nil {
		t.Fatalf("session/prompt: want an error when the agent dies mid-prompt, got %s (tool results %+v)", r.Result, srv.ToolResults())
	}
	if !strings.Contains(r.Error.Message, "agent exited") {
		t.Errorf("session/prompt error %d %q does not say the agent exited", r.Error.Code, r.Error.Message)
	}
	if got := readFile(t, m.in("killed.txt")); !strings.HasPrefix(got, "killing: ") {
		t.Errorf("the tool call found no agent to kill: %q", got)
	}

	// The proxy exits by itself: stdin is still open.
	select {
	case <-e.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("stagefs acp kept its output open 20 s after the agent died; stderr:\n%s", e.stderrText())
	}
	if pid := e.cmd.Process.Pid; !waitProcessGone(pid, 10*time.Second) {
		t.Fatalf("stagefs acp (pid %d) still running 10 s after its output ended; stderr:\n%s", pid, e.stderrText())
	}
	t.Logf("answered and gone %v after the prompt; stderr:\n%s", time.Since(start).Round(time.Millisecond), e.stderrText())

	ids := srv.ToolUseIDs()
	if len(ids) != 2 {
		t.Fatalf("tool calls: %v", ids)
	}
	assertNoOpenSnapshot(t, m, "after the agent died")
	if _, ok := turnLabelled(m, label); !ok {
		t.Errorf("no turn labelled %q in checkpoints: %+v", label, m.checkpoints())
	}
	assertPaths(t, "the tool call before the agent died", pendingOnly(m, m.snapshotInfo(ids[0]).Paths), "staged.txt")
	assertFile(t, m.in("staged.txt"), "staged\n")
	if k := statusKinds(m.status()); k["staged.txt"] == "" {
		t.Errorf("staged.txt is not pending: %v", k)
	}
	assertSameTree(t, "the real workspace after the agent died", before, snapshot(t, m.ws))
	if got := mountsUnder(m.base); len(got) != 1 || got[0] != m.mnt {
		t.Errorf("mounts under %s: %v, want the test's own %s alone", m.base, got, m.mnt)
	}
}

// An agent command that does not exist: stagefs acp says so on stderr and
// exits at once, and its stdout, the editor's channel, carries nothing
// that is not JSON.
func TestACPAgentMissing(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"keep.txt": "keep\n"}))
	for _, agent := range []string{"/no/such/agent", "no-such-agent-for-stagefs"} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, stagefsBin, "acp", "-m", m.mnt, "--", agent)
		cmd.Dir = m.ws
		cmd.Env = append(baseEnv(), "PWD="+m.ws)
		// The editor's end stays open: the proxy must not wait for it.
		inR, inW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, &stdout, &stderr
		cmd.WaitDelay = 5 * time.Second
		start := time.Now()
		err = cmd.Run()
		took := time.Since(start)
		inR.Close()
		inW.Close()
		if ctx.Err() != nil {
			t.Errorf("stagefs acp -- %s still running after %v", agent, took)
		}
		var ee *exec.ExitError
		if err == nil || !errors.As(err, &ee) || ee.ExitCode() <= 0 {
			t.Errorf("stagefs acp -- %s: %v, want a non-zero exit", agent, err)
		}
		if took > 10*time.Second {
			t.Errorf("stagefs acp -- %s took %v to fail", agent, took)
		}
		if !strings.Contains(stderr.String(), agent) {
			t.Errorf("stagefs acp -- %s: stderr does not name the command: %q", agent, stderr.String())
		}
		for _, line := range strings.Split(stdout.String(), "\n") {
			if strings.TrimSpace(line) != "" && !json.Valid([]byte(line)) {
				t.Errorf("stagefs acp -- %s wrote a line that is not JSON to stdout: %q", agent, line)
			}
		}
		t.Logf("stagefs acp -- %s: %v in %v; stderr %q; stdout %q", agent, err, took.Round(time.Millisecond), stderr.String(), stdout.String())
	}
	// Nothing was started in the daemon.
	assertNoOpenSnapshot(t, m, "after the missing agent")
	if ts := m.checkpoints(); len(ts) != 0 {
		t.Errorf("turns after the missing agent: %+v", ts)
	}
	if got := mountsUnder(m.base); len(got) != 1 || got[0] != m.mnt {
		t.Errorf("mounts under %s: %v, want the test's own %s alone", m.base, got, m.mnt)
	}
}

// With the client's fs capability on, Claude's Read, Edit and Write
// through claude-agent-acp: the writes are staged (in the view, not in the
// workspace) and the reads see staged content. claude-agent-acp 0.23.1
// never sends fs/read_text_file or fs/write_text_file (its dist calls
// client.readTextFile/writeTextFile from no tool): Claude Code's own tools
// read and write the staged view through the mount, which the journal
// shows as create/rename records by claude, not as the "patch" records of
// fs/safe_text_patch. The editor is never asked fs/* (acpEditor fails the
// test if it is).
func TestACPFsCapability(t *testing.T) {
	parallel(t)
	agent := agentsim.NeedAgent(t, "claude-agent-acp")
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "alpha\n", "keep.txt": "keep\n"}))
	const key = "acp-fs-capability"
	a, nw := filepath.Join(m.ws, "a.txt"), filepath.Join(m.ws, "new.txt")
	srv := agentsim.Start(t, agentsim.Scripts{
		key: {
			// A staged change first, so that the Edit works only if the
			// Read saw the staged view: "beta" is not in the workspace.
			agentsim.Call("Bash", map[string]any{"command": `printf 'alpha\nbeta\n' > a.txt`, "description": "stage"}),
			agentsim.Call("Read", map[string]any{"file_path": a}),
			agentsim.Call("Edit", map[string]any{"file_path": a, "old_string": "beta", "new_string": "gamma"}),
			agentsim.Call("Write", map[string]any{"file_path": nw, "content": "new\n"}),
			agentsim.Text("fs done"),
		},
	})
	home := filepath.Join(m.base, "home")
	os.MkdirAll(home, 0o755)
	before := snapshot(t, m.ws)
	e := startACP(t, m.ws, acpAgentEnv(t, srv, home), "-m", m.mnt, "--", agent)
	session := acpOpen(t, e, m.ws, fullCaps())
	var r struct {
		StopReason string `json:"stopReason"`
	}
	e.mustCall("session/prompt", promptParams(session, key+": read, edit, write"), &r)
	if r.StopReason != "end_turn" {
		t.Fatalf("session/prompt: %+v", r)
	}
	results := srv.ToolResults()
	if len(results) != 4 {
		t.Fatalf("tool results: %+v", results)
	}
	for i, res := range results {
		if res.IsError {
			t.Errorf("tool call %d failed: %+v", i, res)
		}
	}
	if !strings.Contains(results[1].Output, "beta") {
		t.Errorf("the Read did not see the staged content: %q", results[1].Output)
	}
	assertFile(t, m.in("a.txt"), "alpha\ngamma\n")
	assertFile(t, m.in("new.txt"), "new\n")
	assertSameTree(t, "the real workspace", before, snapshot(t, m.ws))
	assertPending(t, m, "after the prompt", map[string]string{"a.txt": "write", "new.txt": "create"})
	ids := srv.ToolUseIDs()
	assertPaths(t, "the Edit", pendingOnly(m, m.snapshotInfo(ids[2]).Paths), "a.txt")
	assertPaths(t, "the Write", pendingOnly(m, m.snapshotInfo(ids[3]).Paths), "new.txt")
	assertNoOpenSnapshot(t, m, "after the prompt")

	// Which way did the writes go? Through the proxy (fs/write_text_file
	// → fs/safe_text_patch: a "patch" record by stagefs) or through the
	// mount (Claude's own create and rename).
	var viaProxy, viaMount []string
	for _, rec := range m.journal() {
		switch {
		case rec.Op == "patch" && (rec.Path == "a.txt" || rec.Path == "new.txt"):
			viaProxy = append(viaProxy, rec.Path)
		case rec.Op == "rename" && (rec.Path2 == "a.txt" || rec.Path2 == "new.txt"):
			viaMount = append(viaMount, fmt.Sprintf("%s by %s[%d]", rec.Path2, rec.Comm, rec.PID))
		}
	}
	t.Logf("written through fs/write_text_file (the proxy): %v; through the mount: %v", viaProxy, viaMount)
	if len(viaProxy)+len(viaMount) < 2 {
		t.Errorf("the journal shows neither way for the Edit and the Write: proxy %v, mount %v", viaProxy, viaMount)
	}
}

// fakeAgent writes a /bin/sh ACP agent to dir: it logs every line it
// receives to log, answers initialize and session/new, and on
// session/prompt sends each of reqs to the client side, logs the answers,
// then ends the turn.
func fakeAgent(t *testing.T, dir, log string, reqs []map[string]any) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("#!/bin/sh\n")
	fmt.Fprintf(&b, "LOG='%s'\n", log)
	b.WriteString(`while IFS= read -r line; do
  printf '%s\n' "$line" >> "$LOG"
  id=$(printf '%s' "$line" | grep -o '"id":[0-9]*' | head -n 1 | cut -d: -f2)
  case "$line" in
  *'"method":"initialize"'*)
    printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":1,"agentCapabilities":{}}}\n' "$id" ;;
  *'"method":"session/new"'*)
    printf '{"jsonrpc":"2.0","id":%s,"result":{"sessionId":"fake-session"}}\n' "$id" ;;
  *'"method":"session/prompt"'*)
`)
	for _, r := range reqs {
		j, err := json.Marshal(r)
		if err != nil || bytes.ContainsRune(j, '\'') {
			t.Fatalf("request %v: %v", r, err)
		}
		fmt.Fprintf(&b, "    printf '%%s\\n' '%s'\n", j)
		b.WriteString("    IFS= read -r ans || exit 0\n    printf '%s\\n' \"$ans\" >> \"$LOG\"\n")
	}
	b.WriteString(`    printf '{"jsonrpc":"2.0","id":%s,"result":{"stopReason":"end_turn"}}\n' "$id" ;;
  esac
done
`)
	path := filepath.Join(dir, "fake-agent.sh")
	if err := os.WriteFile(path, []byte(b.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// fsRun is what a stand-in agent saw in one prompt: the initialize it
// received, the answer to each of its fs requests by id, and the turn
// the prompt got.
type fsRun struct {
	init    map[string]any
	answers map[int]acpMessage
	turnID  string
}

func fsRead(id int, path string, extra ...any) map[string]any {
	p := map[string]any{"sessionId": "fake-session", "path": path}
	for i := 0; i+1 < len(extra); i += 2 {
		p[extra[i].(string)] = extra[i+1]
	}
	return map[string]any{"jsonrpc": "2.0", "id": id, "method": "fs/read_text_file", "params": p}
}

func fsWrite(id int, path, content string) map[string]any {
	return map[string]any{"jsonrpc": "2.0", "id": id, "method": "fs/write_text_file", "params": map[string]any{"sessionId": "fake-session", "path": path, "content": content}}
}

// runFakeFS runs one prompt through stagefs acp in front of a stand-in
// agent that sends reqs (ids above 100) and returns what it saw.
func runFakeFS(t *testing.T, m *stagefsMount, label string, reqs []map[string]any) fsRun {
	t.Helper()
	agentDir := shortTempDir(t)
	log := filepath.Join(agentDir, "agent.log")
	agent := fakeAgent(t, agentDir, log, reqs)
	e := startACP(t, m.ws, nil, "-m", m.mnt, "--", agent)
	session := acpOpen(t, e, m.ws, fullCaps())
	var r struct {
		StopReason string `json:"stopReason"`
		Meta       struct {
			Stagefs struct {
				TurnID string `json:"turnId"`
			} `json:"stagefs"`
		} `json:"_meta"`
	}
	e.mustCall("session/prompt", promptParams(session, label), &r)
	if r.StopReason != "end_turn" {
		t.Fatalf("session/prompt: %+v", r)
	}
	run := fsRun{answers: map[int]acpMessage{}, turnID: r.Meta.Stagefs.TurnID}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var msg acpMessage
		if err := json.Unmarshal([]byte(line), &msg); err != nil {
			t.Errorf("the agent received a line that is not JSON: %q", line)
			continue
		}
		if msg.Method == "initialize" {
			json.Unmarshal(msg.Params, &run.init)
			continue
		}
		var id int
		if msg.Method == "" && json.Unmarshal(msg.ID, &id) == nil && id > 100 {
			run.answers[id] = msg
		}
	}
	for _, req := range reqs {
		if _, ok := run.answers[req["id"].(int)]; !ok {
			params, _ := json.Marshal(req["params"])
			t.Errorf("%s %s: no answer reached the agent", req["method"], params)
		}
	}
	return run
}

// content checks that the answer to request id is a read result with
// content want.
func (r fsRun) content(t *testing.T, id int, what, want string) {
	t.Helper()
	a := r.answers[id]
	var res struct {
		Content *string `json:"content"`
	}
	if a.Error != nil || json.Unmarshal(a.Result, &res) != nil || res.Content == nil || *res.Content != want {
		t.Errorf("fs/read_text_file of %s: result %s, error %+v; want content %q", what, a.Result, a.Error, want)
	}
}

// ok checks that request id succeeded, failed checks that it got an
// error.
func (r fsRun) ok(t *testing.T, id int, what string) {
	t.Helper()
	if a := r.answers[id]; a.Error != nil || len(a.Result) == 0 {
		t.Errorf("%s: result %s, error %+v; want success", what, a.Result, a.Error)
	}
}

func (r fsRun) failed(t *testing.T, id int, what string) {
	t.Helper()
	if a := r.answers[id]; a.Error == nil {
		t.Errorf("%s: result %s; want an error", what, a.Result)
	}
}

// The proxy serves the agent's fs/read_text_file and fs/write_text_file
// itself, from the staged view, with a stand-in agent that sends them: a
// write is staged (through fs/safe_text_patch, in the prompt's turn), a
// read sees it, a missing file reads as empty, paths outside the
// workspace are refused. The agent's initialize shows no terminal
// although the editor offered one, and still the fs capability.
func TestACPFsServedByProxy(t *testing.T) {
	parallel(t)
	outside := shortTempDir(t)
	writeTree(t, outside, map[string]string{"secret.txt": "secret\n"})
	// --outside rw: the stand-in agent (runFakeFS) lives and logs in a
	// directory outside the workspace.
	m := mountStagefs(t,
		withFiles(map[string]string{"keep.txt": "keep\n", "lines.txt": "l1\nl2\nl3\n", "sub/x": "x"}),
		withSymlink("out", outside), withMountFlags("--outside", "rw"))
	ws := m.ws
	before := snapshot(t, m.ws)
	outsideBefore := snapshot(t, outside)
	r := runFakeFS(t, m, "fake prompt", []map[string]any{
		fsWrite(101, ws+"/new.txt", "fresh\n"),
		fsRead(102, ws+"/new.txt"),
		fsRead(103, ws+"/missing.txt"),
		fsWrite(104, ws+"/keep.txt", "changed\n"),
		fsRead(105, ws+"/keep.txt"),
		fsRead(106, ws+"/lines.txt", "line", 2, "limit", 1),
		fsRead(110, "/etc/hostname"),
		fsWrite(111, filepath.Join(outside, "escape.txt"), "escape\n"),
		fsRead(112, "keep.txt"),
		fsWrite(113, ws+"/../escape2.txt", "escape\n"),
		fsWrite(114, ws+"/out/escape3.txt", "escape\n"),
		fsRead(115, ws+"/out/secret.txt"),
		fsRead(116, ws+"/sub"),
		fsRead(117, m.in("keep.txt")),
	})

	caps, _ := r.init["clientCapabilities"].(map[string]any)
	if term, ok := caps["terminal"]; !ok || term != false {
		t.Errorf("the agent's initialize: clientCapabilities.terminal = %v (present %v), want false; initialize params %v", term, ok, r.init)
	}
	if fs, _ := caps["fs"].(map[string]any); fs["readTextFile"] != true || fs["writeTextFile"] != true {
		t.Errorf("the agent's initialize: clientCapabilities.fs = %v, want both on (the proxy serves them)", caps["fs"])
	}

	r.ok(t, 101, "fs/write_text_file of a new file")
	r.content(t, 102, "the file just written", "fresh\n")
	r.content(t, 103, "a missing file", "")
	r.ok(t, 104, "fs/write_text_file of an existing file")
	r.content(t, 105, "the file just overwritten", "changed\n")
	r.content(t, 106, "line 2, limit 1", "l2\n")
	r.failed(t, 110, "fs/read_text_file of /etc/hostname")
	r.failed(t, 111, "fs/write_text_file outside the workspace")
	r.failed(t, 112, "fs/read_text_file of a relative path")
	r.failed(t, 113, "fs/write_text_file of WS/../escape2.txt")
	r.failed(t, 114, "fs/write_text_file through a symlink to a directory outside the workspace")
	if a := r.answers[115]; strings.Contains(string(a.Result), "secret") {
		t.Errorf("fs/read_text_file through a symlink out of the workspace read the file outside: %s", a.Result)
	}
	r.failed(t, 116, "fs/read_text_file of a directory")
	r.failed(t, 117, "fs/read_text_file of the mount point's path (not the workspace's)")

	// The writes are staged, by the proxy, in the prompt's turn.
	assertFile(t, m.in("new.txt"), "fresh\n")
	assertFile(t, m.in("keep.txt"), "changed\n")
	assertSameTree(t, "the real workspace", before, snapshot(t, m.ws))
	assertSameTree(t, "the directory outside the workspace", outsideBefore, snapshot(t, outside))
	assertMissing(t, filepath.Join(filepath.Dir(m.ws), "escape2.txt"))
	assertPending(t, m, "after the prompt", map[string]string{"new.txt": "create", "keep.txt": "write"})
	patched := map[string]bool{}
	for _, rec := range m.journal() {
		if rec.Op == "patch" {
			patched[rec.Path] = true
		}
	}
	if !patched["new.txt"] || !patched["keep.txt"] {
		t.Errorf("the journal has no patch record (fs/safe_text_patch) for new.txt and keep.txt: %v", patched)
	}
	if ti, ok := turnLabelled(m, "fake prompt"); !ok || ti.TurnID != r.turnID {
		t.Errorf("the prompt's turn %q: %+v (found %v)", r.turnID, ti, ok)
	} else if !contains(ti.Paths, "new.txt") || !contains(ti.Paths, "keep.txt") {
		t.Errorf("the prompt's turn does not hold the proxy's writes: %+v", ti)
	}
	assertNoOpenSnapshot(t, m, "after the prompt")
}

// A symlink inside the workspace to a file inside it reads, in the staged
// view, as its target (cat, an editor, the agent's own tools all follow
// it); fs/read_text_file must too, staged changes included.
func TestACPFsReadSymlinkInWorkspace(t *testing.T) {
	parallel(t)
	// --outside rw: the stand-in agent (runFakeFS) lives and logs in a
	// directory outside the workspace.
	m := mountStagefs(t,
		withFiles(map[string]string{"AGENTS.md": "rules\n", "docs/guide.md": "guide\n"}),
		withSymlink("CLAUDE.md", "AGENTS.md"), withSymlink("guide", "docs"), withMountFlags("--outside", "rw"))
	before := snapshot(t, m.ws)
	sh(t, m.mnt, "echo staged >> docs/guide.md")
	assertFile(t, m.in("CLAUDE.md"), "rules\n")
	assertFile(t, m.in("guide/guide.md"), "guide\nstaged\n")
	r := runFakeFS(t, m, "fake symlink prompt", []map[string]any{
		fsRead(101, m.ws+"/CLAUDE.md"),
		fsRead(102, m.ws+"/guide/guide.md"),
		fsWrite(103, m.ws+"/CLAUDE.md", "w1\n"),
		fsWrite(104, m.ws+"/guide/guide.md", "w2\n"),
	})
	r.content(t, 101, "CLAUDE.md, a symlink to AGENTS.md", "rules\n")
	r.content(t, 102, "guide/guide.md, guide being a symlink to docs", "guide\nstaged\n")

	// A write through a symlink goes to its target, or fails; it never
	// replaces the link.
	if target, err := os.Readlink(m.in("CLAUDE.md")); err != nil || target != "AGENTS.md" {
		t.Errorf("CLAUDE.md after fs/write_text_file: readlink %q, %v; want the symlink to AGENTS.md", target, err)
	}
	for _, c := range []struct {
		id         int
		path, want string
	}{{103, "AGENTS.md", "w1\n"}, {104, "docs/guide.md", "w2\n"}} {
		if a := r.answers[c.id]; a.Error != nil {
			t.Logf("fs/write_text_file %d: error %d %s", c.id, a.Error.Code, a.Error.Message)
			c.want = map[string]string{"AGENTS.md": "rules\n", "docs/guide.md": "guide\nstaged\n"}[c.path]
		}
		assertFile(t, m.in(c.path), c.want)
	}
	assertSameTree(t, "the real workspace", before, snapshot(t, m.ws))
}
