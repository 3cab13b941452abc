package test

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// treeManifest describes every entry under root (not root itself) by all
// a commit must carry over: type, mode, owner, size, mtime, content, link
// target and xattrs. One line per entry, sorted by path.
func treeManifest(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		line := fmt.Sprintf("%s type=%o mode=%o owner=%d:%d mtime=%d.%09d", rel,
			st.Mode&unix.S_IFMT, st.Mode&0o7777, st.Uid, st.Gid, st.Mtim.Sec, st.Mtim.Nsec)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			body, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" size=%d sha=%x", st.Size, sha256.Sum256(body))
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			line += " target=" + target
		case unix.S_IFCHR, unix.S_IFBLK:
			line += fmt.Sprintf(" rdev=%d", st.Rdev)
		}
		if err := appendXattrs(&line, p); err != nil {
			return err
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatalf("manifest of %s: %v", root, err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func appendXattrs(line *string, p string) error {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil && !errors.Is(err, unix.ENOTSUP) {
		return fmt.Errorf("listxattr %s: %w", p, err)
	}
	names := strings.Split(string(buf[:n]), "\x00")
	sort.Strings(names)
	for _, name := range names {
		if name == "" {
			continue
		}
		val := make([]byte, 64<<10)
		vn, err := unix.Lgetxattr(p, name, val)
		if err != nil {
			return fmt.Errorf("getxattr %s %s: %w", p, name, err)
		}
		*line += fmt.Sprintf(" %s=%q", name, val[:vn])
	}
	return nil
}

// After a commit of everything, the workspace holds exactly what the view
// showed before it: for a tree with every kind of entry, odd modes, owners,
// times and xattrs, made with real cp -a, touch -h -d, setfattr and mknod.
func TestCommitWritesWhatTheViewShowed(t *testing.T) {
	parallel(t)
	for _, tool := range []string{"setfattr", "mknod", "cp", "touch"} {
		requireTool(t, tool)
	}
	m := mountStagefs(t, withFiles(map[string]string{
		"old/kept.txt": "workspace file\n",
		"src/a.txt":    "source\n",
	}))
	sh(t, m.ws, `setfattr -n user.was -v here old; ln -s a.txt src/link; mkfifo src/fifo`)
	script := `
mkdir new newer
setfattr -n user.dir -v new new
setfattr -n user.dir -v existing old
echo staged > new/file
chmod 0741 new/file
setfattr -n user.file -v 'with value' new/file
mkfifo new/fifo
setfattr -n trusted.fifo -v t new/fifo
chmod 0620 new/fifo
ln -s ../src/a.txt new/sym
setfattr -h -n trusted.sym -v s new/sym
ln new/file new/hardlink
cp -a src copy
touch -h -d '2001-02-03 04:05:06.123456789' new/sym new/fifo copy/link copy/fifo
touch -d '1999-12-31 23:59:59.5' new/file
`
	if os.Geteuid() == 0 {
		script += `
mknod new/null c 1 3
chmod 0604 new/null
chown 123:456 new/null new/sym
setfattr -n trusted.dev -v d new/null
touch -h -d '2002-02-02' new/null
`
	}
	script += `
touch old/added
touch -d '2003-03-03 03:03:03.3' new old newer
`
	sh(t, m.mnt, script)
	view := treeManifest(t, m.mnt)
	if strings.Contains(treeManifest(t, m.ws), "new/file") {
		t.Fatal("the workspace changed before the commit")
	}
	for _, want := range []string{"new/fifo type=10000 mode=620", "trusted.sym=", "user.dir=\"existing\"", "user.was=\"here\"", "copy/fifo"} {
		if !strings.Contains(view, want) {
			t.Fatalf("the view lacks %q:\n%s", want, view)
		}
	}
	m.mustCLI("commit")
	if ws := treeManifest(t, m.ws); ws != view {
		t.Fatalf("the workspace after the commit differs from the view before it\nview:\n%s\nworkspace:\n%s", view, ws)
	}
	if after := treeManifest(t, m.mnt); after != view {
		t.Fatalf("the view changed with the commit\nbefore:\n%s\nafter:\n%s", view, after)
	}
}

// A special file's mode belongs to its inode: chmod through one name shows
// through every other, and removing a name does not reset it.
func TestSpecialHardLinksShareMode(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	out := sh(t, m.mnt, `mknod a p; ln a b; chmod 0201 a; stat -c %a b; rm b; stat -c %a a`)
	if out != "201\n201\n" {
		t.Fatalf("modes after chmod and rm of the other name: %q, want 201 twice", out)
	}
	// Once the kernel's attribute cache has expired, the engine answers.
	out = sh(t, m.mnt, `sleep 1.2; stat -c %a a`)
	if out != "201\n" {
		t.Fatalf("mode after the attribute cache expired: %q, want 201", out)
	}
	m.mustCLI("commit")
	if out := sh(t, m.ws, `stat -c '%F %a' a`); out != "fifo 201\n" {
		t.Fatalf("committed: %q", out)
	}
}

// Xattrs on fifos and symlinks behave as on ext4: user.* is refused,
// trusted.* (root) and ACLs are kept, so cp -a of a fifo works.
func TestSpecialFileXattrs(t *testing.T) {
	parallel(t)
	requireTool(t, "setfattr")
	requireTool(t, "getfattr")
	if os.Geteuid() != 0 {
		t.Skip("trusted.* xattrs need root")
	}
	m := mountStagefs(t)
	r := runIn(t, cmdSpec{dir: m.mnt}, "sh", "-c", `mkfifo f && setfattr -n user.x -v 1 f`)
	if r.code == 0 || !strings.Contains(r.stderr, "Operation not permitted") {
		t.Fatalf("user xattr on a fifo: %s (want EPERM as on ext4)", r)
	}
	sh(t, m.mnt, `setfattr -n trusted.x -v 1 f; chmod 0640 f; cp -a f g; ln -s f s; setfattr -h -n trusted.y -v 2 s`)
	out := sh(t, m.mnt, `getfattr --absolute-names -h -n trusted.x --only-values g; echo; getfattr -h -n trusted.y --only-values s; echo; stat -c %a g`)
	if out != "1\n2\n640\n" {
		t.Fatalf("xattrs and mode through the view: %q", out)
	}
	m.mustCLI("commit")
	out = sh(t, m.ws, `getfattr -n trusted.x --only-values g; echo; getfattr -h -n trusted.y --only-values s; echo; stat -c %a g`)
	if out != "1\n2\n640\n" {
		t.Fatalf("xattrs and mode in the workspace: %q", out)
	}
}

// open(dir, O_TMPFILE) makes a file with no name, in both modes; linkat
// through /proc names it, and what was written before and after shows
// under the name, staged until the commit.
func TestTmpfileAndLinkat(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"dir/old": "x"}))
	for _, mode := range []string{"staged", "immediate"} {
		m.mustCLI("mode", mode)
		dir := filepath.Join(m.mnt, "dir")
		before := sh(t, dir, "ls -A")
		fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR, 0o640)
		if err != nil {
			t.Fatalf("%s: open O_TMPFILE: %v", mode, err)
		}
		// Closed before the mount's cleanup, also when the test fails.
		t.Cleanup(func() { unix.Close(fd) })
		if _, err := unix.Write(fd, []byte("before the link\n")); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Nlink != 0 || st.Mode != unix.S_IFREG|0o640 {
			t.Fatalf("%s: fstat of the anonymous file: nlink %d mode %o, %v", mode, st.Nlink, st.Mode, err)
		}
		if names := sh(t, dir, "ls -A"); names != before {
			t.Fatalf("%s: the anonymous file is listed: %q", mode, names)
		}
		// A second one that is closed unnamed leaves nothing behind.
		gone, err := unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		unix.Write(gone, []byte("never named"))
		unix.Close(gone)

		name := "named-" + mode
		if err := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), unix.AT_FDCWD, filepath.Join(dir, name), unix.AT_SYMLINK_FOLLOW); err != nil {
			t.Fatalf("%s: linkat: %v", mode, err)
		}
		if _, err := unix.Write(fd, []byte("after it\n")); err != nil {
			t.Fatal(err)
		}
		want := "before the link\nafter it\n"
		if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(got) != want {
			t.Fatalf("%s: the named file holds %q, %v", mode, got, err)
		}
		if names := sh(t, dir, "ls -A"); !strings.Contains(names, name+"\n") || strings.Count(names, "\n") != strings.Count(before, "\n")+1 {
			t.Fatalf("%s: listing %q after naming the file %s", mode, names, name)
		}
		_, err = os.Stat(filepath.Join(m.ws, "dir", name))
		if mode == "staged" {
			if err == nil {
				t.Fatal("staged: the workspace has the file before the commit")
			}
			if st := m.status(); len(st.Entries) != 1 || st.Entries[0].Path != "dir/"+name {
				t.Fatalf("staged: pending %+v, want only dir/%s", st.Entries, name)
			}
			// While the anonymous descriptor is open, its writes
			// bypass the daemon: the file is busy, as one open for
			// writing by name is, and is committed once it is closed.
			if r := m.cli("commit"); r.code != 3 || !strings.Contains(r.stdout+r.stderr, "open for writing") {
				t.Fatalf("staged: commit while the anonymous file is open: %s", r)
			}
			unix.Close(fd)
			if cr := m.commit(); len(cr.Committed) != 1 {
				t.Fatalf("staged: commit after closing the anonymous file: %+v", cr)
			}
		}
		got, err := os.ReadFile(filepath.Join(m.ws, "dir", name))
		if err != nil || string(got) != want {
			t.Fatalf("%s: the workspace has %q, %v", mode, got, err)
		}
	}
}

// A directory held open and then removed, by rmdir or by a rename over
// it, still answers fstat (no links left), as on ext4, in both modes.
func TestRemovedDirectoryHeldOpen(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	for _, mode := range []string{"immediate", "staged"} {
		m.mustCLI("mode", mode)
		root := filepath.Join(m.mnt, mode)
		sh(t, m.mnt, "mkdir -p "+mode+"/d1 "+mode+"/d2 "+mode+"/d3")
		over, err := unix.Open(filepath.Join(root, "d2"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(over) })
		removed, err := unix.Open(filepath.Join(root, "d3"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(removed) })
		sh(t, root, "mv -T d1 d2; rmdir d3")
		for what, fd := range map[string]int{"renamed over": over, "removed": removed} {
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				t.Fatalf("%s: fstat of a directory %s while open: %v", mode, what, err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Nlink != 0 {
				t.Fatalf("%s: fstat of a directory %s: mode %o nlink %d, want a directory with no links", mode, what, st.Mode, st.Nlink)
			}
		}
		if mode == "immediate" {
			continue
		}
		m.mustCLI("commit")
	}
}

// A directory that only holds pending changes shows the workspace
// directory's xattrs as they are now, and once changed through the mount
// it starts from those, so a commit does not put back older ones.
func TestContainerDirectoryXattrsAreLive(t *testing.T) {
	parallel(t)
	requireTool(t, "setfattr")
	requireTool(t, "getfattr")
	m := mountStagefs(t, withFiles(map[string]string{"d/f": "f\n"}))
	sh(t, m.ws, `setfattr -n user.first -v 1 d`)
	sh(t, m.mnt, `echo new > d/new`) // d now holds a pending change
	sh(t, m.ws, `setfattr -n user.first -v 2 d; setfattr -n user.later -v 3 d`)
	dump := `getfattr --absolute-names -d d | grep user. | sort`
	if got := sh(t, m.mnt, dump); got != "user.first=\"2\"\nuser.later=\"3\"\n" {
		t.Fatalf("xattrs of a directory holding changes, in the view: %q", got)
	}
	sh(t, m.mnt, `setfattr -n user.mine -v 4 d`)
	if got := sh(t, m.mnt, dump); got != "user.first=\"2\"\nuser.later=\"3\"\nuser.mine=\"4\"\n" {
		t.Fatalf("after setting one through the mount: %q", got)
	}
	m.mustCLI("commit")
	if got := sh(t, m.ws, dump); got != "user.first=\"2\"\nuser.later=\"3\"\nuser.mine=\"4\"\n" {
		t.Fatalf("in the workspace after the commit: %q", got)
	}
}

// Processes creating and removing one name at once get what a local disk
// gives them: open with O_CREAT creates (never ENOENT), and futimens of a
// descriptor whose name another process just removed works.
func TestCreateRacingRemove(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	name := filepath.Join(m.mnt, "x")
	const workers, rounds = 4, 400
	type counts struct{ opens, openENOENT, openESTALE, times int }
	results := make(chan counts, workers)
	for w := 0; w < workers; w++ {
		go func() {
			var c counts
			for i := 0; i < rounds; i++ {
				fd, err := unix.Open(name, unix.O_CREAT|unix.O_WRONLY|unix.O_NONBLOCK, 0o644)
				c.opens++
				switch {
				case errors.Is(err, unix.ENOENT):
					c.openENOENT++
					continue
				case errors.Is(err, unix.ESTALE):
					c.openESTALE++
					continue
				case err != nil:
					continue
				}
				if err := unix.UtimesNanoAt(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), nil, 0); err != nil {
					c.times++
					t.Logf("futimens: %v", err)
				}
				unix.Close(fd)
				unix.Unlink(name)
			}
			results <- c
		}()
	}
	var total counts
	for w := 0; w < workers; w++ {
		c := <-results
		total.opens += c.opens
		total.openENOENT += c.openENOENT
		total.openESTALE += c.openESTALE
		total.times += c.times
	}
	t.Logf("%d opens with O_CREAT racing unlinks: %d ENOENT, %d ESTALE; %d failed futimens", total.opens, total.openENOENT, total.openESTALE, total.times)
	if total.openENOENT > 0 || total.times > 0 {
		t.Errorf("open(O_CREAT) failed with ENOENT %d times and futimens of an open file %d times (a local disk: never)", total.openENOENT, total.times)
	}
	// The kernel walks the path again once on ESTALE; a second race in
	// that window is rare but possible (0.1-0.8% here).
	if total.openESTALE*20 > total.opens {
		t.Errorf("open(O_CREAT) failed with ESTALE %d times of %d", total.openESTALE, total.opens)
	}
}

// An xattr removed from a directory through the mount is removed from the
// workspace's directory by the commit; one the user set on the
// workspace's directory meanwhile stays, and one removed and set again is
// set.
func TestCommitRemovesDirectoryXattrsRemovedInTheView(t *testing.T) {
	parallel(t)
	requireTool(t, "setfattr")
	requireTool(t, "getfattr")
	m := mountStagefs(t, withFiles(map[string]string{"d/f": "f\n"}))
	sh(t, m.ws, `setfattr -n user.a -v 1 d; setfattr -n user.b -v 2 d`)
	sh(t, m.mnt, `setfattr -x user.a d; setfattr -n user.c -v 3 d; setfattr -x user.b d; setfattr -n user.b -v 5 d`)
	sh(t, m.ws, `setfattr -n user.mine -v 9 d`) // the user's own, after staging
	dump := `getfattr --absolute-names -d d | grep user. | sort`
	if got := sh(t, m.mnt, dump); got != "user.b=\"5\"\nuser.c=\"3\"\n" {
		t.Fatalf("the view: %q", got)
	}
	m.mustCLI("commit")
	if got := sh(t, m.ws, dump); got != "user.b=\"5\"\nuser.c=\"3\"\nuser.mine=\"9\"\n" {
		t.Fatalf("the workspace after the commit: %q", got)
	}
	// Committed: the record is gone with the change, and the view shows
	// the workspace's directory again.
	sh(t, m.ws, `setfattr -n user.a -v again d`)
	m.mustCLI("commit")
	if got := sh(t, m.ws, dump); got != "user.a=\"again\"\nuser.b=\"5\"\nuser.c=\"3\"\nuser.mine=\"9\"\n" {
		t.Fatalf("the workspace after a second commit: %q", got)
	}
}

// The view's root directory shows the time of the last change staged in
// it, as any directory does, and a commit leaves the workspace's root with
// the time the view showed, not the commit's.
func TestRootDirectoryTimes(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a": "a\n", "sub/b": "b\n"}))
	sh(t, m.ws, `touch -d '2020-01-01 00:00:00' . sub`)
	mtime := func(p string) string { return sh(t, "/", "stat -c %y '"+p+"'") }
	if got := mtime(m.mnt); !strings.HasPrefix(got, "2020-01-01 00:00:00") {
		t.Fatalf("the view's root before any change: %s", got)
	}
	sh(t, m.mnt, `echo new > new`)
	staged := mtime(m.mnt)
	if strings.HasPrefix(staged, "2020-01-01") {
		t.Fatalf("creating a file in the view's root left its mtime at %s", staged)
	}
	time.Sleep(1100 * time.Millisecond)
	m.mustCLI("commit")
	if got := mtime(m.inWS("")); got != staged {
		t.Errorf("the workspace's root after the commit: %s, the view showed %s", got, staged)
	}
	if got := mtime(m.mnt); got != staged {
		t.Errorf("the view's root after the commit: %s, before it %s", got, staged)
	}
}
