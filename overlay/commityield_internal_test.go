package overlay

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every yield of a commit must leave the view whole: a path the view
// showed before the commit stays visible with its content throughout.
func TestCommitYieldsKeepOpaqueDirectoriesWhole(t *testing.T) {
	old := commitHoldMax
	commitHoldMax = 0
	t.Cleanup(func() { commitHoldMax = old })
	ws, state := t.TempDir(), t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "d"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "d/old"), []byte("old"), 0o644))
	e := openEngine(t, ws, state)
	defer e.Close()
	require.NoError(t, e.Unlink("d/old", Caller{}))
	require.NoError(t, e.Rmdir("d", Caller{}))
	_, err := e.Mkdir("d", 0o755, Caller{})
	require.NoError(t, err)
	writeNew(t, e, "d/f", "new")
	var missing []int
	yields := 0
	e.die = func(point string) bool {
		if point != "commit-yield" {
			return false
		}
		yields++
		if _, err := e.Stat("d/f"); err != nil {
			missing = append(missing, yields)
		}
		return false
	}
	res := e.Commit(nil, false, Caller{})
	require.Empty(t, res.Failed)
	require.Empty(t, res.Conflicts)
	require.Equal(t, "new", readView(t, e, "d/f"))
	require.Empty(t, missing, "d/f vanished from the view at yields %v of %d", missing, yields)
}

// A branch opened over the same workspace while the main view's commit
// prepares its copies (stagefs branch during a long commit) must not
// break that commit.
func TestAnotherEngineDuringCommitPrepare(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	e := openEngine(t, ws, state)
	defer e.Close()
	stagedFiles(t, e, "d", prepareMin+4)
	e.die = func(point string) bool {
		if point == "commit-prepared" {
			other := openEngine(t, ws, t.TempDir()) // the branch's engine
			other.Close()
		}
		return false
	}
	res := e.Commit(nil, false, Caller{})
	require.Empty(t, res.Failed)
	require.Len(t, res.Committed, prepareMin+5)
}

// A host's edit of a workspace file after the commit checked it, while the
// commit wrote the other files, stays: the file is a conflict, not
// overwritten by the commit's rename.
func TestCommitKeepsAHostEditMadeWhileItWrites(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	for _, f := range []string{"a", "b"} {
		require.NoError(t, os.WriteFile(filepath.Join(ws, f), []byte("base\n"), 0o644))
	}
	e := openEngine(t, ws, state)
	defer e.Close()
	writeNew(t, e, "a", "staged a\n")
	writeNew(t, e, "b", "staged b\n")
	e.die = func(point string) bool {
		if point == "commit-files-written" {
			// The host saves b (a new file renamed over it), as an
			// editor does.
			tmp := filepath.Join(ws, ".b.tmp")
			require.NoError(t, os.WriteFile(tmp, []byte("host b\n"), 0o644))
			require.NoError(t, os.Rename(tmp, filepath.Join(ws, "b")))
		}
		return false
	}
	res := e.Commit(nil, false, Caller{})
	require.Equal(t, []string{"a"}, res.Committed)
	require.Len(t, res.Conflicts, 1)
	require.Equal(t, "b", res.Conflicts[0].Path)
	require.Equal(t, "staged a\n", readFileT(t, filepath.Join(ws, "a")))
	require.Equal(t, "host b\n", readFileT(t, filepath.Join(ws, "b")), "the host's edit was overwritten")
	require.Equal(t, "staged b\n", readView(t, e, "b"), "b stays pending")
}
