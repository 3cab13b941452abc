package agentsim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// CodexModel is the model CodexEnv configures. Codex shapes its tool set by
// model name: an unknown name gets no apply_patch tool, so this is a name
// it knows.
const CodexModel = "gpt-5.5"

// GeminiModel is a model name to pass to Gemini CLI with -m. The Server
// accepts any name; naming one on the command line keeps the CLI from
// asking the model first which model to route the prompt to.
const GeminiModel = "gemini-2.5-flash"

// homeEnv points HOME and the XDG directories into home, so an agent reads
// and writes no file of the user's (settings, credentials, caches).
func homeEnv(home string) []string {
	return []string{
		"HOME=" + home,
		"XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"XDG_CACHE_HOME=" + filepath.Join(home, ".cache"),
		"XDG_DATA_HOME=" + filepath.Join(home, ".local", "share"),
		"XDG_STATE_HOME=" + filepath.Join(home, ".local", "state"),
	}
}

// ClaudeEnv returns the environment that points Claude Code (and
// claude-agent-acp, which runs it) at the Server, with home, a throwaway
// directory, as its home. Append it to os.Environ(): later entries win.
//
// Running as root, Claude Code refuses --dangerously-skip-permissions (and
// claude-agent-acp refuses to start a session) unless IS_SANDBOX=1 says the
// machine is a sandbox, which a test machine is.
func (s *Server) ClaudeEnv(home string) []string {
	env := append(homeEnv(home),
		"CLAUDE_CONFIG_DIR="+filepath.Join(home, ".claude"),
		"ANTHROPIC_BASE_URL="+s.URL,
		"ANTHROPIC_API_KEY=dummy",
		// A token or another provider in the user's environment would win
		// over ANTHROPIC_BASE_URL; clear them.
		"ANTHROPIC_AUTH_TOKEN=",
		"CLAUDE_CODE_USE_BEDROCK=",
		"CLAUDE_CODE_USE_VERTEX=",
		// No telemetry, error reports or update checks: nothing but the
		// Server may be contacted.
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
		"DISABLE_AUTOUPDATER=1",
	)
	if os.Geteuid() == 0 {
		env = append(env, "IS_SANDBOX=1")
	}
	return env
}

// CodexHome is the CODEX_HOME that CodexEnv sets up under home; hooks.json
// goes there.
func CodexHome(home string) string {
	return filepath.Join(home, ".codex")
}

// CodexEnv writes CodexHome(home)/config.toml, which makes the Server
// Codex's model provider, and returns the environment that uses it. Codex
// ignores OPENAI_BASE_URL for this; only a custom provider in config.toml
// redirects it. To add settings, append lines to config.toml after calling
// CodexEnv, inside a table of their own ("[...]") since the file ends in
// one.
func (s *Server) CodexEnv(t testing.TB, home string) []string {
	t.Helper()
	dir := CodexHome(home)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("agentsim: %v", err)
	}
	// Retries off so a failed request fails the run at once instead of
	// after backoff; plugins and analytics off because they go to the
	// network; "responses" because Codex refuses the older "chat" API.
	config := fmt.Sprintf(`# Written by agentsim.CodexEnv: Codex talks only to the test's Server.
model = %q
model_provider = "agentsim"

[model_providers.agentsim]
name = "agentsim"
base_url = "%s/v1"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[features]
plugins = false
unbounded_connection_retries = false

[analytics]
enabled = false
`, CodexModel, s.URL)
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o644); err != nil {
		t.Fatalf("agentsim: %v", err)
	}
	return append(homeEnv(home),
		"CODEX_HOME="+dir,
		// Codex would send a key it finds to the provider, harmless here,
		// but a test has no business reading the user's key.
		"OPENAI_API_KEY=",
	)
}

// GeminiSettings is the settings file GeminiEnv writes under home; put
// hooks in it before or after calling GeminiEnv, which keeps what it finds.
func GeminiSettings(home string) string {
	return filepath.Join(home, ".gemini", "settings.json")
}

// GeminiEnv sets the keys Gemini CLI needs offline in GeminiSettings(home)
// and returns the environment that points it at the Server. Without the
// auth type -p exits with status 41; without usage statistics off it looks
// up Google's hosts.
func (s *Server) GeminiEnv(t testing.TB, home string) []string {
	t.Helper()
	path := GeminiSettings(home)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatalf("agentsim: %v", err)
	}
	settings := map[string]any{}
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &settings); err != nil {
			t.Fatalf("agentsim: %s: %v", path, err)
		}
	} else if !os.IsNotExist(err) {
		t.Fatalf("agentsim: %v", err)
	}
	setPath(settings, "gemini-api-key", "security", "auth", "selectedType")
	setPath(settings, false, "privacy", "usageStatisticsEnabled")
	b, err := json.MarshalIndent(settings, "", "  ")
	if err != nil {
		t.Fatalf("agentsim: %v", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatalf("agentsim: %v", err)
	}
	return append(homeEnv(home),
		"GEMINI_CLI_HOME="+home,
		"GEMINI_API_KEY=dummy",
		"GOOGLE_GEMINI_BASE_URL="+s.URL,
		// A test's temporary directory is never trusted yet, and an
		// untrusted workspace gets no settings or tools of its own.
		"GEMINI_CLI_TRUST_WORKSPACE=true",
		// These would send the CLI to Vertex AI instead.
		"GOOGLE_GENAI_USE_VERTEXAI=",
		"GOOGLE_API_KEY=",
	)
}

// setPath sets m[keys[0]][keys[1]]...=v, making the maps on the way.
func setPath(m map[string]any, v any, keys ...string) {
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[k] = next
		}
		m = next
	}
	m[keys[len(keys)-1]] = v
}
