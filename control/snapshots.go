package control

import "context"

// Snapshot methods: one snapshot per tool call (scopeId, canonically the
// ACP toolCallId), capturing each path's pre-image before its first
// mutation, so one tool call can be undone alone.
const (
	MethodSnapshot      = "fs/snapshot"
	MethodCloseSnapshot = "fs/close_snapshot"
	MethodRestore       = "fs/restore"
	MethodListSnapshots = "fs/list_snapshots"
	MethodDropSnapshot  = "fs/drop_snapshot"

	// EventToolCallRestored is published after a restore, with ToolCallID
	// and RestoredPaths.
	EventToolCallRestored = "tool_call_restored"
)

// SnapshotParams opens a snapshot. With Paths their pre-images are
// captured at once; without, the snapshot is open and captures on write.
// Pid binds it to that process and its descendants.
type SnapshotParams struct {
	ScopeID string   `json:"scopeId"`
	Paths   []string `json:"paths,omitempty"`
	Pid     int      `json:"pid,omitempty"`
	// Label is for people: the tool and its command or file.
	Label string `json:"label,omitempty"`
}

// Validate implements Validator.
func (p SnapshotParams) Validate() error {
	if p.ScopeID == "" {
		return invalidParams("scopeId", "scopeId is required")
	}
	if p.Pid < 0 {
		return invalidParams("pid", "pid must not be negative")
	}
	return nil
}

// SnapshotInfo describes one snapshot.
type SnapshotInfo struct {
	SnapshotID string   `json:"snapshotId"`
	ScopeID    string   `json:"scopeId"`
	Turn       string   `json:"turn,omitempty"`
	Pid        int      `json:"pid,omitempty"`
	Label      string   `json:"label,omitempty"`
	Created    string   `json:"created"` // RFC3339Nano
	Open       bool     `json:"open"`
	Paths      []string `json:"paths"`
	Bytes      int64    `json:"bytes"`
	Workspace  string   `json:"workspace,omitempty"`
	// Uncaptured names paths that changed while the snapshot was open but
	// whose pre-image could not be stored: the snapshot is incomplete.
	Uncaptured []string `json:"uncaptured,omitempty"`
	Incomplete bool     `json:"incomplete,omitempty"`
}

// ScopeParams names a snapshot by its scope id.
type ScopeParams struct {
	ScopeID string `json:"scopeId"`
}

// Validate implements Validator.
func (p ScopeParams) Validate() error {
	if p.ScopeID == "" {
		return invalidParams("scopeId", "scopeId is required")
	}
	return nil
}

// RestoreParams names the snapshot to restore. KeepLater leaves alone the
// paths changed after the snapshot closed (otherwise they are restored and
// listed as overwritten).
type RestoreParams struct {
	ScopeID   string `json:"scopeId"`
	KeepLater bool   `json:"keepLater,omitempty"`
}

// Validate implements Validator.
func (p RestoreParams) Validate() error {
	if p.ScopeID == "" {
		return invalidParams("scopeId", "scopeId is required")
	}
	return nil
}

// RestoreResult reports a restore.
type RestoreResult struct {
	RestoredPaths []string   `json:"restoredPaths"`
	Overwritten   []string   `json:"overwritten"`
	Kept          []string   `json:"kept"`
	Uncaptured    []string   `json:"uncaptured"` // changed, but no pre-image could be stored
	Conflicts     []Conflict `json:"conflicts"`
	Failed        []Failure  `json:"failed"`
}

// ListSnapshotsResult lists snapshots by capture time, oldest first.
type ListSnapshotsResult struct {
	Snapshots []SnapshotInfo `json:"snapshots"`
}

// DropSnapshotResult confirms a drop.
type DropSnapshotResult struct {
	Dropped bool `json:"dropped"`
}

func (c *Client) Snapshot(ctx context.Context, p SnapshotParams) (SnapshotInfo, error) {
	var r SnapshotInfo
	return r, c.Call(ctx, MethodSnapshot, p, &r)
}

func (c *Client) CloseSnapshot(ctx context.Context, scopeID string) (SnapshotInfo, error) {
	var r SnapshotInfo
	return r, c.Call(ctx, MethodCloseSnapshot, ScopeParams{ScopeID: scopeID}, &r)
}

func (c *Client) Restore(ctx context.Context, scopeID string) (RestoreResult, error) {
	return c.RestoreWith(ctx, RestoreParams{ScopeID: scopeID})
}

func (c *Client) RestoreWith(ctx context.Context, p RestoreParams) (RestoreResult, error) {
	var r RestoreResult
	return r, c.Call(ctx, MethodRestore, p, &r)
}

func (c *Client) ListSnapshots(ctx context.Context) (ListSnapshotsResult, error) {
	var r ListSnapshotsResult
	return r, c.Call(ctx, MethodListSnapshots, struct{}{}, &r)
}

func (c *Client) DropSnapshot(ctx context.Context, scopeID string) (DropSnapshotResult, error) {
	var r DropSnapshotResult
	return r, c.Call(ctx, MethodDropSnapshot, ScopeParams{ScopeID: scopeID}, &r)
}
