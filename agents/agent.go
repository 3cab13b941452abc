package agents

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Action is what stagefs does at one of an agent's hook events.
type Action int

const (
	Ignore        Action = iota
	StartTurn            // the user sent a prompt
	StartToolCall        // a tool is about to run
	EndToolCall          // a tool ran, or failed
	EndSession           // the agent is exiting
)

// Agent describes one coding agent's hooks.
type Agent struct {
	Name    string // as in `stagefs hook NAME`
	Binary  string // the command it runs as
	Package string // the npm package that installs it, for messages
	Events  map[string]Action

	// Payload fields (top level of the hook's JSON).
	EventField      string // the event's name
	SessionField    string
	TurnIDField     string // "" when the agent gives prompts no id
	PromptField     string
	ToolCallIDField string // "" when the agent gives tool calls no id
	ToolNameField   string
	ToolInputField  string

	// ShellTools run the shell command in their input's CommandField.
	ShellTools   []string
	CommandField string
	// LabelFields name, in order of preference, the input field that says
	// what a tool works on (a file path), for the snapshot's label.
	LabelFields []string

	// RewriteInput is the answer to a StartToolCall event that replaces
	// the tool's input; nil when the agent has no such answer.
	RewriteInput func(event string, input map[string]any) any

	// Wire returns the arguments put before the user's and the variables
	// added to the agent's environment that make it run hookCommand at
	// its events, without touching any file of the user's. scratch is a
	// private directory that lives as long as the agent runs, readable
	// inside the sandbox.
	Wire func(hookCommand, scratch string) (args, env []string, err error)
	// Preflight, if set, checks before the agent starts that its hooks
	// will run: bin is its binary, env the environment Wire made.
	Preflight func(bin string, env []string) error
	// Note, if set, is printed when the agent exits: what stagefs had to
	// do to the agent's settings for its hooks to run.
	Note string
}

// hookTimeoutSeconds is how long an agent waits for a hook: HookTimeout
// and then some, so that stagefs's own timeout speaks first.
const hookTimeoutSeconds = 10

// Claude is Claude Code: its hooks carry a prompt_id for each prompt and
// a tool_use_id for each tool call, and a PreToolUse hook may rewrite the
// tool's input (hookSpecificOutput.updatedInput).
var Claude = Agent{
	Name:            "claude",
	Binary:          "claude",
	Package:         "@anthropic-ai/claude-code",
	Events:          claudeEvents,
	EventField:      "hook_event_name",
	SessionField:    "session_id",
	TurnIDField:     "prompt_id",
	PromptField:     "prompt",
	ToolCallIDField: "tool_use_id",
	ToolNameField:   "tool_name",
	ToolInputField:  "tool_input",
	ShellTools:      []string{"Bash"},
	CommandField:    "command",
	LabelFields:     []string{"file_path", "notebook_path", "path", "pattern", "url"},
	RewriteInput: func(event string, input map[string]any) any {
		return map[string]any{"hookSpecificOutput": map[string]any{"hookEventName": event, "updatedInput": input}}
	},
	Wire: func(hookCommand, _ string) ([]string, []string, error) {
		s, err := claudeSettings(hookCommand)
		return []string{"--settings", s}, nil, err
	},
}

// All lists the agents stagefs knows, by name.
var All = map[string]*Agent{Claude.Name: &Claude, Codex.Name: &Codex, Gemini.Name: &Gemini}

// Lookup finds an agent by name.
func Lookup(name string) (*Agent, error) {
	if a := All[name]; a != nil {
		return a, nil
	}
	var names []string
	for n := range All {
		names = append(names, n)
	}
	return nil, fmt.Errorf("unknown agent %q (known: %s)", name, strings.Join(names, ", "))
}

func (a *Agent) isShell(tool string) bool {
	for _, t := range a.ShellTools {
		if t == tool {
			return true
		}
	}
	return false
}

var claudeEvents = map[string]Action{
	"UserPromptSubmit":   StartTurn,
	"PreToolUse":         StartToolCall,
	"PostToolUse":        EndToolCall,
	"PostToolUseFailure": EndToolCall,
	"SessionEnd":         EndSession,
}

// claudeSettings is the settings layer `stagefs claude` gives Claude Code
// on its command line (--settings): hooks for the events in claudeEvents,
// beside the user's own settings and hooks, which stay in force.
func claudeSettings(hookCommand string) (string, error) {
	b, err := json.Marshal(map[string]any{"hooks": hookEntries(claudeEvents, hookCommand, hookTimeoutSeconds, false)})
	return string(b), err
}

// hookEntries is the "hooks" table the three agents share: for each
// event, one entry running hookCommand (tool events match every tool).
// timeout is in the agent's unit; named adds the name Gemini CLI shows.
func hookEntries(events map[string]Action, hookCommand string, timeout int, named bool) map[string]any {
	hooks := map[string]any{}
	for event := range events {
		h := map[string]any{"type": "command", "command": hookCommand, "timeout": timeout}
		if named {
			h["name"] = "stagefs"
		}
		entry := map[string]any{"hooks": []any{h}}
		if strings.Contains(event, "Tool") {
			entry["matcher"] = "*"
		}
		hooks[event] = []any{entry}
	}
	return hooks
}

// mergeHooks adds ours to the "hooks" table of a settings object, after
// the entries already there, so that the user's hooks keep running first.
func mergeHooks(settings map[string]any, ours map[string]any) {
	hooks, _ := settings["hooks"].(map[string]any)
	if hooks == nil {
		hooks = map[string]any{}
	}
	for event, entries := range ours {
		have, _ := hooks[event].([]any)
		hooks[event] = append(have, entries.([]any)...)
	}
	settings["hooks"] = hooks
}
