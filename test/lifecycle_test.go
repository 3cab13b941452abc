package test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// stagePending makes a known set of pending changes and returns what the
// mount should show for them.
func stagePending(t *testing.T, m *stagefsMount) {
	t.Helper()
	sh(t, m.mnt, "echo changed > a.txt; echo new > new.txt; rm gone.txt; mkdir d; echo in-d > d/f")
}

func checkPending(t *testing.T, m *stagefsMount, what string) {
	t.Helper()
	assertFile(t, m.in("a.txt"), "changed\n")
	assertFile(t, m.in("new.txt"), "new\n")
	assertFile(t, m.in("d/f"), "in-d\n")
	assertMissing(t, m.in("gone.txt"))
	k := statusKinds(m.status())
	if k["a.txt"] != "write" || k["new.txt"] != "create" || k["gone.txt"] != "delete" || k["d"] != "mkdir" {
		t.Errorf("%s: status = %v", what, k)
	}
}

var lifecycleFiles = map[string]string{"a.txt": "a\n", "gone.txt": "g\n"}

func TestUnmountKeepsPendingSet(t *testing.T) {
	m := mountStagefs(t, withFiles(lifecycleFiles))
	before := snapshot(t, m.ws)
	stagePending(t, m)
	checkPending(t, m, "before unmount")

	m.unmount()
	if _, err := os.Stat(m.sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control socket still there after unmount: %v", err)
	}
	// No daemon: clients say so with exit code 4.
	if r := runStagefs(t, "status", "--socket", m.sock); r.code != 4 {
		t.Errorf("status without a daemon: exit %d, want 4\n%s", r.code, r)
	}
	if r := m.cli("status"); r.code != 4 {
		t.Errorf("status -m on an unmounted dir: exit %d, want 4\n%s", r.code, r)
	}
	// The mount point is an empty dir again; the workspace is untouched.
	if ents, err := os.ReadDir(m.mnt); err != nil || len(ents) != 0 {
		t.Errorf("mount point after unmount: %v entries, %v", len(ents), err)
	}
	assertSameTree(t, "workspace after unmount", before, snapshot(t, m.ws))

	m.mount()
	checkPending(t, m, "after remount")
	assertSameTree(t, "workspace after remount", before, snapshot(t, m.ws))
	m.commit()
	assertFile(t, m.inWS("a.txt"), "changed\n")
	assertMissing(t, m.inWS("gone.txt"))
}

func TestMountRefusals(t *testing.T) {
	m := mountStagefs(t, withFiles(lifecycleFiles))

	// A second daemon on the same state dir.
	mnt2 := filepath.Join(m.base, "mnt2")
	os.Mkdir(mnt2, 0o755)
	r := runStagefs(t, "mount", m.ws, mnt2, "--state", m.state)
	if r.code == 0 {
		t.Errorf("second mount on the same state dir succeeded: %s", r)
		runStagefs(t, "unmount", mnt2)
	}
	if !strings.Contains(r.stderr, "state dir") || !strings.Contains(r.stderr, "another stagefs daemon") {
		t.Errorf("second mount: unclear message: %q", r.stderr)
	}
	if isMounted(mnt2) {
		t.Errorf("%s mounted by the refused mount", mnt2)
		forceUnmount(mnt2)
	}

	// The same mount point again, with another state dir.
	r = runStagefs(t, "mount", m.ws, m.mnt, "--state", filepath.Join(m.base, "st2"))
	if r.code == 0 {
		t.Errorf("mounting over a live stagefs mount succeeded: %s", r)
	} else if !strings.Contains(r.stderr, "already a mount point") {
		t.Errorf("mount over a live mount: unclear message: %q", r.stderr)
	}

	// A mount point inside the workspace.
	inside := m.inWS("sub")
	os.Mkdir(inside, 0o755)
	r = runStagefs(t, "mount", m.ws, inside, "--state", filepath.Join(m.base, "st3"))
	if r.code == 0 {
		t.Errorf("mount point inside the workspace accepted: %s", r)
		runStagefs(t, "unmount", inside)
	} else if !strings.Contains(r.stderr, "inside the workspace") {
		t.Errorf("mount point inside the workspace: unclear message: %q", r.stderr)
	}
	if isMounted(inside) {
		t.Errorf("%s got mounted", inside)
		forceUnmount(inside)
	}

	// The state dir inside the mount point.
	mnt4 := filepath.Join(m.base, "mnt4")
	os.Mkdir(mnt4, 0o755)
	r = runStagefs(t, "mount", m.ws, mnt4, "--state", filepath.Join(mnt4, "st"))
	if r.code == 0 {
		t.Errorf("state dir inside the mount point accepted: %s", r)
		runStagefs(t, "unmount", mnt4)
	}

	// Usage errors exit 2.
	if r := runStagefs(t, "mount", m.ws); r.code != 2 {
		t.Errorf("mount with one argument: exit %d, want 2", r.code)
	}
	if r := runStagefs(t, "frobnicate"); r.code != 2 {
		t.Errorf("unknown command: exit %d, want 2", r.code)
	}
	if r := m.cli("status", "--no-such-flag"); r.code != 2 {
		t.Errorf("unknown flag: exit %d, want 2", r.code)
	}

	// The first mount is unharmed.
	if err := os.WriteFile(m.in("x"), []byte("x\n"), 0o644); err != nil {
		t.Errorf("first mount after the refusals: %v", err)
	}
	if k := statusKinds(m.status()); k["x"] != "create" {
		t.Errorf("status after the refusals: %v", k)
	}
}

func TestUnmountBusyThenLazy(t *testing.T) {
	m := mountStagefs(t, withFiles(lifecycleFiles))

	// A process holding a file of the mount open.
	ctx, cancel := context.WithTimeout(context.Background(), 2*cmdTimeout)
	defer cancel()
	holder := exec.CommandContext(ctx, "sh", "-c", "exec 3<a.txt; echo ready; exec sleep 600")
	holder.Dir = m.mnt
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	// Registered after the mount's cleanup, so it runs first.
	t.Cleanup(func() {
		holder.Process.Kill()
		holder.Wait()
	})
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("holder did not start: %q", line)
	}

	r := runStagefs(t, "unmount", m.mnt)
	if r.code == 0 {
		t.Fatalf("unmount with an open file succeeded: %s", r)
	}
	if !strings.Contains(r.stderr, "--lazy") || !strings.Contains(r.stderr, "busy") {
		t.Errorf("busy unmount message does not mention --lazy: %q", r.stderr)
	}
	if !isMounted(m.mnt) {
		t.Fatalf("refused unmount unmounted anyway")
	}
	assertFile(t, m.in("a.txt"), "a\n")

	r = runStagefs(t, "unmount", "--lazy", m.mnt)
	if r.code != 0 {
		t.Fatalf("unmount --lazy: %s", r)
	}
	if isMounted(m.mnt) {
		t.Errorf("%s still in mountinfo after unmount --lazy", m.mnt)
	}
	// The holder can still read its file; the daemon serves it.
	if out := mustRun(t, cmdSpec{}, "cat", "/proc/"+strconv.Itoa(holder.Process.Pid)+"/fd/3"); out != "a\n" {
		t.Errorf("holder's open file after lazy unmount reads %q", out)
	}
	// Once the holder is gone, the daemon exits.
	holder.Process.Kill()
	holder.Wait()
	if pid := m.daemonPid(); pid > 0 && !waitProcessGone(pid, 15*time.Second) {
		t.Errorf("daemon %d still running after the last holder of the lazily unmounted mount exited", pid)
	}
	// And the state dir can be mounted again.
	m.mount()
	assertFile(t, m.in("a.txt"), "a\n")
}

func TestDaemonKilledThenRecover(t *testing.T) {
	m := mountStagefs(t, withFiles(lifecycleFiles))
	before := snapshot(t, m.ws)
	stagePending(t, m)

	pid := readPid(m.state)
	if pid <= 0 {
		t.Fatalf("no daemon pid in %s/pid", m.state)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !waitProcessGone(pid, 10*time.Second) {
		t.Fatalf("daemon %d survived SIGKILL", pid)
	}
	// The mount is dead: every request that reaches the (gone) daemon
	// fails with ENOTCONN. (A plain stat of the mount point may still be
	// answered from the kernel's attribute cache for --cache-timeout, so
	// statfs, readdir and open are what is checked. ECONNABORTED is what
	// the kernel answers for a request that was in flight at the abort.)
	dead := func(err error) bool {
		return errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED)
	}
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(m.mnt, &sfs); !dead(err) {
		t.Errorf("statfs of the dead mount: %v, want ENOTCONN", err)
	}
	if _, err := os.ReadDir(m.mnt); !dead(err) {
		t.Errorf("readdir of the dead mount: %v, want ENOTCONN", err)
	}
	if _, err := os.ReadFile(m.in("a.txt")); !dead(err) {
		t.Errorf("read in the dead mount: %v, want ENOTCONN", err)
	}
	// The clients report that no daemon answers.
	if r := m.cli("status"); r.code != 4 {
		t.Errorf("status against a killed daemon: exit %d, want 4\n%s", r.code, r)
	}
	assertSameTree(t, "workspace after the daemon was killed", before, snapshot(t, m.ws))

	// Mounting again on the same mount point and state recovers, at once:
	// a script restarting a crashed daemon does not wait for the kernel's
	// attribute cache to expire.
	r := runStagefs(t, "mount", m.ws, m.mnt, "--state", m.state)
	if r.code != 0 {
		t.Errorf("stagefs mount right after the daemon was killed: %s", r)
		// Go on after the cache timeout, to test the rest of the recovery.
		time.Sleep(1500 * time.Millisecond)
		m.mount()
	} else {
		m.setPid(readPid(m.state))
		registerMount(m)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(m.mnt, &st); err != nil {
		t.Fatalf("stat after recovery: %v", err)
	}
	checkPending(t, m, "after recovery")
	// Only one mount at the mount point (the dead one was cleared).
	if n := countMounts(m.mnt); n != 1 {
		t.Errorf("%d mounts at %s after recovery, want 1", n, m.mnt)
	}
	assertSameTree(t, "workspace after recovery", before, snapshot(t, m.ws))
	if err := os.WriteFile(m.in("after.txt"), []byte("after\n"), 0o644); err != nil {
		t.Errorf("write after recovery: %v", err)
	}
	m.commit()
	assertFile(t, m.inWS("a.txt"), "changed\n")
	assertFile(t, m.inWS("after.txt"), "after\n")
}

func countMounts(mnt string) int {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && unescapeMountinfo(f[4]) == mnt {
			n++
		}
	}
	return n
}

func TestUnmountDeadMount(t *testing.T) {
	m := mountStagefs(t, withFiles(lifecycleFiles))
	stagePending(t, m)
	pid := readPid(m.state)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !waitProcessGone(pid, 10*time.Second) {
		t.Fatalf("daemon %d survived SIGKILL", pid)
	}
	start := time.Now()
	r := runStagefs(t, "unmount", m.mnt)
	took := time.Since(start)
	if r.code != 0 {
		t.Errorf("stagefs unmount of a dead mount: %s", r)
	}
	if took > 3*time.Second {
		t.Errorf("stagefs unmount of a dead mount took %v (it waits for the dead daemon's socket to go away)", took.Round(time.Millisecond))
	}
	if isMounted(m.mnt) {
		t.Fatalf("%s still mounted", m.mnt)
	}
	// The pending set survives a crash.
	m.mount()
	checkPending(t, m, "after crash, unmount and mount")
}
