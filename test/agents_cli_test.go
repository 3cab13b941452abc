package test

// stagefs codex and stagefs gemini with the real Codex CLI and Gemini CLI,
// offline against the scripted model: the same contract as stagefs claude.

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"stagefs/control"
	"stagefs/test/agentsim"
)

// toolCallSnapshots lists the tool calls' snapshots (not the turns'),
// oldest first.
func toolCallSnapshots(m *stagefsMount) []control.SnapshotInfo {
	var out []control.SnapshotInfo
	for _, s := range m.snapshotsByScope() {
		if strings.HasPrefix(s.ScopeID, "turn:") || strings.HasPrefix(s.ScopeID, "post:") || strings.HasPrefix(s.ScopeID, "redo:") {
			continue
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SnapshotID < out[j].SnapshotID })
	return out
}

// agentScenario is one agent's run of the shared scenario.
type agentScenario struct {
	name string
	// prompt runs one prompt through stagefs AGENT.
	prompt func(text string) result
	// first is the first prompt's script: a shell call that edits a.txt
	// and b.txt and removes olddir, an edit of c.txt through the agent's
	// own file tool, and a shell call that runs stagefs commit; second's
	// makes second.txt through the shell.
	first, second agentsim.Script
	// editLabel is the start of the file edit's snapshot label.
	editLabel string
}

func runAgentScenario(t *testing.T, m *stagefsMount, sc agentScenario) {
	t.Helper()
	before := snapshot(t, m.ws, ".git")
	r := sc.prompt("first prompt: edit and remove")
	if r.code != 0 {
		t.Fatalf("stagefs %s, first prompt: %s", sc.name, r)
	}
	for _, want := range []string{"1 turn(s), 3 tool call(s)", "stagefs restore", "stagefs rollback", "stagefs commit"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the summary after %s exits lacks %q:\n%s", sc.name, want, r.stderr)
		}
	}
	assertSameTree(t, "the real workspace after the first prompt", before, snapshot(t, m.ws, ".git"))
	assertFile(t, m.in("a.txt"), "new a\n")
	assertFile(t, m.in("c.txt"), "CEE\n")
	assertMissing(t, m.in("olddir"))

	calls := toolCallSnapshots(m)
	if len(calls) != 3 {
		t.Fatalf("tool call snapshots after the first prompt: %+v", calls)
	}
	shell, edit, escape := calls[0], calls[1], calls[2]
	assertPaths(t, "the shell call", pendingOnly(m, shell.Paths), "a.txt", "b.txt", "olddir", "olddir/x.txt")
	assertPaths(t, "the file edit", pendingOnly(m, edit.Paths), "c.txt")
	assertPaths(t, "the call that ran stagefs commit", pendingOnly(m, escape.Paths))
	if !strings.HasPrefix(edit.Label, sc.editLabel) {
		t.Errorf("the file edit's label %q does not start with %q", edit.Label, sc.editLabel)
	}
	// The tool call that ran stagefs commit reached no daemon.
	if kinds := statusKinds(m.status()); len(kinds) != 5 {
		t.Errorf("pending after the first prompt: %v", kinds)
	}

	// Restoring the shell call alone brings olddir back and keeps the
	// file edit.
	m.mustCLI("restore", shell.ScopeID)
	assertFile(t, m.in("olddir/x.txt"), "x\n")
	assertFile(t, m.in("a.txt"), "old a\n")
	assertFile(t, m.in("c.txt"), "CEE\n")

	r = sc.prompt("second prompt: one more")
	if r.code != 0 {
		t.Fatalf("stagefs %s, second prompt: %s", sc.name, r)
	}
	assertFile(t, m.in("second.txt"), "two\n")
	turns := m.checkpoints()
	if len(turns) != 2 || !strings.HasPrefix(turns[0].Label, "second prompt") || !strings.HasPrefix(turns[1].Label, "first prompt") {
		t.Fatalf("checkpoints: %+v", turns)
	}
	m.mustCLI("rollback", turns[0].TurnID)
	assertMissing(t, m.in("second.txt"))
	assertFile(t, m.in("c.txt"), "CEE\n")
	m.mustCLI("redo")
	assertFile(t, m.in("second.txt"), "two\n")

	assertSameTree(t, "the real workspace before the commit", before, snapshot(t, m.ws, ".git"))
	m.commit("c.txt")
	assertFile(t, m.inWS("c.txt"), "CEE\n")
	assertMissing(t, m.inWS("second.txt"))
}

// agentWorkspace is the scenario's workspace: a git repository.
func agentWorkspace(t *testing.T) *stagefsMount {
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "old a\n", "b.txt": "old b\n", "c.txt": "cee\n", "olddir/x.txt": "x\n"}))
	sh(t, m.ws, "git init -q && git add -A && git commit -qm base")
	return m
}

const shellEdit = "sed -i 's/old/new/' a.txt b.txt && rm -r olddir"

func TestCodexSession(t *testing.T) {
	parallel(t)
	codex := agentsim.NeedAgent(t, "codex")
	m := agentWorkspace(t)
	commit := stagefsBin + " commit -m " + m.mnt + "; echo commit=$?"
	patch := "*** Begin Patch\n*** Update File: c.txt\n@@\n-cee\n+CEE\n*** End Patch\n"
	srv := agentsim.Start(t, agentsim.Scripts{
		"first prompt": {
			agentsim.Call("exec_command", map[string]any{"cmd": shellEdit}),
			agentsim.Call("apply_patch", patch),
			agentsim.Call("exec_command", map[string]any{"cmd": commit}),
			agentsim.Text("first done"),
		},
		"second prompt": {
			agentsim.Call("exec_command", map[string]any{"cmd": "echo two > second.txt"}),
			agentsim.Text("second done"),
		},
	})
	home := filepath.Join(m.base, "home")
	os.MkdirAll(home, 0o755)
	env := append(srv.CodexEnv(t, home), "PWD="+m.ws)
	runAgentScenario(t, m, agentScenario{
		name: "codex",
		prompt: func(text string) result {
			return runIn(t, cmdSpec{dir: m.ws, env: env}, stagefsBin, "codex", "--codex", codex, "--",
				"exec", "--dangerously-bypass-approvals-and-sandbox", text)
		},
		editLabel: "apply_patch",
	})
	for _, res := range srv.ToolResults() {
		if strings.Contains(res.Output, "commit=") && !strings.Contains(res.Output, "commit=4") {
			t.Errorf("stagefs commit inside a Codex tool call: %s", res.Output)
		}
	}
	// The user's CODEX_HOME keeps no hooks.json of stagefs's.
	if _, err := os.Stat(filepath.Join(agentsim.CodexHome(home), "hooks.json")); err == nil {
		t.Errorf("stagefs codex wrote hooks.json into the user's CODEX_HOME")
	}
}

func TestGeminiSession(t *testing.T) {
	parallel(t)
	gemini := agentsim.NeedAgent(t, "gemini")
	m := agentWorkspace(t)
	commit := stagefsBin + " commit -m " + m.mnt + "; echo commit=$?"
	srv := agentsim.Start(t, agentsim.Scripts{
		"first prompt": {
			agentsim.Call("run_shell_command", map[string]any{"command": shellEdit}),
			agentsim.Call("replace", map[string]any{"file_path": filepath.Join(m.ws, "c.txt"), "old_string": "cee", "new_string": "CEE", "instruction": "capitals"}),
			agentsim.Call("run_shell_command", map[string]any{"command": commit}),
			agentsim.Text("first done"),
		},
		"second prompt": {
			agentsim.Call("write_file", map[string]any{"file_path": filepath.Join(m.ws, "second.txt"), "content": "two\n"}),
			agentsim.Text("second done"),
		},
	})
	home := filepath.Join(m.base, "home")
	os.MkdirAll(home, 0o755)
	env := append(srv.GeminiEnv(t, home), "PWD="+m.ws)
	settingsBefore := readFile(t, agentsim.GeminiSettings(home))
	runAgentScenario(t, m, agentScenario{
		name: "gemini",
		prompt: func(text string) result {
			return runIn(t, cmdSpec{dir: m.ws, env: env}, stagefsBin, "gemini", "--gemini", gemini, "--",
				"-p", text, "--yolo", "-m", agentsim.GeminiModel)
		},
		editLabel: "replace: " + filepath.Join(m.ws, "c.txt"),
	})
	for _, res := range srv.ToolResults() {
		if strings.Contains(res.Output, "commit=") && !strings.Contains(res.Output, "commit=4") {
			t.Errorf("stagefs commit inside a Gemini tool call: %s", res.Output)
		}
	}
	if after := readFile(t, agentsim.GeminiSettings(home)); after != settingsBefore {
		t.Errorf("stagefs gemini changed the user's settings.json:\n%s", after)
	}
}

// Without the agent, stagefs codex and stagefs gemini name the npm
// package; a hook payload that does not parse is refused for every agent.
func TestAgentCommandsBadInput(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	for agent, pkg := range map[string]string{"codex": "@openai/codex", "gemini": "@google/gemini-cli", "claude": "@anthropic-ai/claude-code"} {
		r := runIn(t, cmdSpec{dir: m.ws, env: []string{"PATH=/usr/bin:/bin"}}, stagefsBin, agent, "--"+agent, filepath.Join(m.base, "no-such-"+agent))
		if r.code != 1 || !strings.Contains(r.stderr, "npm install -g "+pkg) {
			t.Errorf("stagefs %s without it: want exit 1 naming %s, got %s", agent, pkg, r)
		}
		r = runIn(t, cmdSpec{stdin: "{not json", env: []string{"STAGEFS_HOOK_SOCKET=" + hookSocketOf(t, m)}}, stagefsBin, "hook", agent)
		if r.code != 2 || !strings.Contains(r.stderr, "does not parse") {
			t.Errorf("stagefs hook %s with a payload that does not parse: %s", agent, r)
		}
	}
	if r := runStagefs(t, "hook", "nosuchagent"); r.code != 2 || !strings.Contains(r.stderr, "unknown agent") {
		t.Errorf("stagefs hook nosuchagent: %s", r)
	}
}

// A Codex that would skip stagefs's hooks (it does not know the flag that
// makes it run them) is refused before it starts.
func TestCodexHooksWouldBeSkipped(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	fake := filepath.Join(m.base, "codex")
	ran := filepath.Join(m.base, "ran")
	writeTree(t, m.base, map[string]string{"codex": `#!/bin/sh
for a in "$@"; do [ "$a" = --dangerously-bypass-hook-trust ] && { echo "error: unexpected argument '$a'" >&2; exit 2; }; done
touch "` + ran + `"
`})
	os.Chmod(fake, 0o755)
	r := runIn(t, cmdSpec{dir: m.ws, env: []string{"HOME=" + m.base}}, stagefsBin, "codex", "--codex", fake, "--", "exec", "hi")
	if r.code != 1 || !strings.Contains(r.stderr, "would skip stagefs's hooks") {
		t.Errorf("stagefs codex with a Codex that cannot trust the hooks: want exit 1 and a refusal, got %s", r)
	}
	assertMissing(t, ran)
}
