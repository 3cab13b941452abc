package agents

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Codex is OpenAI's Codex CLI: its hooks carry a turn_id for each prompt
// and a tool_use_id (the call_id) for each tool call, Bash or apply_patch.
// A hook cannot rewrite a tool's input, so a shell command's snapshot
// covers every process, like any other tool call's.
var Codex = Agent{
	Name:            "codex",
	Binary:          "codex",
	Package:         "@openai/codex",
	Events:          codexEvents,
	EventField:      "hook_event_name",
	SessionField:    "session_id",
	TurnIDField:     "turn_id",
	PromptField:     "prompt",
	ToolCallIDField: "tool_use_id",
	ToolNameField:   "tool_name",
	ToolInputField:  "tool_input",
	ShellTools:      []string{"Bash"},
	CommandField:    "command",
	LabelFields:     []string{"path", "file_path"},
	Wire:            codexWire,
	Preflight:       codexPreflight,
	Note:            "Codex ran its hooks without persisted trust (--dangerously-bypass-hook-trust): stagefs's, and any in your own hooks.json",
}

var codexEvents = map[string]Action{
	"UserPromptSubmit": StartTurn,
	"PreToolUse":       StartToolCall,
	"PostToolUse":      EndToolCall,
	"SessionEnd":       EndSession,
}

// codexWire gives Codex a private CODEX_HOME: every entry of the user's
// own (config, credentials, sessions) linked in, and a hooks.json that
// holds the user's hooks followed by stagefs's. Codex runs a hook only
// once its definition is trusted, and skips an untrusted one without a
// word; --dangerously-bypass-hook-trust makes it run them for this
// invocation.
func codexWire(hookCommand, scratch string) ([]string, []string, error) {
	own := os.Getenv("CODEX_HOME")
	if own == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, nil, fmt.Errorf("codex: no $CODEX_HOME and no home directory: %w", err)
		}
		own = filepath.Join(home, ".codex")
	}
	// Codex writes its credentials and sessions here: they must land in
	// the user's own, so it must exist for the links.
	if err := os.MkdirAll(own, 0o700); err != nil {
		return nil, nil, err
	}
	overlay := filepath.Join(scratch, "codex-home")
	if err := overlayDir(own, overlay, "hooks.json", hookEntries(codexEvents, hookCommand, hookTimeoutSeconds, false)); err != nil {
		return nil, nil, fmt.Errorf("codex: %w", err)
	}
	return []string{"--dangerously-bypass-hook-trust"}, []string{"CODEX_HOME=" + overlay}, nil
}

// overlayDir makes overlay a copy of the directory own in which every
// entry is a link to own's, except the JSON settings file name, which
// holds own's settings with hooks added (mergeHooks). Writes through the
// links reach the user's own files; the settings file stays untouched.
func overlayDir(own, overlay, name string, hooks map[string]any) error {
	if err := os.MkdirAll(overlay, 0o700); err != nil {
		return err
	}
	entries, err := os.ReadDir(own)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == name {
			continue
		}
		if err := os.Symlink(filepath.Join(own, e.Name()), filepath.Join(overlay, e.Name())); err != nil {
			return err
		}
	}
	settings := map[string]any{}
	if b, err := os.ReadFile(filepath.Join(own, name)); err == nil {
		// Gemini CLI reads its settings with comments allowed; the copy
		// stagefs writes keeps the settings, not the comments.
		if err := json.Unmarshal(stripJSONComments(b), &settings); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(own, name), err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	mergeHooks(settings, hooks)
	b, err := json.MarshalIndent(settings, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(overlay, name), b, 0o600)
}

// codexPreflight refuses a Codex that does not know
// --dangerously-bypass-hook-trust: it would skip stagefs's hooks without a
// word, and its tool calls would run with no snapshot.
func codexPreflight(bin string, env []string) error {
	cmd := exec.Command(bin, "--dangerously-bypass-hook-trust", "--version")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = nil
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s does not accept --dangerously-bypass-hook-trust (%v: %s), so it would skip stagefs's hooks without a word and no tool call would be undoable; update it: npm install -g @openai/codex", bin, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// stripJSONComments blanks out // and /* */ comments outside strings, so
// that a settings file written with them (JSON with comments) parses.
func stripJSONComments(b []byte) []byte {
	out := make([]byte, 0, len(b))
	inString, escaped := false, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case inString:
			out = append(out, c)
			if escaped {
				escaped = false
			} else if c == '\\' {
				escaped = true
			} else if c == '"' {
				inString = false
			}
		case c == '"':
			inString = true
			out = append(out, c)
		case c == '/' && i+1 < len(b) && b[i+1] == '/':
			for i < len(b) && b[i] != '\n' {
				i++
			}
			if i < len(b) {
				out = append(out, '\n')
			}
		case c == '/' && i+1 < len(b) && b[i+1] == '*':
			i += 2
			for i+1 < len(b) && !(b[i] == '*' && b[i+1] == '/') {
				i++
			}
			i++ // the closing '/'
			out = append(out, ' ')
		default:
			out = append(out, c)
		}
	}
	return out
}
