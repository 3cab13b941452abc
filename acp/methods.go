package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sort"

	"stagefs/control"
)

// sessionMethods are the methods the proxy answers itself, by their
// session/ name; each is accepted under _stagefs/ too (ACP keeps names
// that start with _ for extensions).
var sessionMethods = map[string]func(p *Proxy, params json.RawMessage) (any, error){
	"session/restore_tool_call": (*Proxy).restoreToolCall,
	"session/rollback":          (*Proxy).rollback,
	"session/redo":              (*Proxy).redo,
	"session/fs_mode":           (*Proxy).fsMode,
	"session/fs_commit_staged":  (*Proxy).commit,
	"session/fs_discard_staged": (*Proxy).discard,
	"session/fs_staged_status":  (*Proxy).status,
	"session/fs_diff":           (*Proxy).diff,
}

func methodNames() []string {
	var out []string
	for m := range sessionMethods {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// paramError is a request whose params are wrong.
type paramError struct{ msg string }

func (e *paramError) Error() string { return e.msg }

// errorFor turns an error into the JSON-RPC error answer: the daemon's
// own codes pass through.
func errorFor(id json.RawMessage, err error) map[string]any {
	var ce *control.Error
	if errors.As(err, &ce) {
		r := errorResponse(id, ce.Code, ce.Message)
		if ce.Data != nil {
			r["error"].(map[string]any)["data"] = ce.Data
		}
		return r
	}
	var pe *paramError
	if errors.As(err, &pe) {
		return errorResponse(id, -32602, pe.msg)
	}
	return errorResponse(id, -32603, err.Error())
}

// sessionParams are the params every session method takes.
type sessionParams struct {
	SessionID  string   `json:"sessionId"`
	ToolCallID string   `json:"toolCallId,omitempty"`
	TurnID     string   `json:"turnId,omitempty"`
	Mode       string   `json:"mode,omitempty"`
	Paths      []string `json:"paths,omitempty"`
	Force      bool     `json:"force,omitempty"`
}

// parse decodes params and checks the session is one this proxy relays.
func (p *Proxy) parse(params json.RawMessage) (sessionParams, error) {
	var ps sessionParams
	if len(params) == 0 {
		return ps, &paramError{"params are required: {sessionId, ...}"}
	}
	if err := json.Unmarshal(params, &ps); err != nil {
		return ps, &paramError{"invalid params: " + err.Error()}
	}
	if ps.SessionID == "" {
		return ps, &paramError{"invalid params: sessionId is required"}
	}
	p.mu.Lock()
	known := p.sessions[ps.SessionID]
	p.mu.Unlock()
	if !known {
		return ps, control.Errorf(control.CodeNotFound, "no session %q: open one with session/new first", ps.SessionID)
	}
	return ps, nil
}

// paths maps the paths a client names (absolute, or relative to the
// workspace) to workspace-relative ones.
func (p *Proxy) paths(in []string) ([]string, error) {
	var out []string
	for _, path := range in {
		if !filepath.IsAbs(path) {
			path = filepath.Join(p.workspace, path)
		}
		rel, err := p.relPath(path)
		if err != nil {
			return nil, control.Errorf(control.CodePathOutsideWorkspace, "%v", err)
		}
		out = append(out, rel)
	}
	return out, nil
}

func ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), opTimeout)
}

func (p *Proxy) restoreToolCall(params json.RawMessage) (any, error) {
	ps, err := p.parse(params)
	if err != nil {
		return nil, err
	}
	if ps.ToolCallID == "" {
		return nil, &paramError{"invalid params: toolCallId is required"}
	}
	p.mu.Lock()
	scopes := p.toolCalls[ps.ToolCallID]
	open := p.open[ps.ToolCallID] != ""
	p.mu.Unlock()
	if len(scopes) == 0 {
		return nil, control.Errorf(control.CodeNotFound, "no tool call %q in this session", ps.ToolCallID)
	}
	if open {
		return nil, control.Errorf(control.CodeBusy, "tool call %q is still running; restore it once it has completed", ps.ToolCallID)
	}
	c, cancel := ctx()
	defer cancel()
	res := control.RestoreResult{}
	// Newest first: the tool call's own snapshot, then the gap before it.
	for i := len(scopes) - 1; i >= 0; i-- {
		r, err := p.ctl.Restore(c, scopes[i])
		if err != nil {
			return nil, err
		}
		res.RestoredPaths = append(res.RestoredPaths, r.RestoredPaths...)
		res.Overwritten = append(res.Overwritten, r.Overwritten...)
		res.Failed = append(res.Failed, r.Failed...)
		res.Uncaptured = append(res.Uncaptured, r.Uncaptured...)
	}
	abs := []string{}
	for _, rel := range res.RestoredPaths {
		abs = append(abs, filepath.Join(p.workspace, rel))
	}
	p.client.send(map[string]any{"jsonrpc": "2.0", "method": "session/update", "params": map[string]any{
		"sessionId": ps.SessionID,
		"update": map[string]any{
			"sessionUpdate": "tool_call_update",
			"toolCallId":    ps.ToolCallID,
			"status":        "restored",
			"_meta":         map[string]any{"stagefs": map[string]any{"kind": "tool_call_restored", "restoredPaths": abs}},
		},
	}})
	return map[string]any{"toolCallId": ps.ToolCallID, "restoredPaths": abs, "overwritten": nonNil(res.Overwritten), "failed": nonNil(res.Failed), "uncaptured": nonNil(res.Uncaptured)}, nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func (p *Proxy) rollback(params json.RawMessage) (any, error) {
	ps, err := p.parse(params)
	if err != nil {
		return nil, err
	}
	c, cancel := ctx()
	defer cancel()
	return p.ctl.Rollback(c, control.RollbackParams{TurnID: ps.TurnID, Force: ps.Force})
}

func (p *Proxy) redo(params json.RawMessage) (any, error) {
	ps, err := p.parse(params)
	if err != nil {
		return nil, err
	}
	c, cancel := ctx()
	defer cancel()
	return p.ctl.Redo(c, control.RedoParams{Force: ps.Force})
}

func (p *Proxy) fsMode(params json.RawMessage) (any, error) {
	ps, err := p.parse(params)
	if err != nil {
		return nil, err
	}
	c, cancel := ctx()
	defer cancel()
	if ps.Mode == "" {
		init, err := p.ctl.Initialize(c)
		return map[string]any{"mode": init.Mode}, err
	}
	r, err := p.ctl.SetMode(c, ps.Mode)
	if err != nil {
		return nil, err
	}
	return map[string]any{"previous": r.Previous, "mode": ps.Mode}, nil
}

func (p *Proxy) commit(params json.RawMessage) (any, error) {
	return p.onPaths(params, func(c context.Context, ps sessionParams, rel []string) (any, error) {
		return p.ctl.Commit(c, control.CommitParams{Paths: rel, Force: ps.Force})
	})
}

func (p *Proxy) discard(params json.RawMessage) (any, error) {
	return p.onPaths(params, func(c context.Context, _ sessionParams, rel []string) (any, error) {
		return p.ctl.Discard(c, rel)
	})
}

func (p *Proxy) status(params json.RawMessage) (any, error) {
	return p.onPaths(params, func(c context.Context, _ sessionParams, rel []string) (any, error) {
		return p.ctl.Status(c, rel)
	})
}

func (p *Proxy) diff(params json.RawMessage) (any, error) {
	return p.onPaths(params, func(c context.Context, _ sessionParams, rel []string) (any, error) {
		return p.ctl.Diff(c, rel)
	})
}

// onPaths answers a pending-set method: it parses params, makes their
// paths workspace-relative (refusing any outside) and calls fn with them
// under the operation timeout.
func (p *Proxy) onPaths(params json.RawMessage, fn func(context.Context, sessionParams, []string) (any, error)) (any, error) {
	ps, err := p.parse(params)
	if err != nil {
		return nil, err
	}
	rel, err := p.paths(ps.Paths)
	if err != nil {
		return nil, err
	}
	c, cancel := ctx()
	defer cancel()
	return fn(c, ps, rel)
}

// serveFS answers the agent's fs/read_text_file and fs/write_text_file
// from the staged view: a read sees staged writes, a write is staged.
// The editor is not asked: it would read and write the real workspace.
func (p *Proxy) serveFS(e envelope) map[string]any {
	var ps struct {
		Path    string  `json:"path"`
		Content *string `json:"content"`
		Line    *int    `json:"line"`
		Limit   *int    `json:"limit"`
	}
	if err := json.Unmarshal(e.Params, &ps); err != nil {
		return errorResponse(e.ID, -32602, "invalid params: "+err.Error())
	}
	rel, err := p.relPath(ps.Path)
	if err == nil {
		// The daemon opens a path as it is; the agent means what an open
		// in the staged view would reach.
		rel, err = p.resolve(rel)
	}
	if err != nil {
		return errorResponse(e.ID, -32602, err.Error())
	}
	c, cancel := ctx()
	defer cancel()
	cur, err := p.ctl.ReadText(c, rel)
	var ce *control.Error
	if errors.As(err, &ce) && ce.Code == control.CodeNotFound {
		cur, err = control.ReadTextResult{}, nil
	}
	if err != nil {
		return errorFor(e.ID, err)
	}
	if e.Method == "fs/read_text_file" {
		if !cur.Exists {
			// Agents create files by reading them first (Gemini CLI does):
			// a missing file reads as empty, not as an error.
			return resultResponse(e.ID, map[string]any{"content": ""})
		}
		return resultResponse(e.ID, map[string]any{"content": sliceLines(cur.Content, ps.Line, ps.Limit)})
	}
	if ps.Content == nil {
		return errorResponse(e.ID, -32602, "invalid params: content is required")
	}
	r, err := p.ctl.SafeTextPatch(c, control.SafeTextPatchParams{Path: rel, ExpectedHash: cur.SHA256, Content: ps.Content})
	if err != nil {
		return errorFor(e.ID, err)
	}
	if r.Result == control.PatchStaleBase {
		return errorResponse(e.ID, control.CodeStaleBase, fmt.Sprintf("%s changed while it was written; try again", ps.Path))
	}
	return resultResponse(e.ID, map[string]any{})
}

// sliceLines returns limit lines of s from the 1-based line.
func sliceLines(s string, line, limit *int) string {
	if line == nil && limit == nil {
		return s
	}
	start := 0
	if line != nil && *line > 1 {
		for n := 1; n < *line && start < len(s); n++ {
			i := indexFrom(s, start)
			if i < 0 {
				return ""
			}
			start = i + 1
		}
	}
	end := len(s)
	if limit != nil && *limit >= 0 {
		end = start
		for n := 0; n < *limit && end < len(s); n++ {
			i := indexFrom(s, end)
			if i < 0 {
				end = len(s)
				break
			}
			end = i + 1
		}
	}
	return s[start:end]
}

func indexFrom(s string, from int) int {
	for i := from; i < len(s); i++ {
		if s[i] == '\n' {
			return i
		}
	}
	return -1
}
