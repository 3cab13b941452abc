package overlay

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"stagefs/snapshot"
)

// A crash in the middle of replacing a file's whole content (PatchFile,
// WriteFile, a restored pre-image) used to leave the pending body empty or
// partial: the body was truncated in place, then written. And a crash in
// the middle of a restore's move back by copying left a partial copy that
// a restore tried again took for the finished move. These tests stop the
// engine inside each of those windows ("replace-body", "copy-tree"),
// start a new one on the same state dir, and check what the view shows.

// tool is a process a snapshot with pid 0 covers (the daemon, pid 0, is
// never captured).
var tool = Caller{Pid: os.Getpid()}

// snapCrashEngine is crashEngine with a snapshot store in the state dir.
func snapCrashEngine(t *testing.T, ws, state, die string) *Engine {
	t.Helper()
	e, err := New(Options{Workspace: ws, StateDir: state, Mode: Staged, Snapshots: openStore(t, state)})
	require.NoError(t, err)
	e.die = func(point string) bool { return point == die }
	return e
}

func openStore(t *testing.T, state string) *snapshot.Store {
	t.Helper()
	s, err := snapshot.Open(filepath.Join(state, "snapshots"), snapshot.Options{NoSync: true, Lazy: ToolCallScope})
	require.NoError(t, err)
	return s
}

// restartWithStore is restartAfterCrash with the snapshot store read
// again from its directory, as a new daemon reads it.
func restartWithStore(t *testing.T, crashed *Engine) *Engine {
	t.Helper()
	crashed.opts.Snapshots = openStore(t, crashed.opts.StateDir)
	return restartAfterCrash(t, crashed)
}

func writeAs(t *testing.T, e *Engine, p, content string, c Caller) {
	t.Helper()
	f, _, err := e.Create(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644, c)
	require.NoError(t, err)
	_, err = unix.Write(f.Fd, []byte(content))
	require.NoError(t, err)
	e.Release(p, f, c)
}

func requireAbsent(t *testing.T, e *Engine, p string) {
	t.Helper()
	_, err := e.Stat(p)
	require.ErrorIs(t, err, syscall.ENOENT, "%s exists", p)
}

func TestCrashInPatchOrWriteKeepsWholeBody(t *testing.T) {
	patch := func(e *Engine, p string) error {
		return e.PatchFile(p, Caller{}, func([]byte, bool) ([]byte, bool, error) {
			return []byte("new\n"), true, nil
		})
	}
	write := func(e *Engine, p string) error { return e.WriteFile(p, []byte("new\n"), Caller{}) }
	for _, tc := range []struct {
		name string
		op   func(*Engine, string) error
		// before stages the file (or not); old is what the view showed
		// then ("" for absent).
		before func(*testing.T, *Engine)
		old    string
	}{
		{"patch a staged file", patch, func(t *testing.T, e *Engine) { writeNew(t, e, "f", "staged\n") }, "staged\n"},
		{"write a staged file", write, func(t *testing.T, e *Engine) { writeNew(t, e, "f", "staged\n") }, "staged\n"},
		{"patch a workspace file", patch, func(*testing.T, *Engine) {}, "base\n"},
		{"write a workspace file", write, func(*testing.T, *Engine) {}, "base\n"},
		{"write over a deleted file", write, func(t *testing.T, e *Engine) { require.NoError(t, e.Unlink("f", Caller{})) }, ""},
		{"write a new file", write, func(t *testing.T, e *Engine) {
			require.NoError(t, os.Remove(filepath.Join(e.opts.Workspace, "f")))
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, state := t.TempDir(), t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(ws, "f"), []byte("base\n"), 0o644))
			e := crashEngine(t, ws, state, "replace-body")
			tc.before(t, e)
			require.ErrorIs(t, tc.op(e, "f"), errDied)

			e = restartAfterCrash(t, e)
			if tc.old == "" {
				requireAbsent(t, e, "f")
			} else {
				require.Equal(t, tc.old, readView(t, e, "f"), "the old body, whole")
			}

			// The same call, not stopped, gives the new body.
			require.NoError(t, tc.op(e, "f"))
			require.Equal(t, "new\n", readView(t, e, "f"))
			e = restartAfterCrash(t, e)
			require.Equal(t, "new\n", readView(t, e, "f"))
		})
	}
}

// A replaced body keeps the file's mode, owner, xattrs and inode number.
func TestReplacedBodyKeepsAttributes(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "f"), []byte("base\n"), 0o600))
	e, err := New(Options{Workspace: ws, StateDir: state, Mode: Staged})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	writeNew(t, e, "f", "staged\n")
	require.NoError(t, e.Setxattr("f", "user.note", []byte("kept"), 0, Caller{}))
	before, err := e.Stat("f")
	require.NoError(t, err)

	require.NoError(t, e.WriteFile("f", []byte("new\n"), Caller{}))
	after, err := e.Stat("f")
	require.NoError(t, err)
	require.Equal(t, "new\n", readView(t, e, "f"))
	require.Equal(t, before.Ino, after.Ino, "the mount shows the same file")
	require.Equal(t, before.Mode, after.Mode)
	require.Equal(t, before.Uid, after.Uid)
	buf := make([]byte, 64)
	n, err := e.Getxattr("f", "user.note", buf)
	require.NoError(t, err)
	require.Equal(t, "kept", string(buf[:n]))
	res := e.Commit(nil, false, Caller{})
	require.Empty(t, res.Conflicts)
	require.Empty(t, res.Failed)
	b, err := os.ReadFile(filepath.Join(ws, "f"))
	require.NoError(t, err)
	require.Equal(t, "new\n", string(b))
}

// A file open for writing, or with a second name, keeps its body's inode:
// the writer's later writes and the other name see the new content.
func TestReplaceInPlaceForWritersAndLinks(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	e, err := New(Options{Workspace: ws, StateDir: state, Mode: Staged})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })

	writeNew(t, e, "open", "old\n")
	f, err := e.Open("open", unix.O_WRONLY, Caller{})
	require.NoError(t, err)
	require.NoError(t, e.WriteFile("open", []byte("new\n"), Caller{}))
	_, err = unix.Pwrite(f.Fd, []byte("N"), 0)
	require.NoError(t, err)
	e.Release("open", f, Caller{})
	require.Equal(t, "New\n", readView(t, e, "open"), "the writer writes into the new content")

	writeNew(t, e, "a", "old\n")
	_, err = e.Link("a", "b", Caller{})
	require.NoError(t, err)
	require.NoError(t, e.WriteFile("a", []byte("new\n"), Caller{}))
	require.Equal(t, "new\n", readView(t, e, "b"), "the other name shows it too")
}

// restoreCase stages f as "v1" (the workspace has "base"), then lets a tool
// call change it with change inside snapshot "tool".
func restoreCase(t *testing.T, die string, change func(*testing.T, *Engine)) *Engine {
	t.Helper()
	ws, state := t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "f"), []byte("base\n"), 0o644))
	e := snapCrashEngine(t, ws, state, die)
	writeNew(t, e, "f", "v1\n")
	_, err := e.OpenSnapshot("tool", "", 0, nil)
	require.NoError(t, err)
	change(t, e)
	_, err = e.CloseSnapshot("tool")
	require.NoError(t, err)
	return e
}

func TestCrashInRestoreOfFileKeepsWholeBody(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*testing.T, *Engine)
		after  string // what the tool left ("" absent)
	}{
		{"rewritten", func(t *testing.T, e *Engine) { writeAs(t, e, "f", "v2\n", tool) }, "v2\n"},
		{"deleted", func(t *testing.T, e *Engine) { require.NoError(t, e.Unlink("f", tool)) }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := restoreCase(t, "replace-body", tc.change)
			_, err := e.RestoreTool("tool", true)
			require.ErrorIs(t, err, errDied, "stopped in the middle of f")

			e = restartWithStore(t, e)
			if tc.after == "" {
				requireAbsent(t, e, "f")
			} else {
				require.Equal(t, tc.after, readView(t, e, "f"), "what the tool left, whole")
			}

			// Tried again, the restore restores f: it is not a later
			// change to keep.
			res, err := e.RestoreTool("tool", true)
			require.NoError(t, err)
			require.Empty(t, res.Failed)
			require.Empty(t, res.Kept)
			require.Contains(t, res.Restored, "f")
			require.Equal(t, "v1\n", readView(t, e, "f"))
			st, err := e.Stat("f")
			require.NoError(t, err)
			require.Equal(t, uint32(0o644), st.Mode&0o7777)
		})
	}
}

// A tool call's mv of a directory onto a name that holds staged deletions
// fails with EXDEV, so mv copies; restore moves the directory back the same
// way, by copying. A crash in the middle of that copy must not leave the
// partial copy taken for the finished move.
// interruptedMoveBack makes a tool call whose restore must move a
// directory back by copying (e to d, which holds staged deletions), and
// stops that restore in the middle of the copy. It returns the restarted
// engine and the state dir.
func interruptedMoveBack(t *testing.T) (*Engine, string) {
	ws, state := t.TempDir(), t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "d"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "d", "x"), []byte("x\n"), 0o644))
	e := snapCrashEngine(t, ws, state, "copy-tree")
	_, err := e.OpenSnapshot("tool", "", 0, nil)
	require.NoError(t, err)
	// rm -rf d; mkdir d; mv d e (refused: EXDEV); mv's copy instead.
	require.NoError(t, e.Unlink("d/x", tool))
	require.NoError(t, e.Rmdir("d", tool))
	_, err = e.Mkdir("d", 0o755, tool)
	require.NoError(t, err)
	require.ErrorIs(t, e.Rename("d", "e", 0, tool), syscall.EXDEV)
	_, err = e.Mkdir("e", 0o755, tool)
	require.NoError(t, err)
	require.NoError(t, e.Rmdir("d", tool))
	_, err = e.CloseSnapshot("tool")
	require.NoError(t, err)
	// Another process (not the tool's) fills e: the move back takes
	// that along.
	writeNew(t, e, "e/a", "a\n")
	writeNew(t, e, "e/b", "b\n")

	_, err = e.RestoreTool("tool", false)
	require.ErrorIs(t, err, errDied, "stopped in the middle of the copy")
	return restartWithStore(t, e), state
}

func TestCrashInRestoreCopyingMoveBack(t *testing.T) {
	e, state := interruptedMoveBack(t)
	res, err := e.RestoreTool("tool", false)
	require.NoError(t, err)
	require.Empty(t, res.Failed)
	require.Equal(t, "x\n", readView(t, e, "d/x"))
	require.Equal(t, "a\n", readView(t, e, "d/a"))
	require.Equal(t, "b\n", readView(t, e, "d/b"), "the whole tree is back")
	requireAbsent(t, e, "e")
	ents, err := os.ReadDir(filepath.Join(state, "moves"))
	require.NoError(t, err)
	require.Empty(t, ents, "the move back is finished")
}

// A move back left half done by a restore nobody tries again keeps its
// state file only as long as its snapshot.
func TestMoveStateGoesWithItsSnapshot(t *testing.T) {
	e, state := interruptedMoveBack(t)
	ents, err := os.ReadDir(filepath.Join(state, "moves"))
	require.NoError(t, err)
	require.Len(t, ents, 1, "the interrupted move back's state")
	require.NoError(t, e.DropSnapshot("tool"))
	ents, err = os.ReadDir(filepath.Join(state, "moves"))
	require.NoError(t, err)
	require.Empty(t, ents)
}

// Work done in the half-made copy after the crash is not the restore's:
// a restore tried again leaves it, and says so, rather than removing it
// with the partial copy.
func TestInterruptedMoveBackKeepsLaterWork(t *testing.T) {
	e, _ := interruptedMoveBack(t)
	writeNew(t, e, "d/new", "later\n")
	res, err := e.RestoreTool("tool", false)
	require.NoError(t, err)
	require.NotEmpty(t, res.Failed, "the move back cannot go on over later work")
	require.Equal(t, "later\n", readView(t, e, "d/new"))
}

// A move-back state file whose snapshot went while no daemon ran (or in a
// crash before the drop's clean-up) goes at the next start.
func TestStaleMoveStateGoesAtStart(t *testing.T) {
	e, state := interruptedMoveBack(t)
	stray := filepath.Join(state, "moves", "00000000000000aa-0123456789abcdef.0011")
	require.NoError(t, os.WriteFile(stray, []byte("copy"), 0o600))
	e = restartWithStore(t, e)
	_, err := os.Stat(stray)
	require.ErrorIs(t, err, os.ErrNotExist)
	ents, err := os.ReadDir(filepath.Join(state, "moves"))
	require.NoError(t, err)
	require.Len(t, ents, 1, "the live snapshot's state stays")
}
