package overlay

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// Crashes inside the operations that build a new upper entry, or that
// replace one upper entry with another. Each test stops an operation at a
// crash point, restarts on the same state dir, and checks that the view is
// one that some prefix of the acknowledged operations (plus, or not, the
// interrupted one) shows, and that a commit makes the workspace that view.

// openEngine opens an engine with no crash point armed yet: the operations
// that set a test up must run to the end.
func openEngine(t *testing.T, ws, state string) *Engine {
	t.Helper()
	e, err := New(Options{Workspace: ws, StateDir: state, Mode: Staged})
	require.NoError(t, err)
	return e
}

// dieAt makes e stop, as if killed, at the crash point named point.
func dieAt(e *Engine, point string) {
	e.die = func(q string) bool { return q == point }
}

// viewOf describes what the view shows at each of paths: "absent", "dir",
// "fifo", "file:<content>" or "symlink:<target>".
func viewOf(t *testing.T, e *Engine, paths ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range paths {
		st, err := e.Stat(p)
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
			out[p] = "absent"
			continue
		}
		require.NoError(t, err, "stat %s", p)
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			out[p] = "dir"
		case syscall.S_IFIFO:
			out[p] = "fifo"
		case syscall.S_IFREG:
			out[p] = "file:" + readView(t, e, p)
		case syscall.S_IFLNK:
			target, err := e.Readlink(p)
			require.NoError(t, err)
			out[p] = "symlink:" + target
		default:
			out[p] = "other"
		}
	}
	return out
}

// workspaceOf describes the workspace at paths the way viewOf does the view.
func workspaceOf(t *testing.T, ws string, paths ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range paths {
		full := filepath.Join(ws, p)
		fi, err := os.Lstat(full)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			out[p] = "absent"
			continue
		}
		require.NoError(t, err)
		switch {
		case fi.IsDir():
			out[p] = "dir"
		case fi.Mode()&os.ModeNamedPipe != 0:
			out[p] = "fifo"
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(full)
			require.NoError(t, err)
			out[p] = "symlink:" + target
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(full)
			require.NoError(t, err)
			out[p] = "file:" + string(b)
		default:
			out[p] = "other"
		}
	}
	return out
}

// requireOneOf fails unless got is one of the states in want.
func requireOneOf(t *testing.T, got map[string]string, want ...map[string]string) {
	t.Helper()
	for _, w := range want {
		if len(w) == len(got) {
			same := true
			for k, v := range w {
				if got[k] != v {
					same = false
				}
			}
			if same {
				return
			}
		}
	}
	t.Fatalf("the view after the crash is %v: no prefix of the operations shows that (want one of %v)", got, want)
}

// commitMatchesView commits everything and checks that the workspace then
// shows at paths what the view showed.
func commitMatchesView(t *testing.T, e *Engine, ws string, paths ...string) {
	t.Helper()
	view := viewOf(t, e, paths...)
	res := e.Commit(nil, false, Caller{})
	require.Empty(t, res.Conflicts, "nobody changed the workspace")
	require.Empty(t, res.Failed)
	require.Equal(t, view, workspaceOf(t, ws, paths...), "the workspace after the commit")
	require.Equal(t, view, viewOf(t, e, paths...), "the view after the commit")
}

// A new symlink, special file or directory made in place used to be
// caught without its meta: the symlink came back as a regular file holding
// its target, the FIFO as an empty regular file, and the directory as a
// mere container that commit never made in the workspace.
func TestCrashInPlaceNew(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(e *Engine) error
		made string
	}{
		{"symlink", func(e *Engine) error {
			_, err := e.Symlink("target", "x", Caller{})
			return err
		}, "symlink:target"},
		{"fifo", func(e *Engine) error {
			_, err := e.Mknod("x", syscall.S_IFIFO|0o644, 0, Caller{})
			return err
		}, "fifo"},
		{"dir", func(e *Engine) error {
			_, err := e.Mkdir("x", 0o755, Caller{})
			return err
		}, "dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, state := t.TempDir(), t.TempDir()
			e := openEngine(t, ws, state)
			dieAt(e, "place-new")
			require.ErrorIs(t, tc.make(e), errDied)

			e = restartAfterCrash(t, e)
			requireOneOf(t, viewOf(t, e, "x"), map[string]string{"x": "absent"}, map[string]string{"x": tc.made})
			commitMatchesView(t, e, ws, "x")
		})
	}
}

// `rm old; ln src old`: the link used to unlink the whiteout of old
// before it made the link, so a crash in between showed the workspace's
// old again, undoing an acknowledged delete.
func TestCrashInLinkOverWhiteout(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "old"), []byte("old\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "src"), []byte("src\n"), 0o644))

	e := openEngine(t, ws, state)
	require.NoError(t, e.Unlink("old", Caller{}))
	dieAt(e, "link-over-whiteout")
	_, err := e.Link("src", "old", Caller{})
	require.ErrorIs(t, err, errDied)

	e = restartAfterCrash(t, e)
	requireOneOf(t, viewOf(t, e, "old", "src"),
		map[string]string{"old": "absent", "src": "file:src\n"},
		map[string]string{"old": "file:src\n", "src": "file:src\n"})
	commitMatchesView(t, e, ws, "old", "src")
}

// `rm x; mkdir x; rmdir x` over a workspace file x: rmdir used to remove
// the directory before it put the whiteout of x back, so a crash in
// between showed the workspace's file x again.
func TestCrashInRmdirOverDeletedFile(t *testing.T) {
	for _, point := range []string{"whiteout", "whiteout-swapped"} {
		t.Run(point, func(t *testing.T) {
			ws, state := t.TempDir(), t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(ws, "x"), []byte("x\n"), 0o644))

			e := openEngine(t, ws, state)
			require.NoError(t, e.Unlink("x", Caller{}))
			_, err := e.Mkdir("x", 0o755, Caller{})
			require.NoError(t, err)
			dieAt(e, point)
			require.ErrorIs(t, e.Rmdir("x", Caller{}), errDied)

			e = restartAfterCrash(t, e)
			requireOneOf(t, viewOf(t, e, "x"), map[string]string{"x": "absent"}, map[string]string{"x": "dir"})
			commitMatchesView(t, e, ws, "x")
		})
	}
}

// `mv y x` over an empty directory x: rename used to remove x before it
// moved y there, so a crash in between showed the workspace's file x again
// (x made over a deleted file) or lost the new directory x.
func TestCrashInRenameOverEmptyDir(t *testing.T) {
	for _, tc := range []struct {
		name     string
		baseFile bool
	}{
		{"over a deleted workspace file", true},
		{"new directory", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, state := t.TempDir(), t.TempDir()
			if tc.baseFile {
				require.NoError(t, os.WriteFile(filepath.Join(ws, "x"), []byte("x\n"), 0o644))
			}

			e := openEngine(t, ws, state)
			if tc.baseFile {
				require.NoError(t, e.Unlink("x", Caller{}))
			}
			_, err := e.Mkdir("x", 0o755, Caller{})
			require.NoError(t, err)
			_, err = e.Mkdir("y", 0o755, Caller{})
			require.NoError(t, err)
			writeNew(t, e, "y/f", "f\n")
			dieAt(e, "rename")
			require.ErrorIs(t, e.Rename("y", "x", 0, Caller{}), errDied)

			e = restartAfterCrash(t, e)
			paths := []string{"x", "x/f", "y", "y/f"}
			requireOneOf(t, viewOf(t, e, paths...),
				map[string]string{"x": "dir", "x/f": "absent", "y": "dir", "y/f": "file:f\n"},
				map[string]string{"x": "dir", "x/f": "file:f\n", "y": "absent", "y/f": "absent"})
			commitMatchesView(t, e, ws, paths...)
		})
	}
}
