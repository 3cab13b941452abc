package overlay_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"stagefs/overlay"
)

func TestCleanPath(t *testing.T) {
	ok := map[string]string{
		"":             "",
		".":            "",
		"./":           "",
		"a":            "a",
		"a/b":          "a/b",
		"a//b/":        "a/b",
		"./a/./b/.":    "a/b",
		"...":          "...",
		"a/..b/c..":    "a/..b/c..",
		"dir/file.txt": "dir/file.txt",
	}
	for in, want := range ok {
		got, err := overlay.CleanPath(in)
		require.NoError(t, err, "%q", in)
		require.Equal(t, want, got, "%q", in)
	}
	for _, in := range []string{
		"..", "../x", "a/..", "a/../b", "a/b/../../..", "./..",
		"/", "/etc/passwd", "/a/b",
		"a\x00b", "\x00", "a/\x00",
	} {
		got, err := overlay.CleanPath(in)
		require.Error(t, err, "%q accepted as %q", in, got)
	}
}

// escapeHarness is a workspace with a symlink "out" to a directory outside
// it, and a base directory "d" with a file.
func escapeHarness(t *testing.T) (*harness, string) {
	h := newHarness(t)
	outside := t.TempDir()
	h.baseSymlink("out", outside)
	h.baseSymlink("outfile", filepath.Join(outside, "victim"))
	h.baseFile("d/f", "f")
	h.baseFile("plain", "p")
	return h, outside
}

func requireEmptyDir(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, ents, "something appeared in %s", dir)
}

func TestSymlinkOutsideIsNeverFollowed(t *testing.T) {
	h, outside := escapeHarness(t)
	ws := h.wsSnapshot()

	// The link itself is visible as a link.
	st := h.stat("out")
	require.Equal(t, uint32(syscall.S_IFLNK), st.Mode&syscall.S_IFMT)
	target, err := h.e.Readlink("out")
	require.NoError(t, err)
	require.Equal(t, outside, target)

	// Nothing can be created, read or listed through it.
	_, _, err = h.e.Create("out/x", unix.O_WRONLY|unix.O_CREAT, 0o644, caller)
	require.ErrorIs(t, err, syscall.ENOTDIR)
	_, err = h.e.Mkdir("out/y", 0o755, caller)
	require.ErrorIs(t, err, syscall.ENOTDIR)
	_, err = h.e.Symlink("t", "out/z", caller)
	require.ErrorIs(t, err, syscall.ENOTDIR)
	_, err = h.e.Mknod("out/fifo", syscall.S_IFIFO|0o644, 0, caller)
	require.ErrorIs(t, err, syscall.ENOTDIR)
	_, err = h.e.Link("plain", "out/hard", caller)
	require.ErrorIs(t, err, syscall.ENOTDIR)
	require.ErrorIs(t, h.e.Rename("plain", "out/moved", 0, caller), syscall.ENOTDIR)
	require.ErrorIs(t, h.e.Rename("d", "out/d", 0, caller), syscall.ENOTDIR)
	require.NoError(t, h.e.WriteFile("ok-file", []byte("fine"), caller))
	require.ErrorIs(t, h.e.WriteFile("out/w", []byte("no"), caller), syscall.ENOTDIR)
	_, err = h.e.ReadDir("out")
	require.ErrorIs(t, err, syscall.ENOTDIR)
	_, err = h.e.Open("out/x", unix.O_RDONLY, caller)
	require.Error(t, err)
	_, err = h.e.Stat("out/x")
	require.Error(t, err)

	// A file behind a symlink is not opened, read or written either.
	_, err = h.e.Open("outfile", unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, caller)
	require.ErrorIs(t, err, syscall.ELOOP)
	_, _, err = h.e.Create("outfile", unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644, caller)
	require.ErrorIs(t, err, syscall.ELOOP)
	require.ErrorIs(t, h.e.WriteFile("outfile", []byte("no"), caller), syscall.ELOOP)
	size := uint64(0)
	_, err = h.e.Setattr("outfile", -1, overlay.SetAttr{Size: &size}, caller)
	require.ErrorIs(t, err, syscall.EINVAL)
	_, err = h.e.Setattr("out", -1, overlay.SetAttr{Size: &size}, caller)
	require.ErrorIs(t, err, syscall.EINVAL)
	_, err = h.e.Setattr("d", -1, overlay.SetAttr{Size: &size}, caller)
	require.ErrorIs(t, err, syscall.EISDIR)
	for _, p := range []string{"out", "outfile"} {
		target, err := h.e.Readlink(p)
		require.NoError(t, err)
		require.NotEmpty(t, target, "truncate must not touch a link's target")
	}

	require.Equal(t, []string{"created ok-file"}, h.pending())
	h.commit()
	requireEmptyDir(t, outside)
	ws["ok-file"] = "file 644 \"fine\""
	require.Equal(t, ws, h.wsSnapshot())
}

func TestSymlinkedParentAtCommitIsNotFollowed(t *testing.T) {
	// A staged file's base directory is swapped for a symlink to outside
	// before commit: the commit must not write through it.
	h := newHarness(t)
	outside := t.TempDir()
	h.baseFile("d/f", "f")
	h.overwrite("d/f", "staged")
	h.create("d/new", "n")
	h.unlink("d/f")
	h.create("d/f", "again")

	require.NoError(t, os.RemoveAll(h.wsPath("d")))
	h.baseSymlink("d", outside)

	pending := h.pending()
	require.Equal(t, []string{"modified d/f", "created d/new"}, pending)
	res := h.e.Commit(nil, false, caller)
	require.Empty(t, res.Committed)
	require.Len(t, append(res.Failed, failuresOf(res.Conflicts)...), 2)
	requireEmptyDir(t, outside)
	require.Equal(t, pending, h.pending(), "nothing committed stays pending")

	// Even forced.
	res = h.e.Commit(nil, true, caller)
	require.Empty(t, res.Committed)
	requireEmptyDir(t, outside)
}

func failuresOf(cs []overlay.Conflict) []overlay.Failure {
	var out []overlay.Failure
	for _, c := range cs {
		out = append(out, overlay.Failure{Path: c.Path, Reason: c.Reason})
	}
	return out
}

func TestStateDirOnlyHoldsUpperAndWork(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a", "a")
	h.overwrite("a", "b")
	ents, err := os.ReadDir(h.state)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	require.ElementsMatch(t, []string{"upper", "work"}, names)
	requireEmptyDir(t, filepath.Join(h.state, "work"))
	// The upper tree holds only regular files and directories.
	err = filepath.WalkDir(filepath.Join(h.state, "upper"), func(p string, d os.DirEntry, err error) error {
		require.NoError(t, err)
		require.True(t, d.IsDir() || d.Type().IsRegular(), "%s in the upper tree is a %v", p, d.Type())
		return nil
	})
	require.NoError(t, err)
}
