// Package test holds stagefs's integration tests: they build the stagefs
// binary once, mount real FUSE overlays in temporary directories and drive
// them with the CLI, the Go control client and ordinary tools.
package test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"stagefs/control"
)

// cmdTimeout bounds every command the tests run, so a hang in the mount
// fails the test instead of blocking CI.
const cmdTimeout = 60 * time.Second

var (
	stagefsBin string // built once by TestMain
	goBin      string // the go command, for the build and the go build test
	haveFUSE   bool
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	_, err := os.Stat("/dev/fuse")
	haveFUSE = err == nil

	goBin = findGo()
	if goBin == "" {
		fmt.Fprintln(os.Stderr, "test: no go command found (PATH, $GOROOT/bin, /usr/local/go/bin)")
		return 1
	}
	dir, err := os.MkdirTemp("", "stagefs-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "test:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	stagefsBin = filepath.Join(dir, "stagefs")
	build := exec.Command(goBin, "build", "-o", stagefsBin, "../cmd/stagefs")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "test: building stagefs:", err)
		return 1
	}

	stop := startWatchdog()
	code := m.Run()
	stop()
	if left := detachAllMounts("after the tests"); left > 0 && code == 0 {
		code = 1
	}
	return code
}

func findGo() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	for _, p := range []string{filepath.Join(os.Getenv("GOROOT"), "bin", "go"), "/usr/local/go/bin/go"} {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	return ""
}

// ---------------------------------------------------------------------------
// Mount registry and watchdog: a test that hangs inside the mount must not
// leave the mount behind when `go test -timeout` kills the binary. Shortly
// before the deadline the watchdog kills every daemon (which aborts the
// hung requests with ENOTCONN) and detaches every mount.

var (
	liveMu     sync.Mutex
	liveMounts = map[string]*stagefsMount{} // by mount point
)

func registerMount(m *stagefsMount) {
	liveMu.Lock()
	liveMounts[m.mnt] = m
	liveMu.Unlock()
}

func unregisterMount(m *stagefsMount) {
	liveMu.Lock()
	delete(liveMounts, m.mnt)
	liveMu.Unlock()
}

// detachAllMounts kills the daemons and lazily unmounts everything still
// registered; it returns how many mounts it found.
func detachAllMounts(why string) int {
	liveMu.Lock()
	ms := make([]*stagefsMount, 0, len(liveMounts))
	for _, m := range liveMounts {
		ms = append(ms, m)
	}
	liveMu.Unlock()
	n := 0
	for _, m := range ms {
		if pid := m.daemonPid(); pid > 0 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if isMounted(m.mnt) {
			n++
			fmt.Fprintf(os.Stderr, "test: %s: %s was still mounted; detaching it\n", why, m.mnt)
			forceUnmount(m.mnt)
		}
	}
	return n
}

func startWatchdog() (stop func()) {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return func() {}
	}
	d, err := time.ParseDuration(f.Value.String())
	if err != nil || d <= 0 {
		return func() {}
	}
	margin := 20 * time.Second
	if d < 2*margin {
		margin = d / 4
	}
	timer := time.AfterFunc(d-margin, func() {
		fmt.Fprintln(os.Stderr, "test: the test timeout is near; killing the stagefs daemons so hung tests fail")
		detachAllMounts("watchdog")
	})
	return func() { timer.Stop() }
}

// ---------------------------------------------------------------------------
// Mount helper.

type stagefsMount struct {
	t        *testing.T
	base     string // holds ws, mnt, st (unless the state dir was moved)
	ws       string
	mnt      string
	state    string
	sock     string
	pidMu    sync.Mutex
	pid      int // daemon pid of the latest mount
	extraEnv []string
	bin      string // the binary that mounts (and so runs the daemon)
}

type mountOption func(*mountConfig)

type mountConfig struct {
	files    map[string]string // workspace files (path -> content); a trailing "/" makes a dir
	modes    map[string]os.FileMode
	symlinks map[string]string // workspace symlinks (path -> target)
	stateRel string            // state dir relative to base (default "st")
	extra    []string          // extra mount flags
	bin      string            // the stagefs binary (default stagefsBin)
	env      []string          // added to the environment of mount (and so the daemon)
}

func withFiles(files map[string]string) mountOption {
	return func(c *mountConfig) {
		for k, v := range files {
			c.files[k] = v
		}
	}
}

func withMode(path string, mode os.FileMode) mountOption {
	return func(c *mountConfig) { c.modes[path] = mode }
}

func withSymlink(path, target string) mountOption {
	return func(c *mountConfig) { c.symlinks[path] = target }
}

// withStateRel puts the state dir at base/rel (e.g. "ws/.stagefs-state").
func withStateRel(rel string) mountOption {
	return func(c *mountConfig) { c.stateRel = rel }
}

// withBinary mounts with another build of stagefs (say, one built with
// the race detector).
func withBinary(bin string) mountOption {
	return func(c *mountConfig) { c.bin = bin }
}

func withMountFlags(flags ...string) mountOption {
	return func(c *mountConfig) { c.extra = append(c.extra, flags...) }
}

// withDaemonEnv adds KEY=VALUE settings to the daemon's environment.
func withDaemonEnv(kv ...string) mountOption {
	return func(c *mountConfig) { c.env = append(c.env, kv...) }
}

// mountSlots caps the tests running in parallel at two mounts at a time,
// whatever -parallel says.
var mountSlots = make(chan struct{}, 2)

// parallel marks t parallel and waits for a mount slot.
func parallel(t *testing.T) {
	t.Helper()
	t.Parallel()
	mountSlots <- struct{}{}
	t.Cleanup(func() { <-mountSlots })
}

func requireFUSE(t testing.TB) {
	t.Helper()
	if !haveFUSE {
		if os.Getenv("STAGEFS_REQUIRE_FUSE") != "" {
			t.Fatal("STAGEFS_REQUIRE_FUSE is set but /dev/fuse is not usable")
		}
		t.Skip("no /dev/fuse")
	}
}

func requireTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil && os.Getenv("STAGEFS_REQUIRE_FUSE") != "" {
		t.Fatalf("%s is not installed; scripts/setup installs it: %v", name, err)
	}
	if err != nil {
		t.Skipf("%s is not installed (CI installs it): %v", name, err)
	}
	return p
}

// shortTempDir is t.TempDir unless that path is too long for the control
// socket (107 bytes), in which case a short one under /tmp is used.
func shortTempDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if real, err := filepath.EvalSymlinks(d); err == nil {
		d = real
	}
	if len(d)+len("/ws/.stagefs-state/control.sock") < 100 {
		return d
	}
	// Under the test run's own temporary directory (scripts/test makes a
	// short one), so that its leftover check knows the mount as its own.
	d, err := os.MkdirTemp("", "sfs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if real, err := filepath.EvalSymlinks(d); err == nil {
		d = real
	}
	return d
}

// mountStagefs creates a workspace, a mount point and a state dir, fills the
// workspace and mounts it. Cleanup unmounts (stagefs unmount, else umount
// -l), checks the mount is gone and the daemon has exited.
func mountStagefs(t *testing.T, opts ...mountOption) *stagefsMount {
	t.Helper()
	requireFUSE(t)
	cfg := mountConfig{files: map[string]string{}, modes: map[string]os.FileMode{}, symlinks: map[string]string{}, stateRel: "st"}
	for _, o := range opts {
		o(&cfg)
	}
	base := shortTempDir(t)
	m := &stagefsMount{
		t:        t,
		base:     base,
		ws:       filepath.Join(base, "ws"),
		mnt:      filepath.Join(base, "mnt"),
		state:    filepath.Join(base, cfg.stateRel),
		bin:      cfg.bin,
		extraEnv: cfg.env,
	}
	if m.bin == "" {
		m.bin = stagefsBin
	}
	m.sock = filepath.Join(m.state, "control.sock")
	for _, d := range []string{m.ws, m.mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeTree(t, m.ws, cfg.files)
	for p, target := range cfg.symlinks {
		full := filepath.Join(m.ws, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.Symlink(target, full); err != nil {
			t.Fatal(err)
		}
	}
	for p, mode := range cfg.modes {
		if err := os.Chmod(filepath.Join(m.ws, p), mode); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(m.cleanup)
	m.mount(cfg.extra...)
	return m
}

// mount runs `stagefs mount` (again) with the same directories.
func (m *stagefsMount) mount(extra ...string) {
	m.t.Helper()
	args := append([]string{"mount", m.ws, m.mnt, "--state", m.state}, extra...)
	r := runIn(m.t, cmdSpec{env: m.extraEnv}, m.bin, args...)
	if r.code != 0 {
		m.t.Fatalf("stagefs mount failed (exit %d): %s%s\n%s", r.code, r.stdout, r.stderr, m.daemonLog())
	}
	if !isMounted(m.mnt) {
		m.t.Fatalf("stagefs mount returned 0 but %s is not in /proc/self/mountinfo", m.mnt)
	}
	m.setPid(readPid(m.state))
	registerMount(m)
}

func (m *stagefsMount) setPid(pid int) {
	m.pidMu.Lock()
	m.pid = pid
	m.pidMu.Unlock()
}

func (m *stagefsMount) daemonPid() int {
	m.pidMu.Lock()
	defer m.pidMu.Unlock()
	return m.pid
}

func readPid(state string) int {
	b, err := os.ReadFile(filepath.Join(state, "pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// unmount runs `stagefs unmount` and fails the test unless it succeeds and
// the daemon exits.
func (m *stagefsMount) unmount() {
	m.t.Helper()
	r := runStagefs(m.t, "unmount", m.mnt)
	if r.code != 0 {
		m.t.Fatalf("stagefs unmount: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	if isMounted(m.mnt) {
		m.t.Fatalf("%s still mounted after stagefs unmount", m.mnt)
	}
	if pid := m.daemonPid(); pid > 0 && !waitProcessGone(pid, 15*time.Second) {
		m.t.Fatalf("daemon %d still running 15s after unmount", pid)
	}
	unregisterMount(m)
}

func (m *stagefsMount) cleanup() {
	t := m.t
	if t.Failed() {
		if log := m.daemonLog(); log != "" {
			t.Logf("daemon log of %s:\n%s", m.mnt, log)
		}
	}
	if isMounted(m.mnt) {
		ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
		out, err := exec.CommandContext(ctx, stagefsBin, "unmount", m.mnt).CombinedOutput()
		cancel()
		if err != nil {
			t.Logf("cleanup: stagefs unmount %s: %v: %s; falling back to umount -l", m.mnt, err, out)
			forceUnmount(m.mnt)
		}
	}
	if isMounted(m.mnt) {
		t.Errorf("cleanup: %s is still mounted", m.mnt)
		forceUnmount(m.mnt)
	}
	if pid := m.daemonPid(); pid > 0 && !waitProcessGone(pid, 15*time.Second) {
		t.Errorf("cleanup: daemon %d of %s still running 15s after unmount; killing it", pid, m.mnt)
		syscall.Kill(pid, syscall.SIGKILL)
		waitProcessGone(pid, 5*time.Second)
	}
	unregisterMount(m)
}

func (m *stagefsMount) daemonLog() string {
	b, err := os.ReadFile(filepath.Join(m.state, "daemon.log"))
	if err != nil {
		return ""
	}
	const max = 8 << 10
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

func forceUnmount(mnt string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := exec.CommandContext(ctx, "umount", "-l", mnt).Run(); err != nil {
		exec.CommandContext(ctx, "fusermount3", "-u", "-z", mnt).Run()
	}
}

// isMounted reports whether mnt is a mount point in /proc/self/mountinfo.
func isMounted(mnt string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMountinfo(fields[4]) == mnt {
			return true
		}
	}
	return false
}

func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// waitProcessGone waits until pid no longer exists (or is a zombie).
func waitProcessGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if processGone(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) S ...: the state follows the last ')'. A zombie leader
	// whose other threads are still exiting still holds its files (the
	// /dev/fuse fd among them), so it counts as gone only alone.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && (s[i+2] == 'Z' || s[i+2] == 'X') {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		return err != nil || len(tasks) <= 1
	}
	return false
}

// ---------------------------------------------------------------------------
// Running commands.

type result struct {
	stdout, stderr string
	code           int // exit code; -1 if the command could not run or timed out
	err            error
}

func (r result) String() string {
	return fmt.Sprintf("exit %d (%v)\nstdout:\n%s\nstderr:\n%s", r.code, r.err, r.stdout, r.stderr)
}

// baseEnv is the environment of every command the tests run.
func baseEnv() []string {
	env := os.Environ()
	env = append(env,
		"LC_ALL=C",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
		"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com",
		"STAGEFS_SOCKET=", // never pick up a socket from the caller's environment
	)
	return env
}

type cmdSpec struct {
	dir   string
	env   []string // added to baseEnv
	stdin string
	uid   int // run as this uid (and gid) when not 0
}

func runIn(t testing.TB, spec cmdSpec, name string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = spec.dir
	if cmd.Dir == "" {
		cmd.Dir = "/"
	}
	cmd.Env = append(baseEnv(), spec.env...)
	if spec.uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(spec.uid), Gid: uint32(spec.uid)}}
	}
	if spec.stdin != "" {
		cmd.Stdin = strings.NewReader(spec.stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String(), err: err}
	var ee *exec.ExitError
	switch {
	case err == nil:
		r.code = 0
	case errors.As(err, &ee) && ctx.Err() == nil:
		r.code = ee.ExitCode()
	default:
		r.code = -1
	}
	if ctx.Err() != nil {
		r.err = fmt.Errorf("%s %s timed out after %v: %w", name, strings.Join(args, " "), cmdTimeout, err)
	}
	return r
}

// mustRun runs a command and fails the test unless it exits 0.
func mustRun(t testing.TB, spec cmdSpec, name string, args ...string) string {
	t.Helper()
	r := runIn(t, spec, name, args...)
	if r.code != 0 {
		t.Fatalf("%s %s (in %s): %s", name, strings.Join(args, " "), spec.dir, r)
	}
	return r.stdout
}

// sh runs a shell script in dir and fails the test unless it exits 0.
func sh(t testing.TB, dir, script string) string {
	t.Helper()
	return mustRun(t, cmdSpec{dir: dir}, "sh", "-ec", script)
}

func runStagefs(t testing.TB, args ...string) result {
	t.Helper()
	return runIn(t, cmdSpec{}, stagefsBin, args...)
}

// cli runs a client command against this mount (adds -m MOUNTPOINT).
func (m *stagefsMount) cli(args ...string) result {
	m.t.Helper()
	return runStagefs(m.t, append(args, "-m", m.mnt)...)
}

func (m *stagefsMount) mustCLI(args ...string) string {
	m.t.Helper()
	r := m.cli(args...)
	if r.code != 0 {
		m.t.Fatalf("stagefs %s: %s", strings.Join(args, " "), r)
	}
	return r.stdout
}

func (m *stagefsMount) status() control.StatusResult {
	m.t.Helper()
	out := m.mustCLI("status", "--json")
	var st control.StatusResult
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		m.t.Fatalf("status --json: %v\n%s", err, out)
	}
	return st
}

// statusKinds maps each pending path to its kind (and "rename<-FROM").
func statusKinds(st control.StatusResult) map[string]string {
	out := map[string]string{}
	for _, e := range st.Entries {
		k := e.Kind
		if e.From != "" {
			k += "<-" + e.From
		}
		out[e.Path] = k
	}
	return out
}

func (m *stagefsMount) commit(args ...string) control.CommitResult {
	m.t.Helper()
	r := m.cli(append([]string{"commit", "--json"}, args...)...)
	if r.code != 0 {
		m.t.Fatalf("stagefs commit %v: %s", args, r)
	}
	var cr control.CommitResult
	if err := json.Unmarshal([]byte(r.stdout), &cr); err != nil {
		m.t.Fatalf("commit --json: %v\n%s", err, r.stdout)
	}
	return cr
}

func (m *stagefsMount) dial() *control.Client {
	m.t.Helper()
	c, err := control.Dial(m.sock)
	if err != nil {
		m.t.Fatalf("dial %s: %v", m.sock, err)
	}
	m.t.Cleanup(func() { c.Close() })
	return c
}

// in returns the path of rel inside the mount.
func (m *stagefsMount) in(rel string) string { return filepath.Join(m.mnt, rel) }

// inWS returns the path of rel inside the workspace.
func (m *stagefsMount) inWS(rel string) string { return filepath.Join(m.ws, rel) }

// ---------------------------------------------------------------------------
// Files and trees.

// writeTree creates files under root; a key ending in "/" makes a directory.
func writeTree(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(root, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

func assertFile(t testing.TB, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("read %s: %v", path, err)
		return
	}
	if string(b) != want {
		t.Errorf("%s = %q, want %q", path, b, want)
	}
}

func assertMissing(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s: want ENOENT, got %v", path, err)
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// tree is a snapshot of a directory tree: relative path -> description
// (type, permission bits, content hash or link target).
type tree map[string]string

// snapshot describes every entry under root except the excluded relative
// paths (and what is below them).
func snapshot(t testing.TB, root string, exclude ...string) tree {
	t.Helper()
	out := tree{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		for _, x := range exclude {
			if rel == x || strings.HasPrefix(rel, x+"/") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		mode := info.Mode()
		perm := fmt.Sprintf("%04o", uint32(mode.Perm())|specialBits(mode))
		switch {
		case mode.IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = "file " + perm + " " + sha256Hex(b)
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "symlink -> " + target
		case mode.IsDir():
			out[rel] = "dir " + perm
		default:
			out[rel] = "other " + mode.String()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", root, err)
	}
	return out
}

func specialBits(m fs.FileMode) uint32 {
	var b uint32
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// diffTrees lists the differences between two snapshots, "" if none.
func diffTrees(a, b tree) string {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	var sorted []string
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	var out []string
	for _, k := range sorted {
		va, oka := a[k]
		vb, okb := b[k]
		switch {
		case !oka:
			out = append(out, fmt.Sprintf("  only in second: %s (%s)", k, vb))
		case !okb:
			out = append(out, fmt.Sprintf("  only in first:  %s (%s)", k, va))
		case va != vb:
			out = append(out, fmt.Sprintf("  differs: %s: %s vs %s", k, va, vb))
		}
		if len(out) >= 30 {
			out = append(out, "  ...")
			break
		}
	}
	return strings.Join(out, "\n")
}

func assertSameTree(t testing.TB, what string, a, b tree) {
	t.Helper()
	if d := diffTrees(a, b); d != "" {
		t.Errorf("%s: trees differ:\n%s", what, d)
	}
}

// assertUniqueInos checks that no two entries under root (a tree without
// hard links) show the same inode number.
func assertUniqueInos(t testing.TB, what, root string) {
	t.Helper()
	seen := map[uint64]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		if other, ok := seen[st.Ino]; ok {
			t.Errorf("%s: %s and %s both show inode %d", what, other, p, st.Ino)
		}
		seen[st.Ino] = p
		return nil
	})
	if err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// contentHash is how the protocol names content: "sha256:" and the hex
// digest (fs/read_text, fs/safe_text_patch).
func contentHash(b []byte) string { return "sha256:" + sha256Hex(b) }
