package agents

import (
	"fmt"
	"os"
	"path/filepath"
)

// Gemini is Google's Gemini CLI: its hooks carry no turn or tool call id,
// so a prompt's turn is numbered by the daemon, and BeforeTool and
// AfterTool are paired in order, each tool call named from the session
// and a counter.
var Gemini = Agent{
	Name:           "gemini",
	Binary:         "gemini",
	Package:        "@google/gemini-cli",
	Events:         geminiEvents,
	EventField:     "hook_event_name",
	SessionField:   "session_id",
	PromptField:    "prompt",
	ToolNameField:  "tool_name",
	ToolInputField: "tool_input",
	ShellTools:     []string{"run_shell_command"},
	CommandField:   "command",
	LabelFields:    []string{"file_path", "absolute_path", "path", "dir_path"},
	Wire:           geminiWire,
}

var geminiEvents = map[string]Action{
	"BeforeAgent": StartTurn,
	"BeforeTool":  StartToolCall,
	"AfterTool":   EndToolCall,
	"AfterAgent":  EndSession,
	"SessionEnd":  EndSession,
}

// geminiWire gives Gemini CLI a home of stagefs's own ($GEMINI_CLI_HOME):
// its .gemini links every entry of the user's own .gemini, except
// settings.json, which holds the user's settings with stagefs's hooks
// added after the user's. (A system settings layer would be simpler, but
// Gemini CLI skips one under a directory others may write, such as /tmp.)
// Project settings in the workspace's .gemini still apply on top.
func geminiWire(hookCommand, scratch string) ([]string, []string, error) {
	home := os.Getenv("GEMINI_CLI_HOME")
	if home == "" {
		h, err := os.UserHomeDir()
		if err != nil {
			return nil, nil, fmt.Errorf("gemini: no $GEMINI_CLI_HOME and no home directory: %w", err)
		}
		home = h
	}
	own := filepath.Join(home, ".gemini")
	if err := os.MkdirAll(own, 0o700); err != nil {
		return nil, nil, err
	}
	overlay := filepath.Join(scratch, "gemini-home")
	// Gemini CLI's hook timeouts are in milliseconds.
	hooks := hookEntries(geminiEvents, hookCommand, hookTimeoutSeconds*1000, true)
	if err := overlayDir(own, filepath.Join(overlay, ".gemini"), "settings.json", hooks); err != nil {
		return nil, nil, fmt.Errorf("gemini: %w", err)
	}
	return nil, []string{"GEMINI_CLI_HOME=" + overlay}, nil
}
