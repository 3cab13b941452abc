package overlay

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// forkView describes every entry of e's view, recursively: kind, mode,
// inode number, owner, and content or link target or xattr.
func forkView(t *testing.T, e *Engine) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(p string)
	walk = func(p string) {
		st, err := e.Stat(p)
		require.NoError(t, err, "stat %q", p)
		desc := fmt.Sprintf("mode %o ino %d owner %d:%d nlink %d", st.Mode, st.Ino, st.Uid, st.Gid, st.Nlink)
		if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			desc += fmt.Sprintf(" mtime %d", st.Mtim.Nano())
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			ents, err := e.ReadDir(p)
			require.NoError(t, err)
			var names []string
			for _, d := range ents {
				names = append(names, d.Name)
				walk(joinPath(p, d.Name))
			}
			sort.Strings(names)
			desc += " [" + strings.Join(names, " ") + "]"
		case syscall.S_IFREG:
			desc += " " + readView(t, e, p)
		case syscall.S_IFLNK:
			target, err := e.Readlink(p)
			require.NoError(t, err)
			desc += " -> " + target
		}
		if p != "" {
			buf := make([]byte, 256)
			if n, err := e.Getxattr(p, "user.k", buf); err == nil {
				desc += " user.k=" + string(buf[:n])
			}
		}
		out[p] = desc
	}
	walk("")
	return out
}

// A fork shows what its parent showed at that instant, survives a restart
// (no meta looks misplaced), and from then on the two change apart.
func TestForkIsAnIndependentEqualPendingSet(t *testing.T) {
	ws, state, forked := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "branch")
	for p, c := range map[string]string{"a.txt": "a\n", "d/b.txt": "b\n", "old/x": "x\n", "gone.txt": "gone\n"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(ws, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(ws, p), []byte(c), 0o644))
	}
	e := openEngine(t, ws, state)
	defer e.Close()
	c := Caller{Pid: os.Getpid()}
	writeNew(t, e, "a.txt", "changed\n")
	_, err := e.Mkdir("n", 0o750, c)
	require.NoError(t, err)
	writeNew(t, e, "n/f", "new\n")
	_, err = e.Symlink("a.txt", "s", c)
	require.NoError(t, err)
	require.NoError(t, e.Unlink("gone.txt", c))
	require.NoError(t, e.Rename("old", "moved", 0, c))
	mode := uint32(0o600)
	_, err = e.Setattr("d/b.txt", -1, SetAttr{Mode: &mode}, c)
	require.NoError(t, err)
	require.NoError(t, e.Setxattr("a.txt", "user.k", []byte("v"), 0, c))
	_, err = e.Link("n/f", "n/f2", c)
	require.NoError(t, err)
	_, err = e.Mknod("fifo", syscall.S_IFIFO|0o644, 0, c)
	require.NoError(t, err)
	// Another owner and old times, which the copy must carry over.
	uid, gid := uint32(1234), uint32(5678)
	_, err = e.Setattr("n/f", -1, SetAttr{Uid: &uid, Gid: &gid}, c)
	require.NoError(t, err)
	old := unix.Timespec{Sec: 1_000_000_000, Nsec: 42}
	_, err = e.Setattr("d/b.txt", -1, SetAttr{Atime: &old, Mtime: &old}, c)
	require.NoError(t, err)

	want := forkView(t, e)
	require.NoError(t, e.Fork(forked, ForkHooks{}))
	b, err := New(Options{Workspace: ws, StateDir: forked, Mode: Staged, Logf: func(f string, a ...any) {
		t.Errorf("the fork logged at start-up: "+f, a...)
	}})
	require.NoError(t, err)
	defer b.Close()
	require.Equal(t, want, forkView(t, b), "the fork shows what the parent showed")

	// Apart from here on.
	writeNew(t, b, "a.txt", "in the branch\n")
	require.NoError(t, b.Unlink("d/b.txt", c))
	writeNew(t, e, "n/f", "in the parent\n")
	require.Equal(t, "changed\n", readView(t, e, "a.txt"))
	require.Equal(t, "b\n", readView(t, e, "d/b.txt"))
	require.Equal(t, "new\n", readView(t, b, "n/f"))
	require.Equal(t, "in the parent\n", readView(t, e, "n/f2"), "hard links stay one file in the parent")
	require.Equal(t, "new\n", readView(t, b, "n/f2"), "and in the fork")
	_, err = b.Stat("d/b.txt")
	require.ErrorIs(t, err, unix.ENOENT)
	require.Equal(t, "a\n", readFileT(t, filepath.Join(ws, "a.txt")), "the workspace is untouched")
}

func readFileT(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return string(b)
}
