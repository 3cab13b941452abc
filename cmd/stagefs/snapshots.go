package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"stagefs/control"
	"stagefs/overlay"
	"stagefs/snapshot"
)

// registerSnapshots adds the snapshot methods to the control server.
func (b *backend) registerSnapshots(s *control.Server) {
	s.Handle(control.MethodSnapshot, control.Typed(b.openSnapshot))
	s.Handle(control.MethodCloseSnapshot, control.Typed(b.closeSnapshot))
	s.Handle(control.MethodRestore, control.Typed(b.restore))
	s.Handle(control.MethodListSnapshots, control.Typed(b.listSnapshots))
	s.Handle(control.MethodDropSnapshot, control.Typed(b.dropSnapshot))
}

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

// snapshotError maps the store's errors to protocol errors.
func snapshotError(scope string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		// Say that it is the state dir that is full: the workspace's
		// disk may have room.
		return control.Errorf(control.CodeInvalidState, "the state dir is full (%v): free space there, or mount with --state on a larger disk; stagefs status shows the state dir", err)
	case errors.Is(err, snapshot.ErrNotFound):
		// Turns say what is missing ("no turn t9", "nothing to redo");
		// a missing snapshot is named by its scope.
		detail := strings.TrimPrefix(err.Error(), snapshot.ErrNotFound.Error()+": ")
		if detail == err.Error() || strings.HasPrefix(detail, "snapshot ") {
			detail = fmt.Sprintf("no snapshot for scope %q", scope)
		}
		return control.Errorf(control.CodeNotFound, "%s", detail)
	case errors.Is(err, snapshot.ErrExists):
		return control.Errorf(control.CodeBusy, "a snapshot for scope %q is already open; close it first", scope)
	case errors.Is(err, snapshot.ErrClosed):
		return control.Errorf(control.CodeInvalidState, "the snapshot for scope %q is closed", scope)
	case snapshot.ValidScope(scope) != nil:
		return badID(scope, snapshot.ValidScope(scope))
	}
	return err
}

// badID names an id the store refuses as the client gave it: a turn's
// without the prefix its snapshot carries inside.
func badID(scope string, err error) error {
	why := strings.TrimPrefix(err.Error(), "snapshot: ")
	if id, ok := strings.CutPrefix(scope, "turn:"); ok {
		why = strings.Replace(strings.Replace(why, "scope id", "turn id", 1), fmt.Sprintf("%q", scope), fmt.Sprintf("%q", id), 1)
		return control.Errorf(control.CodeInvalidParams, "turnId: %s", why)
	}
	return control.Errorf(control.CodeInvalidParams, "scopeId: %s", why)
}

func (b *backend) openSnapshot(ctx context.Context, p control.SnapshotParams) (control.SnapshotInfo, error) {
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

// checkScopeUnused refuses a scope id that names a closed snapshot: a new
// snapshot would replace it, and its pre-images would be gone with no
// record. (An open one is refused by the store as busy.)
func (b *backend) checkScopeUnused(scope string) error {
	if info, ok := b.snaps.Lookup(scope); ok && info.Closed {
		return control.Errorf(control.CodeBusy, "scope id %q names an earlier tool call's snapshot; choose a new id, or drop that snapshot first (stagefs drop %s)", scope, scope)
	}
	return nil
}

// captureFailed tells subscribers that a snapshot is incomplete. Called
// under the engine's lock: publishing never blocks.
func (b *backend) captureFailed(scope, path string, err error) {
	b.publish(control.Event{Kind: "capture_failed", ToolCallID: scope, Paths: []string{path}, Detail: err.Error()})
}

// reservedScope reports whether scope names a turn's own snapshot.
func reservedScope(scope string) bool { return overlay.InternalScope(scope) }

func checkScope(scope string) error {
	if err := snapshot.ValidScope(scope); err != nil {
		return badID(scope, err)
	}
	if reservedScope(scope) {
		return control.Errorf(control.CodeInvalidParams, "scopeId: the prefixes turn:, post: and redo: are reserved for turns")
	}
	return nil
}

func (b *backend) closeSnapshot(ctx context.Context, p control.ScopeParams) (control.SnapshotInfo, error) {
	if err := checkScope(p.ScopeID); err != nil {
		return control.SnapshotInfo{}, err
	}
	info, err := b.eng.CloseSnapshot(p.ScopeID)
	if err != nil {
		return control.SnapshotInfo{}, snapshotError(p.ScopeID, err)
	}
	return snapshotInfo(info), nil
}

func (b *backend) restore(ctx context.Context, p control.RestoreParams) (control.RestoreResult, error) {
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
	b.fs.Invalidate(res.Restored)
	b.publish(control.Event{
		Kind: control.EventToolCallRestored, ToolCallID: p.ScopeID, RestoredPaths: out.RestoredPaths,
		Status: "restored",
		Meta:   map[string]any{"stagefs": map[string]any{"kind": control.EventToolCallRestored, "restoredPaths": out.RestoredPaths}},
	})
	return out, nil
}

func (b *backend) listSnapshots(ctx context.Context, _ struct{}) (control.ListSnapshotsResult, error) {
	res := control.ListSnapshotsResult{Snapshots: []control.SnapshotInfo{}}
	for _, i := range b.snaps.List() {
		if reservedScope(i.ScopeID) {
			continue // turns' own snapshots: see session/checkpoints
		}
		res.Snapshots = append(res.Snapshots, snapshotInfo(i))
	}
	return res, nil
}

func (b *backend) dropSnapshot(ctx context.Context, p control.ScopeParams) (control.DropSnapshotResult, error) {
	if err := checkScope(p.ScopeID); err != nil {
		return control.DropSnapshotResult{}, err
	}
	if err := b.eng.DropSnapshot(p.ScopeID); err != nil {
		return control.DropSnapshotResult{}, snapshotError(p.ScopeID, err)
	}
	return control.DropSnapshotResult{Dropped: true}, nil
}

// maxLabel bounds a snapshot's or turn's label: a person reads it in a
// listing, and a hook may pass a whole prompt or script.
const maxLabel = 120

// shortLabel makes a label one line of at most maxLabel characters.
func shortLabel(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > maxLabel {
		s = string(r[:maxLabel-1]) + "…"
	}
	return s
}
