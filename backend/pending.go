package backend

// The pending set's methods: fs/staged_status, fs/commit_staged,
// fs/discard_staged and fs/diff.

import (
	"bytes"
	"context"
	"time"

	"stagefs/control"
	"stagefs/internal/unidiff"
	"stagefs/overlay"
)

func (b *Backend) Status(ctx context.Context, paths []string) (control.StatusResult, error) {
	rel, err := b.relPathsOrAll(paths)
	if err != nil {
		return control.StatusResult{}, err
	}
	now := time.Now()
	res := control.StatusResult{Entries: []control.StatusEntry{}, Mode: string(b.eng.Mode()), Policy: b.policy()}
	changes := b.eng.Pending(rel)
	// A renamed directory is one entry, "rename" with its source: the
	// deletion that hides the source in the pending set is shown only
	// when the rename is not (a status of the source alone).
	movedFrom := map[string]bool{}
	for _, c := range changes {
		if c.Dir && c.From != "" {
			movedFrom[c.From] = true
		}
	}
	for _, c := range changes {
		if movedFrom[c.Path] && c.Kind == "deleted" {
			continue
		}
		age := now.Sub(c.Time).Milliseconds()
		res.Entries = append(res.Entries, control.StatusEntry{
			Path: c.Path, Kind: statusKind(c), From: c.From, Bytes: c.Bytes, AgeMs: age, PID: c.Pid, Comm: c.Comm,
		})
		res.TotalBytes += c.Bytes
		if age > res.OldestPendingAgeMs {
			res.OldestPendingAgeMs = age
		}
	}
	res.PendingCount = len(res.Entries)
	if len(paths) == 0 {
		res.Sandbox = b.sandboxStatus()
	}
	return res, nil
}

// statusKind names a pending change the way the protocol does.
func statusKind(c overlay.Change) string {
	switch c.Kind {
	case "created", "special":
		return control.KindCreate
	case "modified":
		return control.KindWrite
	case "deleted":
		if c.Dir {
			return control.KindRmdir
		}
		return control.KindDelete
	case "renamed":
		return control.KindRename
	case "metadata":
		return control.KindMeta
	}
	return c.Kind // mkdir, symlink
}

func (b *Backend) Commit(ctx context.Context, p control.CommitParams) (control.CommitResult, error) {
	if b.cfg.Branch != "" {
		return control.CommitResult{}, control.Errorf(control.CodeInvalidState, "branch %s commits through its parent: merge it (stagefs merge %s), then commit there", b.cfg.Branch, b.cfg.Branch)
	}
	rel, err := b.relPathsOrAll(p.Paths)
	if err != nil {
		return control.CommitResult{}, err
	}
	r := b.eng.Commit(rel, p.Force, ctlCaller(ctx))
	res := control.CommitResult{Committed: nonNil(r.Committed), Conflicts: []control.Conflict{}, Failed: []control.Failure{}}
	var conflicted []string
	for _, c := range r.Conflicts {
		res.Conflicts = append(res.Conflicts, control.Conflict{Path: c.Path, Reason: c.Reason, Expected: c.Expected, Actual: c.Actual,
			WorkspaceHash: c.WorkspaceHash.String(), StagedHash: c.StagedHash.String()})
		conflicted = append(conflicted, c.Path)
	}
	for _, f := range r.Failed {
		res.Failed = append(res.Failed, control.Failure{Path: f.Path, Reason: f.Reason})
	}
	b.invalidate(r.Committed)
	if len(r.Committed) > 0 {
		b.publish(control.Event{Kind: "committed", Paths: r.Committed})
	}
	if len(conflicted) > 0 {
		b.publish(control.Event{Kind: "conflict", Paths: conflicted})
	}
	return res, nil
}

func (b *Backend) Discard(ctx context.Context, paths []string) (control.DiscardResult, error) {
	rel, err := b.relPathsOrAll(paths)
	if err != nil {
		return control.DiscardResult{}, err
	}
	done := b.eng.Discard(rel, ctlCaller(ctx))
	b.invalidate(done)
	if len(done) > 0 {
		b.publish(control.Event{Kind: "discarded", Paths: done})
	}
	return control.DiscardResult{Discarded: nonNil(done)}, nil
}

func (b *Backend) Diff(ctx context.Context, paths []string) (control.DiffResult, error) {
	rel, err := b.relPathsOrAll(paths)
	if err != nil {
		return control.DiffResult{}, err
	}
	changes, err := b.eng.Diff(rel)
	if err != nil {
		return control.DiffResult{}, err
	}
	var buf bytes.Buffer
	if err := unidiff.Write(&buf, changes); err != nil {
		return control.DiffResult{}, err
	}
	return control.DiffResult{Diff: buf.String(), Files: len(changes)}, nil
}
