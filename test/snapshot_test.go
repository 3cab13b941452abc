package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"stagefs/control"
)

// Integration tests of the per-tool-call snapshots: stagefs exec --scope,
// snapshot, close, restore, snapshots and drop against a real mount.

// execScope runs `stagefs exec --scope SCOPE -m MNT [extra...] -- cmd...`.
func (m *stagefsMount) execScope(scope string, extra []string, cmd ...string) result {
	m.t.Helper()
	args := append([]string{"exec", "--scope", scope, "-m", m.mnt}, extra...)
	args = append(append(args, "--"), cmd...)
	return runStagefs(m.t, args...)
}

// mustExec is execScope that fails the test unless the command exits 0.
func (m *stagefsMount) mustExec(scope string, cmd ...string) result {
	m.t.Helper()
	r := m.execScope(scope, nil, cmd...)
	if r.code != 0 {
		m.t.Fatalf("stagefs exec --scope %s -- %s: %s", scope, strings.Join(cmd, " "), r)
	}
	return r
}

// restoreScope runs `stagefs restore SCOPE --json` and fails the test
// unless it exits 0 with nothing failed.
func (m *stagefsMount) restoreScope(scope string) control.RestoreResult {
	m.t.Helper()
	r := m.cli("restore", scope, "--json")
	var res control.RestoreResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		m.t.Fatalf("stagefs restore %s --json: %v\n%s", scope, err, r)
	}
	if r.code != 0 || len(res.Failed) > 0 {
		m.t.Fatalf("stagefs restore %s: %s", scope, r)
	}
	return res
}

// snapshotsByScope lists the snapshots (`stagefs snapshots --json`).
func (m *stagefsMount) snapshotsByScope() map[string]control.SnapshotInfo {
	m.t.Helper()
	out := m.mustCLI("snapshots", "--json")
	var res control.ListSnapshotsResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		m.t.Fatalf("snapshots --json: %v\n%s", err, out)
	}
	by := map[string]control.SnapshotInfo{}
	for _, s := range res.Snapshots {
		by[s.ScopeID] = s
	}
	return by
}

// snapshotInfo returns the snapshot of scope, failing the test if there is
// none.
func (m *stagefsMount) snapshotInfo(scope string) control.SnapshotInfo {
	m.t.Helper()
	s, ok := m.snapshotsByScope()[scope]
	if !ok {
		m.t.Fatalf("no snapshot %q in stagefs snapshots", scope)
	}
	return s
}

// pathSet is the sorted distinct paths.
func pathSet(ps []string) []string {
	seen := map[string]bool{}
	out := []string{}
	for _, p := range ps {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

func assertPaths(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	want = append([]string{}, want...)
	sort.Strings(want)
	if g := pathSet(got); !reflect.DeepEqual(g, want) {
		t.Errorf("%s: paths %v, want %v", what, g, want)
	}
}

func assertNothingPending(t *testing.T, m *stagefsMount, what string) {
	t.Helper()
	if st := m.status(); st.PendingCount != 0 || len(st.Entries) != 0 {
		t.Errorf("%s: pending set = %v, want nothing pending", what, statusKinds(st))
	}
}

func assertPending(t *testing.T, m *stagefsMount, what string, want map[string]string) {
	t.Helper()
	if got := statusKinds(m.status()); !reflect.DeepEqual(got, want) {
		t.Errorf("%s: pending set = %v, want %v", what, got, want)
	}
}

func contains(ps []string, p string) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// 1. A tool call that edits a file with sed -i is undone exactly.
func TestSnapshotExecSedRestore(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{
		"f.txt":     "alpha\nbeta\ngamma\n",
		"other.txt": "other\n",
	}), withMode("f.txt", 0o640))
	ws := snapshot(t, m.ws)
	view := snapshot(t, m.mnt)
	wsInfo, err := os.Stat(m.inWS("f.txt"))
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	events, err := m.dial().Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}

	r := m.mustExec("t1", "sed", "-i", "s/beta/BETA/", "f.txt")
	if !strings.Contains(r.stderr, "t1 touched") || !strings.Contains(r.stderr, " f.txt  17 B\n") {
		t.Errorf("exec did not list the captured f.txt on stderr: %s", r)
	}
	assertFile(t, m.in("f.txt"), "alpha\nBETA\ngamma\n")
	assertSameTree(t, "workspace after the tool call", ws, snapshot(t, m.ws))
	assertPending(t, m, "after sed -i", map[string]string{"f.txt": "write"})

	s := m.snapshotInfo("t1")
	if s.Open || s.Pid == 0 || !contains(s.Paths, "f.txt") || contains(s.Paths, "other.txt") {
		t.Errorf("snapshot t1 = %+v, want closed, bound to the exec process, capturing f.txt only (and sed's temp file)", s)
	}

	res := m.restoreScope("t1")
	if !contains(res.RestoredPaths, "f.txt") {
		t.Errorf("restore t1: restoredPaths %v lack f.txt", res.RestoredPaths)
	}
	assertFile(t, m.in("f.txt"), "alpha\nbeta\ngamma\n")
	assertSameTree(t, "mount after restore vs before the tool call", view, snapshot(t, m.mnt))
	assertSameTree(t, "workspace after restore", ws, snapshot(t, m.ws))
	assertNothingPending(t, m, "after restore")
	if fi, err := os.Stat(m.in("f.txt")); err != nil || fi.Mode() != wsInfo.Mode() || !fi.ModTime().Equal(wsInfo.ModTime()) {
		t.Errorf("f.txt after restore: %v, %v; want mode %v, mtime %v", fi.Mode(), err, wsInfo.Mode(), wsInfo.ModTime())
	}

	// Restoring again changes nothing.
	m.restoreScope("t1")
	assertSameTree(t, "mount after a second restore", view, snapshot(t, m.mnt))
	assertNothingPending(t, m, "after a second restore")

	// The restore is announced.
	timeout := time.After(10 * time.Second)
	for done := false; !done; {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("event stream closed before tool_call_restored")
			}
			if ev.Kind == control.EventToolCallRestored {
				if ev.ToolCallID != "t1" || !contains(ev.RestoredPaths, "f.txt") {
					t.Errorf("tool_call_restored event = %+v", ev)
				}
				done = true
			}
		case <-timeout:
			t.Fatal("no tool_call_restored event within 10s")
		}
	}
}

// 2. Restoring a careless rm -rf brings the tree back as it was just before
// it, with an earlier tool call's pending edit inside it.
func TestSnapshotRestoreRmRfKeepsEarlierEdit(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{
		"dir/file":      "orig\n",
		"dir/keep":      "keep\n",
		"dir/sub/s.txt": "s\n",
		"dir/empty/":    "",
		"top.txt":       "top\n",
	}))
	ws := snapshot(t, m.ws)
	view0 := snapshot(t, m.mnt)

	m.mustExec("edit", "sh", "-ec", "echo edited > dir/file; echo added > dir/added; mkdir dir/newsub; echo n > dir/newsub/n; rm dir/keep")
	view1 := snapshot(t, m.mnt)
	pending1 := map[string]string{
		"dir/file": "write", "dir/added": "create", "dir/newsub": "mkdir", "dir/newsub/n": "create", "dir/keep": "delete",
	}
	assertPending(t, m, "after the edit", pending1)

	m.mustExec("rmrf", "rm", "-rf", "dir")
	assertMissing(t, m.in("dir"))
	if k := statusKinds(m.status()); k["dir"] != "rmdir" || k["dir/file"] != "delete" {
		t.Errorf("status after rm -rf dir = %v", k)
	}
	assertPaths(t, "snapshot rmrf", m.snapshotInfo("rmrf").Paths,
		"dir", "dir/file", "dir/added", "dir/newsub", "dir/newsub/n", "dir/sub", "dir/sub/s.txt", "dir/empty")
	assertPaths(t, "snapshot edit", m.snapshotInfo("edit").Paths, "dir/file", "dir/added", "dir/newsub", "dir/newsub/n", "dir/keep")

	m.restoreScope("rmrf")
	assertFile(t, m.in("dir/file"), "edited\n")
	assertFile(t, m.in("dir/newsub/n"), "n\n")
	assertMissing(t, m.in("dir/keep"))
	assertSameTree(t, "mount after restoring rm -rf vs after the edit", view1, snapshot(t, m.mnt))
	assertPending(t, m, "after restoring rm -rf", pending1)
	assertSameTree(t, "workspace", ws, snapshot(t, m.ws))

	// And the edit can be undone as well.
	m.restoreScope("edit")
	assertSameTree(t, "mount after restoring both", view0, snapshot(t, m.mnt))
	assertNothingPending(t, m, "after restoring both")
	assertSameTree(t, "workspace", ws, snapshot(t, m.ws))
}

// 3. A tool call's new files and directories are removed by its restore.
func TestSnapshotRestoreRemovesCreated(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"src/a.go": "package a\n", "README": "r\n"}))
	ws := snapshot(t, m.ws)
	view := snapshot(t, m.mnt)

	r := m.execScope("create", []string{"-C", m.in("src")}, "sh", "-ec",
		"echo n > new.go; mkdir -p gen/deep; echo g > gen/deep/g.txt; ln -s new.go link; mkdir ../top; : > ../top/empty")
	if r.code != 0 {
		t.Fatalf("exec: %s", r)
	}
	assertFile(t, m.in("src/new.go"), "n\n")
	assertFile(t, m.in("src/gen/deep/g.txt"), "g\n")
	assertFile(t, m.in("top/empty"), "")
	assertPaths(t, "snapshot create", m.snapshotInfo("create").Paths,
		"src/new.go", "src/gen", "src/gen/deep", "src/gen/deep/g.txt", "src/link", "top", "top/empty")
	assertSameTree(t, "workspace", ws, snapshot(t, m.ws))

	m.restoreScope("create")
	for _, p := range []string{"src/new.go", "src/gen", "src/link", "top"} {
		assertMissing(t, m.in(p))
	}
	assertSameTree(t, "mount after restore", view, snapshot(t, m.mnt))
	assertSameTree(t, "workspace", ws, snapshot(t, m.ws))
	assertNothingPending(t, m, "after restore")
}

// 4. mv a b, then an edit of b/x, in one tool call: restore moves the
// directory back with the original x.
func TestSnapshotRestoreDirRename(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a/x": "x0\n", "a/y": "y0\n", "a/sub/z": "z0\n"}))
	ws := snapshot(t, m.ws)
	view := snapshot(t, m.mnt)

	m.mustExec("mv", "sh", "-ec", "mv a b; echo x1 > b/x")
	assertMissing(t, m.in("a"))
	assertFile(t, m.in("b/x"), "x1\n")
	assertFile(t, m.in("b/sub/z"), "z0\n")

	m.restoreScope("mv")
	assertMissing(t, m.in("b"))
	assertFile(t, m.in("a/x"), "x0\n")
	assertSameTree(t, "mount after restore", view, snapshot(t, m.mnt))
	assertSameTree(t, "workspace", ws, snapshot(t, m.ws))
	// The view equals the workspace again: nothing should be pending.
	assertNothingPending(t, m, "after restoring mv a b + edit of b/x")
}

// 4b. The renamed directory held changes of an earlier tool call (a
// deletion, an edit, a new file): restoring the rename keeps them.
func TestSnapshotRestoreDirRenameKeepsEarlierChanges(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a/x": "x0\n", "a/y": "y0\n", "a/z": "z0\n"}))
	ws := snapshot(t, m.ws)

	m.mustExec("earlier", "sh", "-ec", "rm a/y; echo z1 > a/z; echo n > a/new")
	view1 := snapshot(t, m.mnt)
	pending1 := statusKinds(m.status())

	m.mustExec("mv", "sh", "-ec", "mv a b; echo x1 > b/x")
	assertMissing(t, m.in("a"))
	assertFile(t, m.in("b/x"), "x1\n")

	m.restoreScope("mv")
	assertMissing(t, m.in("b"))
	assertMissing(t, m.in("a/y"))
	assertFile(t, m.in("a/z"), "z1\n")
	assertSameTree(t, "mount after restoring the rename vs after the earlier call", view1, snapshot(t, m.mnt))
	assertPending(t, m, "after restoring the rename", pending1)
	assertSameTree(t, "workspace", ws, snapshot(t, m.ws))
}

// 5. git checkout of another branch, undone: the work tree and .git are
// back on the previous branch.
func TestSnapshotRestoreGitCheckout(t *testing.T) {
	parallel(t)
	requireTool(t, "git")
	m := mountStagefs(t)

	git(t, m.mnt, "init", "-q")
	writeTree(t, m.mnt, map[string]string{
		"README":      "hello\n",
		"src/main.go": "package main\n\nfunc main() {}\n",
		"src/util.go": "package main\n",
	})
	git(t, m.mnt, "add", "-A")
	git(t, m.mnt, "commit", "-q", "-m", "first")
	git(t, m.mnt, "checkout", "-q", "-b", "feature")
	sh(t, m.mnt, "echo more >> README; echo new > NEW; rm -r src; mkdir -p pkg/x; echo x > pkg/x/x.go")
	git(t, m.mnt, "add", "-A")
	git(t, m.mnt, "commit", "-q", "-m", "second")
	git(t, m.mnt, "checkout", "-q", "main")
	m.commit()
	assertNothingPending(t, m, "after committing the repo")

	before := snapshot(t, m.mnt)
	ws := snapshot(t, m.ws)
	assertSameTree(t, "workspace vs mount after commit", before, ws)

	m.mustExec("checkout", "git", "checkout", "-q", "feature")
	assertFile(t, m.in(".git/HEAD"), "ref: refs/heads/feature\n")
	assertFile(t, m.in("NEW"), "new\n")
	assertMissing(t, m.in("src"))
	assertSameTree(t, "workspace after checkout", ws, snapshot(t, m.ws))

	m.restoreScope("checkout")
	assertFile(t, m.in(".git/HEAD"), "ref: refs/heads/main\n")
	assertSameTree(t, "mount after restoring the checkout", before, snapshot(t, m.mnt))
	assertSameTree(t, "workspace", ws, snapshot(t, m.ws))
	assertNothingPending(t, m, "after restoring the checkout")
	if out := git(t, m.mnt, "status", "--porcelain"); out != "" {
		t.Errorf("git status --porcelain after restore: %q", out)
	}
	if out := strings.TrimSpace(git(t, m.mnt, "rev-parse", "--abbrev-ref", "HEAD")); out != "main" {
		t.Errorf("HEAD after restore = %q, want main", out)
	}
}

// 6. Two tool calls at once: each snapshot holds its own paths only, and
// restoring one keeps the other's change.
func TestSnapshotConcurrentExec(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a0\n", "b.txt": "b0\n", "c.txt": "c0\n"}))
	ws := snapshot(t, m.ws)
	syncDir := filepath.Join(m.base, "sync")
	if err := os.Mkdir(syncDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Each writes its file, says so, waits until the test has seen both
	// (so both snapshots are open at once), and writes again.
	script := func(name string) string {
		return fmt.Sprintf(`
echo %[1]s1 > %[1]s.txt
touch %[2]s/%[1]s
i=0
while [ ! -e %[2]s/go ]; do i=$((i+1)); [ $i -lt 1000 ] || exit 9; sleep 0.01; done
echo %[1]s2 >> %[1]s.txt
mkdir new-%[1]s
echo %[1]s > new-%[1]s/f
`, name, syncDir)
	}
	var wg sync.WaitGroup
	results := make([]result, 2)
	for i, name := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = m.execScope("call-"+name, nil, "sh", "-ec", script(name))
		}()
	}
	both := waitFor(10*time.Second, func() bool {
		_, ea := os.Stat(filepath.Join(syncDir, "a"))
		_, eb := os.Stat(filepath.Join(syncDir, "b"))
		return ea == nil && eb == nil
	})
	if both {
		// A write by a process neither tool call covers, while both are
		// open.
		if err := os.WriteFile(m.in("c.txt"), []byte("c1\n"), 0o644); err != nil {
			t.Error(err)
		}
		open := m.snapshotsByScope()
		if !open["call-a"].Open || !open["call-b"].Open {
			t.Errorf("both snapshots should be open at once: %+v", open)
		}
	}
	os.WriteFile(filepath.Join(syncDir, "go"), nil, 0o644)
	wg.Wait()
	if !both {
		t.Fatalf("the two tool calls did not both start: %s\n%s", results[0], results[1])
	}
	for i, r := range results {
		if r.code != 0 {
			t.Fatalf("exec %d: %s", i, r)
		}
	}
	assertFile(t, m.in("a.txt"), "a1\na2\n")
	assertFile(t, m.in("b.txt"), "b1\nb2\n")

	snaps := m.snapshotsByScope()
	assertPaths(t, "snapshot call-a", snaps["call-a"].Paths, "a.txt", "new-a", "new-a/f")
	assertPaths(t, "snapshot call-b", snaps["call-b"].Paths, "b.txt", "new-b", "new-b/f")

	m.restoreScope("call-a")
	assertFile(t, m.in("a.txt"), "a0\n")
	assertMissing(t, m.in("new-a"))
	assertFile(t, m.in("b.txt"), "b1\nb2\n")
	assertFile(t, m.in("new-b/f"), "b\n")
	assertFile(t, m.in("c.txt"), "c1\n")
	assertPending(t, m, "after restoring call-a", map[string]string{
		"b.txt": "write", "new-b": "mkdir", "new-b/f": "create", "c.txt": "write",
	})
	assertSameTree(t, "workspace", ws, snapshot(t, m.ws))
}

// 7. Explicit paths: captured at once, the snapshot closed; whoever
// changes them later, restore puts them back.
func TestSnapshotExplicitPaths(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{
		"file.txt":      "file\n",
		"dir/x":         "x\n",
		"dir/sub/y":     "y\n",
		"dir/sub/deep/": "",
		"other.txt":     "other\n",
	}))
	ws := snapshot(t, m.ws)
	view := snapshot(t, m.mnt, "other.txt")

	// A relative path (workspace-relative) and an absolute one in the mount.
	out := m.mustCLI("snapshot", "s1", "file.txt", m.in("dir"), "--json")
	var s control.SnapshotInfo
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("snapshot --json: %v\n%s", err, out)
	}
	if s.Open || s.ScopeID != "s1" {
		t.Errorf("snapshot s1 = %+v, want closed", s)
	}
	want := []string{"file.txt", "dir", "dir/x", "dir/sub", "dir/sub/y", "dir/sub/deep"}
	assertPaths(t, "snapshot s1", s.Paths, want...)

	// Any process changes them; nothing more is captured.
	sh(t, m.mnt, "echo changed > file.txt; echo x2 > dir/x; rm -rf dir/sub; echo o2 > other.txt")
	assertPaths(t, "snapshot s1 after the changes", m.snapshotInfo("s1").Paths, want...)

	m.restoreScope("s1")
	assertFile(t, m.in("file.txt"), "file\n")
	assertFile(t, m.in("dir/sub/y"), "y\n")
	assertSameTree(t, "mount after restore (but other.txt)", view, snapshot(t, m.mnt, "other.txt"))
	assertFile(t, m.in("other.txt"), "o2\n")
	assertPending(t, m, "after restore", map[string]string{"other.txt": "write"})
	assertSameTree(t, "workspace", ws, snapshot(t, m.ws))
}

// 8. An unbound open snapshot captures every process's writes until it is
// closed; opening another unbound one closes it.
func TestSnapshotUnbound(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a\n", "b.txt": "b\n"}))
	ws := snapshot(t, m.ws)
	view := snapshot(t, m.mnt)

	var s control.SnapshotInfo
	if err := json.Unmarshal([]byte(m.mustCLI("snapshot", "s2", "--json")), &s); err != nil {
		t.Fatal(err)
	}
	if !s.Open || s.Pid != 0 || len(s.Paths) != 0 {
		t.Errorf("snapshot s2 = %+v, want open, unbound, empty", s)
	}
	sh(t, m.mnt, "echo a2 > a.txt; echo n > n.txt")
	if err := os.WriteFile(m.in("b.txt"), []byte("b2\n"), 0o644); err != nil { // the test process itself
		t.Fatal(err)
	}
	out := m.mustCLI("close", "s2")
	for _, p := range []string{"a.txt", "n.txt", "b.txt"} {
		if !strings.Contains(out, "\n  "+p+"\n") {
			t.Errorf("stagefs close s2 does not list %s:\n%s", p, out)
		}
	}
	if !strings.HasPrefix(out, "closed s2 ") {
		t.Errorf("stagefs close s2 output:\n%s", out)
	}
	// Closed: later writes are not captured.
	sh(t, m.mnt, "echo late > late.txt")
	if s := m.snapshotInfo("s2"); s.Open || contains(s.Paths, "late.txt") {
		t.Errorf("snapshot s2 after close = %+v", s)
	}
	// Closing again is idempotent: the same answer, nothing captured.
	if again := m.mustCLI("close", "s2"); again != out {
		t.Errorf("closing s2 again:\n%s\nfirst close:\n%s", again, out)
	}

	// A second unbound snapshot closes the first; a bound one does not,
	// and what the bound one's process tree does is its own alone.
	m.mustCLI("snapshot", "s3")
	sh(t, m.mnt, "echo 3 > three.txt")
	m.mustCLI("snapshot", "s4")
	snaps := m.snapshotsByScope()
	if snaps["s3"].Open || !snaps["s4"].Open {
		t.Errorf("after opening s4: s3 open=%v, s4 open=%v; want s3 closed, s4 open", snaps["s3"].Open, snaps["s4"].Open)
	}
	m.mustExec("bound", "sh", "-c", "echo 4 > four.txt")
	if s := m.snapshotInfo("s4"); !s.Open {
		t.Errorf("exec --scope closed the unbound snapshot s4: %+v", s)
	}
	m.mustCLI("close", "s4")
	snaps = m.snapshotsByScope()
	assertPaths(t, "s3", snaps["s3"].Paths, "three.txt")
	assertPaths(t, "s4", snaps["s4"].Paths)
	assertPaths(t, "bound", snaps["bound"].Paths, "four.txt")

	for _, scope := range []string{"bound", "s4", "s3", "s2"} {
		m.restoreScope(scope)
	}
	assertSameTree(t, "mount after restoring bound, s4, s3, s2", view, snapshot(t, m.mnt, "late.txt"))
	assertPending(t, m, "after restoring bound, s4, s3, s2", map[string]string{"late.txt": "create"})
	assertSameTree(t, "workspace", ws, snapshot(t, m.ws))
}

// 9. Snapshots are kept across a daemon restart.
func TestSnapshotSurvivesRestart(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f0\n", "d/g": "g0\n"}))
	ws := snapshot(t, m.ws)
	view := snapshot(t, m.mnt)

	m.mustExec("t1", "sh", "-ec", "echo f1 > f.txt; echo n > n.txt; rm -r d")
	m.mustCLI("snapshot", "still-open")
	before := m.snapshotsByScope()

	m.unmount()
	m.mount()

	after := m.snapshotsByScope()
	for _, scope := range []string{"t1", "still-open"} {
		b, a := before[scope], after[scope]
		if a.SnapshotID != b.SnapshotID || a.Open != b.Open || !reflect.DeepEqual(a.Paths, b.Paths) || a.Created != b.Created {
			t.Errorf("snapshot %s after restart = %+v, want %+v", scope, a, b)
		}
	}
	assertPaths(t, "t1 after restart", after["t1"].Paths, "f.txt", "n.txt", "d", "d/g")
	if !after["still-open"].Open {
		t.Errorf("the open snapshot was closed by the restart: %+v", after["still-open"])
	}
	m.mustCLI("close", "still-open")

	m.restoreScope("t1")
	assertSameTree(t, "mount after restore", view, snapshot(t, m.mnt))
	assertSameTree(t, "workspace", ws, snapshot(t, m.ws))
	assertNothingPending(t, m, "after restore")
}

// 10. Immediate mode: the tool call writes the workspace; restore writes
// the workspace back.
func TestSnapshotImmediateMode(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{
		"f.txt": "old\n", "gone.txt": "g\n", "keep.txt": "k\n", "d/x": "x\n", "d/sub/y": "y\n", "e/z": "z\n",
	}))
	m.mustCLI("mode", "immediate")
	ws := snapshot(t, m.ws)
	fInfo, err := os.Stat(m.inWS("f.txt"))
	if err != nil {
		t.Fatal(err)
	}

	m.mustExec("imm", "sh", "-ec", "sed -i s/old/new/ f.txt; echo c > created.txt; rm gone.txt; mkdir nd; rm -r d; mv e e2; echo z2 > e2/z")
	assertFile(t, m.inWS("f.txt"), "new\n")
	assertMissing(t, m.inWS("d"))
	assertFile(t, m.inWS("e2/z"), "z2\n")
	assertFile(t, m.inWS("created.txt"), "c\n")
	assertMissing(t, m.inWS("gone.txt"))
	assertNothingPending(t, m, "immediate mode after the tool call")

	m.restoreScope("imm")
	assertFile(t, m.inWS("f.txt"), "old\n")
	assertMissing(t, m.inWS("created.txt"))
	assertMissing(t, m.inWS("nd"))
	assertMissing(t, m.inWS("e2"))
	assertFile(t, m.inWS("gone.txt"), "g\n")
	assertFile(t, m.inWS("d/sub/y"), "y\n")
	assertFile(t, m.inWS("e/z"), "z\n")
	assertSameTree(t, "workspace after restore", ws, snapshot(t, m.ws))
	assertSameTree(t, "mount vs workspace after restore", ws, snapshot(t, m.mnt))
	assertNothingPending(t, m, "immediate mode after restore")
	if fi, err := os.Stat(m.inWS("f.txt")); err != nil || fi.Mode() != fInfo.Mode() || !fi.ModTime().Equal(fInfo.ModTime()) {
		t.Errorf("workspace f.txt after restore: %v %v, %v; want %v %v", fi.Mode(), fi.ModTime(), err, fInfo.Mode(), fInfo.ModTime())
	}
}

// 11. drop, and the errors of unknown and invalid scope ids.
func TestSnapshotDropAndErrors(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}))
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	c := m.dial()

	m.mustExec("t1", "sh", "-c", "echo g > f.txt")
	if out := m.mustCLI("drop", "t1"); !strings.Contains(out, "dropped t1") {
		t.Errorf("stagefs drop t1: %q", out)
	}
	if _, ok := m.snapshotsByScope()["t1"]; ok {
		t.Errorf("t1 still listed after drop")
	}
	r := m.cli("restore", "t1")
	if r.code != 1 || !strings.Contains(r.stderr, `"t1"`) || !strings.Contains(r.stderr, "not_found") {
		t.Errorf("restore of a dropped scope: %s", r)
	}
	assertFile(t, m.in("f.txt"), "g\n") // nothing was restored

	for name, call := range map[string]func(string) error{
		"restore": func(s string) error { _, err := c.Restore(ctx, s); return err },
		"close":   func(s string) error { _, err := c.CloseSnapshot(ctx, s); return err },
		"drop":    func(s string) error { _, err := c.DropSnapshot(ctx, s); return err },
	} {
		if err := call("t1"); !control.IsCode(err, control.CodeNotFound) {
			t.Errorf("%s of an unknown scope: %v, want code %d (not_found)", name, err, control.CodeNotFound)
		}
		if err := call("../x"); !control.IsCode(err, control.CodeInvalidParams) {
			t.Errorf("%s of the invalid scope \"../x\": %v, want code %d", name, err, control.CodeInvalidParams)
		}
	}
	for _, bad := range []string{"../x", "a/b", "..", "with space", strings.Repeat("x", 129)} {
		if _, err := c.Snapshot(ctx, control.SnapshotParams{ScopeID: bad}); !control.IsCode(err, control.CodeInvalidParams) {
			t.Errorf("snapshot %q: %v, want code %d", bad, err, control.CodeInvalidParams)
		}
	}
	if _, err := c.Snapshot(ctx, control.SnapshotParams{ScopeID: ""}); !control.IsCode(err, control.CodeInvalidParams) {
		t.Errorf("snapshot with an empty scope: %v, want %d", err, control.CodeInvalidParams)
	}
	if r := m.cli("snapshot", "../x"); r.code != 1 || !strings.Contains(r.stderr, "scope") {
		t.Errorf("stagefs snapshot ../x: %s", r)
	}
	if r := m.cli("snapshot", "s", "/etc/passwd"); r.code == 0 {
		t.Errorf("snapshot of a path outside the workspace succeeded: %s", r)
	}

	// An open scope can not be opened twice; dropping it closes it first.
	if _, err := c.Snapshot(ctx, control.SnapshotParams{ScopeID: "open"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Snapshot(ctx, control.SnapshotParams{ScopeID: "open", Pid: 1}); !control.IsCode(err, control.CodeBusy) {
		t.Errorf("opening an open scope again: %v, want code %d (busy)", err, control.CodeBusy)
	}
	if _, err := c.DropSnapshot(ctx, "open"); err != nil {
		t.Errorf("drop of an open snapshot: %v", err)
	}
	if err := os.WriteFile(m.in("f.txt"), []byte("h\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CloseSnapshot(ctx, "open"); !control.IsCode(err, control.CodeNotFound) {
		t.Errorf("close after drop: %v, want not_found", err)
	}
	if n := len(m.snapshotsByScope()); n != 0 {
		t.Errorf("%d snapshot(s) left after dropping everything", n)
	}
	// A closed scope id is not reused silently: it is refused until its
	// snapshot is dropped.
	m.mustExec("again", "sh", "-c", "echo 1 > one.txt")
	if r := m.execScope("again", nil, "sh", "-c", "echo 2 > two.txt"); r.code != 1 || !strings.Contains(r.stderr, "earlier tool call") {
		t.Errorf("exec --scope again with a closed snapshot again: %s", r)
	}
	assertMissing(t, m.in("two.txt"))
	m.mustCLI("drop", "again")
	m.mustExec("again", "sh", "-c", "echo 2 > two.txt")
	assertPaths(t, "reused scope", m.snapshotInfo("again").Paths, "two.txt")
}

// 12. exec passes the command's exit status through and always closes its
// snapshot.
func TestSnapshotExecExitStatus(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	if r := m.execScope("e7", nil, "sh", "-c", "echo x > x.txt; exit 7"); r.code != 7 {
		t.Errorf("exec of exit 7: %s", r)
	}
	if s := m.snapshotInfo("e7"); s.Open || !contains(s.Paths, "x.txt") {
		t.Errorf("snapshot e7 = %+v, want closed with x.txt", s)
	}
	if r := m.execScope("sig", nil, "sh", "-c", "kill -TERM $$"); r.code != 128+15 {
		t.Errorf("exec of a command killed by SIGTERM: %s, want exit 143", r)
	}
	if r := m.execScope("nocmd", nil, "/nonexistent/command"); r.code == 0 {
		t.Errorf("exec of a missing command: %s", r)
	}
	if s, ok := m.snapshotsByScope()["nocmd"]; ok && s.Open {
		t.Errorf("exec of a missing command left its snapshot open: %+v", s)
	}
	if r := m.execScope("ok", nil, "true"); r.code != 0 {
		t.Errorf("exec true: %s", r)
	}
	if r := runStagefs(t, "exec", "-m", m.mnt, "--", "true"); r.code != 2 {
		t.Errorf("exec without --scope: %s, want usage error (2)", r)
	}
}

// A write through a descriptor opened before the snapshot is a mutation
// while the snapshot is open: restore must undo it.
func TestSnapshotWriteThroughEarlierOpenFd(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"log.txt": "before\n"}))
	f, err := os.OpenFile(m.in("log.txt"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("pending\n"); err != nil { // staged before the snapshot
		t.Fatal(err)
	}
	m.mustCLI("snapshot", "s")
	if _, err := f.WriteString("during\n"); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	s := m.snapshotInfo("s")
	m.mustCLI("close", "s")
	if !contains(s.Paths, "log.txt") {
		t.Errorf("a write through a descriptor opened before the snapshot was not captured: snapshot paths %v", s.Paths)
	}
	m.restoreScope("s")
	assertFile(t, m.in("log.txt"), "before\npending\n")
}

// Restore after the tool call's change was committed stages the old
// content (the workspace now has the new one).
func TestSnapshotRestoreAfterCommit(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "v1\n"}))
	m.mustExec("t1", "sh", "-ec", "echo v2 > f.txt; echo n > n.txt")
	m.commit()
	assertFile(t, m.inWS("f.txt"), "v2\n")
	assertNothingPending(t, m, "after commit")

	m.restoreScope("t1")
	assertFile(t, m.in("f.txt"), "v1\n")
	assertMissing(t, m.in("n.txt"))
	assertFile(t, m.inWS("f.txt"), "v2\n")
	assertFile(t, m.inWS("n.txt"), "n\n")
	assertPending(t, m, "after restore", map[string]string{"f.txt": "write", "n.txt": "delete"})
	m.commit()
	assertFile(t, m.inWS("f.txt"), "v1\n")
	assertMissing(t, m.inWS("n.txt"))
}

// A tool call that creates a thousand files (and edits one) is undone by
// one restore: the tree is back, byte for byte, and nothing is pending.
func TestSnapshotThousandFiles(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"keep.txt": "keep\n", "gen/old.txt": "old\n"}))
	view0 := snapshot(t, m.mnt)
	m.mustExec("gen", "sh", "-ec", "for i in $(seq 1 1000); do echo $i > gen/f$i.txt; done; echo changed > keep.txt")
	if n := len(m.status().Entries); n != 1001 {
		t.Fatalf("after the tool call: %d pending entries, want 1001", n)
	}
	res := m.restoreScope("gen")
	if len(res.RestoredPaths) < 1001 {
		t.Errorf("restored %d paths, want at least 1001", len(res.RestoredPaths))
	}
	assertSameTree(t, "view after restore", view0, snapshot(t, m.mnt))
	if st := m.status(); st.PendingCount != 0 {
		t.Errorf("pending after restore: %+v", st.Entries[:min(len(st.Entries), 5)])
	}
}

// `stagefs exec -C DIR` refuses a directory outside the mount (the command's
// writes would be neither staged nor captured) with the usage exit code,
// and opens no snapshot; a directory inside runs there. The snapshot list
// carries the workspace each snapshot was taken of.
func TestExecDirMustBeInsideMount(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"sub/f.txt": "f\n"}))
	outside := t.TempDir()
	r := runStagefs(t, "exec", "-m", m.mnt, "--scope", "outside", "-C", outside, "--", "sh", "-c", "echo x > y.txt")
	if r.code != 2 || !strings.Contains(r.stderr, "not inside the mount") {
		t.Errorf("exec -C outside the mount: %s; want exit 2 naming the mount", r)
	}
	if _, err := os.Stat(filepath.Join(outside, "y.txt")); err == nil {
		t.Errorf("the command ran outside the mount")
	}
	if _, ok := m.snapshotsByScope()["outside"]; ok {
		t.Errorf("a refused exec opened a snapshot")
	}

	if r := runStagefs(t, "exec", "-m", m.mnt, "--scope", "inside", "-C", m.in("sub"), "--", "sh", "-c", "echo g > g.txt"); r.code != 0 {
		t.Fatalf("exec -C inside the mount: %s", r)
	}
	assertFile(t, m.in("sub/g.txt"), "g\n")
	s := m.snapshotInfo("inside")
	if !contains(s.Paths, "sub/g.txt") || s.Workspace != m.ws {
		t.Errorf("snapshot inside = %+v, want sub/g.txt captured and workspace %s", s, m.ws)
	}
}
