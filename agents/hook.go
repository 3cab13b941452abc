package agents

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"stagefs/control"
)

// Environment variables `stagefs claude` (and the other agent commands)
// give the agent, and so its hooks.
const (
	EnvHookSocket = "STAGEFS_HOOK_SOCKET" // the hook channel's name
	EnvWorkspace  = "STAGEFS_WORKSPACE"   // for messages
	// EnvNoBind, when set, leaves shell commands as they are: their
	// snapshots then cover every process, like any other tool call's.
	EnvNoBind = "STAGEFS_NO_BIND"
)

// HookTimeout bounds one hook's work: a hook must never hang the agent.
const HookTimeout = 5 * time.Second

// Exit statuses of a hook. 2 refuses the event in every agent here (the
// tool call is not run, the prompt not sent), with stderr as the reason;
// 1 is an error the agent reports and carries on from.
const (
	ExitOK      = 0
	ExitWarn    = 1
	ExitRefused = 2
)

// BindExit is the status with which a rewritten shell command stops when
// its snapshot could not be bound: the command does not run unprotected.
const BindExit = 97

// Answer is what a hook gives back to the agent.
type Answer struct {
	Stdout []byte
	Stderr string
	Exit   int
}

// Hook handles one hook event of agent a: payload is the event's JSON,
// dial connects to the hook channel, self is the stagefs binary (for the
// bind command a shell tool call is rewritten to run first), and
// workspace names the workspace in messages.
func Hook(a *Agent, payload []byte, dial func() (*control.Client, error), self, workspace string) Answer {
	var ev map[string]any
	if err := json.Unmarshal(payload, &ev); err != nil || ev == nil {
		why := "not a JSON object"
		if err != nil {
			why = err.Error()
		}
		return Answer{Stderr: fmt.Sprintf("stagefs: the %s hook payload does not parse (%s); refused, since stagefs could not tell what it protects", a.Name, why), Exit: ExitRefused}
	}
	event := str(ev, a.EventField)
	action := a.Events[event]
	if action == Ignore {
		return Answer{}
	}
	c, err := dial()
	if err != nil {
		return failure(action, fmt.Sprintf("stagefs: the staged view of %s is not being served (%v); nothing staged is lost. Start it again with `stagefs %s` (or `stagefs mount`) from the workspace.", orUnknown(workspace), err, a.Name))
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), HookTimeout)
	defer cancel()
	session := str(ev, a.SessionField)

	switch action {
	case StartTurn:
		turn := scopeID(str(ev, a.TurnIDField))
		if _, err := c.HookTurn(ctx, control.HookTurnParams{SessionID: session, TurnID: turn, Label: firstLine(str(ev, a.PromptField))}); err != nil {
			return failure(action, "stagefs: cannot start a turn for this prompt: "+err.Error()+".")
		}
		return Answer{}
	case StartToolCall:
		return startToolCall(ctx, a, c, ev, event, session, self)
	case EndToolCall:
		if _, err := c.HookToolCallEnd(ctx, control.HookToolCallEndParams{SessionID: session, ScopeID: scopeID(str(ev, a.ToolCallIDField))}); err != nil {
			return failure(action, "stagefs: cannot close the tool call's snapshot: "+err.Error())
		}
		return Answer{}
	case EndSession:
		if _, err := c.HookSessionEnd(ctx, session); err != nil {
			return failure(action, "stagefs: cannot close the session's tool calls: "+err.Error())
		}
		return Answer{}
	}
	return Answer{}
}

// startToolCall opens the tool call's snapshot. A shell command that the
// agent lets a hook rewrite is prefixed with `stagefs hook bind ID`, which
// opens the snapshot bound to the shell that runs the command.
func startToolCall(ctx context.Context, a *Agent, c *control.Client, ev map[string]any, event, session, self string) Answer {
	tool := str(ev, a.ToolNameField)
	input, _ := ev[a.ToolInputField].(map[string]any)
	command, _ := input[a.CommandField].(string)
	shell := a.isShell(tool) && a.RewriteInput != nil && command != ""
	res, err := c.HookToolCallStart(ctx, control.HookToolCallStartParams{
		SessionID: session,
		ScopeID:   scopeID(str(ev, a.ToolCallIDField)),
		Label:     label(a, tool, input),
		Bind:      shell,
	})
	if err != nil {
		return failure(StartToolCall, "stagefs: cannot open a snapshot for this tool call: "+err.Error()+".")
	}
	if !shell {
		return Answer{}
	}
	rewritten := map[string]any{}
	for k, v := range input {
		rewritten[k] = v
	}
	rewritten[a.CommandField] = BindPrefix(self, res.ScopeID) + command
	out, err := json.Marshal(a.RewriteInput(event, rewritten))
	if err != nil {
		return failure(StartToolCall, "stagefs: "+err.Error())
	}
	return Answer{Stdout: out}
}

// BindPrefix is the line put before a shell tool call's command: it binds
// the tool call's snapshot to the shell, or stops the shell.
func BindPrefix(self, scope string) string {
	return fmt.Sprintf("%s hook bind %s || exit %d\n", ShellQuote(self), ShellQuote(scope), BindExit)
}

// failure is the answer when stagefs could not do its part: events that
// would let something run unprotected are refused, the rest only warn.
func failure(action Action, msg string) Answer {
	if action == StartTurn || action == StartToolCall {
		return Answer{Stderr: msg + " Refused, so that nothing runs unprotected.", Exit: ExitRefused}
	}
	return Answer{Stderr: msg, Exit: ExitWarn}
}

// label says what a tool call is, for a person: the tool and its command
// or the file it works on.
func label(a *Agent, tool string, input map[string]any) string {
	what := ""
	if a.isShell(tool) {
		what, _ = input[a.CommandField].(string)
	}
	for _, f := range a.LabelFields {
		if what != "" {
			break
		}
		what, _ = input[f].(string)
	}
	if what == "" {
		return tool
	}
	return tool + ": " + what
}

func str(ev map[string]any, field string) string {
	if field == "" {
		return ""
	}
	s, _ := ev[field].(string)
	return s
}

// scopeID keeps an id the agent gave only if a snapshot scope may carry
// it; "" lets the daemon number it.
func scopeID(id string) string {
	if id == "" || len(id) > 200 {
		return ""
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._:@-", c) >= 0
		if !ok {
			return ""
		}
	}
	return id
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

func orUnknown(s string) string {
	if s == "" {
		return "this workspace"
	}
	return s
}

// ShellQuote quotes s for a POSIX shell.
func ShellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
