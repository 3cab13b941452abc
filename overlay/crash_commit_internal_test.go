package overlay

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// These tests stop a commit or a discard inside one of its windows, as a
// SIGKILL would (killPoint), open the state dir again and, for a commit,
// finish it with Recover as the daemon does at start. Nobody changes the
// workspace meanwhile, so nothing may be lost and nothing may conflict.

// commitSelection returns the paths a commit of everything would select:
// what its commit_begin record holds, and what Recover gets at the next
// start.
func commitSelection(e *Engine) []string {
	var sel []string
	e.locked(func() error {
		sel = e.selectLocked(nil, true, commitAncestor)
		return nil
	})
	return sel
}

// crashCommit commits everything on e, which must stop at its crash
// point, then restarts and recovers the commit. It returns the new engine
// and what Recover reported.
func crashCommit(t *testing.T, e *Engine, point string) (*Engine, CommitResult) {
	t.Helper()
	sel := commitSelection(e)
	require.NotEmpty(t, sel)
	require.PanicsWithValue(t, killedAt(point), func() { e.Commit(nil, false, Caller{}) })
	e = restartAfterCrash(t, e)
	return e, e.Recover(sel)
}

// requireAllCommitted checks that a recovered commit left nothing pending.
func requireAllCommitted(t *testing.T, e *Engine, res CommitResult) {
	t.Helper()
	require.Empty(t, res.Conflicts, "nobody changed the workspace")
	require.Empty(t, res.Failed)
	require.NotEmpty(t, res.Committed)
	again := e.Commit(nil, false, Caller{})
	require.Empty(t, again.Committed, "the recovered commit left pending changes")
	require.Empty(t, again.Conflicts)
	require.Empty(t, again.Failed)
}

func readWorkspace(t *testing.T, ws, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ws, p))
	require.NoError(t, err)
	return string(b)
}

// workspaceNames lists the names in the workspace directory dir.
func workspaceNames(t *testing.T, ws, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(ws, dir))
	require.NoError(t, err)
	var names []string
	for _, d := range ents {
		names = append(names, d.Name())
	}
	sort.Strings(names)
	return names
}

// B. Discarding a rename removed the moved file before the deletion at its
// source: a crash in between showed the file under neither name, and the
// next commit deleted it from the workspace.
func TestCrashInDiscardOfRename(t *testing.T) {
	for _, tc := range []struct {
		name, src, dst string
		dir            bool
	}{
		{"file into a directory", "a.txt", "d/a.txt", false},
		// "b" sorts after "a": the renamed directory's entry at a is
		// the first one a deepest-first order meets.
		{"directory", "b", "a", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, state := t.TempDir(), t.TempDir()
			require.NoError(t, os.MkdirAll(filepath.Join(ws, "d"), 0o755))
			body := filepath.Join(ws, tc.src)
			if tc.dir {
				require.NoError(t, os.Mkdir(body, 0o755))
				body = filepath.Join(body, "f")
			}
			require.NoError(t, os.WriteFile(body, []byte("kept\n"), 0o644))
			inside := tc.src
			if tc.dir {
				inside = tc.src + "/f"
			}

			e := crashEngine(t, ws, state, "discard-step")
			require.NoError(t, e.Rename(tc.src, tc.dst, 0, Caller{}))
			require.PanicsWithValue(t, killedAt("discard-step"), func() { e.Discard(nil, Caller{}) })

			e = restartAfterCrash(t, e)
			require.Equal(t, "kept\n", readView(t, e, inside), "the discard's first step hid the workspace entry")
			// The interrupted discard is finished by discarding again.
			e.Discard(nil, Caller{})
			require.Equal(t, "kept\n", readView(t, e, inside))
			_, err := e.Stat(tc.dst)
			require.ErrorIs(t, err, syscall.ENOENT)
			res := e.Commit(nil, false, Caller{})
			require.Empty(t, res.Committed)
			require.Equal(t, "kept\n", readWorkspace(t, ws, inside))
		})
	}
}

// B. A crash after the deletion at a moved file's source was discarded,
// with the moved copy still pending, must not show two files under one
// inode number: the kernel would take them for one.
func TestCrashInDiscardKeepsInodeNumbersApart(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "d"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "a.txt"), []byte("kept\n"), 0o644))

	e := crashEngine(t, ws, state, "discard-step")
	require.NoError(t, e.Rename("a.txt", "d/a.txt", 0, Caller{}))
	require.PanicsWithValue(t, killedAt("discard-step"), func() { e.Discard(nil, Caller{}) })

	e = restartAfterCrash(t, e)
	a, err := e.Stat("a.txt")
	require.NoError(t, err)
	if moved, err := e.Stat("d/a.txt"); err == nil {
		require.NotEqual(t, a.Ino, moved.Ino, "two files shown under one inode number")
	}
}

// C. A directory swap is committed by moving one directory aside first. A
// crash after that move, before the pending renames learnt the temporary
// name, left the commit unable to finish ("move a aside: ENOENT").
func TestCrashInCommitOfDirectorySwap(t *testing.T) {
	for _, point := range []string{"commit-move-aside", "commit-moved-aside"} {
		t.Run(point, func(t *testing.T) {
			ws, state := t.TempDir(), t.TempDir()
			for _, d := range []string{"a", "b"} {
				require.NoError(t, os.Mkdir(filepath.Join(ws, d), 0o755))
				require.NoError(t, os.WriteFile(filepath.Join(ws, d, "from-"+d), []byte(d+"\n"), 0o644))
			}

			// A directory of the user's already has the first
			// temporary name: the swap takes the next, and Recover
			// finds it (and leaves the user's alone).
			require.NoError(t, os.MkdirAll(filepath.Join(ws, ".stagefs-move-a", "mine"), 0o755))

			e := crashEngine(t, ws, state, point)
			require.NoError(t, e.Rename("a", "t", 0, Caller{}))
			require.NoError(t, e.Rename("b", "a", 0, Caller{}))
			require.NoError(t, e.Rename("t", "b", 0, Caller{}))
			e, res := crashCommit(t, e, point)
			requireAllCommitted(t, e, res)

			require.Equal(t, []string{".stagefs-move-a", "a", "b"}, workspaceNames(t, ws, ""), "a temporary name is left in the workspace")
			require.Equal(t, []string{"mine"}, workspaceNames(t, ws, ".stagefs-move-a"))
			require.Equal(t, "b\n", readWorkspace(t, ws, "a/from-b"))
			require.Equal(t, "a\n", readWorkspace(t, ws, "b/from-a"))
			require.Equal(t, "b\n", readView(t, e, "a/from-b"))
			require.Equal(t, "a\n", readView(t, e, "b/from-a"))
		})
	}
}

// treeOf lists every entry below root as list gives it: path -> kind,
// mode and, for a file, its content.
func treeOf(t *testing.T, list func(dir string) []string, stat func(p string) (*syscall.Stat_t, string)) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(string)
	walk = func(dir string) {
		for _, name := range list(dir) {
			p := joinPath(dir, name)
			st, content := stat(p)
			switch st.Mode & syscall.S_IFMT {
			case syscall.S_IFDIR:
				out[p] = fmt.Sprintf("dir %o", st.Mode&0o7777)
				walk(p)
			case syscall.S_IFREG:
				out[p] = fmt.Sprintf("file %o %q", st.Mode&0o7777, content)
			default:
				out[p] = fmt.Sprintf("other %o", st.Mode)
			}
		}
	}
	walk("")
	return out
}

// viewTree is everything e's view shows.
func viewTree(t *testing.T, e *Engine) map[string]string {
	t.Helper()
	return treeOf(t, func(dir string) []string {
		ents, err := e.ReadDir(dir)
		require.NoError(t, err, "readdir %q", dir)
		var names []string
		for _, d := range ents {
			names = append(names, d.Name)
		}
		return names
	}, func(p string) (*syscall.Stat_t, string) {
		st, err := e.Stat(p)
		require.NoError(t, err, "stat %s", p)
		if st.Mode&syscall.S_IFMT == syscall.S_IFREG {
			return st, readView(t, e, p)
		}
		return st, ""
	})
}

// workspaceTree is everything in the workspace ws.
func workspaceTree(t *testing.T, ws string) map[string]string {
	t.Helper()
	return treeOf(t, func(dir string) []string {
		return workspaceNames(t, ws, dir)
	}, func(p string) (*syscall.Stat_t, string) {
		var st syscall.Stat_t
		require.NoError(t, syscall.Lstat(filepath.Join(ws, p), &st))
		if st.Mode&syscall.S_IFMT == syscall.S_IFREG {
			return &st, readWorkspace(t, ws, p)
		}
		return &st, ""
	})
}

// A directory renamed to below its own old place cannot be moved there in
// one step (the workspace refuses to move a directory into itself): the
// commit moves it aside first, then makes its old place (a new directory,
// or another directory renamed there) and moves it in. Committed whole,
// and after a crash at each step, the workspace ends as the view was, and
// nothing is left pending.
func TestCommitOfRenameIntoItsOwnPlace(t *testing.T) {
	mkdir := func(e *Engine, p string) {
		_, err := e.Mkdir(p, 0o750, Caller{})
		require.NoError(t, err, "mkdir %s", p)
	}
	mv := func(e *Engine, a, b string) { require.NoError(t, e.Rename(a, b, 0, Caller{}), "mv %s %s", a, b) }
	throughNewParent := func(e *Engine) { // mkdir n; mv d n/d; mv n d
		mkdir(e, "n")
		mv(e, "d", "n/d")
		mv(e, "n", "d")
	}
	made := []string{"commit-move-aside", "commit-moved-aside", "commit-dir-made", "commit-redirect", "commit-applied"}
	renamed := []string{"commit-move-aside", "commit-moved-aside", "commit-redirect", "commit-applied"}
	for _, tc := range []struct {
		name   string
		ws     []string // workspace dirs (and a file in each, named after it)
		stage  func(e *Engine)
		points []string // crash points the commit passes
	}{
		{"new parent", []string{"d", "e"}, throughNewParent, made},
		{"new parent, a child of the same name", []string{"d", "d/d"}, throughNewParent, made},
		{"new parents, deeper", []string{"d"}, func(e *Engine) {
			mkdir(e, "n")
			mkdir(e, "n/m")
			mv(e, "d", "n/m/d")
			mv(e, "n", "d")
		}, made},
		{"renamed parent", []string{"d", "e"}, func(e *Engine) {
			mv(e, "d", "e/d")
			mv(e, "e", "d")
		}, renamed},
		{"into a former child", []string{"d", "d/c"}, func(e *Engine) {
			mv(e, "d/c", "t")
			mv(e, "d", "t/d")
			mv(e, "t", "d")
		}, renamed},
		// A swap's moved-aside directory leaves a place that is made
		// anew (a review found both; each failed after a crash at
		// commit-applied).
		{"swap, old place made anew", []string{"a", "c", "c/e"}, func(e *Engine) {
			mv(e, "a", "t")
			mkdir(e, "a")
			mv(e, "c/e", "a/e")
			mv(e, "t", "c/e")
		}, made},
		{"swap, then below its own place", []string{"a", "b", "b/e"}, func(e *Engine) {
			mv(e, "a", "tmp")
			mv(e, "b/e", "a")
			mv(e, "tmp", "b/e")
			mkdir(e, "t")
			mv(e, "a", "t/e")
			mv(e, "t", "a")
		}, made},
		// Both d/s and d go below their own places: d/s's rename waits
		// while d's does.
		{"one inside another", []string{"d", "d/s"}, func(e *Engine) {
			mkdir(e, "d/n")
			mv(e, "d/s", "d/n/s")
			mv(e, "d/n", "d/s")
			mkdir(e, "m")
			mv(e, "d", "m/d")
			mv(e, "m", "d")
		}, made},
	} {
		for _, point := range append([]string{"none"}, tc.points...) {
			t.Run(tc.name+"/"+point, func(t *testing.T) {
				ws, state := t.TempDir(), t.TempDir()
				for _, d := range tc.ws {
					require.NoError(t, os.Mkdir(filepath.Join(ws, d), 0o755))
					require.NoError(t, os.WriteFile(filepath.Join(ws, d, "in-"+filepath.Base(d)), []byte(d+"\n"), 0o644))
				}
				e := crashEngine(t, ws, state, point)
				tc.stage(e)
				want := viewTree(t, e)
				var res CommitResult
				if point == "none" {
					res = e.Commit(nil, false, Caller{})
				} else {
					e, res = crashCommit(t, e, point)
				}
				requireAllCommitted(t, e, res)
				require.Equal(t, want, workspaceTree(t, ws), "the workspace is not what the view showed")
				require.Equal(t, want, viewTree(t, e), "the commit changed the view")
			})
		}
	}
}

// Before a commit moves a workspace directory aside, for a rename into its
// own old place or to break a cycle of renames, it checks what the renames
// need: a directory the user replaced or removed meanwhile is a conflict,
// and the workspace is left as the user made it.
func TestCommitMovesNothingAsideForAConflict(t *testing.T) {
	mv := func(e *Engine, a, b string) { require.NoError(t, e.Rename(a, b, 0, Caller{}), "mv %s %s", a, b) }
	for _, tc := range []struct {
		name  string
		stage func(e *Engine)
		user  func(ws string)
	}{
		{"own place, source replaced", func(e *Engine) {
			_, err := e.Mkdir("n", 0o755, Caller{})
			require.NoError(t, err)
			mv(e, "d", "n/d")
			mv(e, "n", "d")
		}, func(ws string) {
			require.NoError(t, os.Rename(filepath.Join(ws, "d"), filepath.Join(ws, "d-orig")))
			require.NoError(t, os.Mkdir(filepath.Join(ws, "d"), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(ws, "d", "mine"), []byte("mine\n"), 0o644))
		}},
		{"own place, the new parent's source removed", func(e *Engine) {
			mv(e, "d", "e/d")
			mv(e, "e", "d")
		}, func(ws string) {
			require.NoError(t, os.RemoveAll(filepath.Join(ws, "e")))
		}},
		{"swap, one side removed", func(e *Engine) {
			mv(e, "d", "t")
			mv(e, "e", "d")
			mv(e, "t", "e")
		}, func(ws string) {
			require.NoError(t, os.RemoveAll(filepath.Join(ws, "e")))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, state := t.TempDir(), t.TempDir()
			for _, d := range []string{"d", "e"} {
				require.NoError(t, os.Mkdir(filepath.Join(ws, d), 0o755))
				require.NoError(t, os.WriteFile(filepath.Join(ws, d, "in-"+d), []byte(d+"\n"), 0o644))
			}
			e := crashEngine(t, ws, state, "none")
			tc.stage(e)
			tc.user(ws)
			before := workspaceTree(t, ws)
			res := e.Commit(nil, false, Caller{})
			require.NotEmpty(t, res.Conflicts)
			require.Equal(t, before, workspaceTree(t, ws), "a conflicting commit changed the workspace")
		})
	}
}

// H. A directory that replaces a workspace file (and a file that replaces
// a workspace directory) is committed by removing the old entry first. A
// crash after that removal, or after the new entry was made, is finished
// by Recover without a conflict.
func TestCrashInCommitOfReplacedType(t *testing.T) {
	for _, point := range []string{"commit-replaced", "commit-applied"} {
		t.Run("directory over file/"+point, func(t *testing.T) {
			ws, state := t.TempDir(), t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(ws, "x"), []byte("old file\n"), 0o644))

			e := crashEngine(t, ws, state, point)
			require.NoError(t, e.Unlink("x", Caller{}))
			_, err := e.Mkdir("x", 0o755, Caller{})
			require.NoError(t, err)
			writeNew(t, e, "x/f", "new\n")
			e, res := crashCommit(t, e, point)
			requireAllCommitted(t, e, res)
			require.Equal(t, "new\n", readWorkspace(t, ws, "x/f"))
		})
		t.Run("file over directory/"+point, func(t *testing.T) {
			ws, state := t.TempDir(), t.TempDir()
			require.NoError(t, os.Mkdir(filepath.Join(ws, "y"), 0o755))

			e := crashEngine(t, ws, state, point)
			require.NoError(t, e.Rmdir("y", Caller{}))
			writeNew(t, e, "y", "new file\n")
			e, res := crashCommit(t, e, point)
			requireAllCommitted(t, e, res)
			require.Equal(t, "new file\n", readWorkspace(t, ws, "y"))
		})
	}
}

// H. A committed fifo was not recognised as already committed: a crash
// before its pending entry was dropped made every later commit conflict.
func TestCrashInCommitOfFifo(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	e := crashEngine(t, ws, state, "commit-applied")
	_, err := e.Mknod("p", syscall.S_IFIFO|0o640, 0, Caller{})
	require.NoError(t, err)
	e, res := crashCommit(t, e, "commit-applied")
	requireAllCommitted(t, e, res)
	var st unix.Stat_t
	require.NoError(t, unix.Lstat(filepath.Join(ws, "p"), &st))
	require.Equal(t, uint32(syscall.S_IFIFO|0o640), st.Mode)
}

// H. Recovering stays strict where the commit could not have made the
// difference: a fifo of another mode at the path is a conflict. A normal
// commit stays as strict as before: even the same fifo, made by someone
// else, is a conflict there.
func TestRecoverStillConflictsOnOtherFifo(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    uint32
		recover bool
	}{
		{"recover, other mode", 0o600, true},
		{"commit, same fifo", 0o640, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, state := t.TempDir(), t.TempDir()
			e, err := New(Options{Workspace: ws, StateDir: state, Mode: Staged})
			require.NoError(t, err)
			t.Cleanup(func() { e.Close() })
			_, err = e.Mknod("p", syscall.S_IFIFO|0o640, 0, Caller{})
			require.NoError(t, err)
			sel := commitSelection(e)
			// Someone makes a fifo at p before the commit.
			old := unix.Umask(0)
			err = unix.Mkfifo(filepath.Join(ws, "p"), tc.mode)
			unix.Umask(old)
			require.NoError(t, err)
			var res CommitResult
			if tc.recover {
				res = e.Recover(sel)
			} else {
				res = e.Commit(nil, false, Caller{})
			}
			require.Len(t, res.Conflicts, 1)
			require.Equal(t, "p", res.Conflicts[0].Path)
		})
	}
}
