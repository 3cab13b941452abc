package acp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"stagefs/control"
)

// opTimeout bounds one call to the daemon made while relaying.
const opTimeout = 30 * time.Second

// toolCall is the part of an ACP tool call the proxy reads.
type toolCall struct {
	ToolCallID string `json:"toolCallId"`
	Title      string `json:"title"`
	Kind       string `json:"kind"`
	Status     string `json:"status"`
	Locations  []struct {
		Path string `json:"path"`
	} `json:"locations"`
}

// sessionUpdate follows the tool calls the agent reports.
func (p *Proxy) sessionUpdate(params json.RawMessage) {
	var ps struct {
		Update struct {
			SessionUpdate string `json:"sessionUpdate"`
			toolCall
		} `json:"update"`
	}
	if json.Unmarshal(params, &ps) != nil || ps.Update.ToolCallID == "" {
		return
	}
	switch ps.Update.SessionUpdate {
	case "tool_call":
		p.toolCallStarted(ps.Update.toolCall)
		if done(ps.Update.Status) {
			p.toolCallEnded(ps.Update.ToolCallID)
		}
	case "tool_call_update":
		if done(ps.Update.Status) {
			p.toolCallEnded(ps.Update.ToolCallID)
		}
	}
}

func done(status string) bool { return status == "completed" || status == "failed" }

// toolCallStarted opens the tool call's snapshot, unless it has one: the
// gap snapshot, open since the previous tool call ended, is closed and
// counted as part of this one.
func (p *Proxy) toolCallStarted(tc toolCall) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.toolCalls[tc.ToolCallID]; ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	var scopes []string
	if p.gap != "" {
		if info, err := p.ctl.CloseSnapshot(ctx, p.gap); err == nil && len(info.Paths) > 0 {
			scopes = append(scopes, p.gap)
		} else {
			p.ctl.DropSnapshot(ctx, p.gap)
		}
		p.gap = ""
	}
	scope := scopeFor(tc.ToolCallID)
	if _, err := p.ctl.Snapshot(ctx, control.SnapshotParams{ScopeID: scope, Label: labelOf(tc)}); err != nil {
		p.logf("acp: snapshot for tool call %s: %v", tc.ToolCallID, err)
	} else {
		p.open[tc.ToolCallID] = scope
	}
	p.toolCalls[tc.ToolCallID] = append(scopes, scope)
}

// toolCallEnded closes the tool call's snapshot and opens the gap that
// the next tool call will own.
func (p *Proxy) toolCallEnded(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	scope, ok := p.open[id]
	if !ok {
		return
	}
	delete(p.open, id)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if _, err := p.ctl.CloseSnapshot(ctx, scope); err != nil {
		p.logf("acp: closing the snapshot of %s: %v", id, err)
	}
	if len(p.open) == 0 {
		p.openGapLocked(ctx)
	}
}

func (p *Proxy) openGapLocked(ctx context.Context) {
	p.serial++
	gap := fmt.Sprintf("acp-gap-%d-%d", time.Now().UnixNano(), p.serial)
	if _, err := p.ctl.Snapshot(ctx, control.SnapshotParams{ScopeID: gap, Label: "between tool calls"}); err != nil {
		p.logf("acp: the snapshot between tool calls: %v", err)
		return
	}
	p.gap = gap
}

// startTurn starts a turn for a prompt and opens the gap before its first
// tool call; it returns the turn's id ("" if the daemon refused).
func (p *Proxy) startTurn(params json.RawMessage) string {
	var ps struct {
		Prompt []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"prompt"`
	}
	json.Unmarshal(params, &ps)
	label := ""
	for _, b := range ps.Prompt {
		if b.Type == "text" && strings.TrimSpace(b.Text) != "" {
			label = strings.TrimSpace(b.Text)
			if i := strings.IndexByte(label, '\n'); i >= 0 {
				label = label[:i]
			}
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	t, err := p.ctl.Turn(ctx, control.TurnParams{Label: label})
	if err != nil {
		p.logf("acp: starting a turn: %v", err)
	}
	p.mu.Lock()
	if p.gap == "" && len(p.open) == 0 {
		p.openGapLocked(ctx)
	}
	p.mu.Unlock()
	return t.TurnID
}

// promptEnded closes every snapshot the prompt left open: its tool calls
// (cancelled, or the agent gone) and the gap.
func (p *Proxy) promptEnded() {
	p.mu.Lock()
	defer p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	for id, scope := range p.open {
		p.ctl.CloseSnapshot(ctx, scope)
		delete(p.open, id)
	}
	if p.gap != "" {
		if info, err := p.ctl.CloseSnapshot(ctx, p.gap); err != nil || len(info.Paths) == 0 {
			p.ctl.DropSnapshot(ctx, p.gap)
		}
		p.gap = ""
	}
}

// scopeFor makes a snapshot scope id of a tool call id: bytes a scope may
// not hold become '_'.
func scopeFor(id string) string {
	b := []byte(id)
	for i, c := range b {
		ok := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._:@-", c) >= 0
		if !ok {
			b[i] = '_'
		}
	}
	if len(b) > 200 {
		b = b[:200]
	}
	if len(b) == 0 || string(b) == "." || string(b) == ".." {
		return "tool-call"
	}
	return string(b)
}

// labelOf says what a tool call is: its kind, title and the paths it
// names.
func labelOf(tc toolCall) string {
	parts := []string{}
	if tc.Kind != "" {
		parts = append(parts, tc.Kind+":")
	}
	if tc.Title != "" {
		parts = append(parts, tc.Title)
	}
	for _, l := range tc.Locations {
		if l.Path != "" && !strings.Contains(tc.Title, l.Path) {
			parts = append(parts, l.Path)
		}
	}
	return strings.Join(parts, " ")
}
