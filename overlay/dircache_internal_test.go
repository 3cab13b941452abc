package overlay

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The directory caches are only as right as dirMoves: a rename or
// directory removal that does not go through renameAt or rmdirAt would
// leave a cached descriptor naming a moved or deleted directory, and the
// next create there would vanish with it.
func TestNoRawRenames(t *testing.T) {
	raw := regexp.MustCompile(`unix\.Renameat|AT_REMOVEDIR|syscall\.Rename|unix\.Rmdir|syscall\.Rmdir|syscall\.Unlinkat`)
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "dircache.go" {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, line := range strings.Split(string(b), "\n") {
			if raw.MatchString(line) {
				t.Errorf("%s:%d renames or removes a directory entry without renameAt/rmdirAt: %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
}

func TestDirCacheFollowsMoves(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "a", "b"), 0o755))
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	l := layer{fd: fd, dirs: newDirCache()}
	defer l.dirs.flush()

	create := func(rel string) error {
		return l.withParent(rel, func(dirfd int, name string) error {
			f, err := unix.Openat(dirfd, name, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err == nil {
				unix.Close(f)
			}
			return err
		})
	}
	require.NoError(t, create("a/b/one"))
	require.Len(t, l.dirs.dirs, 1, "a/b is cached")

	// Move a/b away and make a new a/b: the cached descriptor must not be
	// used for it.
	require.NoError(t, l.withDir("a", func(dirfd int) error { return renameAt(dirfd, "b", dirfd, "old", 0) }))
	require.NoError(t, os.Mkdir(filepath.Join(root, "a", "b"), 0o755))
	require.NoError(t, create("a/b/two"))
	require.FileExists(t, filepath.Join(root, "a", "b", "two"))
	require.NoFileExists(t, filepath.Join(root, "a", "old", "two"))

	// Remove it: the next use fails instead of writing into a deleted
	// directory.
	require.NoError(t, os.Remove(filepath.Join(root, "a", "b", "two")))
	require.NoError(t, l.withDir("a", func(dirfd int) error { return rmdirAt(dirfd, "b") }))
	require.ErrorIs(t, create("a/b/three"), unix.ENOENT)

	// A descriptor in use survives a flush and is closed after its use.
	require.NoError(t, l.withDir("a/old", func(dirfd int) error {
		l.dirs.flush()
		var st unix.Stat_t
		return unix.Fstat(dirfd, &st)
	}))
	require.Empty(t, l.dirs.dirs)
}
