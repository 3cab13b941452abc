package backend

// Turns: session/turn, session/checkpoints, session/rollback,
// session/redo and session/mark_user.

import (
	"bytes"
	"context"
	"syscall"
	"time"

	"stagefs/control"
	"stagefs/internal/unidiff"
	"stagefs/overlay"
)

func turnInfo(t overlay.Turn) control.TurnInfo {
	return control.TurnInfo{TurnID: t.ID, Label: t.Label, Started: t.Started.UTC().Format(time.RFC3339Nano), Open: t.Open, Files: len(t.Paths), Bytes: t.Bytes, Paths: t.Paths, Uncaptured: t.Uncaptured}
}

func (b *Backend) Turn(ctx context.Context, p control.TurnParams) (control.TurnInfo, error) {
	// A turn id used before is refused, as a scope id is: a new turn
	// under it would replace the old one and drop its pre-images.
	if p.TurnID != "" {
		for _, t := range b.eng.Turns() {
			if t.ID == p.TurnID {
				return control.TurnInfo{}, control.Errorf(control.CodeBusy, "turn id %q names an earlier turn; choose a new id, or leave it out and stagefs numbers the turn", p.TurnID)
			}
		}
	}
	t, err := b.eng.StartTurn(p.TurnID, shortLabel(p.Label))
	if err != nil {
		return control.TurnInfo{}, turnError(p.TurnID, err)
	}
	return turnInfo(t), nil
}

func (b *Backend) Checkpoints(ctx context.Context) (control.CheckpointsResult, error) {
	res := control.CheckpointsResult{Turns: []control.TurnInfo{}}
	for _, t := range b.eng.Turns() {
		res.Turns = append(res.Turns, turnInfo(t))
	}
	return res, nil
}

func rollbackResult(r overlay.RollbackResult) control.RollbackResult {
	out := control.RollbackResult{TurnID: r.Turn, RestoredPaths: nonNil(r.Restored), Conflicts: []control.Conflict{}, Failed: []control.Failure{}}
	for _, c := range r.Conflicts {
		out.Conflicts = append(out.Conflicts, control.Conflict{Path: c.Path, Reason: c.Reason, Expected: c.Expected, Actual: c.Actual})
	}
	for _, f := range r.Failed {
		out.Failed = append(out.Failed, control.Failure{Path: f.Path, Reason: f.Reason})
	}
	return out
}

func (b *Backend) Rollback(ctx context.Context, p control.RollbackParams) (control.RollbackResult, error) {
	rel, err := b.relPathsOrAll(p.Paths)
	if err != nil {
		return control.RollbackResult{}, err
	}
	if p.Diff {
		changes, conflicts, err := b.eng.RollbackDiff(p.TurnID, rel, p.Force)
		if err != nil {
			return control.RollbackResult{}, turnError(p.TurnID, err)
		}
		var buf bytes.Buffer
		if err := unidiff.Write(&buf, changes); err != nil {
			return control.RollbackResult{}, err
		}
		out := rollbackResult(overlay.RollbackResult{Turn: p.TurnID, Conflicts: conflicts})
		out.Diff = buf.String()
		return out, nil
	}
	r, err := b.eng.Rollback(p.TurnID, rel, p.Force, ctlCaller(ctx))
	if err != nil {
		return control.RollbackResult{}, turnError(p.TurnID, err)
	}
	b.invalidate(r.Restored)
	b.publish(control.Event{Kind: control.EventRolledBack, Paths: r.Restored, Detail: "rollback to the start of " + r.Turn})
	b.publishConflicts(r.Conflicts)
	return rollbackResult(r), nil
}

func (b *Backend) Redo(ctx context.Context, p control.RedoParams) (control.RollbackResult, error) {
	r, err := b.eng.Redo(p.Force, ctlCaller(ctx))
	if err != nil {
		return control.RollbackResult{}, snapshotError("redo", err)
	}
	b.invalidate(r.Restored)
	b.publish(control.Event{Kind: control.EventRolledBack, Paths: r.Restored, Detail: "redo"})
	b.publishConflicts(r.Conflicts)
	return rollbackResult(r), nil
}

// publishConflicts tells subscribers which paths a rollback or redo left
// alone because someone else changed them.
func (b *Backend) publishConflicts(conflicts []overlay.Conflict) {
	if len(conflicts) == 0 {
		return
	}
	var ps []string
	for _, c := range conflicts {
		ps = append(ps, c.Path)
	}
	b.publish(control.Event{Kind: "conflict", Paths: ps})
}

func (b *Backend) MarkUser(ctx context.Context, p control.MarkUserParams) (control.MarkUserResult, error) {
	// Past the kernel's largest pid (PID_MAX_LIMIT), kill(2) would see
	// the number cut to 32 bits: 2^32+1 is init.
	if !p.Remove && (p.Pid <= 0 || p.Pid > 1<<22 || syscall.Kill(p.Pid, 0) == syscall.ESRCH) {
		return control.MarkUserResult{}, control.Errorf(control.CodeNotFound, "no process %d", p.Pid)
	}
	b.eng.MarkUser(p.Pid, !p.Remove)
	return control.MarkUserResult{Pid: p.Pid, User: !p.Remove}, nil
}
