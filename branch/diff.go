package branch

import (
	"bytes"
	"context"
	"errors"
	"io"
	"syscall"

	"golang.org/x/sys/unix"

	"stagefs/control"
	"stagefs/internal/fdio"
	"stagefs/internal/unidiff"
	"stagefs/overlay"
)

// BranchDiff shows what branch p.Name changed since its fork point, as a
// unified diff against the fork point's versions or, with p.Against naming
// the parent, against the parent's versions now.
func (m *Manager) BranchDiff(ctx context.Context, p control.BranchDiffParams) (control.DiffResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.started(); err != nil {
		return control.DiffResult{}, err
	}
	r := m.recordLocked(p.Name)
	if r == nil {
		return control.DiffResult{}, control.Errorf(control.CodeNotFound, "no branch %q (stagefs branches lists them)", p.Name)
	}
	if p.Against != "" && p.Against != r.Parent {
		return control.DiffResult{}, control.Errorf(control.CodeInvalidParams, "branch %s was forked from %s: --against takes only %s", p.Name, r.Parent, r.Parent)
	}
	bv := m.views[r.Name]
	pv, err := m.viewLocked(r.Parent)
	if bv == nil || err != nil {
		return control.DiffResult{}, control.Errorf(control.CodeInvalidState, "branch %s or its parent %s is not served", r.Name, r.Parent)
	}
	scope := overlay.ForkScope(r.Fork)
	entries, err := bv.Snapshots.Entries(scope)
	if err != nil {
		return control.DiffResult{}, err
	}
	info, _ := bv.Snapshots.Lookup(scope)
	var skipped control.MergeResult
	paths, err := m.relPaths(p.Paths)
	if err != nil {
		return control.DiffResult{}, err
	}
	planned, _ := m.plan(bv, pv, entries, info.Uncaptured, overlay.MergeIntent{Paths: paths}, &skipped)
	var changes []unidiff.FileChange
	for _, c := range planned {
		if c.branch.same(c.fork) && !c.gone {
			continue
		}
		var old side
		if p.Against != "" || c.unknown {
			// A path whose version at the fork was not kept (the store
			// was full, or --no-capture) is shown against the parent's
			// version now: a "new file" patch that git apply would
			// refuse says less.
			old, err = viewSide(pv.Engine, c.path)
		} else {
			old, err = forkSide(bv, c.fork)
		}
		if err != nil {
			return control.DiffResult{}, err
		}
		now, err := viewSide(bv.Engine, c.path)
		if err != nil {
			return control.DiffResult{}, err
		}
		if old.mode == now.mode && bytes.Equal(old.data, now.data) {
			continue
		}
		changes = append(changes, unidiff.FileChange{Path: c.path, Old: old.data, New: now.data, OldMode: old.mode, NewMode: now.mode})
	}
	var buf bytes.Buffer
	if err := unidiff.Write(&buf, changes); err != nil {
		return control.DiffResult{}, err
	}
	return control.DiffResult{Diff: buf.String(), Files: len(changes)}, nil
}

// side is one side of a diff of a path: its content (a symlink's target)
// and its mode as git stores it, 0 when it is no file or symlink.
type side struct {
	data []byte
	mode uint32
}

func gitMode(perm uint32) uint32 {
	if perm&0o111 != 0 {
		return 0o100755
	}
	return 0o100644
}

// forkSide is a path's version at the fork point: its body from the
// fork point's snapshot, or, rebuilt for a renamed directory, from where
// the branch has it now.
func forkSide(bv *View, v version) (side, error) {
	switch v.kind {
	case "file":
		if v.at != "" {
			return viewSide(bv.Engine, v.at)
		}
		body, err := bv.Snapshots.OpenBody(v.hash)
		if err != nil {
			return side{}, err
		}
		defer body.Close()
		data, err := io.ReadAll(body)
		return side{data: data, mode: gitMode(v.mode)}, err
	case "symlink":
		return side{data: []byte(v.target), mode: 0o120000}, nil
	}
	return side{}, nil
}

// viewSide is what eng's view has at p now.
func viewSide(eng *overlay.Engine, p string) (side, error) {
	st, err := eng.Stat(p)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
		return side{}, nil
	}
	if err != nil {
		return side{}, err
	}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		f, err := eng.Open(p, unix.O_RDONLY, overlay.Caller{})
		if err != nil {
			return side{}, err
		}
		defer eng.Release(p, f, overlay.Caller{})
		data, err := io.ReadAll(fdio.Reader(f.Fd))
		return side{data: data, mode: gitMode(st.Mode)}, err
	case syscall.S_IFLNK:
		target, err := eng.Readlink(p)
		return side{data: []byte(target), mode: 0o120000}, err
	}
	return side{}, nil
}
