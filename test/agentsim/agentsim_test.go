package agentsim

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// agentTimeout bounds one agent run; offline each finishes in seconds.
const agentTimeout = 60 * time.Second

// gitRepo makes an empty git repository to run an agent in: Codex wants
// one, and the others behave as they would in a project.
func gitRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("git", "init", "-q", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	return dir
}

// checkRun checks what every agent test checks: the file the script's
// shell call wrote, and that the server saw that call's result come back.
func checkRun(t *testing.T, s *Server, repo, want, prompt, stdout, stderr string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("agent: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	got, rerr := os.ReadFile(filepath.Join(repo, "hello.txt"))
	if rerr != nil || strings.TrimSpace(string(got)) != want {
		t.Errorf("hello.txt = %q, %v; want %q\nstdout:\n%s\nstderr:\n%s", got, rerr, want, stdout, stderr)
	}
	// The tool result is found in a request whose prompt is this test's.
	var sawResult, sawDone bool
	for _, r := range s.Requests() {
		if !strings.Contains(r.Prompt, prompt) {
			continue
		}
		if len(r.Results) > 0 {
			sawResult = true
		}
		if r.Reply.Text == "wrote it" {
			sawDone = true
		}
	}
	if !sawResult || !sawDone {
		for _, r := range s.Requests() {
			t.Logf("request %s %s?%s tools=%d prompt=%.60q results=%+v reply=%+v", r.API, r.Path, r.Query, len(r.Tools), r.Prompt, r.Results, r.Reply)
		}
		t.Errorf("server saw a tool result: %v, sent the final text: %v", sawResult, sawDone)
	}
}

// TestAgents runs each installed agent once against one shared Server: a
// shell tool call that writes a file, then a final text. The three share
// the Server to show that prompts select their own Scripts.
func TestAgents(t *testing.T) {
	s := Start(t, Scripts{
		"agentsim-claude": {
			Call("Bash", map[string]any{"command": "echo hello-claude > hello.txt", "description": "Write hello.txt"}),
			Text("wrote it"),
		},
		"agentsim-codex": {
			Call("exec_command", map[string]any{"cmd": "echo hello-codex > hello.txt"}),
			Text("wrote it"),
		},
		"agentsim-gemini": {
			Call("run_shell_command", map[string]any{"command": "echo hello-gemini > hello.txt"}),
			Text("wrote it"),
		},
	})

	t.Run("claude", func(t *testing.T) {
		t.Parallel()
		bin := NeedAgent(t, "claude")
		repo := gitRepo(t)
		const prompt = "agentsim-claude: write hello.txt"
		stdout, stderr, err := Run(t, agentTimeout, repo, s.ClaudeEnv(t.TempDir()),
			bin, "-p", prompt, "--allowedTools", "Bash Write Edit", "--output-format", "json")
		checkRun(t, s, repo, "hello-claude", prompt, stdout, stderr, err)
		// With --output-format json stdout is one object summing up the run.
		var res struct {
			Result  string `json:"result"`
			IsError bool   `json:"is_error"`
		}
		if err := json.Unmarshal([]byte(stdout), &res); err != nil || res.Result != "wrote it" || res.IsError {
			t.Errorf("claude output: %v, %+v\n%s", err, res, stdout)
		}
		// Claude Code echoes the id the server gave its tool call.
		ids := s.ToolUseIDs()
		found := false
		for _, r := range s.ToolResults() {
			for _, id := range ids {
				found = found || (r.ID == id && strings.HasPrefix(id, "toolu_"))
			}
		}
		if !found {
			t.Errorf("no tool result carries a toolu_ id the server sent (%v): %+v", ids, s.ToolResults())
		}
	})

	t.Run("codex", func(t *testing.T) {
		t.Parallel()
		bin := NeedAgent(t, "codex")
		repo := gitRepo(t)
		const prompt = "agentsim-codex: write hello.txt"
		stdout, stderr, err := Run(t, agentTimeout, repo, s.CodexEnv(t, t.TempDir()),
			bin, "exec", "--dangerously-bypass-approvals-and-sandbox", "--dangerously-bypass-hook-trust", prompt)
		checkRun(t, s, repo, "hello-codex", prompt, stdout, stderr, err)
	})

	t.Run("gemini", func(t *testing.T) {
		t.Parallel()
		bin := NeedAgent(t, "gemini")
		repo := gitRepo(t)
		const prompt = "agentsim-gemini: write hello.txt"
		stdout, stderr, err := Run(t, agentTimeout, repo, s.GeminiEnv(t, t.TempDir()),
			bin, "-p", prompt, "--yolo", "-m", GeminiModel)
		checkRun(t, s, repo, "hello-gemini", prompt, stdout, stderr, err)
	})

	t.Cleanup(func() {
		if testing.Verbose() {
			for _, r := range s.Requests() {
				t.Logf("request %s %s?%s stream=%v tools=%v prompt=%.80q results=%+v reply=%+v",
					r.API, r.Path, r.Query, r.Stream, r.Tools, r.Prompt, r.Results, r.Reply)
			}
		}
	})
}
