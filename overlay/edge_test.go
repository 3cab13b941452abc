package overlay_test

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"stagefs/overlay"
)

// rm -rf d; mv x d: the rename would drop the whiteouts that make d empty,
// and the commit could not apply it. It is refused with EXDEV, so mv falls
// back to copy and delete, which works.
func TestRenameOntoDeletedDirIsEXDEV(t *testing.T) {
	h := newHarness(t)
	h.baseFile("dist/old.js", "old")
	h.baseFile("tmp/new.js", "new")
	h.baseFile("f", "file")
	ws := h.wsSnapshot()
	h.unlink("dist/old.js")
	h.rmdir("dist")
	require.ErrorIs(t, h.e.Rename("tmp", "dist", 0, caller), syscall.EXDEV)
	require.ErrorIs(t, h.e.Rename("f", "dist", 0, caller), syscall.EXDEV)
	require.Equal(t, "new", h.read("tmp/new.js"), "a refused rename changes nothing")
	require.Equal(t, "file", h.read("f"))
	require.Equal(t, []string{"deleted dist", "deleted dist/old.js"}, h.pending())

	// What mv does on EXDEV.
	h.mkdir("dist")
	h.create("dist/new.js", h.read("tmp/new.js"))
	h.unlink("tmp/new.js")
	h.rmdir("tmp")
	require.Equal(t, ws, h.wsSnapshot())
	h.commitAll()
	require.Equal(t, map[string]string{
		"dist": "dir 755", "dist/new.js": "file 644 \"new\"", "f": "file 644 \"file\"",
	}, h.wsSnapshot())
}

func TestRenameOntoEmptiedBaseDirIsEXDEV(t *testing.T) {
	// The directory in the way is empty only because its base entries are
	// deleted in the pending set.
	h := newHarness(t)
	h.baseFile("dst/gone", "g")
	h.baseFile("src/a", "a")
	h.unlink("dst/gone")
	require.Equal(t, []string{}, h.names("dst"))
	require.ErrorIs(t, h.e.Rename("src", "dst", 0, caller), syscall.EXDEV)
	h.commitAll()
}

func TestFailedDirRenameStaysPending(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a/x", "x")
	h.rename("a", "b")
	h.overwrite("b/x", "x2")
	pending := h.pending()
	require.Equal(t, []string{"deleted a", "renamed b<-a", "modified b/x"}, pending)

	// Meanwhile the user makes b in the workspace.
	h.baseFile("b/theirs", "t")
	res := h.e.Commit(nil, false, caller)
	require.Empty(t, res.Committed, "nothing of the rename may be reported committed")
	require.NotEmpty(t, res.Conflicts)
	require.Equal(t, pending, h.pending(), "the rename stays pending")
	require.Equal(t, "x", h.baseRead("a/x"), "the source is not deleted")
	require.Equal(t, "t", h.baseRead("b/theirs"))
	require.Equal(t, "x2", h.read("b/x"))
	h.requireMissing("a")

	// The user removes their b: now it commits.
	require.NoError(t, os.RemoveAll(h.wsPath("b")))
	h.commitAll()
	require.Equal(t, "x2", h.baseRead("b/x"))
}

func TestDiscardChildKeepsSiblings(t *testing.T) {
	h := newHarness(t)
	h.mkdir("n")
	h.create("n/a", "a")
	h.create("n/b", "b")
	done := h.e.Discard([]string{"n/a"}, caller)
	require.Equal(t, []string{"n/a"}, done)
	require.Equal(t, []string{"b"}, h.names("n"))
	require.Equal(t, []string{"mkdir n", "created n/b"}, h.pending())
	h.commitAll()
}

func TestDiscardChildOfRenamedDir(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a/x", "x")
	h.baseFile("a/y", "y")
	h.rename("a", "b")
	h.overwrite("b/x", "x2")
	h.overwrite("b/y", "y2")
	done := h.e.Discard([]string{"b/x"}, caller)
	require.Equal(t, []string{"b/x"}, done)
	require.Equal(t, "x", h.read("b/x"), "back to the base content, still renamed")
	require.Equal(t, "y2", h.read("b/y"), "the sibling's edit is kept")
	require.Equal(t, []string{"deleted a", "renamed b<-a", "modified b/y"}, h.pending())
	h.commitAll()
}

func TestDiscardChildOfDeletedDir(t *testing.T) {
	// A file cannot come back while its directory stays deleted: the
	// directory (and so all of it) comes back.
	h := newHarness(t)
	h.baseFile("d/a", "a")
	h.baseFile("d/b", "b")
	ws := h.wsSnapshot()
	h.unlink("d/a")
	h.unlink("d/b")
	h.rmdir("d")
	done := h.e.Discard([]string{"d/a"}, caller)
	require.Contains(t, done, "d")
	require.Equal(t, []string{"a", "b"}, h.names("d"))
	require.Empty(t, h.pending())
	require.Empty(t, h.upperEntries())
	require.Equal(t, ws, h.view())
}

func TestCommitChildOfRenamedDir(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a/x", "x")
	h.baseFile("a/y", "y")
	h.rename("a", "b")
	h.overwrite("b/x", "x2")
	h.overwrite("b/y", "y2")
	res := h.commit("b/x")
	require.Equal(t, []string{"a", "b", "b/x"}, res.Committed, "the rename (both halves) comes along")
	require.Equal(t, []string{"modified b/y"}, h.pending())
	require.Equal(t, map[string]string{
		"b": "dir 755", "b/x": "file 644 \"x2\"", "b/y": "file 644 \"y\"",
	}, h.wsSnapshot())
	h.restart()
	require.Equal(t, "y2", h.read("b/y"))
	h.commitAll()
}

func TestRecreatedRenamedDirHidesBase(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a/x", "x")
	h.rename("a", "b")
	h.unlink("b/x")
	h.rmdir("b")
	h.mkdir("b")
	require.Equal(t, []string{}, h.names("b"))
	h.requireMissing("b/x")
	// Something appearing later in the base directory does not show
	// through the recreated one, neither listed nor looked up.
	h.baseFile("a/late", "late")
	require.Equal(t, []string{}, h.names("b"))
	h.requireMissing("b/late")
	h.create("b/late", "mine")
	require.Equal(t, "mine", h.read("b/late"))
}

func TestRenameIntoAndOutOfNewDir(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a.txt", "a")
	h.baseFile("olddir/f", "f")
	h.mkdir("n")
	h.rename("a.txt", "n/a.txt")
	h.rename("olddir", "n/moved")
	require.Equal(t, []string{"a.txt", "moved"}, h.names("n"))
	require.Equal(t, "f", h.read("n/moved/f"))
	require.Equal(t, []string{"n"}, h.names(""))
	// Committing the source whiteout alone brings the rename and its new
	// parent along.
	res := h.commit("olddir")
	require.Equal(t, []string{"n", "n/moved", "olddir"}, res.Committed)
	require.Equal(t, "f", h.baseRead("n/moved/f"))
	h.commitAll()
}

func TestHardLinkRenameRestart(t *testing.T) {
	// Hard links share one upper inode, hence one meta: each name must
	// keep its own baseline across a restart.
	h := newHarness(t)
	h.baseFile("a", "A")
	_, err := h.e.Link("a", "b", caller)
	require.NoError(t, err)
	h.rename("b", "c")
	_, err = h.e.Link("a", "d", caller)
	require.NoError(t, err)
	pending := h.pending()
	require.Equal(t, []string{"modified a", "created c", "created d"}, pending)
	h.restart()
	require.Equal(t, pending, h.pending())
	require.Equal(t, h.stat("a").Ino, h.stat("c").Ino)
	require.EqualValues(t, 3, h.stat("d").Nlink)
	h.commitAll()
	require.Equal(t, h.baseIno("a"), h.baseIno("d"))
}

func TestMknodFifo(t *testing.T) {
	h := newHarness(t)
	ws := h.wsSnapshot()
	st, err := h.e.Mknod("fifo", syscall.S_IFIFO|0o640, 0, caller)
	require.NoError(t, err)
	require.Equal(t, uint32(syscall.S_IFIFO|0o640), st.Mode)
	st = h.stat("fifo")
	require.Equal(t, uint32(syscall.S_IFIFO|0o640), st.Mode)
	ents, err := h.e.ReadDir("")
	require.NoError(t, err)
	require.Equal(t, []overlay.Dirent{{Name: "fifo", Mode: syscall.S_IFIFO, Ino: st.Ino}}, ents)
	mode := uint32(0o600)
	_, err = h.e.Setattr("fifo", -1, overlay.SetAttr{Mode: &mode}, caller)
	require.NoError(t, err)
	require.Equal(t, uint32(syscall.S_IFIFO|0o600), h.stat("fifo").Mode)
	require.ErrorIs(t, h.e.Setxattr("fifo", "user.x", []byte("1"), 0, caller), syscall.EPERM)
	require.Equal(t, ws, h.wsSnapshot())
	require.Equal(t, []string{"special fifo"}, h.pending())

	h.restart()
	require.Equal(t, uint32(syscall.S_IFIFO|0o600), h.stat("fifo").Mode)
	h.commit()
	var bst unix.Stat_t
	require.NoError(t, unix.Lstat(h.wsPath("fifo"), &bst))
	require.Equal(t, uint32(syscall.S_IFIFO|0o600), bst.Mode)
	require.Empty(t, h.upperEntries())
}

func TestRecoverIsIdempotent(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a", "a")
	h.create("n", "n")
	h.overwrite("a", "a2")
	// Recover with nothing unfinished does nothing.
	require.Empty(t, h.e.Recover(nil).Committed)
	res := h.e.Recover([]string{"a", "n"})
	require.Empty(t, res.Conflicts)
	require.Equal(t, []string{"a", "n"}, res.Committed)
	require.Equal(t, "a2", h.baseRead("a"))
	require.Empty(t, h.pending())
}

func TestCommitAlreadyAppliedByHand(t *testing.T) {
	// The same change made in the workspace is not a conflict (a commit
	// interrupted after writing the file looks like this).
	h := newHarness(t)
	h.baseFile("a", "old")
	h.overwrite("a", "new")
	require.NoError(t, os.WriteFile(h.wsPath("a"), []byte("new"), 0o644))
	res := h.commit()
	require.Equal(t, []string{"a"}, res.Committed)
	require.Empty(t, h.upperEntries())
}

func TestConcurrentOperations(t *testing.T) {
	// Run with -race: namespace changes, reads and listings from many
	// goroutines at once.
	h := newHarness(t)
	h.baseDir("shared")
	for i := range 8 {
		h.baseFile(fmt.Sprintf("shared/base%d", i), "b")
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dir := fmt.Sprintf("g%d", g)
			if _, err := h.e.Mkdir(dir, 0o755, caller); err != nil {
				errs <- err
				return
			}
			for i := range 10 {
				p := fmt.Sprintf("%s/f%d", dir, i)
				if err := h.e.WriteFile(p, []byte(p), caller); err != nil {
					errs <- err
					return
				}
				if _, err := h.e.ReadDir("shared"); err != nil {
					errs <- err
					return
				}
				if _, err := h.e.Stat(p); err != nil {
					errs <- err
					return
				}
				h.e.Pending(nil)
			}
			base := fmt.Sprintf("shared/base%d", g)
			if err := h.e.WriteFile(base, []byte("edited"), caller); err != nil {
				errs <- err
				return
			}
			if err := h.e.Rename(base, fmt.Sprintf("%s/moved", dir), 0, caller); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, []string{}, h.names("shared"))
	require.Len(t, h.names("g3"), 11)
	h.commitAll()
}

func TestPendingNamesTheProcess(t *testing.T) {
	// Every change, copy-ups included, records the process behind it.
	h := newHarness(t)
	h.baseFile("copied", "c")
	h.baseFile("chmodded", "c")
	h.baseFile("xattred", "c")
	h.baseFile("truncated", "c")
	h.baseFile("linked", "c")
	h.baseDir("dir")
	pid := func(n int) overlay.Caller { return overlay.Caller{Pid: n} }
	f, err := h.e.Open("copied", unix.O_WRONLY|unix.O_APPEND, pid(101))
	require.NoError(t, err)
	h.e.Release("copied", f, pid(101))
	mode := uint32(0o600)
	_, err = h.e.Setattr("chmodded", -1, overlay.SetAttr{Mode: &mode}, pid(102))
	require.NoError(t, err)
	require.NoError(t, h.e.Setxattr("xattred", "user.a", []byte("1"), 0, pid(103)))
	size := uint64(0)
	_, err = h.e.Setattr("truncated", -1, overlay.SetAttr{Size: &size}, pid(104))
	require.NoError(t, err)
	_, err = h.e.Link("linked", "link2", pid(105))
	require.NoError(t, err)
	_, err = h.e.Setattr("dir", -1, overlay.SetAttr{Mode: &mode}, pid(106))
	require.NoError(t, err)
	f, _, err = h.e.Create("created", unix.O_WRONLY|unix.O_CREAT, 0o644, pid(107))
	require.NoError(t, err)
	h.e.Release("created", f, pid(107))

	got := map[string]int{}
	for _, c := range h.e.Pending(nil) {
		got[c.Path] = c.Pid
	}
	require.Equal(t, map[string]int{
		"copied": 101, "chmodded": 102, "xattred": 103, "truncated": 104,
		"linked": 105, "link2": 105, "dir": 106, "created": 107,
	}, got)
	h.restart()
	for _, c := range h.e.Pending(nil) {
		require.Equal(t, got[c.Path], c.Pid, "%s after restart", c.Path)
	}
}

func TestEditThenRenameDirThenRestart(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a/f", "f")
	h.baseFile("a/g", "g")
	ws := h.wsSnapshot()
	h.overwrite("a/f", "f2")
	h.rename("a", "b")
	require.Equal(t, "f2", h.read("b/f"))
	require.Equal(t, "g", h.read("b/g"))
	require.Equal(t, []string{"deleted a", "renamed b<-a", "modified b/f"}, h.pending())
	require.Equal(t, ws, h.wsSnapshot())
	h.restart()
	require.Equal(t, []string{"f", "g"}, h.names("b"))
	h.commitAll()
	require.Equal(t, "f2", h.baseRead("b/f"))
}

// mv a b; discard a: the workspace's a shows again, and it and b, its copy
// with other content, must not show one inode number (the kernel would
// serve one's cached size and pages for the other), now or after a
// restart.
func TestDiscardRenameSourceShowsTwoNumbers(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a", "base")
	h.overwrite("a", "staged longer content")
	h.rename("a", "b")
	done := h.e.Discard([]string{"a"}, caller)
	require.Equal(t, []string{"a"}, done)
	inoOf := func(p string) uint64 {
		st, err := h.e.Stat(p)
		require.NoError(t, err)
		return st.Ino
	}
	require.Equal(t, "base", h.read("a"))
	require.Equal(t, "staged longer content", h.read("b"))
	require.NotEqual(t, inoOf("a"), inoOf("b"), "a and b show one inode number")
	b := inoOf("b")
	h.restart()
	require.Equal(t, b, inoOf("b"), "b's number is kept across a restart")
	require.NotEqual(t, inoOf("a"), inoOf("b"))
	h.commitAll()
	require.Equal(t, "staged longer content", h.baseRead("b"))
	require.Equal(t, "base", h.baseRead("a"))
}

// The root is the workspace's own directory: in staged mode it has no
// pending entry, so an attribute change of it must neither stage nor touch
// the workspace, and must not fail tools that set the times of the
// directory they extract into (tar xf of an archive holding "./").
func TestRootSetattrInStagedMode(t *testing.T) {
	h := newHarness(t)
	require.NoError(t, os.Chmod(h.ws, 0o755))
	before, err := os.Stat(h.ws)
	require.NoError(t, err)

	mtime := unix.Timespec{Sec: 1_000_000_000}
	st, err := h.e.Setattr("", -1, overlay.SetAttr{Mtime: &mtime}, caller)
	require.NoError(t, err, "new times of the root")
	require.Equal(t, uint32(syscall.S_IFDIR|0o755), st.Mode)

	_, err = h.e.Setattr("", -1, overlay.SetAttr{Mode: u32(0o755), Uid: u32(uint32(os.Getuid())), Gid: u32(uint32(os.Getgid()))}, caller)
	require.NoError(t, err, "a mode and owner change that changes nothing")

	_, err = h.e.Setattr("", -1, overlay.SetAttr{Mode: u32(0o700)}, caller)
	require.ErrorIs(t, err, syscall.EPERM)
	size := uint64(0)
	_, err = h.e.Setattr("", -1, overlay.SetAttr{Size: &size}, caller)
	require.ErrorIs(t, err, syscall.EISDIR)
	require.ErrorIs(t, h.e.Setxattr("", "user.test", []byte("v"), 0, caller), syscall.EPERM)

	after, err := os.Stat(h.ws)
	require.NoError(t, err)
	require.Equal(t, before.Mode(), after.Mode())
	require.Equal(t, before.ModTime(), after.ModTime())
	require.Empty(t, h.pending())

	// The engine still serves: nothing was left locked.
	h.create("f", "x")
	require.Equal(t, []string{"created f"}, h.pending())
}

func TestSetattrThatChangesNothingStagesNothing(t *testing.T) {
	// tar, cp -a, rsync and chmod -R / chown -R set attributes a file
	// already has: such a call copies nothing up and journals nothing.
	h := newHarness(t)
	j := &countingJournal{}
	h.opts.Journal = j
	h.restart()
	h.baseFile("f", "f")
	h.baseDir("d")
	h.baseFile("suid", "s")
	require.NoError(t, unix.Chmod(h.wsPath("suid"), 0o4755))
	f, d := h.stat("f"), h.stat("d")
	mode, uid, gid := f.Mode&0o7777, f.Uid, f.Gid
	mtime := unix.Timespec{Sec: f.Mtim.Sec, Nsec: f.Mtim.Nsec}
	caller := overlay.Caller{Pid: 1}
	_, err := h.e.Setattr("f", -1, overlay.SetAttr{Mode: &mode, Uid: &uid, Gid: &gid, Mtime: &mtime}, caller)
	require.NoError(t, err)
	dmode := d.Mode & 0o7777
	_, err = h.e.Setattr("d", -1, overlay.SetAttr{Mode: &dmode, Uid: &uid}, caller)
	require.NoError(t, err)
	require.Equal(t, []string{}, h.pending())
	waited, early, _ := j.counts()
	require.Zero(t, waited+early, "no-op setattrs were journaled")

	// Each of these changes something, so each stages its path.
	sid := h.stat("suid")
	_, err = h.e.Setattr("suid", -1, overlay.SetAttr{Uid: &sid.Uid}, caller) // clears set-id bits
	require.NoError(t, err)
	require.Zero(t, h.stat("suid").Mode&unix.S_ISUID, "chown kept the set-user-id bit")
	now := unix.Timespec{Nsec: unix.UTIME_NOW}
	_, err = h.e.Setattr("d", -1, overlay.SetAttr{Mtime: &now}, caller)
	require.NoError(t, err)
	other := mode ^ 0o100
	_, err = h.e.Setattr("f", -1, overlay.SetAttr{Mode: &other, Mtime: &mtime}, caller)
	require.NoError(t, err)
	require.Equal(t, []string{"metadata d", "metadata f", "metadata suid"}, h.pending())
	require.Equal(t, other, h.stat("f").Mode&0o7777)

	// A staged file's own attributes count, not the workspace's.
	before, _, _ := j.counts()
	_, err = h.e.Setattr("f", -1, overlay.SetAttr{Mode: &other}, caller)
	require.NoError(t, err)
	waited, _, _ = j.counts()
	require.Equal(t, before, waited, "a no-op chmod of a staged file was journaled")
	_, err = h.e.Setattr("f", -1, overlay.SetAttr{Mode: &mode}, caller)
	require.NoError(t, err)
	waited, _, _ = j.counts()
	require.Equal(t, before+1, waited)
}
