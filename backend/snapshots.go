package backend

// Tool calls' snapshots: fs/snapshot, fs/close_snapshot, fs/restore,
// fs/list_snapshots and fs/drop_snapshot. The engine's own snapshots (a
// turn's, what a turn left, a redo) are neither listed nor reachable here.

import (
	"context"
	"time"

	"stagefs/control"
	"stagefs/overlay"
	"stagefs/snapshot"
)

func snapshotInfo(i snapshot.Info) control.SnapshotInfo {
	paths := i.Paths
	if paths == nil {
		paths = []string{}
	}
	return control.SnapshotInfo{
		SnapshotID: i.ID, ScopeID: i.ScopeID, Turn: i.Turn, Pid: i.Pid, Label: i.Label,
		Created: time.Unix(0, i.Created).UTC().Format(time.RFC3339Nano),
		Open:    !i.Closed, Paths: paths, Bytes: i.Bytes,
		Workspace: i.Workspace, Uncaptured: i.Uncaptured, Incomplete: len(i.Uncaptured) > 0,
	}
}

func (b *Backend) Snapshot(ctx context.Context, p control.SnapshotParams) (control.SnapshotInfo, error) {
	rel, err := b.relPaths(p.Paths)
	if err != nil {
		return control.SnapshotInfo{}, err
	}
	if err := checkScope(p.ScopeID); err != nil {
		return control.SnapshotInfo{}, err
	}
	if err := b.checkScopeUnused(p.ScopeID); err != nil {
		return control.SnapshotInfo{}, err
	}
	info, err := b.eng.OpenLabeledSnapshot(p.ScopeID, b.eng.CurrentTurn(), shortLabel(p.Label), p.Pid, rel)
	if err != nil {
		return control.SnapshotInfo{}, snapshotError(p.ScopeID, err)
	}
	return snapshotInfo(info), nil
}

func (b *Backend) CloseSnapshot(ctx context.Context, scopeID string) (control.SnapshotInfo, error) {
	if err := checkScope(scopeID); err != nil {
		return control.SnapshotInfo{}, err
	}
	info, err := b.eng.CloseSnapshot(scopeID)
	if err != nil {
		return control.SnapshotInfo{}, snapshotError(scopeID, err)
	}
	return snapshotInfo(info), nil
}

func (b *Backend) RestoreWith(ctx context.Context, p control.RestoreParams) (control.RestoreResult, error) {
	if err := checkScope(p.ScopeID); err != nil {
		return control.RestoreResult{}, err
	}
	res, err := b.eng.RestoreTool(p.ScopeID, p.KeepLater)
	if err != nil {
		return control.RestoreResult{}, snapshotError(p.ScopeID, err)
	}
	out := control.RestoreResult{RestoredPaths: nonNil(res.Restored), Overwritten: nonNil(res.Overwritten), Kept: nonNil(res.Kept), Uncaptured: nonNil(res.Uncaptured), Conflicts: []control.Conflict{}, Failed: []control.Failure{}}
	for _, f := range res.Failed {
		out.Failed = append(out.Failed, control.Failure{Path: f.Path, Reason: f.Reason})
	}
	b.invalidate(res.Restored)
	b.publish(control.Event{
		Kind: control.EventToolCallRestored, ToolCallID: p.ScopeID, RestoredPaths: out.RestoredPaths,
		Status: "restored",
		Meta:   map[string]any{"stagefs": map[string]any{"kind": control.EventToolCallRestored, "restoredPaths": out.RestoredPaths}},
	})
	return out, nil
}

func (b *Backend) ListSnapshots(ctx context.Context) (control.ListSnapshotsResult, error) {
	res := control.ListSnapshotsResult{Snapshots: []control.SnapshotInfo{}}
	for _, i := range b.snaps.List() {
		if overlay.InternalScope(i.ScopeID) {
			continue // turns' own snapshots: see session/checkpoints
		}
		res.Snapshots = append(res.Snapshots, snapshotInfo(i))
	}
	return res, nil
}

func (b *Backend) DropSnapshot(ctx context.Context, scopeID string) (control.DropSnapshotResult, error) {
	if err := checkScope(scopeID); err != nil {
		return control.DropSnapshotResult{}, err
	}
	if err := b.eng.DropSnapshot(scopeID); err != nil {
		return control.DropSnapshotResult{}, snapshotError(scopeID, err)
	}
	return control.DropSnapshotResult{Dropped: true}, nil
}
