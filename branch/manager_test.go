package branch

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"stagefs/control"
	"stagefs/overlay"
	"stagefs/snapshot"
)

// engineHost opens views as bare engines (no mount, no sockets): the
// manager's logic under the race detector and the lock-order check.
type engineHost struct {
	t  *testing.T
	ws string
}

func openView(t *testing.T, ws, state string) View {
	t.Helper()
	snaps, err := snapshot.Open(filepath.Join(state, "snapshots"), snapshot.Options{NoSync: true})
	require.NoError(t, err)
	eng, err := overlay.New(overlay.Options{Workspace: ws, StateDir: state, Mode: overlay.Staged, Snapshots: snaps})
	require.NoError(t, err)
	closed := false
	return View{Engine: eng, Snapshots: snaps, StateDir: state, Close: func() {
		if !closed {
			closed = true
			eng.Close()
		}
	}}
}

func (h *engineHost) OpenBranch(name, stateDir, mountpoint string) (View, error) {
	return openView(h.t, h.ws, stateDir), nil
}

// served waits for what a fork does after it answered and returns the
// view name as served.
func (m *Manager) served(name string) *View {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.views[name]
}

// proc is a process of the test: its changes are captured.
var proc = overlay.Caller{Pid: os.Getpid()}

func write(t *testing.T, e *overlay.Engine, p, content string) {
	t.Helper()
	f, _, err := e.Create(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644, proc)
	require.NoError(t, err)
	_, err = unix.Write(f.Fd, []byte(content))
	require.NoError(t, err)
	e.Release(p, f, proc)
}

func read(t *testing.T, e *overlay.Engine, p string) string {
	t.Helper()
	f, err := e.Open(p, unix.O_RDONLY, overlay.Caller{})
	require.NoError(t, err)
	defer e.Release(p, f, overlay.Caller{})
	buf := make([]byte, 4096)
	n, err := unix.Read(f.Fd, buf)
	require.NoError(t, err)
	return string(buf[:n])
}

func setup(t *testing.T) (*Manager, View, string) {
	ws, state := t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "f"), []byte("base\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "g"), []byte("g\n"), 0o644))
	main := openView(t, ws, state)
	m := NewManager(Config{State: state, Workspace: ws, Logf: t.Logf})
	require.NoError(t, m.Start(main, &engineHost{t: t, ws: ws}))
	t.Cleanup(func() { m.Close(); main.Close() })
	return m, main, ws
}

func TestMergeAppliesConflictsAndMovesTheForkPoint(t *testing.T) {
	m, main, ws := setup(t)
	ctx := context.Background()
	write(t, main.Engine, "pending-at-fork", "p\n")
	_, err := m.CreateBranch(ctx, control.BranchParams{Name: "b"})
	require.NoError(t, err)
	b := m.served("b").Engine
	require.Equal(t, "p\n", read(t, b, "pending-at-fork"), "the fork has the parent's pending set")

	write(t, b, "f", "branch\n")
	write(t, b, "g", "branch g\n")
	write(t, main.Engine, "g", "main g\n") // the parent changed g too
	require.NoError(t, b.Unlink("pending-at-fork", proc))

	res, err := m.Merge(ctx, control.MergeParams{Name: "b"})
	require.NoError(t, err)
	require.Equal(t, []string{"f", "pending-at-fork"}, res.Merged)
	require.Len(t, res.Conflicts, 1)
	require.Equal(t, "g", res.Conflicts[0].Path)
	require.Equal(t, "branch\n", read(t, main.Engine, "f"))
	require.Equal(t, "main g\n", read(t, main.Engine, "g"))
	_, err = main.Engine.Stat("pending-at-fork")
	require.ErrorIs(t, err, unix.ENOENT)
	ws0, err := os.ReadFile(filepath.Join(ws, "f"))
	require.NoError(t, err)
	require.Equal(t, "base\n", string(ws0), "the workspace is untouched")

	// The fork point moved: the parent's later change of f is not the
	// branch's, and g still conflicts.
	write(t, main.Engine, "f", "main again\n")
	res, err = m.Merge(ctx, control.MergeParams{Name: "b"})
	require.NoError(t, err)
	require.Empty(t, res.Merged)
	require.Len(t, res.Conflicts, 1)
	require.Equal(t, "main again\n", read(t, main.Engine, "f"))

	res, err = m.Merge(ctx, control.MergeParams{Name: "b", Force: true})
	require.NoError(t, err)
	require.Equal(t, []string{"g"}, res.Merged)
	require.Equal(t, "branch g\n", read(t, main.Engine, "g"))
}

// A merge a crash stopped after its intent was journaled is finished at
// the next start: what it applied already counts as merged, the rest is
// applied, a path it left half written included.
func TestUnfinishedMergeIsFinishedAtStart(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	main := openView(t, ws, state)
	m := NewManager(Config{State: state, Logf: t.Logf})
	require.NoError(t, m.Start(main, &engineHost{t: t, ws: ws}))
	ctx := context.Background()
	_, err := m.CreateBranch(ctx, control.BranchParams{Name: "b"})
	require.NoError(t, err)
	b := m.served("b").Engine
	write(t, b, "one", "1\n")
	write(t, b, "two", "2\n")
	// As if the merge had applied "one", truncated "two" and died there.
	write(t, main.Engine, "one", "1\n")
	write(t, main.Engine, "two", "")
	m.Close()
	main.Close()

	main = openView(t, ws, state)
	main.UnfinishedMerge = &overlay.MergeIntent{Branch: "b", Paths: []string{"one", "two"}}
	m = NewManager(Config{State: state, Logf: t.Logf})
	require.NoError(t, m.Start(main, &engineHost{t: t, ws: ws}))
	defer func() { m.Close(); main.Close() }()
	require.Equal(t, "1\n", read(t, main.Engine, "one"))
	require.Equal(t, "2\n", read(t, main.Engine, "two"))
	res, err := m.Merge(ctx, control.MergeParams{Name: "b"})
	require.NoError(t, err)
	require.Empty(t, res.Merged, "nothing left to merge")
	require.Empty(t, res.Conflicts)
}

func TestBranchNamesAndDrops(t *testing.T) {
	m, _, _ := setup(t)
	ctx := context.Background()
	_, err := m.CreateBranch(ctx, control.BranchParams{Name: "a"})
	require.NoError(t, err)
	_, err = m.CreateBranch(ctx, control.BranchParams{Name: "a"})
	require.ErrorContains(t, err, "exists already")
	_, err = m.CreateBranch(ctx, control.BranchParams{Name: "c", From: "nope"})
	require.ErrorContains(t, err, "no branch")
	_, err = m.CreateBranch(ctx, control.BranchParams{Name: "c", From: "a"})
	require.NoError(t, err)
	_, err = m.DropBranch(ctx, control.BranchParams{Name: "a"})
	require.ErrorContains(t, err, "drop that first")
	_, err = m.Merge(ctx, control.MergeParams{Name: "c", Into: "main"})
	require.ErrorContains(t, err, "merges only into a")
	for _, n := range []string{"c", "a"} {
		_, err = m.DropBranch(ctx, control.BranchParams{Name: n})
		require.NoError(t, err)
	}
	require.Empty(t, m.Infos())
	for _, bad := range []string{"", "main", ".x", "-x", "a/b", "..", string(make([]byte, 65))} {
		require.Error(t, control.BranchParams{Name: bad}.Validate(), "%q", bad)
	}
}

func TestBranchDiff(t *testing.T) {
	m, main, _ := setup(t)
	ctx := context.Background()
	_, err := m.CreateBranch(ctx, control.BranchParams{Name: "b"})
	require.NoError(t, err)
	b := m.served("b").Engine
	write(t, b, "f", "branch\n")
	write(t, b, "new", "new\n")
	write(t, main.Engine, "f", "main\n")

	d, err := m.BranchDiff(ctx, control.BranchDiffParams{Name: "b"})
	require.NoError(t, err)
	require.Equal(t, 2, d.Files)
	require.Contains(t, d.Diff, "-base\n+branch\n")
	require.Contains(t, d.Diff, "new file mode 100644")

	d, err = m.BranchDiff(ctx, control.BranchDiffParams{Name: "b", Against: "main", Paths: []string{"f"}})
	require.NoError(t, err)
	require.Equal(t, 1, d.Files)
	require.Contains(t, d.Diff, "-main\n+branch\n")

	_, err = m.BranchDiff(ctx, control.BranchDiffParams{Name: "b", Against: "other"})
	require.ErrorContains(t, err, "--against takes only main")
}

// A directory the branch renamed merges as what it is to the parent:
// everything under the old name gone, everything under the new one there,
// with the changes made in it before and after the rename.
func TestMergeOfADirectoryRename(t *testing.T) {
	m, main, ws := setup(t)
	ctx := context.Background()
	for p, c := range map[string]string{"d/a": "a\n", "d/b": "b\n", "d/sub/c": "c\n"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(ws, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(ws, p), []byte(c), 0o644))
	}
	_, err := m.CreateBranch(ctx, control.BranchParams{Name: "b"})
	require.NoError(t, err)
	b := m.served("b").Engine
	write(t, b, "d/a", "a before the move\n")
	require.NoError(t, b.Rename("d", "e", 0, proc))
	write(t, b, "e/b", "b after the move\n")
	require.NoError(t, b.Unlink("e/sub/c", proc))
	write(t, b, "e/new", "new\n")

	// The diff since the fork: d's files as they were at the fork
	// deleted, e's as they are now created.
	d, err := m.BranchDiff(ctx, control.BranchDiffParams{Name: "b"})
	require.NoError(t, err)
	require.Equal(t, 6, d.Files, d.Diff)
	for _, want := range []string{"--- a/d/a\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n", "--- a/d/b\n+++ /dev/null\n@@ -1 +0,0 @@\n-b\n", "--- a/d/sub/c\n",
		"+++ b/e/a\n@@ -0,0 +1 @@\n+a before the move\n", "+++ b/e/b\n@@ -0,0 +1 @@\n+b after the move\n", "+++ b/e/new\n"} {
		require.Contains(t, d.Diff, want)
	}

	res, err := m.Merge(ctx, control.MergeParams{Name: "b"})
	require.NoError(t, err)
	require.Empty(t, res.Conflicts)
	require.Empty(t, res.Failed)
	for p, want := range map[string]string{"e/a": "a before the move\n", "e/b": "b after the move\n", "e/new": "new\n"} {
		require.Equal(t, want, read(t, main.Engine, p), p)
	}
	st, err := main.Engine.Stat("e/sub")
	require.NoError(t, err)
	require.True(t, st.Mode&unix.S_IFMT == unix.S_IFDIR)
	for _, p := range []string{"d", "e/sub/c"} {
		_, err := main.Engine.Stat(p)
		require.ErrorIs(t, err, unix.ENOENT, p)
	}
	// Nothing left to merge: the rename's entries left the fork point.
	res, err = m.Merge(ctx, control.MergeParams{Name: "b"})
	require.NoError(t, err)
	require.Empty(t, res.Merged)
	require.Empty(t, res.Conflicts)
}

// A file the parent added under a directory the branch renamed away is a
// conflict: the merge would remove it.
func TestMergeOfADirectoryRenameConflicts(t *testing.T) {
	m, main, ws := setup(t)
	ctx := context.Background()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "d"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "d/a"), []byte("a\n"), 0o644))
	_, err := m.CreateBranch(ctx, control.BranchParams{Name: "b"})
	require.NoError(t, err)
	b := m.served("b").Engine
	require.NoError(t, b.Rename("d", "e", 0, proc))
	write(t, main.Engine, "d/extra", "the parent's\n")

	res, err := m.Merge(ctx, control.MergeParams{Name: "b"})
	require.NoError(t, err)
	require.Len(t, res.Conflicts, 1)
	require.Equal(t, "d/extra", res.Conflicts[0].Path)
	require.Empty(t, res.Merged, "a rename merges whole or not at all")
	require.Equal(t, "the parent's\n", read(t, main.Engine, "d/extra"))
	require.Equal(t, "a\n", read(t, main.Engine, "d/a"))
	_, err = main.Engine.Stat("e")
	require.ErrorIs(t, err, unix.ENOENT)
	res, err = m.Merge(ctx, control.MergeParams{Name: "b", Force: true})
	require.NoError(t, err)
	require.Empty(t, res.Failed)
	require.Equal(t, "a\n", read(t, main.Engine, "e/a"))
	_, err = main.Engine.Stat("d")
	require.ErrorIs(t, err, unix.ENOENT)
}

// Paths reach a merge as a user types them: with a trailing slash, a
// leading "./", or absolute under the workspace.
func TestMergePathsAsTyped(t *testing.T) {
	m, main, ws := setup(t)
	ctx := context.Background()
	_, err := m.CreateBranch(ctx, control.BranchParams{Name: "b"})
	require.NoError(t, err)
	b := m.served("b").Engine
	_, err = b.Mkdir("src", 0o755, proc)
	require.NoError(t, err)
	write(t, b, "src/a", "a\n")
	write(t, b, "f", "branch f\n")
	write(t, b, "g", "branch g\n")
	res, err := m.Merge(ctx, control.MergeParams{Name: "b", Paths: []string{"src/", "./f", filepath.Join(ws, "g")}})
	require.NoError(t, err)
	require.Equal(t, []string{"f", "g", "src", "src/a"}, res.Merged)
	require.Equal(t, "a\n", read(t, main.Engine, "src/a"))
	_, err = m.Merge(ctx, control.MergeParams{Name: "b", Paths: []string{"/etc/passwd"}})
	require.ErrorContains(t, err, "outside the workspace")
	_, err = m.Merge(ctx, control.MergeParams{Name: "b", Paths: []string{"../x"}})
	require.Error(t, err)
}

// A fork answers at its instant and copies after, while the parent goes
// on: a change the parent makes meanwhile is not in the branch, and a
// listing of the branches waits for the branch to be served.
func TestForkAnswersFirstAndTheParentGoesOn(t *testing.T) {
	m, main, _ := setup(t)
	ctx := context.Background()
	write(t, main.Engine, "f", "at the fork\n")
	copying := make(chan struct{})
	m.forkedHook = func() { <-copying }
	_, err := m.CreateBranch(ctx, control.BranchParams{Name: "b"})
	require.NoError(t, err)
	require.Equal(t, []string{"b"}, func() (names []string) {
		for _, b := range m.Infos() {
			names = append(names, b.Name)
		}
		return names
	}(), "the branch is listed from its fork's instant")

	listed := make(chan control.ListBranchesResult)
	go func() {
		res, err := m.ListBranches(ctx)
		require.NoError(t, err)
		listed <- res
	}()
	// The parent does not wait for the copy, which has not begun.
	write(t, main.Engine, "f", "after the fork\n")
	write(t, main.Engine, "g", "after the fork\n")
	select {
	case <-listed:
		t.Fatal("branch/list answered before the new branch was served")
	case <-time.After(50 * time.Millisecond):
	}
	close(copying)
	res := <-listed
	require.Len(t, res.Branches, 1)
	require.Equal(t, 1, res.Branches[0].Pending, "the branch is listed with its pending set")
	b := m.served("b").Engine
	require.Equal(t, "at the fork\n", read(t, b, "f"))
	require.Equal(t, "g\n", read(t, b, "g"), "the workspace's g, as at the fork")
	require.Equal(t, "after the fork\n", read(t, main.Engine, "f"))
}

// A fork a crash stopped in its copy is not registered: the next start
// removes what it had made, and the name can be forked again.
func TestStartRemovesAForkACrashStopped(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	ctx := context.Background()
	main := openView(t, ws, state)
	m := NewManager(Config{State: state, Workspace: ws, Logf: t.Logf})
	require.NoError(t, m.Start(main, &engineHost{t: t, ws: ws}))
	write(t, main.Engine, "f", "main's f\n")
	_, err := m.CreateBranch(ctx, control.BranchParams{Name: "b"})
	require.NoError(t, err)
	require.NotNil(t, m.served("b"))
	m.Close()
	main.Close()
	// As a kill during a's copy leaves it: a directory, half made, that
	// the registry does not list.
	require.NoError(t, os.MkdirAll(filepath.Join(state, "branches", "a", "upper"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(state, "branches", "a", "upper", "half"), []byte("x"), 0o600))

	main = openView(t, ws, state)
	m = NewManager(Config{State: state, Workspace: ws, Logf: t.Logf})
	require.NoError(t, m.Start(main, &engineHost{t: t, ws: ws}))
	defer func() { m.Close(); main.Close() }()
	require.NoDirExists(t, filepath.Join(state, "branches", "a"))
	require.Equal(t, "main's f\n", read(t, m.served("b").Engine, "f"))
	_, err = m.CreateBranch(ctx, control.BranchParams{Name: "a"})
	require.NoError(t, err)
	require.Equal(t, "main's f\n", read(t, m.served("a").Engine, "f"))
}
