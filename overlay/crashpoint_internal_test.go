package overlay

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A crash between the two steps of a rename (the meta written for the
// destination, then the entry moved) used to leave the entry where it was
// with the destination's baseline: its commit then reported a conflict
// with a workspace nobody had changed (found by the crash battery: a
// writer's save.tmp, caught before its rename over save.txt).

// crashEngine opens an engine over ws and state that stops, as if killed,
// at the crash point named die.
func crashEngine(t *testing.T, ws, state, die string) *Engine {
	t.Helper()
	e, err := New(Options{Workspace: ws, StateDir: state, Mode: Staged})
	require.NoError(t, err)
	e.die = func(point string) bool { return point == die }
	return e
}

// restartAfterCrash opens a new engine on the same state dir. The crashed
// one is left as it is (a killed daemon flushes nothing), and only its
// descriptors are closed.
func restartAfterCrash(t *testing.T, crashed *Engine) *Engine {
	t.Helper()
	unix.Close(crashed.base.fd)
	unix.Close(crashed.upper.fd)
	unix.Close(crashed.workFd)
	e, err := New(crashed.opts)
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	return e
}

func writeNew(t *testing.T, e *Engine, p, content string) {
	t.Helper()
	f, _, err := e.Create(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644, Caller{})
	require.NoError(t, err)
	_, err = unix.Write(f.Fd, []byte(content))
	require.NoError(t, err)
	e.Release(p, f, Caller{})
}

func readView(t *testing.T, e *Engine, p string) string {
	t.Helper()
	f, err := e.Open(p, unix.O_RDONLY, Caller{})
	require.NoError(t, err, "open %s", p)
	defer e.Release(p, f, Caller{})
	buf := make([]byte, 4096)
	n, err := unix.Pread(f.Fd, buf, 0)
	require.NoError(t, err)
	return string(buf[:n])
}

func TestCrashInRenameOverWorkspaceFile(t *testing.T) {
	for _, tc := range []struct{ name, src, dst string }{
		{"same dir", "w/save.tmp", "w/save.txt"},
		{"same name, other dir", "a/x", "w/x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, state := t.TempDir(), t.TempDir()
			require.NoError(t, os.MkdirAll(filepath.Join(ws, "w"), 0o755))
			require.NoError(t, os.MkdirAll(filepath.Join(ws, "a"), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(ws, tc.dst), []byte("old\n"), 0o644))

			e := crashEngine(t, ws, state, "rename")
			writeNew(t, e, tc.src, "new\n")
			require.ErrorIs(t, e.Rename(tc.src, tc.dst, 0, Caller{}), errDied)

			e = restartAfterCrash(t, e)
			require.Equal(t, "new\n", readView(t, e, tc.src), "the rename did not happen")
			require.Equal(t, "old\n", readView(t, e, tc.dst))
			res := e.Commit(nil, false, Caller{})
			require.Empty(t, res.Conflicts, "nobody changed the workspace")
			require.Empty(t, res.Failed)
			require.Equal(t, []string{tc.src}, res.Committed)
			b, err := os.ReadFile(filepath.Join(ws, tc.src))
			require.NoError(t, err)
			require.Equal(t, "new\n", string(b))
			b, err = os.ReadFile(filepath.Join(ws, tc.dst))
			require.NoError(t, err)
			require.Equal(t, "old\n", string(b))
		})
	}
}

func TestCrashInRenameOfWorkspaceDir(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "d"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "d", "f"), []byte("f\n"), 0o644))

	e := crashEngine(t, ws, state, "rename")
	require.ErrorIs(t, e.Rename("d", "e", 0, Caller{}), errDied)

	e = restartAfterCrash(t, e)
	require.Equal(t, "f\n", readView(t, e, "d/f"))
	_, err := e.Stat("e")
	require.ErrorIs(t, err, syscall.ENOENT)
	res := e.Commit(nil, false, Caller{})
	require.Empty(t, res.Conflicts)
	require.Empty(t, res.Failed)
	_, err = os.Stat(filepath.Join(ws, "d", "f"))
	require.NoError(t, err, "the workspace directory stays where it was")
	_, err = os.Stat(filepath.Join(ws, "e"))
	require.ErrorIs(t, err, os.ErrNotExist)

	// The directory still renames, and commits, as usual afterwards.
	require.NoError(t, e.Rename("d", "e", 0, Caller{}))
	res = e.Commit(nil, false, Caller{})
	require.Empty(t, res.Conflicts)
	require.Empty(t, res.Failed)
	b, err := os.ReadFile(filepath.Join(ws, "e", "f"))
	require.NoError(t, err)
	require.Equal(t, "f\n", string(b))
}

// Under a renamed directory the view's path is not the workspace's: the
// rebase must look where the base has the entry (a/f for b/f after mv a b).
func TestCrashInRenameUnderRenamedDir(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "a", "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "a", "f"), []byte("f\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "a", "sub", "s"), []byte("s\n"), 0o644))

	e := crashEngine(t, ws, state, "")
	require.NoError(t, e.Rename("a", "b", 0, Caller{}))
	f, err := e.Open("b/f", unix.O_WRONLY|unix.O_TRUNC, Caller{})
	require.NoError(t, err)
	_, err = unix.Write(f.Fd, []byte("edited\n"))
	require.NoError(t, err)
	e.Release("b/f", f, Caller{})
	e.die = func(point string) bool { return point == "rename" }
	require.ErrorIs(t, e.Rename("b/f", "b/g", 0, Caller{}), errDied)
	require.ErrorIs(t, e.Rename("b/sub", "c", 0, Caller{}), errDied)

	e = restartAfterCrash(t, e)
	require.Equal(t, "edited\n", readView(t, e, "b/f"))
	require.Equal(t, "s\n", readView(t, e, "b/sub/s"))
	res := e.Commit(nil, false, Caller{})
	require.Empty(t, res.Conflicts, "nobody changed the workspace")
	require.Empty(t, res.Failed)
	b, err := os.ReadFile(filepath.Join(ws, "b", "f"))
	require.NoError(t, err)
	require.Equal(t, "edited\n", string(b))
	b, err = os.ReadFile(filepath.Join(ws, "b", "sub", "s"))
	require.NoError(t, err)
	require.Equal(t, "s\n", string(b))
	_, err = os.Stat(filepath.Join(ws, "a"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// Moving a renamed directory back where the workspace has it clears its
// redirect in the meta written for the destination; a crash before the
// move must not lose the redirect at the old place, or the workspace's
// entries vanish from the view and the directory can never commit.
func TestCrashInRenameBackOfRenamedDir(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "x"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "x", "f"), []byte("f\n"), 0o644))

	e := crashEngine(t, ws, state, "")
	require.NoError(t, e.Rename("x", "a", 0, Caller{}))
	writeNew(t, e, "a/new", "new\n")
	e.die = func(point string) bool { return point == "rename" }
	require.ErrorIs(t, e.Rename("a", "x", 0, Caller{}), errDied)

	e = restartAfterCrash(t, e)
	require.Equal(t, "f\n", readView(t, e, "a/f"), "the workspace's x/f, seen at a")
	require.Equal(t, "new\n", readView(t, e, "a/new"))
	_, err := e.Stat("x")
	require.ErrorIs(t, err, syscall.ENOENT)
	res := e.Commit(nil, false, Caller{})
	require.Empty(t, res.Conflicts)
	require.Empty(t, res.Failed)
	for p, want := range map[string]string{"a/f": "f\n", "a/new": "new\n"} {
		b, err := os.ReadFile(filepath.Join(ws, p))
		require.NoError(t, err)
		require.Equal(t, want, string(b))
	}
	_, err = os.Stat(filepath.Join(ws, "x"))
	require.ErrorIs(t, err, os.ErrNotExist)
}
