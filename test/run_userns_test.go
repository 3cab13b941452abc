package test

// stagefs run as a user other than root, which takes the user-namespace
// path of cmd/stagefs/run.go, and stagefs run where no namespace can be
// made at all.

import (
	"bufio"
	"encoding/json"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"stagefs/control"
)

// userMount is a stagefs mount made by testUserName, whose daemon lives in
// a mount namespace of its own (see startUserMount).
type userMount struct {
	*stagefsMount
	uid, gid string // of testUserName
}

// startUserMount has testUserName mount a new workspace holding files,
// through fusermount3 as any user mounts.
//
// /dev/fuse is 0600 on some machines, this one among them. Rather than
// open it to every user for a while (TestNonRootMount does, and two tests
// changing its mode at once could leave it open), the mount is made in a
// private mount namespace in which /dev/fuse is a 0666 node for the same
// device. The daemon keeps that namespace alive; each step enters it with
// nsenter, and cleanup unmounts there, or kills the daemon, which ends the
// namespace and its mounts with it.
func startUserMount(t *testing.T, files map[string]string) *userMount {
	t.Helper()
	requireFUSE(t)
	for _, tool := range []string{"fusermount3", "unshare", "nsenter", "setpriv", "mknod"} {
		requireTool(t, tool)
	}
	uid := testUser(t)
	acct, err := user.Lookup(testUserName)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat("/dev/fuse")
	if err != nil {
		t.Fatal(err)
	}
	rdev := uint64(st.Sys().(*syscall.Stat_t).Rdev)

	base := shortTempDir(t)
	openToOthers(t, base)
	u := &userMount{
		stagefsMount: &stagefsMount{
			t:     t,
			base:  base,
			ws:    filepath.Join(base, "ws"),
			mnt:   filepath.Join(base, "mnt"),
			state: filepath.Join(base, "st"),
			bin:   strangerBinary(t),
		},
		uid: strconv.Itoa(uid),
		gid: acct.Gid,
	}
	u.sock = filepath.Join(u.state, "control.sock")
	for _, d := range []string{u.ws, u.mnt, u.state} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeTree(t, u.ws, files)
	gid, _ := strconv.Atoi(acct.Gid)
	for _, d := range []string{u.ws, u.mnt, u.state} {
		err := filepath.WalkDir(d, func(p string, _ os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, uid, gid)
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	devDir := filepath.Join(base, "dev")
	if err := os.Mkdir(devDir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := `set -e
mount -t tmpfs -o mode=0755,size=4k stagefs-test-dev "$1"
mknod -m 0666 "$1/fuse" c "$2" "$3"
mount --bind "$1/fuse" /dev/fuse
shift 3
exec setpriv --reuid="$1" --regid="$2" --clear-groups -- "$3" mount "$4" "$5" --state "$6"`
	r := runIn(t, cmdSpec{env: testUserEnv()}, "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh",
		devDir, strconv.FormatUint(uint64(unix.Major(rdev)), 10), strconv.FormatUint(uint64(unix.Minor(rdev)), 10),
		u.uid, u.gid, u.bin, u.ws, u.mnt, u.state)
	// The daemon is there even if mount failed later on: clean it up.
	u.setPid(readPid(u.state))
	registerMount(u.stagefsMount) // the watchdog kills the daemon if the tests hang
	t.Cleanup(u.cleanup)
	if r.code != 0 {
		t.Fatalf("stagefs mount as uid %s in a private mount namespace: %s\n%s", u.uid, r, u.daemonLog())
	}
	if u.daemonPid() <= 0 || !isMountPointOf(u.daemonPid(), u.mnt) {
		t.Fatalf("stagefs mount as uid %s returned 0 but %s is not mounted in the daemon's namespace (pid %d)", u.uid, u.mnt, u.daemonPid())
	}
	return u
}

// testUserEnv is the environment of testUserName's commands: no home.
func testUserEnv() []string {
	return []string{"HOME=/nonexistent", "XDG_STATE_HOME="}
}

// as runs name ARGS as testUserName in the daemon's mount namespace, from
// dir, with $PWD set to dir as a shell sets it.
func (u *userMount) as(dir, name string, args ...string) result {
	u.t.Helper()
	if dir == "" {
		dir = "/"
	}
	pre := []string{"-t", strconv.Itoa(u.daemonPid()), "-m", "--wd=" + dir, "--",
		"setpriv", "--reuid=" + u.uid, "--regid=" + u.gid, "--clear-groups", "--", name}
	return runIn(u.t, cmdSpec{env: append(testUserEnv(), "PWD="+dir)}, "nsenter", append(pre, args...)...)
}

// run runs `stagefs run -m MNT ARGS...` as testUserName from dir.
func (u *userMount) run(dir string, args ...string) result {
	u.t.Helper()
	return u.as(dir, u.bin, append([]string{"run", "-m", u.mnt}, args...)...)
}

// userStatus is `stagefs status` as testUserName.
func (u *userMount) userStatus() control.StatusResult {
	u.t.Helper()
	r := u.as("", u.bin, "status", "--json", "-m", u.mnt)
	var st control.StatusResult
	if err := json.Unmarshal([]byte(r.stdout), &st); r.code != 0 || err != nil {
		u.t.Fatalf("stagefs status as uid %s: %v\n%s", u.uid, err, r)
	}
	return st
}

// cleanup unmounts as the user in the daemon's namespace and makes sure
// the daemon, and so the namespace, is gone.
func (u *userMount) cleanup() {
	t := u.t
	defer unregisterMount(u.stagefsMount)
	pid := u.daemonPid()
	if pid <= 0 || processGone(pid) {
		return
	}
	if t.Failed() {
		t.Logf("daemon log of %s:\n%s", u.mnt, u.daemonLog())
	}
	if r := u.as("", u.bin, "unmount", u.mnt); r.code != 0 {
		t.Errorf("cleanup: stagefs unmount %s as uid %s: %s", u.mnt, u.uid, r)
	}
	if !waitProcessGone(pid, 15*time.Second) {
		t.Errorf("cleanup: daemon %d of %s still running 15s after unmount; killing it", pid, u.mnt)
		syscall.Kill(pid, syscall.SIGKILL)
		waitProcessGone(pid, 5*time.Second)
	}
}

// isMountPointOf reports whether path is a mount point in the mount
// namespace of process pid.
func isMountPointOf(pid int, path string) bool {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root MOUNTPOINT ...
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && fields[4] == path {
			return true
		}
	}
	return false
}

// As a user other than root, stagefs run takes the user-namespace path:
// the same staged view at the workspace path, the state out of reach, the
// exit status passed on, and a command with no capabilities left.
func TestRunUnprivileged(t *testing.T) {
	parallel(t)
	u := startUserMount(t, map[string]string{"f.txt": "one\n", "sub/g.txt": "g\n"})
	ws := u.ws
	before := snapshot(t, ws)

	// pwd, realpath and $PWD say the workspace, and the command runs as
	// the caller.
	for _, dir := range []string{"/", ws, u.mnt} {
		r := u.run(dir, "--", "sh", "-c", `pwd; realpath .; echo "$PWD"; id -u`)
		if want := strings.Repeat(ws+"\n", 3) + u.uid + "\n"; r.code != 0 || r.stdout != want {
			t.Errorf("run from %s as uid %s: want pwd, realpath ., $PWD and id -u = %q, got %s", dir, u.uid, want, r)
		}
	}

	// Writes and deletes through the workspace path are staged; the real
	// workspace is unchanged.
	r := u.run(ws, "--scope", "tc1", "--", "sh", "-c", `echo two >> f.txt && echo new > new.txt && mkdir sub/d && echo e > sub/d/e.txt && rm sub/g.txt`)
	if r.code != 0 || !strings.Contains(r.stderr, "tc1 touched 5 path(s)") {
		t.Fatalf("a tool call as uid %s: %s", u.uid, r)
	}
	kinds := statusKinds(u.userStatus())
	if kinds["f.txt"] != "write" || kinds["new.txt"] != "create" || kinds["sub/d/e.txt"] != "create" || kinds["sub/g.txt"] != "delete" || len(kinds) != 5 {
		t.Errorf("pending after the tool call: %v", kinds)
	}
	if r := u.run(ws, "--", "cat", "f.txt", ws+"/new.txt", "sub/d/e.txt"); r.code != 0 || r.stdout != "one\ntwo\nnew\ne\n" {
		t.Errorf("the staged content inside run: %s", r)
	}
	assertSameTree(t, "the real workspace after the tool call", before, snapshot(t, ws))
	if isMountPointOf(u.daemonPid(), ws) {
		t.Errorf("%s is a mount point in the daemon's namespace: run's mounts leaked out", ws)
	}

	// The command keeps no capability: not even in its user namespace,
	// where it could otherwise unmount the staged view or the tmpfs over
	// the state dir.
	r = u.run(ws, "--", "grep", "-E", "^Cap(Inh|Prm|Eff|Amb):", "/proc/self/status")
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if f := strings.Fields(line); len(f) != 2 || strings.Trim(f[1], "0") != "" {
			t.Errorf("the command has capabilities: %q", line)
		}
	}
	if r.code != 0 || strings.Count(r.stdout, "\n") != 4 {
		t.Errorf("capabilities of the command: %s", r)
	}

	// The state dir and the socket cannot be reached by path, nor through
	// /proc/PID/root of run or the daemon, nor can run's working directory
	// (the real workspace) through /proc/PID/cwd: the kernel does not let
	// a process in a user namespace look into processes outside it.
	daemon := strconv.Itoa(u.daemonPid())
	probe := `S=$1 D=$2 B=$3
stat "$S/control.sock" >/dev/null 2>&1 && echo SOCKET-REACHABLE
stat "$S/journal.log" >/dev/null 2>&1 && echo JOURNAL-REACHABLE
touch "$S/x" 2>/dev/null && echo STATE-WRITABLE
ls -A "$S"
ls /proc/$PPID/cwd/ >/dev/null 2>&1 && echo RUN-CWD-REACHABLE
stat "/proc/$PPID/root$S/control.sock" >/dev/null 2>&1 && echo SOCKET-REACHABLE-THROUGH-RUN
stat "/proc/$D/root$S/control.sock" >/dev/null 2>&1 && echo SOCKET-REACHABLE-THROUGH-DAEMON
"$B" status --socket "/proc/$D/root$S/control.sock" >/dev/null 2>&1 && echo DAEMON-ANSWERS
ls -A`
	if r := u.run(ws, "--", "sh", "-c", probe, "sh", u.state, daemon, u.bin); r.code != 0 || r.stdout != "f.txt\nnew.txt\nsub\n" {
		t.Errorf("probing the state from inside run: want only the staged listing f.txt new.txt sub, got %s", r)
	}
	// The same user outside run can: the probes above were not vacuous.
	if r := u.as(ws, "stat", "/proc/"+daemon+"/root"+u.sock); r.code != 0 {
		t.Errorf("uid %s outside run cannot stat the socket through /proc/%s/root either: %s", u.uid, daemon, r)
	}
	if r := u.run(ws, "--", u.bin, "status", "--socket", u.sock); r.code != 4 {
		t.Errorf("stagefs status --socket STATE/control.sock inside run: want exit 4 (no daemon), got %s", r)
	}

	// The exit status passes through.
	for _, tc := range []struct {
		script string
		code   int
	}{
		{"exit 5", 5},
		{"kill -TERM $$", 128 + int(syscall.SIGTERM)},
	} {
		if r := u.run("", "--", "sh", "-c", tc.script); r.code != tc.code {
			t.Errorf("%q as uid %s: want exit %d, got %s", tc.script, u.uid, tc.code, r)
		}
	}
	if r := u.run("", "--", "no-such-command-here"); r.code != 127 {
		t.Errorf("a missing command as uid %s: want exit 127, got %s", u.uid, r)
	}

	// Restoring the tool call undoes it.
	if r := u.as("", u.bin, "restore", "-m", u.mnt, "tc1"); r.code != 0 {
		t.Fatalf("stagefs restore tc1 as uid %s: %s", u.uid, r)
	}
	if st := u.userStatus(); st.PendingCount != 0 {
		t.Errorf("pending after restoring tc1: %v", statusKinds(st))
	}
	assertSameTree(t, "the real workspace at the end", before, snapshot(t, ws))
}

// Where neither namespace can be made, run says what is missing and starts
// nothing. Provoked without touching the machine: root gives up
// CAP_SYS_ADMIN (so no plain mount namespace) inside a user namespace of
// its own whose user.max_user_namespaces is 0 (so no nested user
// namespace); the sysctl is per user namespace, and that one ends with the
// command.
func TestRunWithoutNamespaces(t *testing.T) {
	parallel(t)
	requireTool(t, "unshare")
	requireTool(t, "setpriv")
	if os.Geteuid() != 0 {
		t.Skip("needs root to map uid 0 in a user namespace and reach root's daemon")
	}
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}))
	limit, err := os.ReadFile("/proc/sys/user/max_user_namespaces")
	if err != nil {
		t.Skipf("no user namespaces here: %v", err)
	}
	script := `echo 0 > /proc/sys/user/max_user_namespaces || exit 99
exec setpriv --bounding-set=-sys_admin --inh-caps=-sys_admin -- "$@"`
	r := runIn(t, cmdSpec{dir: m.ws}, "unshare", "--user", "--map-root-user", "--", "sh", "-c", script, "sh",
		stagefsBin, "run", "-m", m.mnt, "--scope", "tc1", "--", "touch", "new.txt")
	if r.code == 99 || (r.code != 0 && strings.Contains(r.stderr, "unshare failed")) {
		t.Skipf("cannot make a user namespace with its own limit here: %s", r)
	}
	for _, want := range []string{"cannot create a private mount namespace", "no CAP_SYS_ADMIN",
		"user.max_user_namespaces is 0 or reached", "kernel.unprivileged_userns_clone=1"} {
		if r.code != 1 || !strings.Contains(r.stderr, want) {
			t.Errorf("run without namespaces: want exit 1 and a message with %q, got %s", want, r)
		}
	}
	assertMissing(t, m.in("new.txt"))
	if st := m.status(); st.PendingCount != 0 {
		t.Errorf("pending after a run that could not start: %v", statusKinds(st))
	}
	// The snapshot opened for the tool call is dropped, not left open.
	if out := m.mustCLI("snapshots"); strings.Contains(out, "tc1") {
		t.Errorf("the snapshot of a run that could not start is still there:\n%s", out)
	}
	if now, _ := os.ReadFile("/proc/sys/user/max_user_namespaces"); string(now) != string(limit) {
		t.Errorf("user.max_user_namespaces of the machine changed from %q to %q", limit, now)
	}
}
