package overlay_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"stagefs/overlay"
	snapstore "stagefs/snapshot"
)

// threeTurns stages three turns of changes over fillBase's workspace and
// returns the view at the start of each turn.
func threeTurns(t *testing.T, h *harness) (starts []map[string]string) {
	t.Helper()
	starts = append(starts, h.view())
	_, err := h.e.StartTurn("t1", "edit and create")
	require.NoError(t, err)
	h.overwrite("f.txt", "f1\n")
	h.mkdir("out")
	h.create("out/o", "o\n")

	starts = append(starts, h.view())
	_, err = h.e.StartTurn("t2", "move and delete")
	require.NoError(t, err)
	h.rename("d", "d2")
	h.overwrite("d2/x", "x2\n")
	h.unlink("out/o")
	h.unlink("g.txt")

	starts = append(starts, h.view())
	_, err = h.e.StartTurn("t3", "more edits")
	require.NoError(t, err)
	h.overwrite("f.txt", "f3\n")
	h.create("new", "n\n")
	return starts
}

func TestTurnsRollbackEachAndRedo(t *testing.T) {
	for _, mode := range []overlay.Mode{overlay.Staged, overlay.Immediate} {
		t.Run(string(mode), func(t *testing.T) {
			for k := 2; k >= 0; k-- {
				h, _ := newSnapHarness(t, mode)
				fillBase(h)
				ws := h.wsSnapshot()
				starts := threeTurns(t, h)
				end := h.view()
				id := []string{"t1", "t2", "t3"}[k]

				res, err := h.e.Rollback(id, nil, false, overlay.Caller{})
				require.NoError(t, err)
				require.Empty(t, res.Conflicts)
				require.Empty(t, res.Failed)
				require.Equal(t, starts[k], h.view(), "view after rollback to the start of %s", id)
				if mode == overlay.Staged {
					require.Equal(t, ws, h.wsSnapshot(), "staged rollback must not touch the workspace")
				}
				if k == 0 && mode == overlay.Staged {
					require.Empty(t, h.pending(), "rolled back to the workspace: nothing pending")
				}

				_, err = h.e.Redo(false, overlay.Caller{})
				require.NoError(t, err)
				require.Equal(t, end, h.view(), "view after redo")
				_, err = h.e.Redo(false, overlay.Caller{})
				require.Error(t, err, "a redo is used once")
			}
		})
	}
}

func TestTurnsRollbackPaths(t *testing.T) {
	h, _ := newSnapHarness(t, overlay.Staged)
	fillBase(h)
	threeTurns(t, h)
	_, err := h.e.Rollback("t1", []string{"f.txt"}, false, overlay.Caller{})
	require.NoError(t, err)
	require.Equal(t, "f0\n", h.read("f.txt"))
	require.Equal(t, "n\n", h.read("new"), "paths outside the rollback keep their state")
	require.Equal(t, "x2\n", h.read("d2/x"))
}

func TestTurnsNewMutationClearsRedo(t *testing.T) {
	h, _ := newSnapHarness(t, overlay.Staged)
	fillBase(h)
	threeTurns(t, h)
	_, err := h.e.Rollback("", nil, false, overlay.Caller{})
	require.NoError(t, err)
	h.create("after", "a\n")
	_, err = h.e.Redo(false, overlay.Caller{})
	require.ErrorIs(t, err, snapstore.ErrNotFound)
	require.Equal(t, "f1\n", h.read("f.txt"), "the rollback stays")
}

// A user's edit after the turn, made directly in the workspace, is a
// conflict: kept and reported, overwritten only with force.
func TestTurnsConflictWithUserEdit(t *testing.T) {
	h, _ := newSnapHarness(t, overlay.Staged)
	h.baseFile("a", "a0\n")
	h.baseFile("b", "b0\n")
	_, err := h.e.StartTurn("t1", "")
	require.NoError(t, err)
	h.overwrite("a", "a1\n")
	h.overwrite("b", "b1\n")
	_, err = h.e.StartTurn("t2", "")
	require.NoError(t, err)
	h.commitAll()
	// The user edits b in the workspace after the turn was committed.
	require.NoError(t, os.WriteFile(h.wsPath("b"), []byte("user\n"), 0o644))

	res, err := h.e.Rollback("t1", nil, false, overlay.Caller{})
	require.NoError(t, err)
	require.Len(t, res.Conflicts, 1)
	require.Equal(t, "b", res.Conflicts[0].Path)
	require.Equal(t, "a0\n", h.read("a"))
	require.Equal(t, "user\n", h.read("b"), "the user's edit is kept")

	res, err = h.e.Rollback("t1", []string{"b"}, true, overlay.Caller{})
	require.NoError(t, err)
	require.Empty(t, res.Conflicts)
	require.Equal(t, "b0\n", h.read("b"))
}

func TestTurnsSurviveRestartAndList(t *testing.T) {
	dir := t.TempDir()
	h, _ := newSnapHarnessIn(t, overlay.Staged, dir)
	fillBase(h)
	starts := threeTurns(t, h)
	turns := h.e.Turns()
	require.Len(t, turns, 3)
	require.Equal(t, "t3", turns[0].ID)
	require.True(t, turns[0].Open)
	require.Equal(t, "move and delete", turns[1].Label)
	require.ElementsMatch(t, []string{"d2", "d", "d2/x", "out/o", "g.txt"}, turns[1].Paths)

	require.NoError(t, h.e.Close())
	h.e = nil
	st, err := snapstore.Open(dir, snapstore.Options{})
	require.NoError(t, err)
	h.opts.Snapshots = st
	h.open()
	require.Equal(t, "t3", h.e.CurrentTurn())
	_, err = h.e.Rollback("t2", nil, false, overlay.Caller{})
	require.NoError(t, err)
	require.Equal(t, starts[1], h.view())
}

func TestTurnsRetention(t *testing.T) {
	h, st := newSnapHarness(t, overlay.Staged)
	require.NoError(t, h.e.Close())
	h.e = nil
	h.opts.Turns = overlay.TurnOptions{MaxTurns: 3}
	h.open()
	h.baseFile("f", "0\n")
	for i := 0; i < 6; i++ {
		_, err := h.e.StartTurn("", "")
		require.NoError(t, err)
		h.overwrite("f", string(rune('a'+i))+"\n")
	}
	turns := h.e.Turns()
	require.Len(t, turns, 3, "at most MaxTurns are kept")
	require.Equal(t, "t6", turns[0].ID)
	for _, s := range st.List() {
		require.NotContains(t, []string{"turn:t1", "turn:t2", "turn:t3", "post:t1", "post:t2"}, s.ScopeID)
	}

	// Age: with a tiny MaxAge, every closed turn goes at the next start.
	require.NoError(t, h.e.Close())
	h.e = nil
	h.opts.Turns = overlay.TurnOptions{MaxAge: time.Nanosecond}
	h.open()
	_, err := h.e.StartTurn("last", "")
	require.NoError(t, err)
	turns = h.e.Turns()
	require.Len(t, turns, 1)
	require.Equal(t, "last", turns[0].ID)
}

func TestTurnsNoCapture(t *testing.T) {
	h, st := newSnapHarness(t, overlay.Staged)
	require.NoError(t, h.e.Close())
	h.e = nil
	h.opts.Turns = overlay.TurnOptions{NoCapture: []string{"node_modules", "build/*.o"}}
	h.open()
	_, err := h.e.StartTurn("t1", "")
	require.NoError(t, err)
	h.mkdir("node_modules")
	h.create("node_modules/x.js", "x\n")
	h.mkdir("build")
	h.create("build/a.o", "o\n")
	h.create("build/keep.txt", "k\n")
	ents, err := st.Entries("turn:t1")
	require.NoError(t, err)
	var paths []string
	for _, e := range ents {
		paths = append(paths, e.Path)
	}
	require.ElementsMatch(t, []string{"build", "build/keep.txt"}, paths)
}

// A process the host marked as the user's is never part of a turn, and a
// path it changed during a turn is a conflict for that turn's rollback.
func TestTurnsUserProcess(t *testing.T) {
	h, _ := newSnapHarness(t, overlay.Staged)
	h.baseFile("a", "a0\n")
	h.baseFile("b", "b0\n")
	_, err := h.e.StartTurn("t1", "")
	require.NoError(t, err)
	h.overwrite("a", "agent\n")
	h.overwrite("b", "agent\n")
	// The user (here: a process marked as the user's) edits b.
	h.e.MarkUser(os.Getpid(), true)
	h.overwrite("b", "user\n")
	h.e.MarkUser(os.Getpid(), false)

	res, err := h.e.Rollback("t1", nil, false, overlay.Caller{})
	require.NoError(t, err)
	require.Len(t, res.Conflicts, 1)
	require.Equal(t, "b", res.Conflicts[0].Path)
	require.Equal(t, "a0\n", h.read("a"))
	require.Equal(t, "user\n", h.read("b"), "the user's edit survives")

	_, err = h.e.Rollback("t1", []string{"b"}, true, overlay.Caller{})
	require.NoError(t, err)
	require.Equal(t, "b0\n", h.read("b"), "--force rolls it back too")
}

// hostEditor is the host editing through the control socket
// (fs/safe_text_patch passes a Caller with Host set).
var hostEditor = overlay.Caller{Host: true}

// hostPatch replaces p's content as fs/safe_text_patch does.
func hostPatch(t *testing.T, h *harness, p, content string) {
	t.Helper()
	err := h.e.PatchFile(p, hostEditor, func([]byte, bool) ([]byte, bool, error) {
		return []byte(content), true, nil
	})
	require.NoError(t, err, "patch %s", p)
}

// The host's own edits are the agent's: the open turn and an unbound tool
// call's snapshot capture them, a rollback takes them back, and one made
// after a rollback clears redo instead of being overwritten by it.
func TestTurnsHostEdits(t *testing.T) {
	h, st := newSnapHarness(t, overlay.Staged)
	h.baseFile("f.txt", "f0\n")
	h.baseFile("g.txt", "g0\n")
	_, err := h.e.StartTurn("t1", "")
	require.NoError(t, err)
	hostPatch(t, h, "f.txt", "f1\n")
	_, err = h.e.OpenSnapshot("tc1", "t1", 0, nil)
	require.NoError(t, err)
	hostPatch(t, h, "g.txt", "g1\n")
	_, err = h.e.CloseSnapshot("tc1")
	require.NoError(t, err)

	require.Equal(t, []string{"file g.txt"}, entryKinds(t, st, "tc1"), "the unbound snapshot covers the host")
	turns := h.e.Turns()
	require.Len(t, turns, 1)
	require.ElementsMatch(t, []string{"f.txt", "g.txt"}, turns[0].Paths)

	res, err := h.e.Rollback("t1", nil, false, overlay.Caller{})
	require.NoError(t, err)
	require.Empty(t, res.Conflicts)
	require.Equal(t, "f0\n", h.read("f.txt"))
	require.Equal(t, "g0\n", h.read("g.txt"))

	hostPatch(t, h, "f.txt", "mine\n")
	_, err = h.e.Redo(false, overlay.Caller{})
	require.ErrorIs(t, err, snapstore.ErrNotFound, "the host's edit after the rollback clears redo")
	require.Equal(t, "mine\n", h.read("f.txt"))
	require.Equal(t, "g0\n", h.read("g.txt"))
}

// An edit made directly in the workspace after a rollback does not clear
// redo (the mount never sees it), so redo compares each path with what the
// rollback left: a changed one is a conflict, kept until a forced redo. A
// directory redo would remove is a conflict when someone put a file in it.
func TestTurnsRedoConflictWithWorkspaceEdit(t *testing.T) {
	for _, mode := range []overlay.Mode{overlay.Staged, overlay.Immediate} {
		t.Run(string(mode), func(t *testing.T) {
			h, _ := newSnapHarness(t, mode)
			h.baseFile("a", "a0\n")
			h.baseFile("b", "b0\n")
			h.baseFile("d/x", "x0\n")
			_, err := h.e.StartTurn("t1", "")
			require.NoError(t, err)
			h.overwrite("a", "a1\n")
			h.overwrite("b", "b1\n")
			h.unlink("d/x")
			h.rmdir("d")
			_, err = h.e.Rollback("t1", nil, false, overlay.Caller{})
			require.NoError(t, err)
			require.Equal(t, "b0\n", h.read("b"))
			require.Equal(t, "x0\n", h.read("d/x"))

			// The user edits b and adds d/new in the workspace.
			require.NoError(t, os.WriteFile(h.wsPath("b"), []byte("user\n"), 0o644))
			require.NoError(t, os.WriteFile(h.wsPath("d/new"), []byte("new\n"), 0o644))
			res, err := h.e.Redo(false, overlay.Caller{})
			require.NoError(t, err)
			var paths []string
			for _, c := range res.Conflicts {
				paths = append(paths, c.Path)
			}
			require.Equal(t, []string{"b", "d"}, paths)
			require.Equal(t, "a1\n", h.read("a"), "the rest is redone")
			require.Equal(t, "user\n", h.read("b"), "the user's edit is kept")
			require.Equal(t, "new\n", h.read("d/new"), "the user's file is kept")
			h.requireMissing("d/x")

			// Redo stays available for a forced redo, which overwrites.
			res, err = h.e.Redo(true, overlay.Caller{})
			require.NoError(t, err)
			require.Empty(t, res.Conflicts)
			require.Equal(t, "b1\n", h.read("b"))
			h.requireMissing("d")
			_, err = h.e.Redo(false, overlay.Caller{})
			require.ErrorIs(t, err, snapstore.ErrNotFound, "a complete redo is used")
		})
	}
}

// conflictPaths lists the paths of a result's conflicts.
func conflictPaths(res overlay.RollbackResult) []string {
	out := []string{}
	for _, c := range res.Conflicts {
		out = append(out, c.Path)
	}
	return out
}

// A user's edit made outside the mount, while the turn is still open, to a
// file the turn changed is a conflict for the rollback of that turn, whether
// the rollback or the next turn ends it: it is not what the turn left.
func TestTurnsOutsideEditDuringTurn(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mode   overlay.Mode
		commit bool // commit the turn's changes before the user's edit
		next   bool // start the next turn before the rollback
	}{
		{"immediate", overlay.Immediate, false, false},
		{"immediate next turn", overlay.Immediate, false, true},
		{"staged committed", overlay.Staged, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := newSnapHarness(t, tc.mode)
			h.baseFile("a", "a0\n")
			h.baseFile("b", "b0\n")
			_, err := h.e.StartTurn("t1", "")
			require.NoError(t, err)
			h.overwrite("a", "a1\n")
			h.overwrite("b", "b1\n")
			h.create("c", "c1\n")
			h.rename("c", "c2")
			if tc.commit {
				h.commitAll()
			}
			// Past the kernel's clock tick, so that the edit's ctime is
			// later than the mount's last change.
			time.Sleep(20 * time.Millisecond)
			require.NoError(t, os.WriteFile(h.wsPath("b"), []byte("user\n"), 0o644))
			if tc.next {
				_, err = h.e.StartTurn("t2", "")
				require.NoError(t, err)
			} else {
				_, conflicts, err := h.e.RollbackDiff("t1", nil, false)
				require.NoError(t, err)
				require.Len(t, conflicts, 1, "rollback --diff while the turn is open")
				require.Equal(t, "b", conflicts[0].Path)
			}

			res, err := h.e.Rollback("t1", nil, false, overlay.Caller{})
			require.NoError(t, err)
			require.Equal(t, []string{"b"}, conflictPaths(res))
			require.Contains(t, res.Conflicts[0].Reason, "outside the mount")
			require.Equal(t, "a0\n", h.read("a"))
			require.Equal(t, "user\n", h.read("b"), "the user's edit is kept")
			h.requireMissing("c2")

			_, err = h.e.Rollback("t1", []string{"b"}, true, overlay.Caller{})
			require.NoError(t, err)
			require.Equal(t, "b0\n", h.read("b"), "--force rolls it back too")
		})
	}
}

// Retention holds as the engine starts: turns past the count or the age a
// restart now allows are pruned before any new turn starts.
func TestTurnsPruneAtStart(t *testing.T) {
	h, st := newSnapHarness(t, overlay.Staged)
	h.baseFile("f", "0\n")
	for i := 0; i < 4; i++ {
		_, err := h.e.StartTurn("", "")
		require.NoError(t, err)
		h.overwrite("f", string(rune('a'+i))+"\n")
	}
	require.Len(t, h.e.Turns(), 4)

	require.NoError(t, h.e.Close())
	h.e = nil
	h.opts.Turns = overlay.TurnOptions{MaxTurns: 2}
	h.open()
	turns := h.e.Turns()
	require.Len(t, turns, 2, "pruned by count at start-up")
	require.Equal(t, "t4", turns[0].ID)
	require.True(t, turns[0].Open)

	require.NoError(t, h.e.Close())
	h.e = nil
	h.opts.Turns = overlay.TurnOptions{MaxAge: time.Nanosecond}
	h.open()
	turns = h.e.Turns()
	require.Len(t, turns, 1, "pruned by age at start-up; the open turn stays")
	require.Equal(t, "t4", turns[0].ID)
	for _, s := range st.List() {
		require.NotContains(t, []string{"post:t1", "post:t2", "post:t3"}, s.ScopeID)
	}
}

// The byte cap evicts snapshots one at a time; a turn's end state goes with
// its pre-images, not later.
func TestTurnsByteCapDropsEndStates(t *testing.T) {
	h, st := newSnapHarnessWith(t, overlay.Staged, filepath.Join(t.TempDir(), "snapshots"), snapstore.Options{ByteCap: 4096})
	const size = 3 << 10
	for i := 1; i <= 4; i++ {
		h.baseFile(fmt.Sprintf("f%d", i), strings.Repeat(fmt.Sprint(i), size))
	}
	for i := 1; i <= 4; i++ {
		_, err := h.e.StartTurn(fmt.Sprintf("t%d", i), "")
		require.NoError(t, err)
		h.overwrite(fmt.Sprintf("f%d", i), strings.Repeat("x", size-1)+fmt.Sprint(i))
	}
	_, err := h.e.StartTurn("last", "")
	require.NoError(t, err)
	kept := map[string]bool{}
	for _, s := range st.List() {
		kept[s.ScopeID] = true
	}
	require.False(t, kept["turn:t1"], "the byte cap evicted nothing: %v", kept)
	for scope := range kept {
		if id, ok := strings.CutPrefix(scope, "post:"); ok {
			require.True(t, kept["turn:"+id], "%s is left without turn:%s", scope, id)
		}
	}
}

// A write after a rollback through a file opened before it reaches the
// daemon only as a write on a handle, which does not clear redo; redo
// still keeps it, as a conflict.
func TestTurnsRedoKeepsWriteThroughOpenFile(t *testing.T) {
	h, _ := newSnapHarness(t, overlay.Immediate)
	h.baseFile("a", "a0\n")
	h.baseFile("b", "b0\n")
	_, err := h.e.StartTurn("t1", "")
	require.NoError(t, err)
	h.overwrite("b", "b1\n")
	f, err := h.e.Open("a", unix.O_WRONLY, caller)
	require.NoError(t, err)
	// Past the kernel's clock tick: the write's ctime is later than the
	// open's record, and the file, still open through the mount, must
	// not look changed outside it.
	time.Sleep(30 * time.Millisecond)
	_, err = unix.Pwrite(f.Fd, []byte("a1\n"), 0)
	require.NoError(t, err)

	_, err = h.e.Rollback("t1", nil, false, overlay.Caller{})
	require.NoError(t, err)
	require.Equal(t, "a0\n", h.read("a"))
	_, err = unix.Pwrite(f.Fd, []byte("late\n"), 0)
	require.NoError(t, err)
	h.e.Release("a", f, caller)

	res, err := h.e.Redo(false, overlay.Caller{})
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, conflictPaths(res))
	require.Equal(t, "late\n", h.read("a"), "the write after the rollback is kept")
	require.Equal(t, "b1\n", h.read("b"))
}

// A directory a turn made that later holds an entry the turn did not make
// (here: written into the workspace from outside the mount) is a conflict
// at rollback: the turn's own entries go, the directory and the other
// entry stay; with force the directory goes whole.
func TestTurnsRollbackKeepsForeignEntriesOfNewDirectory(t *testing.T) {
	for _, force := range []bool{false, true} {
		h, _ := newSnapHarness(t, overlay.Immediate)
		h.baseFile("a", "a0\n")
		_, err := h.e.StartTurn("t1", "")
		require.NoError(t, err)
		h.mkdir("gen")
		h.create("gen/own", "own\n")
		require.NoError(t, os.WriteFile(h.wsPath("gen/user.txt"), []byte("user\n"), 0o644))

		res, err := h.e.Rollback("t1", nil, force, overlay.Caller{})
		require.NoError(t, err)
		if force {
			require.Empty(t, res.Conflicts)
			h.requireMissing("gen")
			continue
		}
		require.Equal(t, []string{"gen"}, conflictPaths(res))
		require.Contains(t, res.Conflicts[0].Reason, "gen/user.txt")
		require.Equal(t, []string{"user.txt"}, h.names("gen"))
		require.Equal(t, "user\n", h.read("gen/user.txt"))
	}
}

// A write through a file opened before a rollback is a new change: the
// FUSE layer calls BeforeWrite while redo is available (Capturing says
// so), and that clears redo.
func TestTurnsWriteThroughOpenFileClearsRedo(t *testing.T) {
	h, _ := newSnapHarness(t, overlay.Immediate)
	h.baseFile("a", "a0\n")
	_, err := h.e.StartTurn("t1", "")
	require.NoError(t, err)
	h.overwrite("a", "a1\n")
	_, err = h.e.Rollback("t1", nil, false, overlay.Caller{})
	require.NoError(t, err)
	require.True(t, h.e.Capturing(), "with redo available, writes must reach BeforeWrite")

	require.NoError(t, h.e.BeforeWrite("a", caller))
	_, err = h.e.Redo(false, overlay.Caller{})
	require.ErrorContains(t, err, "redo was cleared")
	require.False(t, h.e.Capturing())
}

// A rollback whose redo capture needs room under the byte cap never
// evicts the turns it is about to restore: when the room cannot be made
// otherwise, the rollback is refused before any file changes, and the
// turn is still there.
func TestRollbackNeverEvictsItsOwnTurns(t *testing.T) {
	h, _ := newSnapHarnessWith(t, overlay.Immediate, filepath.Join(t.TempDir(), "snapshots"), snapstore.Options{ByteCap: 2500})
	h.baseFile("f1", strings.Repeat("0", 1000))
	_, err := h.e.StartTurn("t1", "")
	require.NoError(t, err)
	h.overwrite("f1", strings.Repeat("1", 1000)) // t1's pre-image: 1000 bytes
	_, err = h.e.StartTurn("t2", "")             // t1's end state: 1000 more
	require.NoError(t, err)
	user := strings.Repeat("u", 1000)
	require.NoError(t, os.WriteFile(h.wsPath("f1"), []byte(user), 0o644))

	// Redo would need 1000 bytes more: 3000 > 2500, and only t1's own
	// snapshots could make room.
	_, err = h.e.Rollback("t1", nil, true, overlay.Caller{})
	require.ErrorIs(t, err, snapstore.ErrOverCap)
	require.Equal(t, user, h.read("f1"), "nothing changed")
	var ids []string
	for _, turn := range h.e.Turns() {
		ids = append(ids, turn.ID)
	}
	require.Contains(t, ids, "t1")
}

// A rollback of a turn that only moved a directory captures for redo what
// the turn changed, not the whole directory: a file in it past the
// snapshot cap once failed the rollback, and a large directory made it
// slow.
func TestRollbackOfAMoveCapturesOnlyWhatChanged(t *testing.T) {
	h, _ := newSnapHarnessWith(t, overlay.Staged, filepath.Join(t.TempDir(), "snapshots"), snapstore.Options{ByteCap: 3000})
	h.baseFile("d/big", strings.Repeat("b", 4000))
	for i := 0; i < 200; i++ {
		h.baseFile(fmt.Sprintf("d/f%d", i), "x")
	}
	c := overlay.Caller{Pid: os.Getpid()}
	_, err := h.e.StartTurn("t1", "")
	require.NoError(t, err)
	require.NoError(t, h.e.Rename("d", "d2", 0, c))
	res, err := h.e.Rollback("t1", nil, false, c)
	require.NoError(t, err)
	require.Empty(t, res.Conflicts)
	require.Equal(t, 4000, len(h.read("d/big")))
	_, err = h.e.Redo(false, c)
	require.NoError(t, err)
	require.Equal(t, 4000, len(h.read("d2/big")))
}
