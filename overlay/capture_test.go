package overlay_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"stagefs/internal/contenthash"
	"stagefs/overlay"
	snapstore "stagefs/snapshot"
)

// newSnapHarness is newHarness with a snapshot store: the engine captures
// pre-images into it.
func newSnapHarness(t *testing.T, mode overlay.Mode) (*harness, *snapstore.Store) {
	t.Helper()
	return newSnapHarnessIn(t, mode, filepath.Join(t.TempDir(), "snapshots"))
}

// newSnapHarnessIn keeps the snapshot store in dir.
func newSnapHarnessIn(t *testing.T, mode overlay.Mode, dir string) (*harness, *snapstore.Store) {
	t.Helper()
	return newSnapHarnessWith(t, mode, dir, snapstore.Options{})
}

// newSnapHarnessWith keeps the snapshot store in dir, opened with opts.
func newSnapHarnessWith(t *testing.T, mode overlay.Mode, dir string, opts snapstore.Options) (*harness, *snapstore.Store) {
	t.Helper()
	h := newHarness(t)
	st, err := snapstore.Open(dir, opts)
	require.NoError(t, err)
	require.NoError(t, h.e.Close())
	h.e = nil
	h.opts.Snapshots = st
	h.opts.Mode = mode
	h.open()
	return h, st
}

// fillBase gives the workspace one of each kind of entry the capture tests
// mutate.
func fillBase(h *harness) {
	h.baseFile("f.txt", "f0\n")
	h.baseFile("g.txt", "g0\n")
	h.baseFile("d/x", "x0\n")
	h.baseFile("d/sub/y", "y0\n")
	h.baseDir("e")
	h.baseSymlink("link", "f.txt")
}

// entryKinds describes a snapshot's entries as "kind path" (moves as
// "moved path<-from"), in capture order.
func entryKinds(t *testing.T, st *snapstore.Store, scope string) []string {
	t.Helper()
	ents, err := st.Entries(scope)
	require.NoError(t, err)
	out := []string{}
	for _, e := range ents {
		s := string(e.Kind) + " " + e.Path
		if e.From != "" {
			s += "<-" + e.From
		}
		out = append(out, s)
	}
	return out
}

func entryOf(t *testing.T, st *snapstore.Store, scope, path string, kind snapstore.Kind) snapstore.Entry {
	t.Helper()
	ents, err := st.Entries(scope)
	require.NoError(t, err)
	for _, e := range ents {
		if e.Path == path && e.Kind == kind {
			return e
		}
	}
	t.Fatalf("snapshot %s has no %s entry for %s: %v", scope, kind, path, entryKinds(t, st, scope))
	return snapstore.Entry{}
}

func hashOfText(s string) contenthash.Hash { return contenthash.Sum([]byte(s)) }

func u32(v uint32) *uint32 { return &v }

// TestCaptureEachMutation makes one mutation per snapshot, checks the
// entries it captured, restores, and checks that the view is back to what
// it was, with the pending set it had.
func TestCaptureEachMutation(t *testing.T) {
	cases := []struct {
		name string
		op   func(h *harness)
		want []string         // entry kinds, in capture order
		pre  func(h *harness) // run before the snapshot opens
	}{
		{"write-open", func(h *harness) {
			f, err := h.e.Open("f.txt", unix.O_WRONLY, caller)
			require.NoError(h.t, err)
			h.pwrite("f.txt", f, "F")
		}, []string{"file f.txt"}, nil},
		{"open-trunc", func(h *harness) { h.overwrite("f.txt", "new content\n") }, []string{"file f.txt"}, nil},
		{"create-new", func(h *harness) { h.create("new.txt", "n\n") }, []string{"absent new.txt"}, nil},
		{"create-existing-trunc", func(h *harness) { h.create("f.txt", "again\n") }, []string{"file f.txt"}, nil},
		{"create-in-new-dir", func(h *harness) {
			h.mkdir("nd")
			h.create("nd/n.txt", "n\n")
		}, []string{"absent nd", "absent nd/n.txt"}, nil},
		{"unlink", func(h *harness) { h.unlink("f.txt") }, []string{"file f.txt"}, nil},
		{"unlink-symlink", func(h *harness) { h.unlink("link") }, []string{"symlink link"}, nil},
		{"rmdir", func(h *harness) { h.rmdir("e") }, []string{"dir e"}, nil},
		{"rm-rf", func(h *harness) {
			h.unlink("d/sub/y")
			h.rmdir("d/sub")
			h.unlink("d/x")
			h.rmdir("d")
		}, []string{"file d/sub/y", "dir d/sub", "file d/x", "dir d"}, nil},
		{"rename-file", func(h *harness) { h.rename("f.txt", "h.txt") }, []string{"file f.txt", "absent h.txt"}, nil},
		{"rename-file-over", func(h *harness) { h.rename("f.txt", "g.txt") }, []string{"file f.txt", "file g.txt"}, nil},
		{"rename-dir", func(h *harness) { h.rename("d", "d2") }, []string{"absent d2", "moved d2<-d"}, nil},
		{"rename-dir-then-edit", func(h *harness) {
			h.rename("d", "d2")
			h.overwrite("d2/x", "x1\n")
		}, []string{"absent d2", "moved d2<-d", "file d2/x"}, nil},
		{"rename-dir-over-empty-dir", func(h *harness) { h.rename("d", "e") }, []string{"dir e", "moved e<-d"}, nil},
		{"rmdir-then-mkdir", func(h *harness) {
			h.rmdir("e")
			h.mkdir("e")
			h.create("e/new", "n\n")
		}, []string{"dir e", "absent e/new"}, nil},
		{"rm-rf-then-mkdir", func(h *harness) {
			h.unlink("d/sub/y")
			h.rmdir("d/sub")
			h.unlink("d/x")
			h.rmdir("d")
			h.mkdir("d")
			h.create("d/x", "other\n")
		}, []string{"file d/sub/y", "dir d/sub", "file d/x", "dir d"}, nil},
		{"unlink-then-create", func(h *harness) {
			h.unlink("f.txt")
			h.create("f.txt", "replacement\n")
		}, []string{"file f.txt"}, nil},
		{"rename-dir-twice-nested", func(h *harness) {
			h.rename("d", "d2")
			h.rename("d2/sub", "top")
			h.overwrite("top/y", "y1\n")
		}, []string{"absent d2", "moved d2<-d", "absent top", "moved top<-d2/sub", "file top/y"}, nil},
		{"rename-dir-then-reuse-old-name", func(h *harness) {
			h.rename("d", "d2")
			h.mkdir("d")
			h.create("d/x", "new x\n")
		}, []string{"absent d2", "moved d2<-d", "absent d", "absent d/x"}, nil},
		{"rename-dir-with-earlier-pending-changes", func(h *harness) {
			h.rename("d", "d2")
			h.overwrite("d2/x", "x2\n")
		}, []string{"absent d2", "moved d2<-d", "file d2/x"}, func(h *harness) {
			h.unlink("d/sub/y")
			h.overwrite("d/x", "x1\n")
			h.create("d/new", "n\n")
		}},
		{"mkdir", func(h *harness) { h.mkdir("m") }, []string{"absent m"}, nil},
		{"symlink", func(h *harness) {
			_, err := h.e.Symlink("f.txt", "s", caller)
			require.NoError(h.t, err)
		}, []string{"absent s"}, nil},
		{"link", func(h *harness) {
			_, err := h.e.Link("f.txt", "hl", caller)
			require.NoError(h.t, err)
		}, []string{"absent hl"}, nil},
		{"chmod-file", func(h *harness) {
			_, err := h.e.Setattr("f.txt", -1, overlay.SetAttr{Mode: u32(0o600)}, caller)
			require.NoError(h.t, err)
		}, []string{"file f.txt"}, nil},
		{"chmod-dir", func(h *harness) {
			_, err := h.e.Setattr("e", -1, overlay.SetAttr{Mode: u32(0o700)}, caller)
			require.NoError(h.t, err)
		}, []string{"dir e"}, nil},
		{"truncate", func(h *harness) {
			size := uint64(1)
			_, err := h.e.Setattr("f.txt", -1, overlay.SetAttr{Size: &size}, caller)
			require.NoError(h.t, err)
		}, []string{"file f.txt"}, nil},
		{"setxattr", func(h *harness) {
			require.NoError(h.t, h.e.Setxattr("f.txt", "user.test", []byte("v"), 0, caller))
		}, []string{"file f.txt"}, nil},
		{"two-writes-first-wins", func(h *harness) {
			h.overwrite("f.txt", "one\n")
			h.overwrite("f.txt", "two\n")
			h.unlink("f.txt")
		}, []string{"file f.txt"}, nil},
	}
	// Staged, linking copies the old name up: it is captured as well, so
	// that restore can drop the copy.
	stagedWant := map[string][]string{"link": {"absent hl", "file f.txt"}}
	for _, mode := range []overlay.Mode{overlay.Staged, overlay.Immediate} {
		for _, tc := range cases {
			t.Run(string(mode)+"/"+tc.name, func(t *testing.T) {
				h, st := newSnapHarness(t, mode)
				fillBase(h)
				if tc.pre != nil {
					tc.pre(h)
				}
				before := h.view()
				pending := h.pending()
				ws := h.wsSnapshot()

				_, err := h.e.OpenSnapshot("t1", "", os.Getpid(), nil)
				require.NoError(t, err)
				tc.op(h)
				info, err := h.e.CloseSnapshot("t1")
				require.NoError(t, err)
				require.True(t, info.Closed)
				want := tc.want
				if w, ok := stagedWant[tc.name]; ok && mode == overlay.Staged {
					want = w
				}
				require.Equal(t, want, entryKinds(t, st, "t1"))
				if mode == overlay.Staged {
					require.Equal(t, ws, h.wsSnapshot(), "staged: the workspace changed")
				}

				res, err := h.e.Restore("t1")
				require.NoError(t, err)
				require.Empty(t, res.Failed, "restore failures")
				require.NotEmpty(t, res.Restored)
				require.Equal(t, before, h.view(), "view after restore")
				require.Equal(t, ws, h.wsSnapshot(), "workspace after restore")
				if tc.name == "setxattr" {
					_, err := h.e.Getxattr("f.txt", "user.test", make([]byte, 64))
					assert.ErrorIs(t, err, unix.ENODATA, "the xattr set by the tool call survived the restore")
				}
				// The view is what it was, so the pending set must be too:
				// a pre-image equal to the workspace drops the pending
				// entry rather than staging a copy of the workspace.
				assert.Equal(t, pending, h.pending(), "pending set after restore (the view is what it was before)")
			})
		}
	}
}

// TestCaptureFileEntry checks what a file's pre-image holds: the body of
// the state before the first mutation, its size, mode and mtime.
func TestCaptureFileEntry(t *testing.T) {
	h, st := newSnapHarness(t, overlay.Staged)
	h.baseFile("f.txt", "before\n")
	require.NoError(t, os.Chmod(h.wsPath("f.txt"), 0o640))
	bst := h.stat("f.txt")

	_, err := h.e.OpenSnapshot("t1", "", os.Getpid(), nil)
	require.NoError(t, err)
	h.overwrite("f.txt", "after one\n")
	h.overwrite("f.txt", "after two\n")
	_, err = h.e.CloseSnapshot("t1")
	require.NoError(t, err)

	e := entryOf(t, st, "t1", "f.txt", snapstore.KindFile)
	require.Equal(t, hashOfText("before\n"), e.Hash)
	require.EqualValues(t, len("before\n"), e.Size)
	require.EqualValues(t, 0o640, e.Mode&0o7777)
	require.EqualValues(t, syscall.S_IFREG, e.Mode&syscall.S_IFMT)
	require.Equal(t, bst.Mtim.Nano(), e.Mtime)
	require.Equal(t, os.Getpid(), e.Pid)
	require.NotZero(t, e.Time)

	// A symlink's pre-image is its target.
	h.baseSymlink("l", "somewhere")
	_, err = h.e.OpenSnapshot("t2", "", os.Getpid(), nil)
	require.NoError(t, err)
	h.unlink("l")
	_, err = h.e.CloseSnapshot("t2")
	require.NoError(t, err)
	require.Equal(t, "somewhere", entryOf(t, st, "t2", "l", snapstore.KindSymlink).Target)
	_, err = h.e.Restore("t2")
	require.NoError(t, err)
	target, err := h.e.Readlink("l")
	require.NoError(t, err)
	require.Equal(t, "somewhere", target)

	// Restoring an edit of a pending file brings the pending content back
	// (the pre-image is not the workspace's).
	h.overwrite("f.txt", "pending\n")
	_, err = h.e.OpenSnapshot("t3", "", os.Getpid(), nil)
	require.NoError(t, err)
	h.overwrite("f.txt", "tool call\n")
	_, err = h.e.CloseSnapshot("t3")
	require.NoError(t, err)
	_, err = h.e.Restore("t3")
	require.NoError(t, err)
	require.Equal(t, "pending\n", h.read("f.txt"))
	require.Contains(t, h.pending(), "modified f.txt")
	require.Equal(t, "before\n", h.baseRead("f.txt"))
}

// TestCapturePidBinding checks who a snapshot captures for: a bound
// snapshot its process and descendants only, an unbound one every process,
// and neither the daemon's own operations (pid 0).
func TestCapturePidBinding(t *testing.T) {
	self := os.Getpid()
	unrelated := os.Getppid() // our parent is not our descendant
	require.NotEqual(t, self, unrelated)

	child := exec.Command("sleep", "30")
	require.NoError(t, child.Start())
	t.Cleanup(func() {
		child.Process.Kill()
		child.Wait()
	})

	write := func(h *harness, p string, c overlay.Caller) {
		t.Helper()
		f, _, err := h.e.Create(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644, c)
		require.NoError(t, err)
		_, err = unix.Pwrite(f.Fd, []byte("w\n"), 0)
		require.NoError(t, err)
		h.e.Release(p, f, c)
	}

	t.Run("bound", func(t *testing.T) {
		h, st := newSnapHarness(t, overlay.Staged)
		h.baseFile("a", "a\n")
		h.baseFile("b", "b\n")
		h.baseFile("c", "c\n")
		h.baseFile("d", "d\n")
		info, err := h.e.OpenSnapshot("bound", "", self, nil)
		require.NoError(t, err)
		require.Equal(t, self, info.Pid)
		write(h, "a", overlay.Caller{Pid: unrelated})
		write(h, "b", overlay.Caller{Pid: self})
		write(h, "c", overlay.Caller{Pid: child.Process.Pid})
		write(h, "d", overlay.Caller{Pid: 0})
		write(h, "e", overlay.Caller{Pid: 1 << 30}) // no such process
		info, err = h.e.CloseSnapshot("bound")
		require.NoError(t, err)
		require.Equal(t, []string{"b", "c"}, info.Paths)
		require.Equal(t, []string{"file b", "file c"}, entryKinds(t, st, "bound"))
	})

	t.Run("unbound", func(t *testing.T) {
		h, st := newSnapHarness(t, overlay.Staged)
		h.baseFile("a", "a\n")
		h.baseFile("d", "d\n")
		info, err := h.e.OpenSnapshot("any", "", 0, nil)
		require.NoError(t, err)
		require.Zero(t, info.Pid)
		write(h, "a", overlay.Caller{Pid: unrelated})
		write(h, "b", overlay.Caller{Pid: self})
		write(h, "d", overlay.Caller{Pid: 0})
		info, err = h.e.CloseSnapshot("any")
		require.NoError(t, err)
		require.Equal(t, []string{"a", "b"}, info.Paths)
		require.Equal(t, []string{"file a", "absent b"}, entryKinds(t, st, "any"))
	})

	t.Run("two-bound-at-once", func(t *testing.T) {
		// Two sibling processes, each with its own snapshot: neither is
		// the other's descendant.
		other := exec.Command("sleep", "30")
		require.NoError(t, other.Start())
		t.Cleanup(func() {
			other.Process.Kill()
			other.Wait()
		})
		a, b := child.Process.Pid, other.Process.Pid
		h, st := newSnapHarness(t, overlay.Staged)
		h.baseFile("mine", "m\n")
		h.baseFile("theirs", "t\n")
		h.baseFile("shared", "s\n")
		_, err := h.e.OpenSnapshot("me", "", a, nil)
		require.NoError(t, err)
		_, err = h.e.OpenSnapshot("them", "", b, nil)
		require.NoError(t, err)
		write(h, "mine", overlay.Caller{Pid: a})
		write(h, "theirs", overlay.Caller{Pid: b})
		write(h, "shared", overlay.Caller{Pid: a})
		h.overwrite("shared", "test process\n") // neither's
		write(h, "shared", overlay.Caller{Pid: b})
		me, err := h.e.CloseSnapshot("me")
		require.NoError(t, err)
		them, err := h.e.CloseSnapshot("them")
		require.NoError(t, err)
		require.Equal(t, []string{"mine", "shared"}, me.Paths)
		require.Equal(t, []string{"theirs", "shared"}, them.Paths)
		// Each captured shared as it was before its own first write.
		require.Equal(t, hashOfText("s\n"), entryOf(t, st, "me", "shared", snapstore.KindFile).Hash)
		require.Equal(t, hashOfText("test process\n"), entryOf(t, st, "them", "shared", snapstore.KindFile).Hash)

		// Restoring "me" keeps the other tool call's change to its file.
		res, err := h.e.Restore("me")
		require.NoError(t, err)
		require.Empty(t, res.Failed)
		require.Equal(t, "m\n", h.read("mine"))
		require.Equal(t, "w\n", h.read("theirs"))
		require.Equal(t, "s\n", h.read("shared"))
		require.Equal(t, []string{"modified theirs"}, h.pending())
	})

	t.Run("restore-is-not-captured", func(t *testing.T) {
		h, _ := newSnapHarness(t, overlay.Staged)
		h.baseFile("f", "f0\n")
		_, err := h.e.OpenSnapshot("t1", "", self, nil)
		require.NoError(t, err)
		h.overwrite("f", "f1\n")
		_, err = h.e.CloseSnapshot("t1")
		require.NoError(t, err)
		// An unbound snapshot is open while t1 is restored: the restore
		// is the daemon's and must not be captured.
		_, err = h.e.OpenSnapshot("watch", "", 0, nil)
		require.NoError(t, err)
		_, err = h.e.Restore("t1")
		require.NoError(t, err)
		info, err := h.e.CloseSnapshot("watch")
		require.NoError(t, err)
		require.Empty(t, info.Paths)
		require.Equal(t, "f0\n", h.read("f"))
	})
}

// TestCaptureExplicitPaths: with paths the snapshot captures them now
// (directories with everything below) and is closed.
func TestCaptureExplicitPaths(t *testing.T) {
	h, st := newSnapHarness(t, overlay.Staged)
	fillBase(h)
	before := h.view()
	info, err := h.e.OpenSnapshot("now", "", 0, []string{"f.txt", "d", "missing"})
	require.NoError(t, err)
	require.True(t, info.Closed)
	got := entryKinds(t, st, "now")
	sort.Strings(got)
	require.Equal(t, []string{"absent missing", "dir d", "dir d/sub", "file d/sub/y", "file d/x", "file f.txt"}, got)

	// Later mutations are not captured: the snapshot is closed.
	h.overwrite("f.txt", "changed\n")
	h.overwrite("d/x", "changed\n")
	h.unlink("d/sub/y")
	h.rmdir("d/sub")
	h.create("missing", "now here\n")
	_, err = h.e.Setattr("d", -1, overlay.SetAttr{Mode: u32(0o700)}, caller)
	require.NoError(t, err)
	require.Len(t, entryKinds(t, st, "now"), 6)

	res, err := h.e.Restore("now")
	require.NoError(t, err)
	require.Empty(t, res.Failed)
	require.Equal(t, before, h.view())
	assert.Empty(t, h.pending(), "pending set after restore (the view equals the workspace)")
}

// TestCaptureUnboundReplacesUnbound: opening an unbound snapshot closes the
// previous unbound one; bound ones stay open. A process a bound snapshot
// covers is that tool call's alone: the unbound ones leave it, and capture
// every other process.
func TestCaptureUnboundReplacesUnbound(t *testing.T) {
	h, st := newSnapHarness(t, overlay.Staged)
	other := overlay.Caller{Pid: 1} // not below the bound process
	_, err := h.e.OpenSnapshot("u1", "", 0, nil)
	require.NoError(t, err)
	_, err = h.e.OpenSnapshot("b1", "", os.Getpid(), nil)
	require.NoError(t, err)
	h.create("one", "1\n")
	_, err = h.e.Mkdir("other1", 0o755, other)
	require.NoError(t, err)
	_, err = h.e.OpenSnapshot("u2", "", 0, nil)
	require.NoError(t, err)
	h.create("two", "2\n")
	_, err = h.e.Mkdir("other2", 0o755, other)
	require.NoError(t, err)

	open := map[string]bool{}
	for _, i := range st.List() {
		open[i.ScopeID] = !i.Closed
	}
	require.Equal(t, map[string]bool{"u1": false, "b1": true, "u2": true}, open)
	require.Equal(t, []string{"absent other1"}, entryKinds(t, st, "u1"))
	require.Equal(t, []string{"absent one", "absent two"}, entryKinds(t, st, "b1"))
	require.Equal(t, []string{"absent other2"}, entryKinds(t, st, "u2"))
}

// TestCaptureSurvivesRestart: snapshots are on disk; a new engine over the
// same store restores them.
func TestCaptureSurvivesRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snapshots")
	h, _ := newSnapHarnessIn(t, overlay.Staged, dir)
	fillBase(h)
	before := h.view()
	_, err := h.e.OpenSnapshot("t1", "", os.Getpid(), nil)
	require.NoError(t, err)
	h.overwrite("f.txt", "changed\n")
	h.rename("d", "d2")
	_, err = h.e.CloseSnapshot("t1")
	require.NoError(t, err)
	// An unbound snapshot left open stays open and keeps capturing.
	_, err = h.e.OpenSnapshot("open", "", 0, nil)
	require.NoError(t, err)
	h.create("during", "1\n")

	// A new engine and store over the same state dir and snapshot dir.
	require.NoError(t, h.e.Close())
	h.e = nil
	st2, err := snapstore.Open(dir, snapstore.Options{})
	require.NoError(t, err)
	h.opts.Snapshots = st2
	h.open()
	h.create("after", "2\n")
	info, err := h.e.CloseSnapshot("open")
	require.NoError(t, err)
	require.Equal(t, []string{"during", "after"}, info.Paths)
	h.unlink("during")
	h.unlink("after")

	res, err := h.e.Restore("t1")
	require.NoError(t, err)
	require.Empty(t, res.Failed)
	require.Equal(t, before, h.view())
	require.Empty(t, h.pending())
}

// TestCaptureXattr: an extended attribute changed by a tool call is undone
// by restore, also where restore cannot just drop a pending copy (a file
// that was pending before the tool call, immediate mode).
func TestCaptureXattr(t *testing.T) {
	for _, mode := range []overlay.Mode{overlay.Staged, overlay.Immediate} {
		t.Run(string(mode)+"/set-on-pending-file", func(t *testing.T) {
			h, _ := newSnapHarness(t, mode)
			h.create("p.txt", "p\n") // pending (staged) or in the workspace
			_, err := h.e.OpenSnapshot("t1", "", os.Getpid(), nil)
			require.NoError(t, err)
			require.NoError(t, h.e.Setxattr("p.txt", "user.k", []byte("v"), 0, caller))
			_, err = h.e.CloseSnapshot("t1")
			require.NoError(t, err)
			res, err := h.e.Restore("t1")
			require.NoError(t, err)
			require.Empty(t, res.Failed)
			require.Equal(t, "p\n", h.read("p.txt"))
			_, err = h.e.Getxattr("p.txt", "user.k", make([]byte, 64))
			assert.ErrorIs(t, err, unix.ENODATA, "the xattr set by the tool call survived the restore")
		})
		t.Run(string(mode)+"/remove", func(t *testing.T) {
			h, _ := newSnapHarness(t, mode)
			h.baseFile("f.txt", "f\n")
			require.NoError(t, unix.Setxattr(h.wsPath("f.txt"), "user.k", []byte("v"), 0))
			_, err := h.e.OpenSnapshot("t1", "", os.Getpid(), nil)
			require.NoError(t, err)
			require.NoError(t, h.e.Removexattr("f.txt", "user.k", caller))
			_, err = h.e.CloseSnapshot("t1")
			require.NoError(t, err)
			require.Equal(t, []string{"file f.txt"}, entryKinds(t, h.opts.Snapshots, "t1"))
			res, err := h.e.Restore("t1")
			require.NoError(t, err)
			require.Empty(t, res.Failed)
			buf := make([]byte, 64)
			n, err := h.e.Getxattr("f.txt", "user.k", buf)
			if assert.NoError(t, err, "the xattr removed by the tool call is not back after the restore") {
				assert.Equal(t, "v", string(buf[:n]))
			}
		})
	}
}

// Paths changed after a tool call's snapshot closed are restored and
// listed as overwritten, or with keepLater left alone and listed as kept;
// restoring twice is the same as once.
func TestRestoreLaterChanges(t *testing.T) {
	for _, keepLater := range []bool{false, true} {
		h, _ := newSnapHarness(t, overlay.Staged)
		h.baseFile("a", "a0\n")
		h.baseFile("b", "b0\n")
		_, err := h.e.OpenSnapshot("tc1", "", 0, nil)
		require.NoError(t, err)
		h.overwrite("a", "a1\n")
		h.overwrite("b", "b1\n")
		_, err = h.e.CloseSnapshot("tc1")
		require.NoError(t, err)
		h.overwrite("b", "b2 by a later tool call\n")

		res, err := h.e.RestoreTool("tc1", keepLater)
		require.NoError(t, err)
		require.Equal(t, "a0\n", h.read("a"))
		if keepLater {
			require.Equal(t, []string{"b"}, res.Kept)
			require.Empty(t, res.Overwritten)
			require.Equal(t, "b2 by a later tool call\n", h.read("b"))
		} else {
			require.Equal(t, []string{"b"}, res.Overwritten)
			require.Empty(t, res.Kept)
			require.Equal(t, "b0\n", h.read("b"))
		}
		view := h.view()
		again, err := h.e.RestoreTool("tc1", keepLater)
		require.NoError(t, err)
		require.Equal(t, view, h.view(), "a second restore changes nothing")
		require.Empty(t, again.Overwritten, "what the first restore put back is not a later change")
	}
}

// A pre-image that cannot be stored (here: the content store's disk is
// full) lets the mutation go on and marks the snapshot incomplete, or with
// CaptureFailure "deny" fails the mutation with ENOSPC.
func TestCaptureFailurePolicy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	for _, policy := range []string{"allow", "deny"} {
		dir := t.TempDir()
		require.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"))
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
		h, _ := newSnapHarnessIn(t, overlay.Staged, filepath.Join(dir, "snapshots"))
		require.NoError(t, h.e.Close())
		h.e = nil
		h.opts.CaptureFailure = policy
		var failed []string
		h.opts.OnCaptureFailed = func(scope, p string, err error) { failed = append(failed, scope+" "+p) }
		h.open()
		h.baseFile("big", strings.Repeat("x", 256<<10))
		h.baseFile("small", "s\n")
		_, err := h.e.OpenSnapshot("tc", "", 0, nil)
		require.NoError(t, err)
		h.overwrite("small", "s2\n")
		f, err := h.e.Open("big", unix.O_WRONLY|unix.O_TRUNC, caller)
		if policy == "deny" {
			require.ErrorIs(t, err, syscall.ENOSPC)
			require.Equal(t, strings.Repeat("x", 256<<10), h.read("big"))
			continue
		}
		require.NoError(t, err)
		h.pwrite("big", f, "y\n")
		require.Equal(t, []string{"tc big"}, failed)
		_, err = h.e.CloseSnapshot("tc")
		require.NoError(t, err)
		res, err := h.e.Restore("tc")
		require.NoError(t, err)
		require.Equal(t, []string{"big"}, res.Uncaptured)
		require.Equal(t, "s\n", h.read("small"), "what was captured is restored")
		require.Equal(t, "y\n", h.read("big"), "what could not be captured stays")
	}
}

// A restore that brings back a directory which a later rename (kept by the
// restore) took away must not show the workspace directory twice: the
// restored one is a copy, and commit then writes both.
func TestRestoreRenamedAwayDirectory(t *testing.T) {
	h, _ := newSnapHarness(t, overlay.Staged)
	h.baseFile("d/s/y", "y\n")
	h.baseDir("d/t")
	_, err := h.e.OpenSnapshot("call", "", 0, []string{"d/s"})
	require.NoError(t, err)
	h.rename("d/s", "d/t/s")
	_, err = h.e.Restore("call")
	require.NoError(t, err)
	require.Equal(t, "y\n", h.read("d/s/y"))
	require.Equal(t, "y\n", h.read("d/t/s/y"))
	h.commitAll()
	require.Equal(t, "y\n", h.baseRead("d/s/y"))
	require.Equal(t, "y\n", h.baseRead("d/t/s/y"))
}

// A later process's work is not undone silently: a file it made inside a
// directory the tool call created, and a mode it changed on a file the tool
// call wrote, are listed as overwritten, or with keepLater kept (with the
// directory that holds them).
func TestRestoreLaterWorkBelowAndModes(t *testing.T) {
	other := overlay.Caller{Pid: 1} // not the tool call's process tree
	for _, keepLater := range []bool{false, true} {
		h, _ := newSnapHarness(t, overlay.Staged)
		h.baseFile("f.txt", "f0\n")
		_, err := h.e.OpenSnapshot("tc1", "", os.Getpid(), nil)
		require.NoError(t, err)
		h.mkdir("gen")
		h.create("gen/a", "a\n")
		h.overwrite("f.txt", "f1\n")
		_, err = h.e.CloseSnapshot("tc1")
		require.NoError(t, err)

		f, _, err := h.e.Create("gen/b", unix.O_WRONLY|unix.O_CREAT, 0o644, other)
		require.NoError(t, err)
		h.pwrite("gen/b", f, "b\n")
		_, err = h.e.Setattr("f.txt", -1, overlay.SetAttr{Mode: ptrTo(uint32(0o600))}, other)
		require.NoError(t, err)

		res, err := h.e.RestoreTool("tc1", keepLater)
		require.NoError(t, err)
		require.Empty(t, res.Failed)
		if keepLater {
			require.Equal(t, []string{"f.txt", "gen", "gen/b"}, res.Kept)
			require.Empty(t, res.Overwritten)
			require.Equal(t, []string{"b"}, h.names("gen"), "the tool call's own file goes")
			require.Equal(t, "f1\n", h.read("f.txt"))
		} else {
			require.Equal(t, []string{"f.txt", "gen/b"}, res.Overwritten)
			require.Empty(t, res.Kept)
			h.requireMissing("gen")
			require.Equal(t, "f0\n", h.read("f.txt"))
			require.Equal(t, uint32(0o644), h.stat("f.txt").Mode&0o7777)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }

// Over the byte cap, a capture evicts closed snapshots first; a body that
// still does not fit is not stored: the mutation goes on, the path is
// recorded in the manifest as uncaptured (kept across a restart) and named
// in restore's result, and the rest of the tool call is restored.
func TestCaptureOverByteCap(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snapshots")
	h, st := newSnapHarnessWith(t, overlay.Staged, dir, snapstore.Options{ByteCap: 100})
	var failed []string
	h.opts.OnCaptureFailed = func(scope, p string, err error) { failed = append(failed, scope+" "+p) }
	h.restart()
	h.baseFile("old", strings.Repeat("o", 60))
	h.baseFile("mid", strings.Repeat("m", 60))
	h.baseFile("big", strings.Repeat("b", 200))
	h.baseFile("small", "s\n")

	_, err := h.e.OpenSnapshot("early", "", 0, nil)
	require.NoError(t, err)
	h.overwrite("old", "o2\n")
	_, err = h.e.CloseSnapshot("early")
	require.NoError(t, err)

	_, err = h.e.OpenSnapshot("tc", "", 0, nil)
	require.NoError(t, err)
	h.overwrite("mid", "m2\n") // 60 + 60 > 100: "early" is evicted
	_, ok := st.Lookup("early")
	require.False(t, ok, "a closed snapshot makes room")
	h.overwrite("big", "b2\n") // larger than the whole cap
	// Its next mutation does not capture "b2" (which fits) as if it were
	// the pre-image: the path changed since its capture failed.
	h.overwrite("big", "b3\n")
	h.overwrite("small", "s2\n")
	require.Equal(t, []string{"tc big"}, failed)
	info, err := h.e.CloseSnapshot("tc")
	require.NoError(t, err)
	require.Equal(t, []string{"mid", "small"}, info.Paths)
	require.Equal(t, []string{"big"}, info.Uncaptured)

	// A new engine over a reopened store.
	require.NoError(t, h.e.Close())
	h.e = nil
	h.opts.Snapshots, err = snapstore.Open(dir, snapstore.Options{ByteCap: 100})
	require.NoError(t, err)
	h.open()
	res, err := h.e.Restore("tc")
	require.NoError(t, err)
	require.Equal(t, []string{"big"}, res.Uncaptured)
	require.Equal(t, strings.Repeat("m", 60), h.read("mid"))
	require.Equal(t, "s\n", h.read("small"))
	require.Equal(t, "b3\n", h.read("big"), "what could not be captured stays")
}

// A closed tool-call snapshot whose post file is missing (closed at the
// start after a reboot, or lost in a crash) gets one at the next start,
// from the view, so that a later change is still told apart at restore.
func TestMissingPostIsRebuiltAtStart(t *testing.T) {
	h, _ := newSnapHarness(t, overlay.Staged)
	h.baseFile("a", "a0\n")
	_, err := h.e.OpenSnapshot("tc1", "", 0, nil)
	require.NoError(t, err)
	h.overwrite("a", "a1\n")
	info, err := h.e.CloseSnapshot("tc1")
	require.NoError(t, err)
	post := filepath.Join(h.opts.StateDir, "posts", info.ID+".json")
	require.FileExists(t, post)
	require.NoError(t, os.Remove(post))

	h.restart()
	require.FileExists(t, post)
	h.overwrite("a", "a2 by a later tool call\n")
	res, err := h.e.RestoreTool("tc1", true)
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, res.Kept)
	require.Equal(t, "a2 by a later tool call\n", h.read("a"))
}
