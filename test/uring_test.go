package test

import (
	"bytes"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// FUSE over io_uring (--fuse-transport io_uring, package fuseuring).

// requireURing skips t where the kernel cannot carry FUSE over io_uring:
// not root, or no enable_uring parameter (Linux before 6.14, or built
// without CONFIG_FUSE_IO_URING).
func requireURing(t *testing.T) {
	t.Helper()
	requireFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("FUSE over io_uring: the daemon turns it on as root only")
	}
	if _, err := os.Stat("/sys/module/fuse/parameters/enable_uring"); err != nil {
		t.Skip("FUSE over io_uring: this kernel has no enable_uring parameter")
	}
}

// uringAnswered is the number of requests the daemon's log says its rings
// answered, from the line it writes at unmount; -1 when it wrote none.
func uringAnswered(t *testing.T, m *stagefsMount) int {
	t.Helper()
	re := regexp.MustCompile(`FUSE transport at unmount: io_uring, \d+ entries \((\d+) requests answered\)`)
	match := re.FindStringSubmatch(m.daemonLog())
	if match == nil {
		return -1
	}
	n, _ := strconv.Atoi(match[1])
	return n
}

// TestIOURingTransportWithRealTools runs real tools through a mount served
// over io_uring, with passthrough off so reads and writes travel through
// the rings' payload buffers too, and checks the view, the untouched
// workspace, a commit, and that the rings answered the requests.
func TestIOURingTransportWithRealTools(t *testing.T) {
	parallel(t)
	requireURing(t)
	git := requireTool(t, "git")
	files := map[string]string{"main.go": "package main\n\nfunc main() { println(\"old\") }\n", "dir/keep.txt": "keep\n"}
	m := mountStagefs(t, withFiles(files), withMountFlags("--fuse-transport", "io_uring", "--no-passthrough"))
	if log := m.daemonLog(); !strings.Contains(log, "FUSE transport: io_uring, ") {
		t.Fatalf("the daemon did not serve over io_uring on a kernel that has it:\n%s", log)
	}

	// A file larger than one payload buffer (128 KiB), written and read
	// back by real tools.
	big := make([]byte, 3<<20+17)
	rand.Read(big)
	src := filepath.Join(m.base, "big.bin")
	if err := os.WriteFile(src, big, 0o644); err != nil {
		t.Fatal(err)
	}
	sh(t, m.mnt, "cp "+src+" big.bin && cmp big.bin "+src)
	sh(t, m.mnt, `sed -i 's/old/new/' main.go
mkdir -p many && cd many && for i in $(seq 1 600); do echo "$i" > "file-$i.txt"; done && cd ..
test "$(ls many | wc -l)" = 600
ln -s main.go link.go && test "$(readlink link.go)" = main.go
setfattr -n user.note -v "a value" main.go && test "$(getfattr --only-values -n user.note main.go)" = "a value"
mv dir/keep.txt dir/kept.txt && rm -rf many/file-1*.txt`)
	mustRun(t, cmdSpec{dir: m.mnt}, git, "init", "-q")
	mustRun(t, cmdSpec{dir: m.mnt}, git, "add", "-A")
	mustRun(t, cmdSpec{dir: m.mnt}, git, "commit", "-qm", "over io_uring")
	if out := mustRun(t, cmdSpec{dir: m.mnt}, git, "log", "--format=%s"); strings.TrimSpace(out) != "over io_uring" {
		t.Errorf("git log in the view: %q", out)
	}
	if got, err := os.ReadFile(filepath.Join(m.mnt, "big.bin")); err != nil || !bytes.Equal(got, big) {
		t.Errorf("big.bin read back through the rings differs (err %v, %d bytes)", err, len(got))
	}
	if n := len(mustReadDir(t, filepath.Join(m.mnt, "many"))); n != 600-111 {
		t.Errorf("many/ has %d entries, want %d", n, 600-111)
	}

	// The workspace is untouched until the commit.
	for p, want := range files {
		if got, err := os.ReadFile(filepath.Join(m.ws, p)); err != nil || string(got) != want {
			t.Errorf("workspace %s changed before commit: %q, %v", p, got, err)
		}
	}
	for _, p := range []string{"big.bin", "many", ".git", "link.go"} {
		if _, err := os.Lstat(filepath.Join(m.ws, p)); !os.IsNotExist(err) {
			t.Errorf("workspace has %s before commit (%v)", p, err)
		}
	}
	m.mustCLI("commit")
	if got, _ := os.ReadFile(filepath.Join(m.ws, "main.go")); !strings.Contains(string(got), "new") {
		t.Errorf("workspace main.go after commit: %q", got)
	}
	if got, err := os.ReadFile(filepath.Join(m.ws, "big.bin")); err != nil || !bytes.Equal(got, big) {
		t.Errorf("workspace big.bin after commit differs (err %v)", err)
	}
	m.unmount()
	n := uringAnswered(t, m)
	t.Logf("the rings answered %d requests", n)
	if n < 1000 {
		t.Errorf("the rings answered %d requests (want the bulk of this run's):\n%s", n, m.daemonLog())
	}
}

func mustReadDir(t *testing.T, dir string) []os.DirEntry {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

// TestIOURingDaemonKilledMidRequests kills the daemon while a shell keeps
// its rings busy: the shell must see the mount die instead of hanging,
// and mounting again must serve the same pending set.
func TestIOURingDaemonKilledMidRequests(t *testing.T) {
	parallel(t)
	requireURing(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a\n"}), withMountFlags("--fuse-transport", "io_uring"))
	if err := os.WriteFile(m.in("pending.txt"), []byte("pending\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	busy := exec.Command("sh", "-c", `i=0; while :; do i=$((i+1)); echo $i > f$((i % 40)) && stat f$((i % 40)) >/dev/null || exit 0; done`)
	busy.Dir = m.mnt
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- busy.Wait() }()
	time.Sleep(300 * time.Millisecond)
	pid := readPid(m.state)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !waitProcessGone(pid, 10*time.Second) {
		t.Fatalf("daemon %d survived SIGKILL", pid)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		busy.Process.Kill()
		t.Fatal("a shell working in the mount hung after its io_uring daemon was killed")
	}
	if _, err := os.Stat(filepath.Join(m.ws, "pending.txt")); !os.IsNotExist(err) {
		t.Errorf("the workspace has pending.txt before any commit (%v)", err)
	}
	r := runStagefs(t, "mount", m.ws, m.mnt, "--state", m.state, "--fuse-transport", "io_uring")
	if r.code != 0 {
		t.Fatalf("stagefs mount after the kill: %s", r)
	}
	m.setPid(readPid(m.state))
	registerMount(m)
	assertFile(t, m.in("pending.txt"), "pending\n")
	m.commit()
	assertFile(t, m.inWS("pending.txt"), "pending\n")
}

// TestFUSETransportChoice: io_uring is the default where the kernel has
// it, --fuse-transport dev keeps /dev/fuse, and anything else is refused.
func TestFUSETransportChoice(t *testing.T) {
	parallel(t)
	requireURing(t)
	def := mountStagefs(t, withDaemonEnv("STAGEFS_FUSE_TRANSPORT="))
	if log := def.daemonLog(); !strings.Contains(log, "FUSE transport: io_uring, ") {
		t.Errorf("the default mount is not served over io_uring:\n%s", log)
	}
	dev := mountStagefs(t, withMountFlags("--fuse-transport", "dev"))
	if log := dev.daemonLog(); !strings.Contains(log, "FUSE transport: /dev/fuse\n") {
		t.Errorf("--fuse-transport dev is not served over /dev/fuse:\n%s", log)
	}
	for _, m := range []*stagefsMount{def, dev} {
		sh(t, m.mnt, "echo x > new.txt && mkdir d && mv new.txt d/ && cat d/new.txt >/dev/null")
		if st := m.status(); len(st.Entries) != 2 {
			t.Errorf("%s: %d pending entries, want d and d/new.txt: %+v", m.mnt, len(st.Entries), st.Entries)
		}
	}
	r := runStagefs(t, "mount", dev.ws, filepath.Join(dev.base, "other"), "--fuse-transport", "pipes")
	if r.code != 2 || !strings.Contains(r.stderr, "--fuse-transport must be dev or io_uring") {
		t.Errorf("mount --fuse-transport pipes: %s", r)
	}
}

// TestFUSETransportFallsBack turns io_uring off for the whole machine
// (kernel.io_uring_disabled=2) while a mount is made: the daemon must
// serve over /dev/fuse and say why. Not parallel: the setting is global,
// and it is put back before the parallel tests run.
func TestFUSETransportFallsBack(t *testing.T) {
	requireURing(t)
	const knob = "/proc/sys/kernel/io_uring_disabled"
	old, err := os.ReadFile(knob)
	if err != nil {
		t.Skipf("no %s: %v", knob, err)
	}
	if err := os.WriteFile(knob, []byte("2"), 0); err != nil {
		t.Skipf("cannot turn io_uring off: %v", err)
	}
	t.Cleanup(func() { os.WriteFile(knob, old, 0) }) // should the mount fail
	m := mountStagefs(t, withDaemonEnv("STAGEFS_FUSE_TRANSPORT="))
	if err := os.WriteFile(knob, old, 0); err != nil {
		t.Fatalf("putting %s back: %v", knob, err)
	}
	if log := m.daemonLog(); !strings.Contains(log, "FUSE transport: /dev/fuse (io_uring: io_uring_setup: operation not permitted") {
		t.Errorf("with io_uring disabled the daemon did not fall back to /dev/fuse and say why:\n%s", log)
	}
	sh(t, m.mnt, "echo x > new.txt && test \"$(cat new.txt)\" = x")
	m.commit()
	assertFile(t, m.inWS("new.txt"), "x\n")
}
