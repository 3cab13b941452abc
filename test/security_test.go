package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// testUserName is a non-root account made for the tests that need
// another user: a peer of the control socket, a non-root mount.
const testUserName = "stagefs-test"

var (
	testUserOnce sync.Once
	testUID      int
	testUserErr  error
)

// testUser returns the uid of testUserName, creating the account (no home,
// no login) the first time. It needs root.
func testUser(t *testing.T) int {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to make a user and run commands as it")
	}
	testUserOnce.Do(func() {
		if u, err := user.Lookup(testUserName); err == nil {
			testUID, testUserErr = strconv.Atoi(u.Uid)
			return
		}
		out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", testUserName).CombinedOutput()
		if err != nil {
			testUserErr = fmt.Errorf("useradd %s: %v: %s", testUserName, err, out)
			return
		}
		u, err := user.Lookup(testUserName)
		if err != nil {
			testUserErr = err
			return
		}
		testUID, testUserErr = strconv.Atoi(u.Uid)
	})
	if testUserErr != nil {
		t.Fatal(testUserErr)
	}
	return testUID
}

// strangerBinary is a copy of the stagefs binary that the test user may
// execute (the build dir is private to root).
func strangerBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "stagefs-peer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "stagefs")
	// cp writes the copy, not this process: a file this process held
	// open for writing would be inherited by every child the parallel
	// tests fork meanwhile, and exec of it would fail with ETXTBSY until
	// they exec too.
	if out, err := exec.Command("cp", stagefsBin, bin).CombinedOutput(); err != nil {
		t.Fatalf("cp %s: %v: %s", stagefsBin, err, out)
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// runAs runs a command as uid (its own group too), with no home.
func runAs(t *testing.T, uid int, name string, args ...string) result {
	t.Helper()
	return runIn(t, cmdSpec{uid: uid, env: []string{"HOME=/nonexistent", "XDG_STATE_HOME="}}, name, args...)
}

// openToOthers makes dir and its ancestors searchable by every user.
func openToOthers(t *testing.T, dir string) {
	t.Helper()
	for ; dir != "/" && dir != os.TempDir(); dir = filepath.Dir(dir) {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// A user other than the daemon's and root's cannot use the control
// socket: the file modes stop it first, and SO_PEERCRED stops it when the
// modes were loosened by mistake.
func TestControlSocketRefusesOtherUsers(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a\n"}))
	sh(t, m.mnt, "echo staged > a.txt")

	for path, want := range map[string]os.FileMode{m.state: 0o700, m.sock: 0o600} {
		st, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Mode().Perm(); got != want {
			t.Errorf("%s has mode %o, want %o", path, got, want)
		}
	}

	uid := testUser(t)
	bin := strangerBinary(t)
	r := runAs(t, uid, bin, "status", "--json", "--socket", m.sock)
	if r.code == 0 {
		t.Fatalf("uid %d read the status through a 0600 socket in a 0700 dir: %s", uid, r)
	}
	if !strings.Contains(r.stderr, "permission denied") {
		t.Errorf("uid %d: want a permission error, got %s", uid, r)
	}

	// Loosen the modes as a careless host might: the daemon itself
	// still refuses the peer by its uid.
	openToOthers(t, m.state)
	if err := os.Chmod(m.sock, 0o666); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"status", "--json"},
		{"commit", "--json"},
		{"discard", "--json"},
		{"mode", "immediate"},
	} {
		r := runAs(t, uid, bin, append(args, "--socket", m.sock)...)
		if r.code == 0 {
			t.Errorf("uid %d ran %v: %s", uid, args, r)
		}
		if !strings.Contains(r.stderr, "not allowed") {
			t.Errorf("uid %d ran %v: want a refusal naming the uid, got %s", uid, args, r)
		}
	}
	if !strings.Contains(m.daemonLog(), strconv.Itoa(uid)) {
		t.Errorf("the daemon log does not record the refused uid:\n%s", m.daemonLog())
	}
	// Nothing the stranger asked for happened.
	assertFile(t, m.inWS("a.txt"), "a\n")
	assertFile(t, m.in("a.txt"), "staged\n")
	if st := m.status(); st.PendingCount != 1 || st.Mode != "staged" {
		t.Errorf("after the refused requests: %+v", st)
	}
}

// From inside the mount nothing leads to the state dir when it lives in
// the workspace: not its name, not `..` walks, not /proc/self/cwd, not a
// symlink, not a hard link.
func TestStateDirUnreachableFromMount(t *testing.T) {
	parallel(t)
	const hidden = ".stagefs-state"
	m := mountStagefs(t,
		withFiles(map[string]string{"a.txt": "a\n", "sub/b.txt": "b\n"}),
		withSymlink("to-state", hidden),
		withSymlink("sub/up-state", "../"+hidden+"/journal.log"),
		withStateRel("ws/"+hidden))
	before := snapshot(t, m.ws, hidden)

	unreachable := []string{
		hidden,
		hidden + "/journal.log",
		hidden + "/control.sock",
		"sub/../" + hidden + "/journal.log",
		"./sub/.././" + hidden,
		"to-state/journal.log",
		"sub/up-state",
	}
	for _, rel := range unreachable {
		if _, err := os.Stat(m.in(rel)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stat mnt/%s: %v, want ENOENT", rel, err)
		}
		if _, err := os.ReadFile(m.in(rel)); err == nil {
			t.Errorf("read mnt/%s succeeded", rel)
		}
		if err := os.WriteFile(m.in(rel), []byte("x"), 0o644); err == nil {
			t.Errorf("write mnt/%s succeeded", rel)
		}
	}
	// A process whose working directory is in the mount, through
	// /proc/self/cwd and relative walks.
	script := `for p in /proc/self/cwd/` + hidden + `/journal.log ../` + filepath.Base(m.mnt) + `/` + hidden + ` ./` + hidden + `/control.sock /proc/self/cwd/../sub/../` + hidden + `; do
	  if cat "$p" >/dev/null 2>&1 || ls "$p" >/dev/null 2>&1; then echo "REACHED $p"; fi
	done
	echo x > /proc/self/cwd/` + hidden + `/journal.log 2>/dev/null && echo "WROTE journal"
	ln /proc/self/cwd/a.txt /proc/self/cwd/` + hidden + `/stolen 2>/dev/null && echo "LINKED into state"
	ln /proc/self/cwd/` + hidden + `/journal.log stolen 2>/dev/null && echo "LINKED out of state"
	mv a.txt ` + hidden + ` 2>/dev/null && echo "RENAMED onto state"
	ln -s ` + hidden + `/journal.log j && cat j >/dev/null 2>&1 && echo "FOLLOWED new symlink"
	true`
	if out := sh(t, m.in("sub"), "cd .. && "+script); strings.TrimSpace(out) != "" {
		t.Errorf("from inside the mount:\n%s", out)
	}
	if out := sh(t, m.mnt, "find . -name '*journal*' -o -name '*.sock' -o -name '"+hidden+"'"); strings.TrimSpace(out) != "" {
		t.Errorf("find in the mount sees the state dir:\n%s", out)
	}
	// The state dir is intact and the workspace is untouched until a
	// commit; the symlink the script made is staged, pointing nowhere.
	if _, err := m.dial().Initialize(context.Background()); err != nil {
		t.Errorf("control socket after the attempts: %v", err)
	}
	if r := m.cli("log", "--json"); r.code != 0 {
		t.Errorf("the journal after the attempts: %s", r)
	}
	assertSameTree(t, "the workspace", before, snapshot(t, m.ws, hidden))
	if _, err := os.Stat(filepath.Join(m.state, "stolen")); err == nil {
		t.Errorf("a file appeared in the state dir")
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && m.status().PendingCount == 0 {
		time.Sleep(50 * time.Millisecond)
	}
	if kinds := statusKinds(m.status()); kinds["j"] != "symlink" || len(kinds) != 1 {
		t.Errorf("pending after the attempts = %v, want only the symlink j", kinds)
	}
}

// A user other than root mounts through fusermount3: when /dev/fuse is not
// open to it, the mount says what to change; when it is, the mount works
// and the workspace stays untouched.
func TestNonRootMount(t *testing.T) {
	parallel(t)
	requireFUSE(t)
	requireTool(t, "fusermount3")
	uid := testUser(t)
	bin := strangerBinary(t)
	base := shortTempDir(t)
	openToOthers(t, base)
	ws, mnt, state := filepath.Join(base, "ws"), filepath.Join(base, "mnt"), filepath.Join(base, "st")
	writeTree(t, ws, map[string]string{"a.txt": "a\n"})
	for _, d := range []string{ws, mnt, state, filepath.Join(ws, "a.txt")} {
		os.MkdirAll(d, 0o755)
		if err := os.Chown(d, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if isMounted(mnt) {
			t.Errorf("%s left mounted", mnt)
			forceUnmount(mnt)
		}
	})
	mount := func() result { return runAs(t, uid, bin, "mount", ws, mnt, "--state", state) }

	st, err := os.Stat("/dev/fuse")
	if err != nil {
		t.Fatal(err)
	}
	if mode := st.Mode().Perm(); mode&0o006 != 0o006 {
		r := mount()
		if r.code == 0 || isMounted(mnt) {
			t.Fatalf("mount as uid %d with /dev/fuse %04o succeeded: %s", uid, mode, r)
		}
		if !strings.Contains(r.stderr, "chmod 0666 /dev/fuse") {
			t.Errorf("mount as uid %d with /dev/fuse %04o: the error does not say what to change: %s", uid, mode, r)
		}
		// Open the device to others for the rest of the test, as
		// distributions ship it.
		if err := os.Chmod("/dev/fuse", 0o666); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod("/dev/fuse", mode) })
	}

	if r := mount(); r.code != 0 {
		t.Fatalf("mount as uid %d: %s", uid, r)
	}
	if !isMounted(mnt) {
		t.Fatalf("mount as uid %d returned 0 but %s is not mounted", uid, mnt)
	}
	script := "echo staged > " + mnt + "/a.txt && cat " + mnt + "/a.txt && " + bin + " status --json -m " + mnt
	r := runAs(t, uid, "sh", "-c", script)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "staged\n") || !strings.Contains(r.stdout, `"pendingCount": 1,`) {
		t.Errorf("writing through the mount as uid %d: %s", uid, r)
	}
	assertFile(t, filepath.Join(ws, "a.txt"), "a\n")
	if r := runAs(t, uid, bin, "unmount", mnt); r.code != 0 {
		t.Errorf("unmount as uid %d: %s", uid, r)
	}
	if isMounted(mnt) {
		t.Errorf("%s still mounted after stagefs unmount", mnt)
	}
	if fi, err := os.Stat(filepath.Join(state, "upper", "a.txt")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(uid) {
		t.Errorf("the staged copy in the state dir: %v (want it owned by uid %d)", err, uid)
	}
}
