package overlay

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// stagedFiles makes dir with n new files dir/fNN holding "vNN".
func stagedFiles(t *testing.T, e *Engine, dir string, n int) {
	t.Helper()
	_, err := e.Mkdir(dir, 0o755, Caller{})
	require.NoError(t, err)
	for i := 0; i < n; i++ {
		writeNew(t, e, fmt.Sprintf("%s/f%02d", dir, i), fmt.Sprintf("v%02d", i))
	}
}

// A commit copies the files before it takes the engine lock. Whatever
// changes after those copies were made must still be what it commits, and
// the stage directory must never show in the view nor stay behind.
func TestCommitTakesPreparedCopiesOnlyIfUnchanged(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	e := openEngine(t, ws, state)
	defer e.Close()
	stagedFiles(t, e, "d", prepareMin+8)
	mode := uint32(0o600)
	hooked := false
	e.die = func(point string) bool {
		if point != "commit-prepared" || hooked {
			return false
		}
		hooked = true
		copies, err := os.ReadDir(filepath.Join(ws, e.stageDir()))
		require.NoError(t, err)
		require.Len(t, copies, prepareMin+8, "every file was copied before the lock")
		_, err = e.Stat(e.stageDir())
		require.ErrorIs(t, err, syscall.ENOENT, "the stage directory is not in the view")
		ents, err := e.ReadDir("")
		require.NoError(t, err)
		for _, d := range ents {
			require.NotEqual(t, e.stageDir(), d.Name)
		}
		// Changes after the copies: each must win over its copy.
		writeNew(t, e, "d/f01", "changed after the copy")
		_, err = e.Setattr("d/f02", -1, SetAttr{Mode: &mode}, Caller{})
		require.NoError(t, err)
		require.NoError(t, e.Unlink("d/f03", Caller{}))
		require.NoError(t, e.Rename("d/f04", "d/g04", 0, Caller{}))
		return false
	}
	res := e.Commit(nil, false, Caller{})
	require.True(t, hooked)
	require.Empty(t, res.Conflicts)
	require.Empty(t, res.Failed)
	require.Equal(t, "changed after the copy", readWorkspace(t, ws, "d/f01"))
	st, err := os.Stat(filepath.Join(ws, "d/f02"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(mode), st.Mode().Perm())
	require.NoFileExists(t, filepath.Join(ws, "d/f03"))
	require.NoFileExists(t, filepath.Join(ws, "d/f04"))
	require.Equal(t, "v04", readWorkspace(t, ws, "d/g04"))
	for i := 5; i < prepareMin+8; i++ {
		require.Equal(t, fmt.Sprintf("v%02d", i), readWorkspace(t, ws, fmt.Sprintf("d/f%02d", i)))
	}
	require.NoDirExists(t, filepath.Join(ws, e.stageDir()))
	for _, dir := range []string{"", "d"} {
		for _, name := range workspaceNames(t, ws, dir) {
			require.False(t, isCommitTemp(name), "%s left in %q", name, dir)
		}
	}
	require.Empty(t, e.Commit(nil, false, Caller{}).Committed, "nothing stays pending")
}

// A crash after the copies were made, before the commit began: nothing is
// committed, and the next start removes the copies.
func TestCrashAfterCommitPrepared(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	e := crashEngine(t, ws, state, "commit-prepared")
	stagedFiles(t, e, "d", prepareMin)
	require.PanicsWithValue(t, killedAt("commit-prepared"), func() { e.Commit(nil, false, Caller{}) })
	require.DirExists(t, filepath.Join(ws, e.stageDir()), "a kill leaves the copies")
	e = restartAfterCrash(t, e)
	require.NoDirExists(t, filepath.Join(ws, e.stageDir()))
	require.NoDirExists(t, filepath.Join(ws, "d"), "nothing was committed")
	res := e.Commit(nil, false, Caller{})
	require.Empty(t, res.Failed)
	require.Len(t, res.Committed, prepareMin+1)
	require.Equal(t, "v07", readWorkspace(t, ws, "d/f07"))
}

// While a commit lets go of the engine lock, a stat goes through, and a
// change waits for the commit's end.
func TestCommitLetsReadsInAndKeepsChangesOut(t *testing.T) {
	old := commitHoldMax
	commitHoldMax = 0
	t.Cleanup(func() { commitHoldMax = old })
	ws, state := t.TempDir(), t.TempDir()
	e := openEngine(t, ws, state)
	defer e.Close()
	stagedFiles(t, e, "d", 4)
	changed := make(chan error, 1)
	yields := 0
	e.die = func(point string) bool {
		if point != "commit-yield" {
			return false
		}
		yields++
		st, err := e.Stat("d/f00")
		require.NoError(t, err, "a stat during the commit")
		require.EqualValues(t, 3, st.Size)
		if yields == 1 {
			go func() {
				_, err := e.Mkdir("made-during-commit", 0o755, Caller{})
				changed <- err
			}()
			select {
			case err := <-changed:
				t.Fatalf("a change went through while the commit ran (err %v)", err)
			case <-time.After(50 * time.Millisecond):
			}
		}
		return false
	}
	res := e.Commit(nil, false, Caller{})
	require.Positive(t, yields)
	require.Len(t, res.Committed, 5)
	require.NoError(t, <-changed, "the change goes through after the commit")
	require.NoDirExists(t, filepath.Join(ws, "made-during-commit"), "and stays pending")
	st, err := e.Stat("made-during-commit")
	require.NoError(t, err)
	require.True(t, st.Mode&unix.S_IFMT == unix.S_IFDIR)
}
