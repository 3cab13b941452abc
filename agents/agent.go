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
	// its events, without touching any file of the user's.
	Wire func(hookCommand string) (args, env []string, err error)
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
	Wire: func(hookCommand string) ([]string, []string, error) {
		s, err := claudeSettings(hookCommand)
		return []string{"--settings", s}, nil, err
	},
}

// All lists the agents stagefs knows, by name.
var All = map[string]*Agent{Claude.Name: &Claude}

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
// on its command line (--settings): hooks for the events in Claude.Events,
// beside the user's own settings and hooks, which stay in force.
func claudeSettings(hookCommand string) (string, error) {
	hooks := map[string]any{}
	for event := range claudeEvents {
		entry := map[string]any{"hooks": []any{map[string]any{"type": "command", "command": hookCommand, "timeout": hookTimeoutSeconds}}}
		if strings.Contains(event, "ToolUse") {
			entry["matcher"] = "*"
		}
		hooks[event] = []any{entry}
	}
	b, err := json.Marshal(map[string]any{"hooks": hooks})
	return string(b), err
}
