package test

// stagefs claude with the real Claude Code, offline: a scripted stand-in
// for the Messages API (test/agentsim) chooses the tool calls; the tests
// check what stagefs made of them.

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"stagefs/test/agentsim"
)

// claudeSession is one workspace with Claude Code pointed at a scripted
// model.
type claudeSession struct {
	t      *testing.T
	m      *stagefsMount
	claude string
	srv    *agentsim.Server
	home   string
}

func newClaudeSession(t *testing.T, m *stagefsMount, scripts agentsim.Scripts) *claudeSession {
	t.Helper()
	claude := agentsim.NeedAgent(t, "claude")
	home := filepath.Join(m.base, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	return &claudeSession{t: t, m: m, claude: claude, srv: agentsim.Start(t, scripts), home: home}
}

// prompt runs `stagefs claude -- -p PROMPT ARGS...` from the workspace.
func (s *claudeSession) prompt(prompt string, args ...string) result {
	s.t.Helper()
	argv := append([]string{"claude", "--claude", s.claude, "--", "-p", prompt, "--allowedTools", "Bash Write Edit Read", "--output-format", "json"}, args...)
	return runIn(s.t, cmdSpec{dir: s.m.ws, env: append(s.srv.ClaudeEnv(s.home), "PWD="+s.m.ws)}, stagefsBin, argv...)
}

// checkAttribution checks that each tool call's snapshot holds the paths
// it changed and none that another tool call changed. A snapshot may also
// hold temporary names (sed's, Claude's atomic saves) that have no pending
// change now.
func checkAttribution(t *testing.T, m *stagefsMount, ids []string, want map[string][]string) {
	t.Helper()
	snaps := m.snapshotsByScope()
	pending := statusKinds(m.status())
	owner := map[string]string{}
	for id, paths := range want {
		for _, p := range paths {
			owner[p] = id
		}
	}
	for _, id := range ids {
		s, ok := snaps[id]
		if !ok {
			t.Errorf("tool call %s has no snapshot; snapshots: %v", id, keys(snaps))
			continue
		}
		has := map[string]bool{}
		for _, p := range s.Paths {
			has[p] = true
			if o, ok := owner[p]; ok && o != id {
				t.Errorf("tool call %s (%s) captured %s, which %s changed", id, s.Label, p, o)
			} else if !ok {
				if _, isPending := pending[p]; isPending {
					t.Errorf("tool call %s (%s) captured %s, which no tool call should have changed", id, s.Label, p)
				}
			}
		}
		for _, p := range want[id] {
			if !has[p] {
				t.Errorf("tool call %s (%s) did not capture %s: it holds %v", id, s.Label, p, s.Paths)
			}
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestClaudeCodeSession runs two prompts of the real Claude Code through
// stagefs claude: shell edits, an rm -rf, a heredoc, Write, Read and Edit,
// a background command that writes while later tool calls run. Each tool
// call is its own snapshot, each prompt its own turn, and the workspace
// changes only at the commit of chosen paths.
func TestClaudeCodeSession(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{
		"a.txt": "old a\n", "b.txt": "old b\n", "c.txt": "cee\n",
		"olddir/x.txt": "x\n", "olddir/sub/y.txt": "y\n",
	}))
	sh(t, m.ws, "git init -q && git add -A && git commit -qm base")
	ws := m.ws
	s := newClaudeSession(t, m, agentsim.Scripts{
		"first prompt": {
			agentsim.Call("Bash", map[string]any{"command": "sed -i 's/old/new/' a.txt b.txt", "description": "edit"}),
			agentsim.Call("Bash", map[string]any{"command": "rm -rf olddir", "description": "remove"}),
			agentsim.Call("Bash", map[string]any{"command": "cat > notes.md <<'EOF'\nline one\nline two\nEOF", "description": "heredoc"}),
			agentsim.Call("Write", map[string]any{"file_path": filepath.Join(ws, "written.txt"), "content": "written\n"}),
			agentsim.Call("Read", map[string]any{"file_path": filepath.Join(ws, "c.txt")}),
			agentsim.Call("Edit", map[string]any{"file_path": filepath.Join(ws, "c.txt"), "old_string": "cee", "new_string": "CEE"}),
			agentsim.Call("Bash", map[string]any{"command": "sleep 1; echo late > bg.txt", "description": "background", "run_in_background": true}),
			agentsim.Call("Bash", map[string]any{"command": "echo next > next.txt", "description": "next"}),
			agentsim.Call("Bash", map[string]any{"command": "for i in $(seq 100); do [ -e bg.txt ] && break; sleep 0.1; done; cat bg.txt", "description": "wait"}),
			agentsim.Text("first done"),
		},
		"second prompt": {
			agentsim.Call("Bash", map[string]any{"command": "echo two > second.txt && sed -i 's/new/newer/' a.txt", "description": "second"}),
			agentsim.Text("second done"),
		},
	})
	before := snapshot(t, ws, ".git")

	r := s.prompt("first prompt: edit the files")
	if r.code != 0 || !strings.Contains(r.stdout, "first done") {
		t.Fatalf("stagefs claude, first prompt: %s", r)
	}
	for _, want := range []string{"1 turn(s), 9 tool call(s)", "stagefs restore", "stagefs rollback", "stagefs commit", "stagefs diff"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the summary after Claude Code exits lacks %q:\n%s", want, r.stderr)
		}
	}
	assertSameTree(t, "the real workspace after the first prompt", before, snapshot(t, ws, ".git"))
	ids := s.srv.ToolUseIDs()
	if len(ids) != 9 {
		t.Fatalf("tool calls sent: %v, want 9", ids)
	}
	sed, rm, heredoc, write, read, edit, bg, next, wait := ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], ids[7], ids[8]
	checkAttribution(t, m, ids, map[string][]string{
		sed:     {"a.txt", "b.txt"},
		rm:      {"olddir", "olddir/x.txt", "olddir/sub", "olddir/sub/y.txt"},
		heredoc: {"notes.md"},
		write:   {"written.txt"},
		edit:    {"c.txt"},
		bg:      {"bg.txt"},
		next:    {"next.txt"},
	})
	snaps := m.snapshotsByScope()
	if len(snaps[read].Paths) != 0 || len(snaps[wait].Paths) != 0 {
		t.Errorf("Read and the waiting Bash captured %v and %v, want nothing", snaps[read].Paths, snaps[wait].Paths)
	}
	if got := snaps[sed].Label; got != "Bash: sed -i 's/old/new/' a.txt b.txt" {
		t.Errorf("label of the sed call: %q", got)
	}
	if got := snaps[write].Label; got != "Write: "+filepath.Join(ws, "written.txt") {
		t.Errorf("label of the Write call: %q", got)
	}
	if snaps[bg].Open {
		t.Errorf("the background call's snapshot is still open after its command exited")
	}
	if out := m.mustCLI("snapshots"); !strings.Contains(out, "Bash: rm -rf olddir") {
		t.Errorf("stagefs snapshots does not show the labels:\n%s", out)
	}

	// Restoring the rm -rf alone brings the directory back and keeps what
	// the later tool calls made.
	m.mustCLI("restore", rm)
	assertFile(t, m.in("olddir/x.txt"), "x\n")
	assertFile(t, m.in("olddir/sub/y.txt"), "y\n")
	for p, want := range map[string]string{"notes.md": "line one\nline two\n", "written.txt": "written\n", "c.txt": "CEE\n", "bg.txt": "late\n", "next.txt": "next\n", "a.txt": "new a\n"} {
		assertFile(t, m.in(p), want)
	}

	// A second prompt in the same conversation is a second turn.
	r = s.prompt("second prompt: one more", "--continue")
	if r.code != 0 || !strings.Contains(r.stdout, "second done") {
		t.Fatalf("stagefs claude, second prompt: %s", r)
	}
	turns := m.checkpoints()
	if len(turns) != 2 || !strings.HasPrefix(turns[0].Label, "second prompt") || !strings.HasPrefix(turns[1].Label, "first prompt") {
		t.Fatalf("checkpoints after two prompts: %+v", turns)
	}
	if out := m.mustCLI("checkpoints"); !strings.Contains(out, "second prompt: one more") {
		t.Errorf("stagefs checkpoints does not show the prompts:\n%s", out)
	}
	assertFile(t, m.in("second.txt"), "two\n")
	assertFile(t, m.in("a.txt"), "newer a\n")

	// Rolling the second prompt back keeps the first prompt's changes;
	// redo brings it back.
	m.mustCLI("rollback", turns[0].TurnID)
	assertMissing(t, m.in("second.txt"))
	assertFile(t, m.in("a.txt"), "new a\n")
	assertFile(t, m.in("written.txt"), "written\n")
	m.mustCLI("redo")
	assertFile(t, m.in("second.txt"), "two\n")
	assertFile(t, m.in("a.txt"), "newer a\n")
	assertSameTree(t, "the real workspace before the commit", before, snapshot(t, ws, ".git"))

	// A commit of chosen paths reaches the workspace, and nothing else.
	m.commit("written.txt", "notes.md")
	assertFile(t, m.inWS("written.txt"), "written\n")
	assertFile(t, m.inWS("notes.md"), "line one\nline two\n")
	assertFile(t, m.inWS("a.txt"), "old a\n")
	assertMissing(t, m.inWS("second.txt"))
	if kinds := statusKinds(m.status()); kinds["a.txt"] != "write" || kinds["second.txt"] != "create" {
		t.Errorf("pending after committing two paths: %v", kinds)
	}
}
