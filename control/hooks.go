package control

import (
	"context"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// The hook channel: a second socket on which the daemon answers only what
// an agent's hooks need — start a turn, open, bind and close a tool call's
// snapshot. The hooks run inside the sandbox with the agent's own tool
// calls, so the channel is reachable from there, and can do nothing else:
// no commit, discard, restore, rollback, mode switch or read.
const (
	MethodHookTurn          = "hook/turn"
	MethodHookToolCallStart = "hook/tool_call_start"
	MethodHookToolCallBind  = "hook/tool_call_bind"
	MethodHookToolCallEnd   = "hook/tool_call_end"
	MethodHookSessionEnd    = "hook/session_end"
)

// HookMethods lists every method the hook channel answers.
var HookMethods = []string{MethodHookTurn, MethodHookToolCallStart, MethodHookToolCallBind, MethodHookToolCallEnd, MethodHookSessionEnd}

// HookBackend is what the hook channel's server needs from the daemon: one
// method for every hook method. As with Backend, an *Error picks the
// JSON-RPC error, and each method has the signature of the Client's method
// of the same name.
type HookBackend interface {
	HookTurn(ctx context.Context, p HookTurnParams) (TurnInfo, error)
	HookToolCallStart(ctx context.Context, p HookToolCallStartParams) (HookToolCallStartResult, error)
	HookToolCallBind(ctx context.Context, scopeID string) (HookToolCallBindResult, error)
	HookToolCallEnd(ctx context.Context, p HookToolCallEndParams) (HookToolCallEndResult, error)
	HookSessionEnd(ctx context.Context, sessionID string) (HookSessionEndResult, error)
}

// A Client of a hook channel is a HookBackend too.
var _ HookBackend = (*Client)(nil)

// NewHookServer returns a server answering the hook methods (HookMethods)
// with h, and events/subscribe, as every Server does.
func NewHookServer(h HookBackend, opts ServerOptions) *Server {
	s := NewServer(nil, opts)
	s.Handle(MethodHookTurn, Typed(h.HookTurn))
	s.Handle(MethodHookToolCallStart, Typed(h.HookToolCallStart))
	s.Handle(MethodHookToolCallBind, Typed(func(ctx context.Context, p HookToolCallBindParams) (HookToolCallBindResult, error) {
		return h.HookToolCallBind(ctx, p.ScopeID)
	}))
	s.Handle(MethodHookToolCallEnd, Typed(h.HookToolCallEnd))
	s.Handle(MethodHookSessionEnd, Typed(func(ctx context.Context, p HookSessionEndParams) (HookSessionEndResult, error) {
		r, err := h.HookSessionEnd(ctx, p.SessionID)
		r.Closed = nonNil(r.Closed)
		return r, err
	}))
	return s
}

// HookSocketPrefix starts the hook channel's name: an abstract Unix socket
// (no file, so nothing to hide or clean up, and reachable in the sandbox,
// which shares the host's network namespace).
const HookSocketPrefix = "@stagefs-hooks-"

// HookTurnParams starts a turn for an agent's new prompt.
type HookTurnParams struct {
	SessionID string `json:"sessionId,omitempty"`
	TurnID    string `json:"turnId,omitempty"` // empty: the daemon picks one
	Label     string `json:"label,omitempty"`  // the prompt, shortened
}

// HookToolCallStartParams opens a tool call's snapshot. With Bind the
// snapshot opens only when the tool's command binds it to its own process
// tree (MethodHookToolCallBind).
type HookToolCallStartParams struct {
	SessionID string `json:"sessionId,omitempty"`
	ScopeID   string `json:"scopeId,omitempty"` // empty: the session's next numbered id
	Label     string `json:"label,omitempty"`
	Bind      bool   `json:"bind,omitempty"`
}

// Validate implements Validator.
func (p HookToolCallStartParams) Validate() error {
	if p.ScopeID == "" && p.SessionID == "" {
		return invalidParams("scopeId", "scopeId or sessionId is required")
	}
	return nil
}

// HookToolCallStartResult names the tool call's scope.
type HookToolCallStartResult struct {
	ScopeID string `json:"scopeId"`
}

// HookToolCallBindParams opens the pending snapshot of ScopeID bound to
// the parent of the calling process: the shell that runs the tool call's
// command.
type HookToolCallBindParams struct {
	ScopeID string `json:"scopeId"`
}

// Validate implements Validator.
func (p HookToolCallBindParams) Validate() error {
	if p.ScopeID == "" {
		return invalidParams("scopeId", "scopeId is required")
	}
	return nil
}

// HookToolCallBindResult says which process the snapshot follows.
type HookToolCallBindResult struct {
	ScopeID string `json:"scopeId"`
	Pid     int    `json:"pid"`
}

// HookToolCallEndParams closes a tool call's snapshot: ScopeID's, or with
// only SessionID the session's oldest open one (agents whose hooks carry
// no tool call id pair the events in order). A snapshot bound to a process
// that still runs (a command in the background) closes when it exits.
type HookToolCallEndParams struct {
	SessionID string `json:"sessionId,omitempty"`
	ScopeID   string `json:"scopeId,omitempty"`
}

// Validate implements Validator.
func (p HookToolCallEndParams) Validate() error {
	if p.ScopeID == "" && p.SessionID == "" {
		return invalidParams("scopeId", "scopeId or sessionId is required")
	}
	return nil
}

// HookToolCallEndResult says what happened to the snapshot.
type HookToolCallEndResult struct {
	ScopeID string `json:"scopeId"`
	// Deferred: the bound process still runs; the snapshot closes when it
	// exits.
	Deferred bool `json:"deferred,omitempty"`
}

// HookSessionEndParams closes every tool call the session left open.
type HookSessionEndParams struct {
	SessionID string `json:"sessionId"`
}

// HookSessionEndResult lists the scopes closed (or left to close when
// their processes exit).
type HookSessionEndResult struct {
	Closed []string `json:"closed"`
}

// HookSocketName is the hook channel's abstract socket name for the daemon
// whose state dir is state: unique per state dir, and short.
func HookSocketName(state string) string {
	return fmt.Sprintf("%s%016x", HookSocketPrefix, fnv64(state))
}

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// DialHooks connects to a hook channel and checks that the process serving
// it is the caller's own user or root: an abstract socket has no file
// mode, so anyone could have taken the name, and a hook must not report a
// tool call as protected to an impostor.
func DialHooks(name string) (*Client, error) {
	if !strings.HasPrefix(name, HookSocketPrefix) {
		return nil, fmt.Errorf("%q is not a stagefs hook channel (want %s...)", name, HookSocketPrefix)
	}
	c, err := Dial(name)
	if err != nil {
		return nil, err
	}
	raw, err := c.conn.SyscallConn()
	if err != nil {
		c.Close()
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		credErr = err
	}
	if credErr != nil {
		c.Close()
		return nil, fmt.Errorf("hook channel %s: read its owner: %w", name, credErr)
	}
	if cred.Uid != uint32(os.Getuid()) && cred.Uid != 0 {
		c.Close()
		return nil, fmt.Errorf("hook channel %s is served by uid %d, not by this user or root", name, cred.Uid)
	}
	return c, nil
}

// HookTurn starts a turn.
func (c *Client) HookTurn(ctx context.Context, p HookTurnParams) (TurnInfo, error) {
	var r TurnInfo
	return r, c.Call(ctx, MethodHookTurn, p, &r)
}

// HookToolCallStart opens (or, with Bind, prepares) a tool call's snapshot.
func (c *Client) HookToolCallStart(ctx context.Context, p HookToolCallStartParams) (HookToolCallStartResult, error) {
	var r HookToolCallStartResult
	return r, c.Call(ctx, MethodHookToolCallStart, p, &r)
}

// HookToolCallBind binds a prepared tool call's snapshot to the caller's
// parent process.
func (c *Client) HookToolCallBind(ctx context.Context, scope string) (HookToolCallBindResult, error) {
	var r HookToolCallBindResult
	return r, c.Call(ctx, MethodHookToolCallBind, HookToolCallBindParams{ScopeID: scope}, &r)
}

// HookToolCallEnd closes a tool call's snapshot.
func (c *Client) HookToolCallEnd(ctx context.Context, p HookToolCallEndParams) (HookToolCallEndResult, error) {
	var r HookToolCallEndResult
	return r, c.Call(ctx, MethodHookToolCallEnd, p, &r)
}

// HookSessionEnd closes the tool calls a session left open.
func (c *Client) HookSessionEnd(ctx context.Context, session string) (HookSessionEndResult, error) {
	var r HookSessionEndResult
	return r, c.Call(ctx, MethodHookSessionEnd, HookSessionEndParams{SessionID: session}, &r)
}
