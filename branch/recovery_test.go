package branch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"stagefs/control"
	"stagefs/journal"
	"stagefs/overlay"
	"stagefs/snapshot"
)

// openJournaled opens the main view like openStage does: with a journal,
// its unfinished merge read from it, checkpointed when there is none.
func openJournaled(t *testing.T, ws, state string) (View, *journal.Journal) {
	t.Helper()
	jr, info, err := journal.Open(filepath.Join(state, "journal.log"), journal.Options{NoSync: true})
	require.NoError(t, err)
	_, in, err := overlay.Unfinished(jr, info.CheckpointSeq)
	require.NoError(t, err)
	if in == nil {
		require.NoError(t, jr.Checkpoint())
	}
	snaps, err := snapshot.Open(filepath.Join(state, "snapshots"), snapshot.Options{NoSync: true})
	require.NoError(t, err)
	eng, err := overlay.New(overlay.Options{Workspace: ws, StateDir: state, Mode: overlay.Staged, Snapshots: snaps, Journal: jr})
	require.NoError(t, err)
	closed := false
	return View{Engine: eng, Snapshots: snaps, StateDir: state, UnfinishedMerge: in, Close: func() {
		if !closed {
			closed = true
			eng.Close()
			jr.Close()
		}
	}}, jr
}

// A merge interrupted after its last path was applied is finished at the
// next start with nothing left to write: its merge_begin must be ended all
// the same, or every later start forces that old intent again.
func TestFinishedMergeLeavesNoStaleIntent(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	ctx := context.Background()
	main, _ := openJournaled(t, ws, state)
	m := NewManager(Config{State: state, Logf: t.Logf})
	require.NoError(t, m.Start(main, &engineHost{t: t, ws: ws}))
	_, err := m.CreateBranch(ctx, control.BranchParams{Name: "b"})
	require.NoError(t, err)
	write(t, m.served("b").Engine, "f", "branch 1\n")
	// As if killed after applying f, before merge_end.
	require.NoError(t, main.Engine.NoteMergeBegin(overlay.MergeIntent{Branch: "b", Paths: []string{"f"}}))
	write(t, main.Engine, "f", "branch 1\n")
	m.Close()
	main.Close()

	// Restart: the merge is finished (nothing left to write).
	main, _ = openJournaled(t, ws, state)
	require.NotNil(t, main.UnfinishedMerge)
	m = NewManager(Config{State: state, Logf: t.Logf})
	require.NoError(t, m.Start(main, &engineHost{t: t, ws: ws}))
	// Later work: the parent and the branch both change f.
	write(t, main.Engine, "f", "main's own edit\n")
	write(t, m.served("b").Engine, "f", "branch 2\n")
	m.Close()
	main.Close()

	// A clean restart must not merge anything by itself.
	main, _ = openJournaled(t, ws, state)
	require.Nil(t, main.UnfinishedMerge, "the finished merge is still unfinished in the journal")
	m = NewManager(Config{State: state, Logf: t.Logf})
	require.NoError(t, m.Start(main, &engineHost{t: t, ws: ws}))
	defer func() { m.Close(); main.Close() }()
	require.Equal(t, "main's own edit\n", read(t, main.Engine, "f"))
}

// The intent lists the paths free of conflicts; finishing it must not
// force what lies below a listed directory: those were conflicts.
func TestFinishingForcesNoConflictBelowAListedDir(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	ctx := context.Background()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "d"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "d/x"), []byte("base\n"), 0o644))
	main, _ := openJournaled(t, ws, state)
	m := NewManager(Config{State: state, Logf: t.Logf})
	require.NoError(t, m.Start(main, &engineHost{t: t, ws: ws}))
	_, err := m.CreateBranch(ctx, control.BranchParams{Name: "b"})
	require.NoError(t, err)
	b := m.served("b").Engine
	mode := uint32(0o700)
	_, err = b.Setattr("d", -1, overlay.SetAttr{Mode: &mode}, proc)
	require.NoError(t, err)
	write(t, b, "d/x", "branch\n")
	write(t, main.Engine, "d/x", "main\n") // a conflict
	// What Merge journals for this (d applied, d/x a conflict), then a
	// kill right after its begin record.
	require.NoError(t, main.Engine.NoteMergeBegin(overlay.MergeIntent{Branch: "b", Paths: []string{"d"}}))
	m.Close()
	main.Close()
	main, _ = openJournaled(t, ws, state)
	m = NewManager(Config{State: state, Logf: t.Logf})
	require.NoError(t, m.Start(main, &engineHost{t: t, ws: ws}))
	defer func() { m.Close(); main.Close() }()
	require.Equal(t, "main\n", read(t, main.Engine, "d/x"), "finishing the merge forced a conflict it had kept out")
}

// A path the merge reports as a conflict must stay as the parent has it:
// here the branch replaced the file a by a directory a holding x, and the
// parent edited a.
func TestConflictKeptFromMakeParents(t *testing.T) {
	m, main, ws := setup(t)
	ctx := context.Background()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "a"), []byte("base a\n"), 0o644))
	_, err := m.CreateBranch(ctx, control.BranchParams{Name: "b"})
	require.NoError(t, err)
	b := m.served("b").Engine
	require.NoError(t, b.Unlink("a", proc))
	_, err = b.Mkdir("a", 0o755, proc)
	require.NoError(t, err)
	write(t, b, "a/x", "x\n")
	write(t, main.Engine, "a", "the parent's edit of a\n")

	res, err := m.Merge(ctx, control.MergeParams{Name: "b"})
	require.NoError(t, err)
	t.Logf("merged %v conflicts %v failed %v", res.Merged, res.Conflicts, res.Failed)
	require.NotEmpty(t, res.Conflicts)
	require.Equal(t, "the parent's edit of a\n", read(t, main.Engine, "a"), "the conflict at a was overwritten")
}

// failingHost fails to open one branch, as a mount or socket error would.
type failingHost struct {
	engineHost
	fail string
}

func (h *failingHost) OpenBranch(name, stateDir, mountpoint string) (View, error) {
	if name == h.fail {
		return View{}, errors.New("mount: device or resource busy")
	}
	return h.engineHost.OpenBranch(name, stateDir, mountpoint)
}

// A branch that cannot be served at one start (its mount is busy, its
// socket path too long) must not lose its pending set.
func TestStartKeepsABranchItCannotOpen(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	ctx := context.Background()
	main := openView(t, ws, state)
	m := NewManager(Config{State: state, Logf: t.Logf})
	require.NoError(t, m.Start(main, &engineHost{t: t, ws: ws}))
	_, err := m.CreateBranch(ctx, control.BranchParams{Name: "b"})
	require.NoError(t, err)
	write(t, m.served("b").Engine, "work", "an hour of the agent's work\n")
	m.Close()
	main.Close()

	main = openView(t, ws, state)
	m = NewManager(Config{State: state, Logf: t.Logf})
	require.Error(t, m.Start(main, &failingHost{engineHost: engineHost{t: t, ws: ws}, fail: "b"}))
	m.Close()
	main.Close()
	require.DirExists(t, filepath.Join(state, "branches", "b", "upper"), "the branch's pending set was removed")
}

// A conflict's fork version must survive the move of the fork point even
// when a process in the branch holds the file open for writing through
// passthrough (captureHeld runs when the next fork point opens).
func TestConflictSurvivesAHeldWriter(t *testing.T) {
	m, main, _ := setup(t)
	ctx := context.Background()
	_, err := m.CreateBranch(ctx, control.BranchParams{Name: "b"})
	require.NoError(t, err)
	b := m.served("b").Engine
	write(t, b, "g", "branch g\n")
	write(t, main.Engine, "g", "main g\n")
	// An agent's process keeps g open for writing (passthrough).
	b.SetHeldWriters(func() []overlay.HeldWriter { return []overlay.HeldWriter{{Path: "g", Pid: os.Getpid()}} })
	res, err := m.Merge(ctx, control.MergeParams{Name: "b"})
	require.NoError(t, err)
	require.Len(t, res.Conflicts, 1)
	res, err = m.Merge(ctx, control.MergeParams{Name: "b", Force: true})
	require.NoError(t, err)
	require.Equal(t, []string{"g"}, res.Merged, "the conflict vanished: g now looks unchanged in the branch")
	require.Equal(t, "branch g\n", read(t, main.Engine, "g"))
}
