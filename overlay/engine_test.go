package overlay_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"stagefs/internal/unidiff"
	"stagefs/overlay"
)

func TestNewRejectsRelativePaths(t *testing.T) {
	_, err := overlay.New(overlay.Options{Workspace: "ws", StateDir: t.TempDir()})
	require.Error(t, err)
	_, err = overlay.New(overlay.Options{Workspace: t.TempDir(), StateDir: "state"})
	require.Error(t, err)
}

func TestCopyUpOnWrite(t *testing.T) {
	h := newHarness(t)
	h.baseFile("src/main.go", "package main\n")
	ino := h.baseIno("src/main.go")
	ws := h.wsSnapshot()

	h.overwrite("src/main.go", "package main // edited\n")

	require.Equal(t, "package main // edited\n", h.read("src/main.go"))
	require.Equal(t, ws, h.wsSnapshot(), "workspace changed before commit")
	st := h.stat("src/main.go")
	require.Equal(t, ino, st.Ino, "copied-up file keeps the base inode number")
	require.EqualValues(t, len("package main // edited\n"), st.Size)
	require.Equal(t, []string{"modified src/main.go"}, h.pending())
	require.True(t, h.e.IsStaged("src/main.go"))

	h.commitAll()
	require.Equal(t, "package main // edited\n", h.baseRead("src/main.go"))
}

func TestWriteAtOffsetKeepsRest(t *testing.T) {
	// Copy-up must copy the body: a write without O_TRUNC changes only the
	// bytes it covers.
	h := newHarness(t)
	h.baseFile("f", "0123456789")
	f, err := h.e.Open("f", unix.O_RDWR, caller)
	require.NoError(t, err)
	_, err = unix.Pwrite(f.Fd, []byte("ab"), 4)
	require.NoError(t, err)
	h.e.Release("f", f, caller)
	require.Equal(t, "0123ab6789", h.read("f"))
	require.Equal(t, "0123456789", h.baseRead("f"))
	h.commitAll()
}

func TestReadOnlyOpenDoesNotStage(t *testing.T) {
	h := newHarness(t)
	h.baseFile("f", "x")
	f, err := h.e.Open("f", unix.O_RDONLY, caller)
	require.NoError(t, err)
	require.False(t, f.Upper)
	h.e.Release("f", f, caller)
	require.Empty(t, h.pending())
	require.Empty(t, h.upperEntries())
}

func TestCreateFile(t *testing.T) {
	h := newHarness(t)
	h.baseFile("keep", "k")
	ws := h.wsSnapshot()

	h.create("new.txt", "hello\n")
	require.Equal(t, "hello\n", h.read("new.txt"))
	require.Equal(t, ws, h.wsSnapshot())
	h.requireBaseMissing("new.txt")
	require.Equal(t, []string{"created new.txt"}, h.pending())
	require.Equal(t, []string{"keep", "new.txt"}, h.names(""))

	// O_EXCL on an existing file (base or staged) fails.
	_, _, err := h.e.Create("new.txt", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o644, caller)
	require.ErrorIs(t, err, syscall.EEXIST)
	_, _, err = h.e.Create("keep", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o644, caller)
	require.ErrorIs(t, err, syscall.EEXIST)
	// A missing parent is ENOENT.
	_, _, err = h.e.Create("nodir/x", unix.O_WRONLY|unix.O_CREAT, 0o644, caller)
	require.ErrorIs(t, err, syscall.ENOENT)
	// A file as a parent is ENOTDIR.
	_, _, err = h.e.Create("keep/x", unix.O_WRONLY|unix.O_CREAT, 0o644, caller)
	require.ErrorIs(t, err, syscall.ENOTDIR)
	require.Equal(t, ws, h.wsSnapshot())

	h.commitAll()
	require.Equal(t, "hello\n", h.baseRead("new.txt"))
}

func TestCreateThenUnlinkLeavesNothing(t *testing.T) {
	h := newHarness(t)
	h.baseDir("d")
	h.create("d/tmp", "x")
	h.unlink("d/tmp")
	h.requireMissing("d/tmp")
	require.Empty(t, h.pending())
	require.Empty(t, h.upperEntries(), "an undone create leaves nothing in the upper tree")
}

func TestMkdirNested(t *testing.T) {
	h := newHarness(t)
	h.baseDir("src")
	ws := h.wsSnapshot()

	// mkdir -p src/a/b/c, then files at several levels.
	for _, d := range []string{"src", "src/a", "src/a/b", "src/a/b/c"} {
		if _, err := h.e.Stat(d); err == nil {
			continue
		}
		h.mkdir(d)
	}
	h.create("src/a/one", "1")
	h.create("src/a/b/two", "2")
	h.create("src/a/b/c/three", "3")

	_, err := h.e.Mkdir("src/a", 0o755, caller)
	require.ErrorIs(t, err, syscall.EEXIST)
	_, err = h.e.Mkdir("src/missing/x", 0o755, caller)
	require.ErrorIs(t, err, syscall.ENOENT)

	require.Equal(t, []string{"a"}, h.names("src"))
	require.Equal(t, []string{"b", "one"}, h.names("src/a"))
	require.Equal(t, []string{"c", "two"}, h.names("src/a/b"))
	require.Equal(t, "3", h.read("src/a/b/c/three"))
	require.True(t, h.stat("src/a/b").Mode&syscall.S_IFMT == syscall.S_IFDIR)
	require.Equal(t, ws, h.wsSnapshot())
	require.Equal(t, []string{
		"mkdir src/a", "mkdir src/a/b", "mkdir src/a/b/c", "created src/a/b/c/three",
		"created src/a/b/two", "created src/a/one",
	}, h.pending())

	h.commitAll()
	require.Equal(t, "3", h.baseRead("src/a/b/c/three"))
}

func TestUnlinkBaseFile(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a", "A")
	h.baseFile("b", "B")
	h.baseDir("d")
	ws := h.wsSnapshot()

	h.unlink("a")
	h.requireMissing("a")
	require.Equal(t, []string{"b", "d"}, h.names(""))
	require.Equal(t, ws, h.wsSnapshot())
	require.Equal(t, []string{"deleted a"}, h.pending())

	require.ErrorIs(t, h.e.Unlink("a", caller), syscall.ENOENT)
	require.ErrorIs(t, h.e.Unlink("d", caller), syscall.EISDIR)
	_, err := h.e.Open("a", unix.O_RDONLY, caller)
	require.ErrorIs(t, err, syscall.ENOENT)

	h.commitAll()
	h.requireBaseMissing("a")
	require.Equal(t, "B", h.baseRead("b"))
}

func TestRecreateUnlinkedBaseFile(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a", "old")
	ino := h.baseIno("a")
	h.unlink("a")
	h.create("a", "new")
	require.Equal(t, "new", h.read("a"))
	require.NotEqual(t, ino, h.stat("a").Ino, "a new file is not the old one")
	require.Equal(t, []string{"modified a"}, h.pending())
	require.Equal(t, "old", h.baseRead("a"))
	h.commitAll()
}

func TestRmRfBaseDir(t *testing.T) {
	h := newHarness(t)
	h.baseFile("proj/build/a.o", "a")
	h.baseFile("proj/build/b.o", "b")
	h.baseFile("proj/build/sub/c.o", "c")
	h.baseFile("proj/keep.c", "k")
	ws := h.wsSnapshot()

	// rm -rf proj/build: children first, then the directories.
	require.ErrorIs(t, h.e.Rmdir("proj/build", caller), syscall.ENOTEMPTY)
	h.unlink("proj/build/sub/c.o")
	h.rmdir("proj/build/sub")
	h.unlink("proj/build/a.o")
	h.unlink("proj/build/b.o")
	h.rmdir("proj/build")

	h.requireMissing("proj/build")
	h.requireMissing("proj/build/a.o")
	require.Equal(t, []string{"keep.c"}, h.names("proj"))
	require.ErrorIs(t, h.e.Rmdir("proj/build", caller), syscall.ENOENT)
	require.ErrorIs(t, h.e.Rmdir("proj/keep.c", caller), syscall.ENOTDIR)
	require.Equal(t, ws, h.wsSnapshot())
	require.Equal(t, []string{
		"deleted proj/build", "deleted proj/build/a.o", "deleted proj/build/b.o",
		"deleted proj/build/sub", "deleted proj/build/sub/c.o",
	}, h.pending())

	h.commitAll()
	h.requireBaseMissing("proj/build")
	require.Equal(t, "k", h.baseRead("proj/keep.c"))
}

func TestRmdirEmptyBaseDir(t *testing.T) {
	h := newHarness(t)
	h.baseDir("empty")
	h.rmdir("empty")
	h.requireMissing("empty")
	require.Equal(t, []string{"deleted empty"}, h.pending())
	require.DirExists(t, h.wsPath("empty"))
	h.commitAll()
	h.requireBaseMissing("empty")
}

func TestRecreateDeletedDirIsOpaque(t *testing.T) {
	h := newHarness(t)
	h.baseFile("d/old1", "1")
	h.baseFile("d/old2", "2")
	ws := h.wsSnapshot()

	h.unlink("d/old1")
	h.unlink("d/old2")
	h.rmdir("d")
	h.mkdir("d")
	require.Equal(t, []string{}, h.names("d"), "a recreated directory is empty")
	h.requireMissing("d/old1")
	h.create("d/new", "n")
	require.Equal(t, []string{"new"}, h.names("d"))
	require.Equal(t, ws, h.wsSnapshot())
	require.Equal(t, []string{"mkdir d", "created d/new", "deleted d/old1", "deleted d/old2"}, h.pending())

	h.commitAll()
	require.Equal(t, map[string]string{"d": "dir 755", "d/new": "file 644 \"n\""}, h.wsSnapshot())
}

func TestMkdirWhereBaseDirWasRemoved(t *testing.T) {
	// rmdir of an empty base directory leaves a whiteout; mkdir at the same
	// name must replace it with a directory.
	h := newHarness(t)
	h.baseDir("d")
	h.rmdir("d")
	h.mkdir("d")
	require.Equal(t, []string{}, h.names("d"))
	h.create("d/f", "x")
	require.Equal(t, []string{"f"}, h.names("d"))
	h.commitAll()
}

func TestMkdirWhereBaseFileWasRemoved(t *testing.T) {
	h := newHarness(t)
	h.baseFile("x", "file")
	h.unlink("x")
	h.mkdir("x")
	require.True(t, h.stat("x").Mode&syscall.S_IFMT == syscall.S_IFDIR)
	h.create("x/inner", "i")
	require.Equal(t, "file", h.baseRead("x"))
	h.commitAll()
	require.Equal(t, "i", h.baseRead("x/inner"))
}

func TestFileWhereBaseDirWasRemoved(t *testing.T) {
	h := newHarness(t)
	h.baseDir("x")
	h.rmdir("x")
	h.create("x", "now a file")
	require.Equal(t, "now a file", h.read("x"))
	require.DirExists(t, h.wsPath("x"))
	h.commitAll()
}

func TestRenameFileOverExisting(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a", "AAA")
	h.baseFile("b", "BBB")
	inoA := h.baseIno("a")
	ws := h.wsSnapshot()

	h.rename("a", "b")
	h.requireMissing("a")
	require.Equal(t, "AAA", h.read("b"))
	require.Equal(t, inoA, h.stat("b").Ino, "rename keeps the inode number")
	require.Equal(t, []string{"b"}, h.names(""))
	require.Equal(t, ws, h.wsSnapshot())
	require.Equal(t, []string{"deleted a", "modified b"}, h.pending())

	h.commitAll()
	require.Equal(t, map[string]string{"b": "file 644 \"AAA\""}, h.wsSnapshot())
}

func TestRenameStagedFiles(t *testing.T) {
	h := newHarness(t)
	h.create("x", "X")
	h.create("y", "Y")
	h.rename("x", "y")
	h.requireMissing("x")
	require.Equal(t, "X", h.read("y"))
	require.Equal(t, []string{"created y"}, h.pending())
	h.rename("y", "z")
	require.Equal(t, []string{"created z"}, h.pending())
	h.commitAll()
}

func TestRenameNoReplace(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a", "A")
	h.baseFile("b", "B")
	h.create("c", "C")
	ws := h.wsSnapshot()

	require.ErrorIs(t, h.e.Rename("a", "b", unix.RENAME_NOREPLACE, caller), syscall.EEXIST)
	require.ErrorIs(t, h.e.Rename("a", "c", unix.RENAME_NOREPLACE, caller), syscall.EEXIST)
	require.ErrorIs(t, h.e.Rename("a", "b", unix.RENAME_EXCHANGE, caller), syscall.EINVAL)
	require.Equal(t, "A", h.read("a"))
	require.Equal(t, "B", h.read("b"))
	require.Equal(t, []string{"created c"}, h.pending())

	// To a free name it works.
	require.NoError(t, h.e.Rename("a", "n", unix.RENAME_NOREPLACE, caller))
	require.Equal(t, "A", h.read("n"))
	require.Equal(t, ws, h.wsSnapshot())
	h.commitAll()
}

func TestRenameErrors(t *testing.T) {
	h := newHarness(t)
	h.baseFile("d/f", "f")
	h.baseFile("file", "x")
	h.baseDir("e")
	require.ErrorIs(t, h.e.Rename("missing", "x", 0, caller), syscall.ENOENT)
	require.ErrorIs(t, h.e.Rename("d", "d/sub", 0, caller), syscall.EINVAL)
	require.ErrorIs(t, h.e.Rename("d", "file", 0, caller), syscall.ENOTDIR)
	require.ErrorIs(t, h.e.Rename("file", "e", 0, caller), syscall.EISDIR)
	require.ErrorIs(t, h.e.Rename("file", "nodir/x", 0, caller), syscall.ENOENT)
	require.NoError(t, h.e.Rename("file", "file", 0, caller))
	require.Empty(t, h.pending())
}

func TestRenameDirOverNonEmptyDir(t *testing.T) {
	h := newHarness(t)
	h.baseFile("src/a", "a")
	h.baseFile("dst/b", "b")
	h.baseDir("emptydst")
	ws := h.wsSnapshot()

	require.ErrorIs(t, h.e.Rename("src", "dst", 0, caller), syscall.ENOTEMPTY)
	require.Equal(t, []string{"b"}, h.names("dst"))
	require.Empty(t, h.pending())

	// A staged file makes a directory non-empty too.
	h.create("emptydst/new", "n")
	require.ErrorIs(t, h.e.Rename("src", "emptydst", 0, caller), syscall.ENOTEMPTY)
	// Once empty again in the view, the rename replaces it.
	h.unlink("emptydst/new")
	h.rename("src", "emptydst")
	require.Equal(t, []string{"a"}, h.names("emptydst"))
	require.Equal(t, "a", h.read("emptydst/a"))
	h.requireMissing("src")
	require.Equal(t, ws, h.wsSnapshot())

	h.commitAll()
	require.Equal(t, "a", h.baseRead("emptydst/a"))
	h.requireBaseMissing("src")
}

func TestRenameBaseDirThenEdit(t *testing.T) {
	h := newHarness(t)
	h.baseFile("old/a.txt", "a")
	h.baseFile("old/sub/b.txt", "b")
	h.baseFile("other", "o")
	inoDir := h.baseIno("old")
	inoA := h.baseIno("old/a.txt")
	ws := h.wsSnapshot()

	h.rename("old", "new")
	h.requireMissing("old")
	require.Equal(t, []string{"new", "other"}, h.names(""))
	require.Equal(t, []string{"a.txt", "sub"}, h.names("new"), "a renamed directory shows its base content")
	require.Equal(t, []string{"b.txt"}, h.names("new/sub"))
	require.Equal(t, "a", h.read("new/a.txt"))
	require.Equal(t, inoDir, h.stat("new").Ino)
	require.Equal(t, inoA, h.stat("new/a.txt").Ino)
	require.Equal(t, []string{"renamed new<-old", "deleted old"}, h.pending())
	// Not empty: rmdir and rename over a non-empty dir must see its base content.
	require.ErrorIs(t, h.e.Rmdir("new", caller), syscall.ENOTEMPTY)

	// Edit a file inside the renamed directory, add one, delete one.
	h.overwrite("new/a.txt", "a2")
	h.create("new/sub/c.txt", "c")
	h.unlink("new/sub/b.txt")
	require.Equal(t, "a2", h.read("new/a.txt"))
	require.Equal(t, inoA, h.stat("new/a.txt").Ino)
	require.Equal(t, []string{"c.txt"}, h.names("new/sub"))
	require.Equal(t, ws, h.wsSnapshot())

	h.commitAll()
	require.Equal(t, "a2", h.baseRead("new/a.txt"))
	require.Equal(t, inoDir, h.baseIno("new"), "commit renames the directory rather than copying it")
	h.requireBaseMissing("old")
}

func TestRenameDirBack(t *testing.T) {
	h := newHarness(t)
	h.baseFile("d/f", "f")
	h.baseFile("d/g", "g")
	ws := h.wsSnapshot()

	h.rename("d", "e")
	h.rename("e", "d")
	h.requireMissing("e")
	require.Equal(t, []string{"d"}, h.names(""))
	require.Equal(t, []string{"f", "g"}, h.names("d"))
	require.Equal(t, "f", h.read("d/f"))
	require.Equal(t, ws, h.view(), "renamed back: the view is the workspace again")
	require.Equal(t, ws, h.wsSnapshot())
	require.Empty(t, h.pending(), "a round trip is no change")
	require.Empty(t, h.upperEntries(), "and leaves nothing in the upper tree")
	diff, err := h.e.Diff(nil)
	require.NoError(t, err)
	require.Empty(t, diff, "a directory renamed back has no content changes")

	// Edits inside after the round trip still commit to the right place.
	h.overwrite("d/f", "f2")
	h.commitAll()
	require.Equal(t, "f2", h.baseRead("d/f"))
	require.Equal(t, "g", h.baseRead("d/g"))
}

func TestRenameDirTwice(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a/x", "x")
	h.rename("a", "b")
	h.rename("b", "c")
	require.Equal(t, []string{"c"}, h.names(""))
	require.Equal(t, "x", h.read("c/x"))
	require.Equal(t, []string{"deleted a", "renamed c<-a"}, h.pending())
	h.commitAll()
}

func TestRenameSubdirOfRenamedDir(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a/sub/x", "x")
	h.baseFile("a/y", "y")
	h.rename("a", "b")
	h.rename("b/sub", "sub2")
	require.Equal(t, []string{"b", "sub2"}, h.names(""))
	require.Equal(t, []string{"y"}, h.names("b"))
	require.Equal(t, "x", h.read("sub2/x"))
	h.commitAll()
}

func TestSymlink(t *testing.T) {
	h := newHarness(t)
	h.baseFile("target.txt", "t")
	h.baseSymlink("baselink", "target.txt")
	ws := h.wsSnapshot()

	st, err := h.e.Symlink("target.txt", "link", caller)
	require.NoError(t, err)
	require.Equal(t, uint32(syscall.S_IFLNK), st.Mode&syscall.S_IFMT)
	st = h.stat("link")
	require.Equal(t, uint32(syscall.S_IFLNK), st.Mode&syscall.S_IFMT)
	require.EqualValues(t, len("target.txt"), st.Size)
	target, err := h.e.Readlink("link")
	require.NoError(t, err)
	require.Equal(t, "target.txt", target)

	target, err = h.e.Readlink("baselink")
	require.NoError(t, err)
	require.Equal(t, "target.txt", target)
	_, err = h.e.Readlink("target.txt")
	require.ErrorIs(t, err, syscall.EINVAL)
	_, err = h.e.Symlink("x", "baselink", caller)
	require.ErrorIs(t, err, syscall.EEXIST)

	// Opening a symlink never follows it, nor opens the staged body that
	// holds its target; writing through it must not change the target.
	for _, p := range []string{"link", "baselink"} {
		_, err = h.e.Open(p, unix.O_RDONLY, caller)
		require.ErrorIs(t, err, syscall.ELOOP, p)
		_, err = h.e.Open(p, unix.O_WRONLY|unix.O_TRUNC, caller)
		require.ErrorIs(t, err, syscall.ELOOP, p)
		require.ErrorIs(t, h.e.WriteFile(p, []byte("oops"), caller), syscall.ELOOP, p)
		_, _, err = h.e.ReadFile(p)
		require.ErrorIs(t, err, syscall.ELOOP, p)
		target, err = h.e.Readlink(p)
		require.NoError(t, err)
		require.Equal(t, "target.txt", target)
	}

	require.Equal(t, ws, h.wsSnapshot())
	require.Equal(t, []string{"symlink link"}, h.pending())

	h.commitAll()
	got, err := os.Readlink(h.wsPath("link"))
	require.NoError(t, err)
	require.Equal(t, "target.txt", got)
}

func TestHardLink(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a", "shared")
	h.baseDir("d")
	inoA := h.baseIno("a")
	ws := h.wsSnapshot()

	st, err := h.e.Link("a", "b", caller)
	require.NoError(t, err)
	require.Equal(t, inoA, st.Ino)
	sa, sb := h.stat("a"), h.stat("b")
	require.Equal(t, sa.Ino, sb.Ino, "both names are one file")
	require.Equal(t, inoA, sa.Ino)
	require.EqualValues(t, 2, sa.Nlink)
	require.EqualValues(t, 2, sb.Nlink)
	require.Equal(t, "shared", h.read("b"))

	// A write through one name shows through the other.
	h.overwrite("b", "written via b")
	require.Equal(t, "written via b", h.read("a"))

	_, err = h.e.Link("d", "d2", caller)
	require.ErrorIs(t, err, syscall.EPERM)
	_, err = h.e.Link("a", "b", caller)
	require.ErrorIs(t, err, syscall.EEXIST)
	require.Equal(t, ws, h.wsSnapshot())
	require.Equal(t, []string{"modified a", "created b"}, h.pending())

	h.commitAll()
	require.Equal(t, h.baseIno("a"), h.baseIno("b"), "committed as one file with two names")
	var bst unix.Stat_t
	require.NoError(t, unix.Lstat(h.wsPath("b"), &bst))
	require.EqualValues(t, 2, bst.Nlink)
}

func TestSetattrChmodUtimens(t *testing.T) {
	h := newHarness(t)
	h.baseFile("f", "content")
	h.baseDir("d")
	ino := h.baseIno("f")
	ws := h.wsSnapshot()

	mode := uint32(0o600)
	mtime := unix.Timespec{Sec: 1_000_000_000, Nsec: 123}
	atime := unix.Timespec{Sec: 900_000_000}
	st, err := h.e.Setattr("f", -1, overlay.SetAttr{Mode: &mode, Mtime: &mtime, Atime: &atime}, caller)
	require.NoError(t, err)
	require.Equal(t, uint32(syscall.S_IFREG|0o600), st.Mode)
	st = h.stat("f")
	require.Equal(t, uint32(syscall.S_IFREG|0o600), st.Mode)
	require.Equal(t, int64(1_000_000_000), st.Mtim.Sec)
	require.Equal(t, int64(123), st.Mtim.Nsec)
	require.Equal(t, int64(900_000_000), st.Atim.Sec)
	require.Equal(t, ino, st.Ino)
	require.Equal(t, "content", h.read("f"))

	dmode := uint32(0o700)
	_, err = h.e.Setattr("d", -1, overlay.SetAttr{Mode: &dmode}, caller)
	require.NoError(t, err)
	require.Equal(t, uint32(syscall.S_IFDIR|0o700), h.stat("d").Mode)

	require.Equal(t, ws, h.wsSnapshot())
	// Only attributes changed: the body is still the workspace's.
	require.Equal(t, []string{"metadata d", "metadata f"}, h.pending())

	h.commitAll()
	var bst unix.Stat_t
	require.NoError(t, unix.Lstat(h.wsPath("f"), &bst))
	require.Equal(t, uint32(0o600), bst.Mode&0o7777)
	require.Equal(t, int64(1_000_000_000), bst.Mtim.Sec)
	require.NoError(t, unix.Lstat(h.wsPath("d"), &bst))
	require.Equal(t, uint32(0o700), bst.Mode&0o7777)
}

func TestSetattrTruncate(t *testing.T) {
	h := newHarness(t)
	h.baseFile("f", "hello world")
	h.baseFile("g", "to be emptied")
	ino := h.baseIno("f")
	ws := h.wsSnapshot()

	size := uint64(5)
	st, err := h.e.Setattr("f", -1, overlay.SetAttr{Size: &size}, caller)
	require.NoError(t, err)
	require.EqualValues(t, 5, st.Size)
	require.Equal(t, "hello", h.read("f"))
	require.Equal(t, ino, h.stat("f").Ino)

	zero := uint64(0)
	_, err = h.e.Setattr("g", -1, overlay.SetAttr{Size: &zero}, caller)
	require.NoError(t, err)
	require.Equal(t, "", h.read("g"))

	// Truncation through an open handle (ftruncate).
	f, err := h.e.Open("f", unix.O_RDWR, caller)
	require.NoError(t, err)
	two := uint64(2)
	_, err = h.e.Setattr("f", f.Fd, overlay.SetAttr{Size: &two}, caller)
	require.NoError(t, err)
	h.e.Release("f", f, caller)
	require.Equal(t, "he", h.read("f"))

	require.Equal(t, ws, h.wsSnapshot())
	require.Equal(t, []string{"modified f", "modified g"}, h.pending())
	h.commitAll()
	require.Equal(t, "he", h.baseRead("f"))
	require.Equal(t, "", h.baseRead("g"))
}

func TestXattrs(t *testing.T) {
	h := newHarness(t)
	h.baseFile("f", "x")
	h.baseFile("g", "y")
	require.NoError(t, unix.Lsetxattr(h.wsPath("g"), "user.orig", []byte("kept"), 0))
	ws := h.wsSnapshot()

	require.NoError(t, h.e.Setxattr("f", "user.color", []byte("blue"), 0, caller))
	buf := make([]byte, 64)
	n, err := h.e.Getxattr("f", "user.color", buf)
	require.NoError(t, err)
	require.Equal(t, "blue", string(buf[:n]))
	list, err := h.e.Listxattr("f")
	require.NoError(t, err)
	require.Equal(t, "user.color\x00", string(list), "only user xattrs, never stagefs's own")

	// stagefs's own namespace is hidden and cannot be written.
	_, err = h.e.Getxattr("f", "user.stagefs.meta", buf)
	require.ErrorIs(t, err, unix.ENODATA)
	require.ErrorIs(t, h.e.Setxattr("f", "user.stagefs.meta", []byte("{}"), 0, caller), syscall.EPERM)
	require.ErrorIs(t, h.e.Setxattr("f", "user.stagefs.other", []byte("x"), 0, caller), syscall.EPERM)
	require.ErrorIs(t, h.e.Removexattr("f", "user.stagefs.meta", caller), syscall.EPERM)
	n, err = h.e.Getxattr("f", "user.color", buf)
	require.NoError(t, err, "the refused calls left the file alone")
	require.Equal(t, "blue", string(buf[:n]))

	// A base file's xattrs show, and survive a copy-up by a write.
	n, err = h.e.Getxattr("g", "user.orig", buf)
	require.NoError(t, err)
	require.Equal(t, "kept", string(buf[:n]))
	f, err := h.e.Open("g", unix.O_WRONLY, caller)
	require.NoError(t, err)
	h.pwrite("g", f, "z")
	n, err = h.e.Getxattr("g", "user.orig", buf)
	require.NoError(t, err)
	require.Equal(t, "kept", string(buf[:n]))
	list, err = h.e.Listxattr("g")
	require.NoError(t, err)
	require.Equal(t, "user.orig\x00", string(list))

	// Also when the copy-up skips the body (O_TRUNC): truncation keeps xattrs.
	h.baseFile("h", "long content")
	require.NoError(t, unix.Lsetxattr(h.wsPath("h"), "user.orig", []byte("h-kept"), 0))
	ws = h.wsSnapshot()
	h.overwrite("h", "short")
	n, err = h.e.Getxattr("h", "user.orig", buf)
	require.NoError(t, err)
	require.Equal(t, "h-kept", string(buf[:n]))

	// Removexattr works on the staged copy.
	require.NoError(t, h.e.Setxattr("f", "user.tmp", []byte("1"), 0, caller))
	require.NoError(t, h.e.Removexattr("f", "user.tmp", caller))
	_, err = h.e.Getxattr("f", "user.tmp", buf)
	require.ErrorIs(t, err, unix.ENODATA)

	// The workspace file did not get the xattr before commit.
	_, err = unix.Lgetxattr(h.wsPath("f"), "user.color", buf)
	require.ErrorIs(t, err, unix.ENODATA)
	require.Equal(t, ws, h.wsSnapshot())
	require.Equal(t, []string{"metadata f", "modified g", "modified h"}, h.pending())

	h.commitAll()
	n, err = unix.Lgetxattr(h.wsPath("h"), "user.orig", buf)
	require.NoError(t, err)
	require.Equal(t, "h-kept", string(buf[:n]))
	n, err = unix.Lgetxattr(h.wsPath("f"), "user.color", buf)
	require.NoError(t, err)
	require.Equal(t, "blue", string(buf[:n]))
	n, err = unix.Lgetxattr(h.wsPath("g"), "user.orig", buf)
	require.NoError(t, err)
	require.Equal(t, "kept", string(buf[:n]))
	_, err = unix.Lgetxattr(h.wsPath("f"), "user.stagefs.meta", buf)
	require.ErrorIs(t, err, unix.ENODATA, "commit must not leak the meta xattr into the workspace")
}

func TestReadDirMerges(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a", "a")
	h.baseFile("b", "b")
	h.baseFile("c", "c")
	h.baseFile("d/x", "x")
	h.baseFile("d/y", "y")
	ws := h.wsSnapshot()

	h.unlink("a")           // whiteout: hidden
	h.overwrite("b", "b2")  // in both layers: listed once
	h.create("n", "n")      // upper only
	h.mkdir("m")            // upper only dir
	h.unlink("d/x")         // whiteout below a container
	h.create("d/z", "z")    // new below a container
	h.overwrite("d/y", "Y") // in both, below a container

	ents, err := h.e.ReadDir("")
	require.NoError(t, err)
	byName := map[string]overlay.Dirent{}
	for _, d := range ents {
		_, dup := byName[d.Name]
		require.False(t, dup, "duplicate %s", d.Name)
		byName[d.Name] = d
	}
	require.Equal(t, []string{"b", "c", "d", "m", "n"}, h.names(""))
	require.Equal(t, uint32(syscall.S_IFDIR), byName["d"].Mode)
	require.Equal(t, uint32(syscall.S_IFDIR), byName["m"].Mode)
	require.Equal(t, uint32(syscall.S_IFREG), byName["b"].Mode)
	require.Equal(t, h.baseIno("b"), byName["b"].Ino)
	require.Equal(t, []string{"y", "z"}, h.names("d"))
	require.Equal(t, []string{}, h.names("m"))

	_, err = h.e.ReadDir("c")
	require.ErrorIs(t, err, syscall.ENOTDIR)
	_, err = h.e.ReadDir("a")
	require.ErrorIs(t, err, syscall.ENOENT)
	h.view() // readdir/stat agree everywhere
	require.Equal(t, ws, h.wsSnapshot())
}

func TestInodeNumbersUnique(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a", "a")
	h.baseFile("d/b", "b")
	h.create("new1", "1")
	h.create("d/new2", "2")
	h.mkdir("nd")
	h.overwrite("a", "A")
	seen := map[uint64]string{}
	for _, p := range []string{"", "a", "d", "d/b", "new1", "d/new2", "nd"} {
		ino := h.stat(p).Ino
		prev, dup := seen[ino]
		require.False(t, dup, "%s and %s share inode %d", p, prev, ino)
		seen[ino] = p
	}
}

func TestCommitSelectedPaths(t *testing.T) {
	h := newHarness(t)
	h.baseFile("z", "z")
	h.baseFile("dir/q", "q")
	h.create("x", "x")
	h.create("y", "y")
	h.overwrite("z", "z2")
	h.mkdir("newdir")
	h.create("newdir/f", "f")
	h.unlink("dir/q")

	res := h.commit("x")
	require.Equal(t, []string{"x"}, res.Committed)
	require.Equal(t, "x", h.baseRead("x"))
	h.requireBaseMissing("y")
	require.Equal(t, "z", h.baseRead("z"))
	require.Equal(t, []string{"deleted dir/q", "mkdir newdir", "created newdir/f", "created y", "modified z"}, h.pending())

	// A file inside a new directory brings the directory along.
	res = h.commit("newdir/f")
	require.Equal(t, []string{"newdir", "newdir/f"}, res.Committed)
	require.Equal(t, "f", h.baseRead("newdir/f"))
	// A directory selects what is below it.
	res = h.commit("dir")
	require.Equal(t, []string{"dir/q"}, res.Committed)
	h.requireBaseMissing("dir/q")
	require.Equal(t, []string{"created y", "modified z"}, h.pending())
	require.Equal(t, "y", h.read("y"))
	require.Equal(t, "z2", h.read("z"))

	// Nothing selected: nothing done.
	res = h.e.Commit([]string{"no/such"}, false, caller)
	require.Empty(t, res.Committed)
	require.Equal(t, []string{"created y", "modified z"}, h.pending())

	h.commitAll()
}

func TestCommitAllMixed(t *testing.T) {
	h := newHarness(t)
	stageMix(h)
	ws := h.wsSnapshot()
	require.Equal(t, mixBase, ws, "staging left the workspace alone")
	h.commitAll()
}

// mixBase is the workspace stageMix starts from.
var mixBase = map[string]string{
	"README":           "file 644 \"readme\"",
	"build":            "dir 755",
	"build/out.o":      "file 644 \"obj\"",
	"build/sub":        "dir 755",
	"build/sub/x.o":    "file 644 \"x\"",
	"docs":             "dir 755",
	"docs/guide.md":    "file 644 \"guide\"",
	"lib":              "dir 755",
	"lib/util.go":      "file 644 \"util\"",
	"lib/old.go":       "file 644 \"old\"",
	"src":              "dir 755",
	"src/main.go":      "file 644 \"main\"",
	"src/pkg":          "dir 755",
	"src/pkg/a.go":     "file 644 \"a\"",
	"victim":           "file 644 \"replaced\"",
	"winner":           "file 644 \"wins\"",
	"script.sh":        "file 644 \"#!/bin/sh\"",
	"to-delete.txt":    "file 644 \"bye\"",
	"recreated":        "dir 755",
	"recreated/gone":   "file 644 \"gone\"",
	"linked":           "file 644 \"linked\"",
	"attrs":            "file 644 \"attrs\"",
	"truncate-me.txt":  "file 644 \"0123456789\"",
	"lib/keep-mode.go": "file 644 \"km\"",
}

// stageMix builds mixBase in the workspace and stages one of everything.
func stageMix(h *harness) {
	h.t.Helper()
	for p, d := range mixBase {
		switch {
		case d == "dir 755":
			h.baseDir(p)
		default:
			content, err := strconv.Unquote(strings.TrimPrefix(d, "file 644 "))
			require.NoError(h.t, err)
			h.baseFile(p, content)
		}
	}
	h.overwrite("src/main.go", "main v2")                     // copy-up
	h.create("src/new.go", "new")                             // create
	h.mkdir("src/gen")                                        // nested new dirs
	h.mkdir("src/gen/deep")                                   //
	h.create("src/gen/deep/g.go", "gen")                      //
	h.unlink("to-delete.txt")                                 // delete base file
	h.unlink("build/sub/x.o")                                 // rm -rf build
	h.rmdir("build/sub")                                      //
	h.unlink("build/out.o")                                   //
	h.rmdir("build")                                          //
	h.unlink("recreated/gone")                                // delete, recreate (opaque)
	h.rmdir("recreated")                                      //
	h.mkdir("recreated")                                      //
	h.create("recreated/fresh", "fresh")                      //
	h.rename("winner", "victim")                              // rename over existing
	h.rename("docs", "manual")                                // dir rename (redirect)
	h.overwrite("manual/guide.md", "guide v2")                // edit inside it
	h.create("manual/new.md", "new doc")                      //
	h.rename("lib", "pkg")                                    // rename and back
	h.rename("pkg", "lib")                                    //
	h.unlink("lib/old.go")                                    //
	_, err := h.e.Symlink("src/main.go", "main-link", caller) // symlink
	require.NoError(h.t, err)
	_, err = h.e.Link("linked", "linked2", caller) // hard link
	require.NoError(h.t, err)
	mode := uint32(0o755)
	_, err = h.e.Setattr("script.sh", -1, overlay.SetAttr{Mode: &mode}, caller) // chmod
	require.NoError(h.t, err)
	require.NoError(h.t, h.e.Setxattr("attrs", "user.k", []byte("v"), 0, caller))
	size := uint64(4)
	_, err = h.e.Setattr("truncate-me.txt", -1, overlay.SetAttr{Size: &size}, caller)
	require.NoError(h.t, err)
}

func TestCommitConflict(t *testing.T) {
	h := newHarness(t)
	h.baseFile("f", "original")
	h.baseFile("other", "o")
	h.overwrite("f", "staged")
	h.overwrite("other", "o2")

	// The user edits the workspace file directly (different size, so the
	// baseline differs whatever the timestamp granularity).
	require.NoError(t, os.WriteFile(h.wsPath("f"), []byte("user's own edit"), 0o644))

	res := h.e.Commit(nil, false, caller)
	require.Len(t, res.Conflicts, 1)
	require.Equal(t, "f", res.Conflicts[0].Path)
	require.NotEmpty(t, res.Conflicts[0].Expected)
	require.NotEmpty(t, res.Conflicts[0].Actual)
	require.Empty(t, res.Failed)
	require.Equal(t, []string{"other"}, res.Committed, "the conflict does not block other paths")
	require.Equal(t, "user's own edit", h.baseRead("f"), "the user's edit is kept")
	require.Equal(t, "o2", h.baseRead("other"))
	require.Equal(t, []string{"modified f"}, h.pending(), "the conflicting change stays pending")
	require.Equal(t, "staged", h.read("f"))

	// Committing again without force still conflicts.
	res = h.e.Commit([]string{"f"}, false, caller)
	require.Len(t, res.Conflicts, 1)
	require.Equal(t, "user's own edit", h.baseRead("f"))

	res = h.e.Commit([]string{"f"}, true, caller)
	require.Empty(t, res.Conflicts)
	require.Empty(t, res.Failed)
	require.Equal(t, []string{"f"}, res.Committed)
	require.Equal(t, "staged", h.baseRead("f"))
	require.Empty(t, h.pending())
	require.Empty(t, h.upperEntries())
}

func TestCommitConflictOnDeleteAndCreate(t *testing.T) {
	h := newHarness(t)
	h.baseFile("del", "d")
	h.unlink("del")
	h.create("made", "staged")
	// Meanwhile, in the workspace: del is rewritten, made is created.
	require.NoError(t, os.WriteFile(h.wsPath("del"), []byte("changed by user"), 0o644))
	require.NoError(t, os.WriteFile(h.wsPath("made"), []byte("user made it"), 0o644))

	res := h.e.Commit(nil, false, caller)
	var paths []string
	for _, c := range res.Conflicts {
		paths = append(paths, c.Path)
	}
	require.ElementsMatch(t, []string{"del", "made"}, paths)
	require.Equal(t, "changed by user", h.baseRead("del"))
	require.Equal(t, "user made it", h.baseRead("made"))
	require.Equal(t, []string{"deleted del", "created made"}, h.pending())
}

func TestCommitRefusesOpenWriter(t *testing.T) {
	h := newHarness(t)
	h.baseFile("f", "x")
	f, err := h.e.Open("f", unix.O_WRONLY, caller)
	require.NoError(t, err)
	_, err = unix.Pwrite(f.Fd, []byte("y"), 0)
	require.NoError(t, err)
	res := h.e.Commit(nil, false, caller)
	require.Len(t, res.Failed, 1)
	require.Equal(t, "x", h.baseRead("f"))
	h.e.Release("f", f, caller)
	h.commitAll()
	require.Equal(t, "y", h.baseRead("f"))
}

func TestDiscardOnePath(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a", "A")
	h.baseFile("b", "B")
	h.baseFile("d/c", "C")
	ws := h.wsSnapshot()

	h.overwrite("a", "A2")
	h.unlink("b")
	h.create("d/new", "N")
	h.overwrite("d/c", "C2")

	done := h.e.Discard([]string{"a"}, caller)
	require.Equal(t, []string{"a"}, done)
	require.Equal(t, "A", h.read("a"), "discard restores the base view")
	require.Equal(t, h.baseIno("a"), h.stat("a").Ino)
	require.Equal(t, []string{"deleted b", "modified d/c", "created d/new"}, h.pending())

	done = h.e.Discard([]string{"b"}, caller)
	require.Equal(t, []string{"b"}, done)
	require.Equal(t, "B", h.read("b"))

	done = h.e.Discard([]string{"d/new"}, caller)
	require.Equal(t, []string{"d/new"}, done)
	h.requireMissing("d/new")
	require.Equal(t, []string{"c"}, h.names("d"))
	require.Equal(t, []string{"modified d/c"}, h.pending())
	require.Equal(t, ws, h.wsSnapshot())

	require.Empty(t, h.e.Discard([]string{"nothing/here"}, caller))
}

func TestDiscardAll(t *testing.T) {
	h := newHarness(t)
	stageMix(h)
	ws := h.wsSnapshot()
	require.NotEmpty(t, h.pending())

	done := h.e.Discard(nil, caller)
	require.NotEmpty(t, done)
	require.Empty(t, h.pending())
	require.Zero(t, h.e.PendingCount())
	require.Empty(t, h.upperEntries(), "discard of all empties the upper tree")
	require.Equal(t, ws, h.view(), "the view is the workspace again")
	require.Equal(t, ws, h.wsSnapshot())
}

func TestDiscardDirRename(t *testing.T) {
	for _, which := range []string{"new", "old"} {
		t.Run("discard "+which, func(t *testing.T) {
			h := newHarness(t)
			h.baseFile("old/f", "f")
			h.baseFile("old/sub/g", "g")
			ws := h.wsSnapshot()
			h.rename("old", "new")
			h.overwrite("new/f", "f2")
			require.Equal(t, []string{"new"}, h.names(""))

			// Either name brings its partner: half a rename would lose
			// or duplicate the directory.
			done := h.e.Discard([]string{which}, caller)
			require.Contains(t, done, "old")
			require.Contains(t, done, "new")
			require.Equal(t, []string{"old"}, h.names(""))
			require.Equal(t, "f", h.read("old/f"))
			require.Equal(t, []string{"f", "sub"}, h.names("old"))
			h.requireMissing("new")
			require.Empty(t, h.pending())
			require.Empty(t, h.upperEntries())
			require.Equal(t, ws, h.view())
			require.Equal(t, ws, h.wsSnapshot())
		})
	}
}

func TestRestartKeepsPendingSet(t *testing.T) {
	h := newHarness(t)
	stageMix(h)
	pending := h.e.Pending(nil)
	view := h.view()
	ws := h.wsSnapshot()
	diff, err := h.e.Diff(nil)
	require.NoError(t, err)

	h.restart()
	require.Equal(t, pending, h.e.Pending(nil), "pending set after restart")
	require.Equal(t, view, h.view(), "view after restart")
	require.Equal(t, ws, h.wsSnapshot())
	diff2, err := h.e.Diff(nil)
	require.NoError(t, err)
	require.Equal(t, diff, diff2)

	// The reloaded pending set keeps working: more changes, then commit.
	h.overwrite("manual/guide.md", "guide v3")
	h.commitAll()
	require.Equal(t, "guide v3", h.baseRead("manual/guide.md"))
}

func TestRestartCleansWork(t *testing.T) {
	h := newHarness(t)
	h.create("f", "x")
	leftover := filepath.Join(h.state, "work", "leftover")
	require.NoError(t, os.WriteFile(leftover, []byte("half"), 0o600))
	h.restart()
	require.NoFileExists(t, leftover)
	require.Equal(t, []string{"created f"}, h.pending())
}

func TestHiddenPath(t *testing.T) {
	h := newHarness(t, ".stagefs")
	h.baseFile(".stagefs/state/journal", "j")
	h.baseFile("visible", "v")
	ws := h.wsSnapshot()

	require.Equal(t, []string{"visible"}, h.names(""))
	h.requireMissing(".stagefs")
	h.requireMissing(".stagefs/state/journal")
	_, err := h.e.ReadDir(".stagefs")
	require.ErrorIs(t, err, syscall.ENOENT)
	_, err = h.e.Open(".stagefs/state/journal", unix.O_RDONLY, caller)
	require.ErrorIs(t, err, syscall.ENOENT)

	_, _, err = h.e.Create(".stagefs", unix.O_WRONLY|unix.O_CREAT, 0o644, caller)
	require.ErrorIs(t, err, syscall.EACCES)
	_, _, err = h.e.Create(".stagefs/x", unix.O_WRONLY|unix.O_CREAT, 0o644, caller)
	require.ErrorIs(t, err, syscall.EACCES)
	_, err = h.e.Mkdir(".stagefs", 0o755, caller)
	require.ErrorIs(t, err, syscall.EACCES)
	_, err = h.e.Symlink("x", ".stagefs", caller)
	require.ErrorIs(t, err, syscall.EACCES)
	_, err = h.e.Link("visible", ".stagefs", caller)
	require.ErrorIs(t, err, syscall.EACCES)
	require.Error(t, h.e.Rename("visible", ".stagefs", 0, caller))
	require.Error(t, h.e.Rename(".stagefs", "moved", 0, caller))
	require.Error(t, h.e.Unlink(".stagefs/state/journal", caller))
	require.Error(t, h.e.Setxattr(".stagefs", "user.x", []byte("1"), 0, caller))

	require.Empty(t, h.pending())
	require.Equal(t, ws, h.wsSnapshot())
	require.Equal(t, "v", h.read("visible"))
}

func TestHiddenPathImmediate(t *testing.T) {
	// In immediate mode operations go straight to the workspace: the
	// hidden paths must be refused there too (the state dir lives there).
	h := newHarness(t, ".stagefs")
	h.baseFile(".stagefs/state/journal", "j")
	h.baseFile("visible", "v")
	_, err := h.e.SetMode(overlay.Immediate, caller)
	require.NoError(t, err)
	ws := h.wsSnapshot()

	require.Equal(t, []string{"visible"}, h.names(""))
	h.requireMissing(".stagefs/state/journal")
	_, _, err = h.e.Create(".stagefs/state/evil", unix.O_WRONLY|unix.O_CREAT, 0o644, caller)
	require.ErrorIs(t, err, syscall.EACCES)
	_, err = h.e.Mkdir(".stagefs/d", 0o755, caller)
	require.ErrorIs(t, err, syscall.EACCES)
	_, err = h.e.Symlink("x", ".stagefs/l", caller)
	require.ErrorIs(t, err, syscall.EACCES)
	_, err = h.e.Mknod(".stagefs/n", syscall.S_IFIFO|0o600, 0, caller)
	require.ErrorIs(t, err, syscall.EACCES)
	_, err = h.e.Link("visible", ".stagefs/h", caller)
	require.ErrorIs(t, err, syscall.EACCES)
	_, err = h.e.Link(".stagefs/state/journal", "stolen", caller)
	require.ErrorIs(t, err, syscall.ENOENT)
	require.ErrorIs(t, h.e.Unlink(".stagefs/state/journal", caller), syscall.ENOENT)
	require.ErrorIs(t, h.e.Rmdir(".stagefs/state", caller), syscall.ENOENT)
	require.ErrorIs(t, h.e.Rename(".stagefs/state/journal", "stolen", 0, caller), syscall.ENOENT)
	require.ErrorIs(t, h.e.Rename("visible", ".stagefs/state/journal", 0, caller), syscall.EACCES)
	mode := uint32(0o777)
	_, err = h.e.Setattr(".stagefs/state/journal", -1, overlay.SetAttr{Mode: &mode}, caller)
	require.ErrorIs(t, err, syscall.ENOENT)
	require.ErrorIs(t, h.e.Setxattr(".stagefs", "user.x", []byte("1"), 0, caller), syscall.ENOENT)
	_, err = h.e.Open(".stagefs/state/journal", unix.O_WRONLY|unix.O_TRUNC, caller)
	require.ErrorIs(t, err, syscall.ENOENT)
	require.Equal(t, ws, h.wsSnapshot())
}

func TestSetModeImmediate(t *testing.T) {
	h := newHarness(t)
	h.baseFile("f", "base")
	h.create("staged", "s")

	prev, err := h.e.SetMode(overlay.Immediate, caller)
	var se *overlay.StateError
	require.True(t, errors.As(err, &se), "switching to immediate with pending changes is refused: %v", err)
	require.Equal(t, overlay.Staged, prev)
	require.Equal(t, overlay.Staged, h.e.Mode())
	h.requireBaseMissing("staged")

	h.commitAll()
	prev, err = h.e.SetMode(overlay.Immediate, caller)
	require.NoError(t, err)
	require.Equal(t, overlay.Staged, prev)
	require.Equal(t, overlay.Immediate, h.e.Mode())

	// Writes go straight to the workspace.
	h.create("direct", "d")
	require.Equal(t, "d", h.baseRead("direct"))
	h.overwrite("f", "changed")
	require.Equal(t, "changed", h.baseRead("f"))
	h.mkdir("dir")
	require.DirExists(t, h.wsPath("dir"))
	h.rename("direct", "dir/moved")
	require.Equal(t, "d", h.baseRead("dir/moved"))
	h.unlink("staged")
	h.requireBaseMissing("staged")
	_, err = h.e.Symlink("f", "lnk", caller)
	require.NoError(t, err)
	got, err := os.Readlink(h.wsPath("lnk"))
	require.NoError(t, err)
	require.Equal(t, "f", got)
	require.Empty(t, h.pending())
	require.Empty(t, h.upperEntries())
	require.Equal(t, h.wsSnapshot(), h.view())

	// Back to staged: writes are staged again.
	_, err = h.e.SetMode(overlay.Staged, caller)
	require.NoError(t, err)
	h.overwrite("f", "staged again")
	require.Equal(t, "changed", h.baseRead("f"))
	require.Equal(t, []string{"modified f"}, h.pending())
}

func TestParseMode(t *testing.T) {
	m, err := overlay.ParseMode("staged")
	require.NoError(t, err)
	require.Equal(t, overlay.Staged, m)
	m, err = overlay.ParseMode("immediate")
	require.NoError(t, err)
	require.Equal(t, overlay.Immediate, m)
	_, err = overlay.ParseMode("eager")
	require.Error(t, err)
}

func TestDiff(t *testing.T) {
	h := newHarness(t)
	h.baseFile("mod.txt", "old\n")
	h.baseFile("del.txt", "gone\n")
	h.baseFile("deldir/x", "x\n")
	h.baseFile("same.txt", "same\n")
	h.overwrite("mod.txt", "new\n")
	h.unlink("del.txt")
	h.create("add.txt", "hello\n")
	mode := uint32(0o755)
	h.create("run.sh", "#!/bin/sh\n")
	_, err := h.e.Setattr("run.sh", -1, overlay.SetAttr{Mode: &mode}, caller)
	require.NoError(t, err)
	_, err = h.e.Symlink("mod.txt", "ln", caller)
	require.NoError(t, err)
	h.unlink("deldir/x")
	h.rmdir("deldir")

	diff, err := h.e.Diff(nil)
	require.NoError(t, err)
	require.Equal(t, []unidiff.FileChange{
		{Path: "add.txt", New: []byte("hello\n"), NewMode: 0o100644},
		{Path: "del.txt", Old: []byte("gone\n"), OldMode: 0o100644},
		{Path: "deldir/x", Old: []byte("x\n"), OldMode: 0o100644},
		{Path: "ln", New: []byte("mod.txt"), NewMode: 0o120000},
		{Path: "mod.txt", Old: []byte("old\n"), OldMode: 0o100644, New: []byte("new\n"), NewMode: 0o100644},
		{Path: "run.sh", New: []byte("#!/bin/sh\n"), NewMode: 0o100755},
	}, diff)

	// Restricted to paths.
	diff, err = h.e.Diff([]string{"mod.txt"})
	require.NoError(t, err)
	require.Len(t, diff, 1)
	require.Equal(t, "mod.txt", diff[0].Path)
	diff, err = h.e.Diff([]string{"same.txt"})
	require.NoError(t, err)
	require.Empty(t, diff)
}

func TestDiffRenamedDir(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a/x", "x\n")
	h.rename("a", "b")
	diff, err := h.e.Diff(nil)
	require.NoError(t, err)
	require.Equal(t, []unidiff.FileChange{
		{Path: "a/x", Old: []byte("x\n"), OldMode: 0o100644},
		{Path: "b/x", New: []byte("x\n"), NewMode: 0o100644},
	}, diff)
}

func TestWriteFileReadFile(t *testing.T) {
	h := newHarness(t)
	h.baseFile("f", "base")
	require.NoError(t, h.e.WriteFile("f", []byte("via WriteFile"), caller))
	require.NoError(t, h.e.WriteFile("g", []byte("new"), caller))
	require.Equal(t, "via WriteFile", h.read("f"))
	require.Equal(t, "new", h.read("g"))
	require.Equal(t, "base", h.baseRead("f"))
	_, ok, err := h.e.ReadFile("missing")
	require.NoError(t, err)
	require.False(t, ok)
	h.baseDir("d")
	_, _, err = h.e.ReadFile("d")
	require.ErrorIs(t, err, syscall.EISDIR)
	require.Equal(t, []string{"modified f", "created g"}, h.pending())
}

func TestOnChangeCalled(t *testing.T) {
	ws, state := t.TempDir(), t.TempDir()
	n := 0
	e, err := overlay.New(overlay.Options{Workspace: ws, StateDir: state, OnChange: func() { n++ }})
	require.NoError(t, err)
	defer e.Close()
	require.Equal(t, overlay.Staged, e.Mode(), "staged is the default mode")
	_, err = e.Mkdir("d", 0o755, caller)
	require.NoError(t, err)
	require.Positive(t, n)
}

// Extended attributes larger than the first small buffer (here 2,000 bytes) are
// copied up and committed whole.
func TestLargeXattrSurvivesCopyUpAndCommit(t *testing.T) {
	h := newHarness(t)
	h.baseFile("x", "old\n")
	big := bytes.Repeat([]byte("v"), 2000) // more than the first 1 KiB buffer
	if err := unix.Setxattr(h.wsPath("x"), "user.big", big, 0); err != nil {
		t.Skip("no user xattrs here:", err)
	}
	h.overwrite("x", "new\n")
	got := make([]byte, 8192)
	n, err := h.e.Getxattr("x", "user.big", got)
	require.NoError(t, err)
	require.Equal(t, big, got[:n], "copied up")
	h.commitAll()
	n, err = unix.Getxattr(h.wsPath("x"), "user.big", got)
	require.NoError(t, err)
	require.Equal(t, big, got[:n], "committed")
	require.Equal(t, "new\n", h.baseRead("x"))
}

// A commit moves the committed upper files into work/ and unlinks them
// after it has answered; by Close nothing of them is left, in upper/ or
// in work/.
func TestCommitLeavesNoTrash(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a", "a0\n")
	h.overwrite("a", "a1\n")
	h.create("b", "b1\n")
	h.commitAll()
	require.Empty(t, h.upperEntries())
	require.NoError(t, h.e.Close())
	h.e = nil
	ents, err := os.ReadDir(filepath.Join(h.opts.StateDir, "work"))
	require.NoError(t, err)
	require.Empty(t, ents)
	h.open()
	require.Equal(t, "a1\n", h.read("a"))
	require.Equal(t, "b1\n", h.read("b"))
}

// A DirStatter (READDIRPLUS's lookups) answers exactly as LookupStat, for
// every kind of entry and every way a directory's view is made.
func TestDirStatterIsStat(t *testing.T) {
	h := newHarness(t, ".stagefs")
	for _, p := range []string{"d/base", "d/edited", "d/gone", "d/sub/f", "r/one", "o/old", ".stagefs/x"} {
		h.baseFile(p, "content of "+p+"\n")
	}
	h.baseSymlink("d/link", "base")
	h.overwrite("d/edited", "edited\n")
	h.unlink("d/gone")
	h.create("d/new", "new\n")
	h.rename("r", "moved")
	h.create("moved/two", "two\n")
	h.unlink("o/old")
	h.rmdir("o")
	h.mkdir("o")
	h.create("o/fresh", "fresh\n")
	names := []string{"base", "edited", "gone", "sub", "link", "new", "missing", "one", "two", "old", "fresh", ".stagefs", "f"}
	for _, dir := range []string{"", "d", "d/sub", "moved", "o", "r"} {
		s := h.e.OpenDirStatter(dir)
		for _, name := range names {
			p := name
			if dir != "" {
				p = dir + "/" + name
			}
			want, wantShared, wantErr := h.e.LookupStat(p)
			got, gotShared, gotErr := s.LookupStat(name)
			require.Equal(t, wantErr, gotErr, "%s", p)
			if wantErr == nil {
				require.Equal(t, *want, *got, "%s", p)
				require.Equal(t, wantShared, gotShared, "%s", p)
			}
		}
		s.Close()
	}
}
