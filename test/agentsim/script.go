package agentsim

import (
	"sort"
	"strings"
)

// DoneText is the final reply once a Script has run out of steps.
const DoneText = "done"

// SideText is the reply to requests no Script covers: side requests without
// tools (titles, summaries, quota checks) and prompts no key matches.
const SideText = "ok"

// ToolCall is one tool call in a model reply.
type ToolCall struct {
	// Name is the tool's name as the agent declares it, for example "Bash"
	// or "Write" (Claude Code), "exec_command" or "apply_patch" (Codex),
	// "run_shell_command" or "write_file" (Gemini CLI).
	Name string
	// Input is the tool's arguments, marshalled to JSON: a map or a struct
	// (nil sends {}), since all three APIs want an object. The exception is
	// Codex's freeform tools: for Codex a string Input makes a
	// custom_tool_call carrying that text, which is how its apply_patch
	// tool takes the patch.
	Input any
	// ID is the tool-use id the agent echoes in its tool result. Leave it
	// empty in a Script: the Server fills in a fresh one ("toolu_sim0001",
	// "call_sim0001", numbered across the Server's life) and records it.
	// Gemini calls get no id unless the Script sets one.
	ID string
}

// Step is one model reply: a text, one tool call, or several tool calls in
// one reply (parallel calls; checked with Claude Code only). A Step with
// both Text and Calls sends the text first. A Step without calls ends the
// agent's turn, so it belongs at the end of a Script.
type Step struct {
	Text  string
	Calls []ToolCall
}

// Text is a Step replying with text only.
func Text(s string) Step { return Step{Text: s} }

// Call is a Step making one tool call.
func Call(name string, input any) Step {
	return Step{Calls: []ToolCall{{Name: name, Input: input}}}
}

// Script is the replies for one prompt, in order. Step i answers the request
// that carries the results of the tool calls of steps 0..i-1; past the end
// the reply is DoneText.
type Script []Step

// stepFor returns the step that answers a request carrying results tool
// results since the prompt. Steps are matched by the running total of their
// calls, so a step with two parallel calls is followed once both results are
// back (or, should the agent drop one, as soon as any is).
func (s Script) stepFor(results int) Step {
	seen := 0
	for _, step := range s {
		if seen >= results {
			return step
		}
		seen += len(step.Calls)
	}
	return Text(DoneText)
}

// Scripts maps a prompt to its Script. A key matches when the latest user
// prompt text contains it. Keys are tried longest first (then in byte
// order), so a more specific key wins over a shorter one it contains and
// the choice never depends on map order.
//
// The prompt text is all the text of the user message that holds the
// prompt, and agents put context there: Claude Code its system reminders
// (git status, CLAUDE.md), Gemini CLI a session context with the working
// directory and a listing of it. So make keys distinctive
// ("agentsim-edit-1"), not words ("fix") that context may contain.
type Scripts map[string]Script

// match returns the Script for prompt, or false when no key matches.
func (ss Scripts) match(prompt string) (Script, bool) {
	keys := make([]string, 0, len(ss))
	for k := range ss {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if len(keys[i]) != len(keys[j]) {
			return len(keys[i]) > len(keys[j])
		}
		return keys[i] < keys[j]
	})
	for _, k := range keys {
		if strings.Contains(prompt, k) {
			return ss[k], true
		}
	}
	return nil, false
}
