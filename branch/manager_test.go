package branch

import (
	"context"
	"os"
	"path/filepath"
	"testing"

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
	m := NewManager(Config{State: state, Logf: t.Logf})
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
	b := m.views["b"].Engine
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
	b := m.views["b"].Engine
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
	b := m.views["b"].Engine
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
