package agentsim

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// npmPackages names the npm package that provides each agent FindAgent
// knows; scripts/setup installs these, pinned, one directory per agent.
var npmPackages = map[string]string{
	"claude":           "@anthropic-ai/claude-code",
	"claude-agent-acp": "@zed-industries/claude-agent-acp",
	"codex":            "@openai/codex",
	"gemini":           "@google/gemini-cli",
}

// AgentsDir is where scripts/setup installs the agents:
// $STAGEFS_AGENTS, or else ~/.cache/stagefs-agents. Each agent NAME gets
// its own npm prefix, AgentsDir()/NAME.
func AgentsDir() string {
	if dir := os.Getenv("STAGEFS_AGENTS"); dir != "" {
		return dir
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".cache", "stagefs-agents")
}

// FindAgent returns the path of an agent's executable: "claude", "codex",
// "gemini" or "claude-agent-acp". It looks on PATH first, then in the npm
// prefix scripts/setup installs into (AgentsDir()/NAME/node_modules/.bin).
func FindAgent(name string) (path string, ok bool) {
	if _, known := npmPackages[name]; !known {
		return "", false
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, true
	}
	dir := AgentsDir()
	if dir == "" {
		return "", false
	}
	p := filepath.Join(dir, name, "node_modules", ".bin", name)
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
		return p, true
	}
	return "", false
}

// NeedAgent returns FindAgent(name)'s path, or ends the test when the
// agent is missing: it skips, unless STAGEFS_REQUIRE_AGENTS=1 says this
// machine must have the agents (CI after scripts/setup), and then fails.
func NeedAgent(t testing.TB, name string) string {
	t.Helper()
	if p, ok := FindAgent(name); ok {
		return p
	}
	pkg := npmPackages[name]
	if pkg == "" {
		t.Fatalf("agentsim: unknown agent %q", name)
	}
	msg := name + " not found on PATH or in " + filepath.Join(AgentsDir(), name) +
		"; scripts/setup installs it (npm package " + pkg + ")"
	if os.Getenv("STAGEFS_REQUIRE_AGENTS") == "1" {
		t.Fatal("STAGEFS_REQUIRE_AGENTS=1 but " + msg)
	}
	t.Skip(msg)
	return ""
}
