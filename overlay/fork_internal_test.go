package overlay

import (
	"fmt"
	"maps"
	"math/rand"
	"os"
	"path/filepath"
	"regexp"
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
	fk, err := e.Fork(forked)
	require.NoError(t, err)
	require.NoError(t, fk.Run())
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

// pendingDirTimes lists the mtimes of e's pending directories, which
// forkView leaves out (a listing does not move them, but a copy could).
func pendingDirTimes(e *Engine) map[string]int64 {
	e.rlock()
	defer e.runlock()
	out := map[string]int64{}
	for p, m := range e.index {
		if m.Kind == KindDir && !m.Deleted {
			if st, err := e.upper.lstat(p); err == nil {
				out[p] = st.Mtim.Nano()
			}
		}
	}
	return out
}

// A fork's copy runs while its parent changes: whatever the parent does
// after the fork's instant (writes, truncations, attributes, xattrs,
// renames of files and directories, removals, hard links, new entries in
// the directories forked, a commit, a discard), the fork shows what the
// parent showed at the instant.
func TestForkCopiesTheInstantWhileItsParentChanges(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { forkWhileParentChanges(t, seed) })
	}
}

func forkWhileParentChanges(t *testing.T, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	ws, state, forked := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "branch")
	for _, p := range []string{"a", "b", "d/c", "d/e/f", "w/x"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(ws, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(ws, p), []byte("ws "+p+"\n"), 0o644))
	}
	e := openEngine(t, ws, state)
	defer e.Close()
	c := Caller{Pid: os.Getpid()}
	// The pending set at the fork: changed and new files, a new
	// directory tree, a hard link, a symlink, an xattr, a removal, a
	// renamed directory, a mode and times.
	writeNew(t, e, "a", "staged a\n")
	writeNew(t, e, "d/e/f", "staged f\n")
	_, err := e.Mkdir("n", 0o750, c)
	require.NoError(t, err)
	_, err = e.Mkdir("n/m", 0o700, c)
	require.NoError(t, err)
	writeNew(t, e, "n/g", "new g\n")
	writeNew(t, e, "n/m/h", "new h\n")
	_, err = e.Link("n/g", "n/g2", c)
	require.NoError(t, err)
	_, err = e.Symlink("a", "n/s", c)
	require.NoError(t, err)
	require.NoError(t, e.Setxattr("d/c", "user.k", []byte("v"), 0, c))
	require.NoError(t, e.Unlink("b", c))
	require.NoError(t, e.Rename("w", "w2", 0, c))
	old := unix.Timespec{Sec: 1_000_000_000}
	_, err = e.Setattr("n/m/h", -1, SetAttr{Atime: &old, Mtime: &old}, c)
	require.NoError(t, err)
	want, wantDirs := forkView(t, e), pendingDirTimes(e)
	root, err := e.Stat("")
	require.NoError(t, err)

	fk, err := e.Fork(forked)
	require.NoError(t, err)
	// The parent changes before and while the copy runs.
	paths := []string{"a", "d/c", "d/e/f", "n/g", "n/g2", "n/m/h", "n/s", "n/new", "d/e/new", "w2/x"}
	dirs := []string{"n", "n/m", "d", "d/e", "w2"}
	ops := []func(){
		func() { tryWrite(e, paths[rng.Intn(len(paths))], fmt.Sprintf("parent %d\n", rng.Int()), c) },
		func() {
			size := uint64(1)
			e.Setattr(paths[rng.Intn(len(paths))], -1, SetAttr{Size: &size}, c)
		},
		func() {
			mode := uint32(0o755)
			e.Setattr(dirs[rng.Intn(len(dirs))], -1, SetAttr{Mode: &mode}, c)
		},
		func() {
			now := unix.Timespec{Sec: 2_000_000_000}
			e.Setattr(paths[rng.Intn(len(paths))], -1, SetAttr{Atime: &now, Mtime: &now}, c)
		},
		func() { e.Setxattr(paths[rng.Intn(len(paths))], "user.k", []byte("parent"), 0, c) },
		func() { e.Removexattr("d/c", "user.k", c) },
		func() { e.Unlink(paths[rng.Intn(len(paths))], c) },
		func() { e.Rename(paths[rng.Intn(len(paths))], paths[rng.Intn(len(paths))], 0, c) },
		func() { e.Rename(dirs[rng.Intn(len(dirs))], fmt.Sprintf("moved%d", rng.Intn(3)), 0, c) },
		func() { e.Link(paths[rng.Intn(len(paths))], fmt.Sprintf("n/l%d", rng.Intn(3)), c) },
		func() { e.Mkdir(dirs[rng.Intn(len(dirs))]+"/sub", 0o700, c) },
		func() { e.Discard([]string{paths[rng.Intn(len(paths))]}, c) },
		// Only paths the fork has pending too: a commit of another
		// would show through in the fork, as it does in every view.
		func() { e.Commit([]string{[]string{"a", "d/e/f", "n/g", "n/m/h"}[rng.Intn(4)]}, false, c) },
	}
	for i := 0; i < 30; i++ {
		ops[rng.Intn(len(ops))]()
	}
	done := make(chan error)
	go func() { done <- fk.Run() }()
	for i := 0; i < 30; i++ {
		ops[rng.Intn(len(ops))]()
	}
	require.NoError(t, <-done)

	b, err := New(Options{Workspace: ws, StateDir: forked, Mode: Staged, Logf: func(f string, a ...any) {
		t.Errorf("the fork logged at start-up: "+f, a...)
	}})
	require.NoError(t, err)
	defer b.Close()
	if got := forkView(t, b); !equalViews(want, got) {
		t.Errorf("the fork does not show what its parent showed at the instant:\nwant %v\ngot  %v", want, got)
	}
	require.Equal(t, wantDirs, pendingDirTimes(b), "directory times")
	if broot, err := b.Stat(""); err != nil || broot.Mtim.Nano() < root.Mtim.Nano() {
		t.Errorf("the fork's root shows mtime %v, before the parent's at the instant %v (%v)", broot.Mtim, root.Mtim, err)
	} else if ws, _ := os.Stat(ws); broot.Mtim.Nano() != root.Mtim.Nano() && broot.Mtim.Nano() != ws.ModTime().UnixNano() {
		t.Errorf("the fork's root shows mtime %v: neither the parent's at the instant %v nor the workspace's since", broot.Mtim, root.Mtim)
	}
}

// equalViews compares two forkViews but for the root's link count: the
// root is the workspace's own directory, where the parent's commits may
// have made directories.
func equalViews(a, b map[string]string) bool {
	nlink := regexp.MustCompile(`nlink \d+`)
	a, b = maps.Clone(a), maps.Clone(b)
	a[""], b[""] = nlink.ReplaceAllString(a[""], ""), nlink.ReplaceAllString(b[""], "")
	return fmt.Sprint(a) == fmt.Sprint(b)
}

// tryWrite writes content to p if it can (the test's random changes may
// name what is gone).
func tryWrite(e *Engine, p, content string, c Caller) {
	f, _, err := e.Create(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644, c)
	if err != nil {
		return
	}
	unix.Write(f.Fd, []byte(content))
	e.Release(p, f, c)
}

// A file a process holds open for writing at the fork's instant is copied
// then: its writes (passthrough, in the mount) never reach the engine, so
// no later push could keep them out of the fork.
func TestForkCopiesFilesHeldOpenForWritingAtItsInstant(t *testing.T) {
	ws, state, forked := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "branch")
	e := openEngine(t, ws, state)
	defer e.Close()
	c := Caller{Pid: os.Getpid()}
	writeNew(t, e, "held", "at the fork\n")
	f, err := e.Open("held", unix.O_WRONLY, c)
	require.NoError(t, err)
	fk, err := e.Fork(forked)
	require.NoError(t, err)
	_, err = unix.Pwrite(f.Fd, []byte("AFTER"), 0)
	require.NoError(t, err)
	e.Release("held", f, c)
	require.NoError(t, fk.Run())
	b, err := New(Options{Workspace: ws, StateDir: forked, Mode: Staged})
	require.NoError(t, err)
	defer b.Close()
	require.Equal(t, "at the fork\n", readView(t, b, "held"))
	require.Equal(t, "AFTERe fork\n", readView(t, e, "held"))
}

// A fork keeps set-id bits and file capabilities: giving the copy its
// owner clears both, so the owner must come first.
func TestForkKeepsSetIDBitsAndCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("setting security.capability needs root")
	}
	ws, state, forked := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "branch")
	e := openEngine(t, ws, state)
	defer e.Close()
	c := Caller{Pid: os.Getpid()}
	writeNew(t, e, "su", "#!/bin/true\n")
	writeNew(t, e, "cap", "#!/bin/true\n")
	suid, exe := uint32(0o4755|0o2000), uint32(0o755)
	uid, gid := uint32(1234), uint32(5678)
	_, err := e.Setattr("su", -1, SetAttr{Uid: &uid, Gid: &gid}, c)
	require.NoError(t, err)
	_, err = e.Setattr("su", -1, SetAttr{Mode: &suid}, c)
	require.NoError(t, err)
	_, err = e.Setattr("cap", -1, SetAttr{Mode: &exe}, c)
	require.NoError(t, err)
	capValue := []byte{1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	require.NoError(t, e.Setxattr("cap", "security.capability", capValue, 0, c))
	fk, err := e.Fork(forked)
	require.NoError(t, err)
	require.NoError(t, fk.Run())
	b, err := New(Options{Workspace: ws, StateDir: forked, Mode: Staged})
	require.NoError(t, err)
	defer b.Close()
	st, err := b.Stat("su")
	require.NoError(t, err)
	require.Equal(t, uint32(0o6755), st.Mode&0o7777, "the set-id bits")
	require.Equal(t, [2]uint32{uid, gid}, [2]uint32{st.Uid, st.Gid})
	buf := make([]byte, 64)
	n, err := b.Getxattr("cap", "security.capability", buf)
	require.NoError(t, err, "the file capability")
	require.Equal(t, capValue, buf[:n])
}
