package test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Issue 4: more kinds of tool calls inside a scope, and eviction under a
// small --snapshot-cap, against a real mount through the daemon.

// xattrHelperEnv makes the test binary act as a tiny removexattr tool
// (`removexattr PATH NAME`), used where setfattr is not installed.
const xattrHelperEnv = "STAGEFS_TEST_XATTR_HELPER"

func init() {
	if os.Getenv(xattrHelperEnv) == "remove" && len(os.Args) == 3 {
		if err := syscall.Removexattr(os.Args[1], os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "removexattr:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// removexattrCmd is the command that removes xattr name from path (relative
// to the mount): setfattr -x when installed, else this test binary.
func removexattrCmd(t *testing.T, path, name string) []string {
	if p, err := exec.LookPath("setfattr"); err == nil {
		return []string{p, "-x", name, path}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("setfattr is not installed; removing the xattr with %s", self)
	return []string{"env", xattrHelperEnv + "=remove", self, path, name}
}

// sed -i over several files in one scope, with an earlier tool call's
// pending edit in one of them: restore gives back the tree as it was just
// before the scope (tree hash), keeps the earlier edit pending, and never
// touches the workspace.
func TestSnapshotSedSeveralFiles(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{
		"a.txt":          "alpha\nfoo one\n",
		"b.txt":          "foo bar\n",
		"sub/c.txt":      "x foo y\nfoo\n",
		"sub/deep/d.txt": "foo\n",
		"keep.txt":       "foo kept: not given to sed\n",
	}), withMode("b.txt", 0o600))
	// An earlier change, outside the scope.
	sh(t, m.mnt, "echo 'foo staged before' >> b.txt")
	ws0 := snapshot(t, m.ws)
	view0 := snapshot(t, m.mnt)
	hash0 := treeHash(view0)

	files := []string{"a.txt", "b.txt", "sub/c.txt", "sub/deep/d.txt"}
	m.mustExec("sed-multi", append([]string{"sed", "-i", "s/foo/FOO/g"}, files...)...)
	for _, f := range files {
		if got := readFile(t, m.in(f)); strings.Contains(got, "foo") || !strings.Contains(got, "FOO") {
			t.Errorf("%s after sed -i = %q", f, got)
		}
	}
	assertFile(t, m.in("keep.txt"), "foo kept: not given to sed\n")
	if treeHash(snapshot(t, m.mnt)) == hash0 {
		t.Fatal("the tree hash did not change with sed -i: the test would prove nothing")
	}
	assertSameTree(t, "workspace after sed -i", ws0, snapshot(t, m.ws))
	s := m.snapshotInfo("sed-multi")
	for _, f := range files {
		if !contains(s.Paths, f) {
			t.Errorf("snapshot sed-multi lacks %s: %v", f, s.Paths)
		}
	}
	if contains(s.Paths, "keep.txt") {
		t.Errorf("snapshot sed-multi captured keep.txt, which sed never touched: %v", s.Paths)
	}

	res := m.restoreScope("sed-multi")
	for _, f := range files {
		if !contains(res.RestoredPaths, f) {
			t.Errorf("restore sed-multi: restoredPaths %v lack %s", res.RestoredPaths, f)
		}
	}
	view1 := snapshot(t, m.mnt)
	assertTreeHash(t, "the mount after restore vs just before the scope", view0, view1)
	assertSameTree(t, "workspace after restore", ws0, snapshot(t, m.ws))
	assertFile(t, m.in("b.txt"), "foo bar\nfoo staged before\n")
	assertPending(t, m, "after restore", map[string]string{"b.txt": "write"})

	// Once more: the same.
	m.restoreScope("sed-multi")
	assertTreeHash(t, "the mount after a second restore", view0, snapshot(t, m.mnt))
}

type fileMeta struct {
	uid, gid uint32
	mtime    syscall.Timespec
	mode     uint32
	xattrs   map[string]string
}

func statMeta(t *testing.T, path string) fileMeta {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatalf("lstat %s: %v", path, err)
	}
	fm := fileMeta{uid: st.Uid, gid: st.Gid, mtime: st.Mtim, mode: st.Mode, xattrs: map[string]string{}}
	buf := make([]byte, 4096)
	n, err := syscall.Listxattr(path, buf)
	if err != nil {
		t.Fatalf("listxattr %s: %v", path, err)
	}
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if !strings.HasPrefix(name, "user.") {
			continue
		}
		v := make([]byte, 4096)
		k, err := syscall.Getxattr(path, name, v)
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", path, name, err)
		}
		fm.xattrs[name] = string(v[:k])
	}
	return fm
}

func (fm fileMeta) String() string {
	return fmt.Sprintf("uid %d gid %d mtime %d.%09d mode %o xattrs %v", fm.uid, fm.gid, fm.mtime.Sec, fm.mtime.Nsec, fm.mode, fm.xattrs)
}

func sameMeta(a, b fileMeta) bool { return a.String() == b.String() }

// chown, utimens (touch -d) and removexattr (setfattr -x), each its own
// tool call: each is captured (its path alone), and restoring each one
// puts back exactly that attribute, leaving the other tool calls' changes
// until they are restored in turn.
func TestSnapshotCapturesChownUtimensRemovexattr(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to another owner needs root")
	}
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{
		"own.txt":  "owned\n",
		"time.txt": "timed\n",
		"x.txt":    "with xattrs\n",
	}))
	// Give the workspace files distinctive metadata before anything looks
	// at them through the mount.
	when := time.Date(2020, 5, 6, 7, 8, 9, 123456789, time.UTC)
	if err := os.Chtimes(m.inWS("time.txt"), when, when); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"user.note": "hello", "user.other": "keep me"} {
		if err := syscall.Setxattr(m.inWS("x.txt"), name, []byte(v), 0); err != nil {
			t.Skipf("the workspace's file system has no user xattrs: %v", err)
		}
	}
	ws0 := snapshot(t, m.ws)
	wsMeta := map[string]fileMeta{}
	before := map[string]fileMeta{}
	for _, f := range []string{"own.txt", "time.txt", "x.txt"} {
		wsMeta[f] = statMeta(t, m.inWS(f))
		before[f] = statMeta(t, m.in(f))
	}
	if before["x.txt"].xattrs["user.note"] != "hello" || before["time.txt"].mtime.Nsec != 123456789 {
		t.Fatalf("the mount does not show the workspace's metadata: %v, %v", before["x.txt"], before["time.txt"])
	}

	type step struct {
		scope, path string
		cmd         []string
		changed     func(fileMeta) bool
	}
	steps := []step{
		{"chown", "own.txt", []string{"chown", "1234:5678", "own.txt"},
			func(fm fileMeta) bool { return fm.uid == 1234 && fm.gid == 5678 }},
		{"utimens", "time.txt", []string{"touch", "-d", "2001-02-03 04:05:06", "time.txt"},
			func(fm fileMeta) bool { return fm.mtime.Sec == time.Date(2001, 2, 3, 4, 5, 6, 0, time.Local).Unix() }},
		{"rmxattr", "x.txt", removexattrCmd(t, "x.txt", "user.note"),
			func(fm fileMeta) bool {
				_, has := fm.xattrs["user.note"]
				return !has && fm.xattrs["user.other"] == "keep me"
			}},
	}
	for _, s := range steps {
		m.mustExec(s.scope, s.cmd...)
		if got := statMeta(t, m.in(s.path)); !s.changed(got) {
			t.Fatalf("%s did not change %s as expected: %v", strings.Join(s.cmd, " "), s.path, got)
		}
		assertPaths(t, "snapshot "+s.scope, m.snapshotInfo(s.scope).Paths, s.path)
		if k := statusKinds(m.status())[s.path]; k == "" {
			t.Errorf("%s: %s not pending after the change", s.scope, s.path)
		}
	}
	assertSameTree(t, "workspace after the tool calls", ws0, snapshot(t, m.ws))
	for f, fm := range wsMeta {
		if got := statMeta(t, m.inWS(f)); !sameMeta(got, fm) {
			t.Errorf("workspace %s changed: %v, was %v", f, got, fm)
		}
	}

	// Restore one at a time, in an order other than the changes'.
	order := []int{1, 0, 2}
	for i, k := range order {
		s := steps[k]
		res := m.restoreScope(s.scope)
		if !contains(res.RestoredPaths, s.path) {
			t.Errorf("restore %s: restoredPaths %v lack %s", s.scope, res.RestoredPaths, s.path)
		}
		if got := statMeta(t, m.in(s.path)); !sameMeta(got, before[s.path]) {
			t.Errorf("restore %s: %s is %v, want %v", s.scope, s.path, got, before[s.path])
		}
		// The tool calls not yet restored keep their change.
		for _, k2 := range order[i+1:] {
			o := steps[k2]
			if got := statMeta(t, m.in(o.path)); !o.changed(got) {
				t.Errorf("restore %s undid %s's change on %s too: %v", s.scope, o.scope, o.path, got)
			}
		}
	}
	assertNothingPending(t, m, "after restoring every tool call")
	assertSameTree(t, "workspace at the end", ws0, snapshot(t, m.ws))
	for f, fm := range before {
		if got := statMeta(t, m.in(f)); !sameMeta(got, fm) {
			t.Errorf("%s at the end: %v, want %v", f, got, fm)
		}
	}
}

// boundShell is a shell running in the mount that runs one command line
// at a time on request, so a test can mutate the mount from one known
// process (for a snapshot bound to its pid).
type boundShell struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines *bufio.Scanner
}

func startBoundShell(t *testing.T, dir string) *boundShell {
	t.Helper()
	cmd := exec.Command("sh", "-c", `while IFS= read -r line; do eval "$line" && echo ok || echo "failed $?"; done`)
	cmd.Dir = dir
	cmd.Env = baseEnv()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b := &boundShell{t: t, cmd: cmd, in: in, lines: bufio.NewScanner(out)}
	// Registered after the mount's cleanup, so it runs first: the shell
	// has its working directory in the mount.
	t.Cleanup(func() {
		in.Close()
		wait := make(chan struct{})
		go func() { cmd.Wait(); close(wait) }()
		select {
		case <-wait:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-wait
		}
	})
	return b
}

func (b *boundShell) run(line string) {
	b.t.Helper()
	if _, err := io.WriteString(b.in, line+"\n"); err != nil {
		b.t.Fatalf("bound shell: %v", err)
	}
	if !b.lines.Scan() {
		b.t.Fatalf("bound shell ended: %v", b.lines.Err())
	}
	if got := b.lines.Text(); got != "ok" {
		b.t.Fatalf("bound shell: %q: %s", line, got)
	}
}

// Under a small --snapshot-cap, tool calls' captures evict the oldest
// closed snapshots, in insertion order, until the bodies fit; the evicted
// are gone from `stagefs snapshots` and their bodies from the store; an
// open snapshot is never evicted, and a pre-image that cannot fit beside
// the open ones is not stored (the snapshot is incomplete, the rest still
// restores).
func TestSnapshotEvictionUnderCap(t *testing.T) {
	parallel(t)
	const byteCap = 10000
	const bigSize, smallSize, big2Size = 4000, 2500, 9000
	files := map[string]string{
		"big.txt":  strings.Repeat("B", bigSize),
		"big2.txt": strings.Repeat("D", big2Size),
	}
	for i := 1; i <= 5; i++ {
		files[fmt.Sprintf("c%d.txt", i)] = strings.Repeat(fmt.Sprint(i), smallSize)
	}
	m := mountStagefs(t, withFiles(files), withMountFlags("--snapshot-cap", fmt.Sprint(byteCap)))
	view0 := snapshot(t, m.mnt)

	// The open snapshot comes first, so it is the oldest of all.
	bs := startBoundShell(t, m.mnt)
	m.mustCLI("snapshot", "keep", "--pid", fmt.Sprint(bs.cmd.Process.Pid))
	bs.run("echo x > big.txt")
	if s := m.snapshotInfo("keep"); !s.Open || s.Bytes != bigSize {
		t.Fatalf("snapshot keep = %+v, want open with %d bytes", s, bigSize)
	}

	// Closed snapshots of 2,500 bytes each: with the open 4,000 the store
	// goes over 10,000 at the third, and then the oldest closed go first.
	present := func() map[string]bool {
		out := map[string]bool{}
		for scope := range m.snapshotsByScope() {
			out[scope] = true
		}
		return out
	}
	want := []string{"keep"}
	total := int64(bigSize)
	for i := 1; i <= 4; i++ {
		scope := fmt.Sprintf("c%d", i)
		m.mustExec(scope, "sh", "-c", fmt.Sprintf("echo y > c%d.txt", i))
		want = append(want, scope)
		total += smallSize
		for total > byteCap {
			// Evict the oldest closed: want[0] is the open "keep".
			want = append(want[:1], want[2:]...)
			total -= smallSize
		}
		got := present()
		for _, w := range want {
			if !got[w] {
				t.Errorf("after closing %s: snapshot %s is gone, want %v kept", scope, w, want)
			}
		}
		if len(got) != len(want) {
			t.Errorf("after closing %s: snapshots %v, want %v", scope, got, want)
		}
	}
	for _, gone := range []string{"c1", "c2"} {
		if r := m.cli("restore", gone); r.code != 1 || !strings.Contains(r.stderr, "not_found") {
			t.Errorf("restore of the evicted %s: %s", gone, r)
		}
	}
	by := m.snapshotsByScope()
	if !by["keep"].Open || by["c3"].Bytes != smallSize || by["c4"].Bytes != smallSize {
		t.Errorf("after evictions: %+v", by)
	}
	if n, size := blobBytes(t, m.state); size != total {
		t.Errorf("the store holds %d bodies, %d bytes; want the kept snapshots' %d bytes", n, size, total)
	}
	// A kept closed snapshot still restores.
	m.restoreScope("c4")
	assertFile(t, m.in("c4.txt"), files["c4.txt"])

	// A pre-image that cannot fit even with every closed snapshot gone
	// (the open 4,000 + 9,000 > 10,000) is not stored: the write goes on,
	// the open snapshot is marked incomplete, and nothing is evicted for
	// nothing.
	bs.run("echo z > big2.txt")
	assertFile(t, m.in("big2.txt"), "z\n")
	s := m.snapshotInfo("keep")
	if !s.Open || s.Bytes != bigSize || !s.Incomplete || !reflect.DeepEqual(s.Uncaptured, []string{"big2.txt"}) {
		t.Fatalf("snapshot keep = %+v, want open with %d bytes, incomplete, big2.txt uncaptured", s, bigSize)
	}
	if got := present(); len(got) != 3 || !got["c3"] || !got["c4"] {
		t.Errorf("after a refused capture: snapshots %v, want keep, c3 and c4", got)
	}
	if _, size := blobBytes(t, m.state); size != total {
		t.Errorf("the store holds %d bytes of bodies, want %d: the refused body is not kept", size, total)
	}

	// Restoring the open snapshot gives back what it captured and names
	// what it could not.
	res := m.restoreScope("keep")
	assertPaths(t, "restore keep", res.RestoredPaths, "big.txt")
	if !reflect.DeepEqual(res.Uncaptured, []string{"big2.txt"}) {
		t.Errorf("restore keep: uncaptured %v, want big2.txt", res.Uncaptured)
	}
	assertFile(t, m.in("big.txt"), files["big.txt"])
	assertFile(t, m.in("big2.txt"), "z\n")
	// c1..c3's changes stay (c4 was restored); the rest is as before.
	now := snapshot(t, m.mnt)
	for _, f := range []string{"c1.txt", "c2.txt", "c3.txt", "big2.txt"} {
		if now[f] == view0[f] {
			t.Errorf("%s is back to its old content, though no restore covered it", f)
		}
		delete(now, f)
		delete(view0, f)
	}
	assertSameTree(t, "the rest of the mount", view0, now)
}
