package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"stagefs/control"
	"stagefs/test/agentsim"
)

// runInBranch runs script with sh at the workspace's own path inside
// branch's view (stagefs run --branch).
func (m *stagefsMount) runInBranch(branch, script string) result {
	m.t.Helper()
	return runIn(m.t, cmdSpec{dir: m.ws, env: []string{"PATH=" + filepath.Dir(goBin) + ":" + os.Getenv("PATH")}},
		stagefsBin, "run", "-m", m.mnt, "--branch", branch, "--", "sh", "-ec", script)
}

// applyBranchDiff applies `stagefs diff --branch branch` with git apply to
// a copy of the workspace and runs the shell script check in it.
func (m *stagefsMount) applyBranchDiff(branch, check string) {
	m.t.Helper()
	diff := m.mustCLI("diff", "--branch", branch, "--color", "never")
	sh(m.t, m.base, "rm -rf check && cp -r ws check && cd check && git apply - <<'EOF'\n"+diff+"EOF\n"+check)
}

func (m *stagefsMount) merge(args ...string) (control.MergeResult, result) {
	m.t.Helper()
	r := m.cli(append([]string{"merge", "--json"}, args...)...)
	var res control.MergeResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		m.t.Fatalf("stagefs merge %s: %v\n%s", strings.Join(args, " "), err, r)
	}
	return res, r
}

// Two agents work at once in two branches with real tools (sed -i, go
// build, git, rm -rf): each sees only its own changes, the main view and
// the workspace see neither; the first merge applies, the second finds the
// paths both changed in conflict, and a forced merge takes the branch's.
func TestBranchesWithRealTools(t *testing.T) {
	parallel(t)
	requireTool(t, "git")
	m := mountStagefs(t, withFiles(map[string]string{
		"go.mod":     "module app\n\ngo 1.22\n",
		"main.go":    "package main\n\nfunc main() { println(\"v0\") }\n",
		"shared.txt": "line 1\n",
		"docs/a.md":  "# a\n",
		"docs/b.md":  "# b\n",
	}))
	sh(t, m.ws, "git init -q && git add -A && git commit -qm init")
	m.mustCLI("branch", "a")
	m.mustCLI("branch", "b")
	var list control.ListBranchesResult
	if err := json.Unmarshal([]byte(m.mustCLI("branches", "--json")), &list); err != nil || len(list.Branches) != 2 {
		t.Fatalf("branches: %v %+v", err, list)
	}

	var wg sync.WaitGroup
	results := map[string]result{}
	var mu sync.Mutex
	for name, script := range map[string]string{
		"a": `sed -i s/v0/va/ main.go
go build -o app .
./app 2> out.txt
echo from-a >> shared.txt
git add -A && git commit -qm a`,
		"b": `rm -rf docs
sed -i s/v0/vb/ main.go
echo from-b >> shared.txt
echo new > b-only.txt`,
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := m.runInBranch(name, script)
			mu.Lock()
			results[name] = r
			mu.Unlock()
		}()
	}
	wg.Wait()
	for name, r := range results {
		if r.code != 0 {
			t.Fatalf("branch %s: %s", name, r)
		}
	}
	// Each branch sees its own changes only.
	if got := m.runInBranch("a", "cat main.go out.txt; ls docs; git log --format=%s | head -1").stdout; got != "package main\n\nfunc main() { println(\"va\") }\nva\na.md\nb.md\na\n" {
		t.Fatalf("branch a sees %q", got)
	}
	if got := m.runInBranch("b", "cat main.go; ls; git log --format=%s | head -1").stdout; got != "package main\n\nfunc main() { println(\"vb\") }\nb-only.txt\ngo.mod\nmain.go\nshared.txt\ninit\n" {
		t.Fatalf("branch b sees %q", got)
	}
	// Neither in the main view, nor in the workspace.
	for _, root := range []string{m.mnt, m.ws} {
		assertFile(t, filepath.Join(root, "main.go"), "package main\n\nfunc main() { println(\"v0\") }\n")
		assertFile(t, filepath.Join(root, "docs/a.md"), "# a\n")
		assertMissing(t, filepath.Join(root, "app"))
		assertMissing(t, filepath.Join(root, "b-only.txt"))
	}

	// What b changed since its fork, as git apply takes it.
	diff := m.mustCLI("diff", "--branch", "b", "--color", "never")
	for _, want := range []string{"+++ b/main.go", "-func main() { println(\"v0\") }", "+func main() { println(\"vb\") }", "deleted file mode 100644", "--- a/docs/a.md", "+from-b", "new file mode 100644"} {
		if !strings.Contains(diff, want) {
			t.Errorf("diff --branch b lacks %q:\n%s", want, diff)
		}
	}
	sh(t, m.base, "rm -rf check && cp -r ws check && cd check && git apply --check - <<'EOF'\n"+diff+"EOF\n")

	res, r := m.merge("a")
	if r.code != 0 || len(res.Conflicts) != 0 || len(res.Failed) != 0 {
		t.Fatalf("merge a: %s", r)
	}
	for _, p := range []string{"main.go", "app", "out.txt", "shared.txt"} {
		if !contains(res.Merged, p) {
			t.Errorf("merge a did not merge %s: %v", p, res.Merged)
		}
	}
	assertFile(t, m.in("shared.txt"), "line 1\nfrom-a\n")
	if got := sh(t, m.mnt, "./app 2>&1; git log --format=%s | head -1"); got != "va\na\n" {
		t.Fatalf("the main view after merging a: %q", got)
	}

	// Against the main view now, b's main.go replaces a's.
	if diff := m.mustCLI("diff", "--branch", "b", "--against", "main", "main.go", "--color", "never"); !strings.Contains(diff, "-func main() { println(\"va\") }\n+func main() { println(\"vb\") }") {
		t.Errorf("diff --branch b --against main main.go:\n%s", diff)
	}

	// b changed main.go and shared.txt too: conflicts; the rest merges.
	res, r = m.merge("b")
	if r.code != 3 {
		t.Fatalf("merge b: want exit 3 (conflicts): %s", r)
	}
	var conflicted []string
	for _, c := range res.Conflicts {
		conflicted = append(conflicted, c.Path)
	}
	if strings.Join(conflicted, " ") != "main.go shared.txt" {
		t.Fatalf("merge b conflicts: %v, want main.go and shared.txt (%s)", conflicted, r)
	}
	for _, p := range []string{"docs", "docs/a.md", "b-only.txt"} {
		if !contains(res.Merged, p) {
			t.Errorf("merge b did not merge %s: %v", p, res.Merged)
		}
	}
	assertMissing(t, m.in("docs"))
	assertFile(t, m.in("b-only.txt"), "new\n")
	assertFile(t, m.in("main.go"), "package main\n\nfunc main() { println(\"va\") }\n")

	// The conflicts stay in b until forced, path by path.
	res, r = m.merge("b", "main.go", "--force")
	if r.code != 0 || strings.Join(res.Merged, " ") != "main.go" {
		t.Fatalf("forced merge of main.go: %s", r)
	}
	assertFile(t, m.in("main.go"), "package main\n\nfunc main() { println(\"vb\") }\n")
	res, _ = m.merge("b")
	if len(res.Conflicts) != 1 || res.Conflicts[0].Path != "shared.txt" {
		t.Fatalf("after the forced merge of main.go, b still conflicts on: %+v", res.Conflicts)
	}

	// A branch commits only through its parent; the workspace has
	// changed by none of this until the main view commits.
	if r := runIn(t, cmdSpec{dir: m.ws}, stagefsBin, "commit", "-m", m.mnt, "--branch", "a"); r.code == 0 || !strings.Contains(r.stderr, "merge it") {
		t.Fatalf("commit in a branch: %s", r)
	}
	assertFile(t, m.inWS("main.go"), "package main\n\nfunc main() { println(\"v0\") }\n")
	m.commit()
	assertFile(t, m.inWS("main.go"), "package main\n\nfunc main() { println(\"vb\") }\n")
	assertMissing(t, m.inWS("docs"))
	// a's git commit, and b's changes on top of it: main.go modified,
	// docs/a.md and docs/b.md deleted, b-only.txt new.
	if got := sh(t, m.ws, "git log --format=%s | head -1; git status --short"); got != "a\n D docs/a.md\n D docs/b.md\n M main.go\n?? b-only.txt\n" {
		t.Fatalf("git in the workspace after the commit: %q", got)
	}

	// A branch's mount is not unmounted on its own.
	if r := runStagefs(t, "unmount", list.Branches[0].Mount); r.code == 0 || !strings.Contains(r.stderr, "branch --drop") {
		t.Fatalf("unmount of a branch's mount: %s", r)
	}

	// Dropping: children first.
	m.mustCLI("branch", "c", "--from", "a")
	if r := m.cli("branch", "--drop", "a"); r.code == 0 || !strings.Contains(r.stderr, "drop that first") {
		t.Fatalf("drop of a branch with a branch: %s", r)
	}
	for _, name := range []string{"c", "a", "b"} {
		m.mustCLI("branch", "--drop", name)
	}
	if got := m.mustCLI("branches"); !strings.Contains(got, "no branches") {
		t.Fatalf("branches after the drops: %q", got)
	}
	if ents, _ := os.ReadDir(filepath.Join(m.state, "branches")); len(ents) != 1 { // branches.json
		t.Fatalf("left in the state dir: %v", ents)
	}
}

// Branches survive a restart of the daemon: served again, with what is
// pending in them and their fork points, so a merge after the restart
// still tells the branch's changes from the parent's.
func TestBranchesSurviveRestart(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "base\n", "g.txt": "g\n"}))
	m.mustCLI("branch", "x")
	if r := m.runInBranch("x", "echo x > f.txt"); r.code != 0 {
		t.Fatal(r)
	}
	sh(t, m.mnt, "echo main > g.txt")
	m.unmount()
	m.mount()
	if got := m.runInBranch("x", "cat f.txt g.txt").stdout; got != "x\ng\n" {
		t.Fatalf("branch x after the restart shows %q", got)
	}
	res, r := m.merge("x")
	if r.code != 0 || fmt.Sprint(res.Merged) != "[f.txt]" {
		t.Fatalf("merge after the restart: %s", r)
	}
	assertFile(t, m.in("f.txt"), "x\n")
	assertFile(t, m.in("g.txt"), "main\n")
}

// stagefs claude --branch runs Claude Code in a branch: its tool calls are
// the branch's snapshots, its writes the branch's, and the main view sees
// them only through a merge.
func TestClaudeCodeInABranch(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "old a\n"}))
	m.mustCLI("branch", "agent")
	s := newClaudeSession(t, m, agentsim.Scripts{
		"branch prompt": {
			agentsim.Call("Bash", map[string]any{"command": "sed -i 's/old/new/' a.txt", "description": "edit"}),
			agentsim.Call("Write", map[string]any{"file_path": filepath.Join(m.ws, "written.txt"), "content": "written\n"}),
			agentsim.Text("branch done"),
		},
	})
	r := runIn(t, cmdSpec{dir: m.ws, env: append(s.srv.ClaudeEnv(s.home), "PWD="+m.ws)}, stagefsBin,
		"claude", "--branch", "agent", "--claude", s.claude, "--", "-p", "branch prompt", "--allowedTools", "Bash Write", "--output-format", "json")
	if r.code != 0 || !strings.Contains(r.stdout, "branch done") {
		t.Fatalf("stagefs claude --branch agent: %s", r)
	}
	// The summary says how a branch's work goes on: a merge, not a commit.
	if !strings.Contains(r.stderr, "stagefs merge -m") || strings.Contains(r.stderr, "stagefs commit") || strings.Contains(r.stderr, "stagefs unmount") {
		t.Errorf("the summary after Claude Code exits in a branch:\n%s", r.stderr)
	}
	assertFile(t, m.in("a.txt"), "old a\n")
	assertMissing(t, m.in("written.txt"))
	if got := m.runInBranch("agent", "cat a.txt written.txt").stdout; got != "new a\nwritten\n" {
		t.Fatalf("the branch shows %q", got)
	}
	ids := s.srv.ToolUseIDs()
	if len(ids) != 2 {
		t.Fatalf("tool calls: %v", ids)
	}
	var snaps control.ListSnapshotsResult
	if err := json.Unmarshal([]byte(m.mustCLI("snapshots", "--json", "--branch", "agent")), &snaps); err != nil {
		t.Fatal(err)
	}
	byScope := map[string][]string{}
	for _, sn := range snaps.Snapshots {
		byScope[sn.ScopeID] = sn.Paths
	}
	// (Each may hold its tool's temporary name too.)
	if !contains(byScope[ids[0]], "a.txt") || contains(byScope[ids[0]], "written.txt") ||
		!contains(byScope[ids[1]], "written.txt") || contains(byScope[ids[1]], "a.txt") {
		t.Fatalf("the branch's tool-call snapshots: %v", byScope)
	}
	if len(m.snapshotsByScope()) != 0 {
		t.Fatalf("the main view has snapshots: %v", m.snapshotsByScope())
	}
	// Undo the sed alone, in the branch; merge the rest.
	m.mustCLI("restore", ids[0], "--branch", "agent")
	res, r := m.merge("agent")
	if r.code != 0 || fmt.Sprint(res.Merged) != "[written.txt]" {
		t.Fatalf("merge: %s", r)
	}
	assertFile(t, m.in("a.txt"), "old a\n")
	assertFile(t, m.in("written.txt"), "written\n")
	assertMissing(t, m.inWS("written.txt"))
}

// A directory renamed in a branch (mv, git mv) merges whole: the old name
// gone from the main view, the new one there with the branch's changes.
func TestBranchDirectoryRenameMerges(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"docs/a.md": "# a\n", "docs/sub/b.md": "# b\n", "keep.txt": "keep\n"}))
	m.mustCLI("branch", "mover")
	if r := m.runInBranch("mover", "sed -i s/a/A/ docs/a.md && mv docs guide && echo new > guide/new.md && rm guide/sub/b.md"); r.code != 0 {
		t.Fatal(r)
	}
	m.applyBranchDiff("mover", "test ! -e docs && cat guide/a.md guide/new.md")
	res, r := m.merge("mover")
	if r.code != 0 || len(res.Conflicts)+len(res.Failed) > 0 {
		t.Fatalf("merge: %s", r)
	}
	assertMissing(t, m.in("docs"))
	assertFile(t, m.in("guide/a.md"), "# A\n")
	assertFile(t, m.in("guide/new.md"), "new\n")
	assertMissing(t, m.in("guide/sub/b.md"))
	if st, err := os.Stat(m.in("guide/sub")); err != nil || !st.IsDir() {
		t.Fatalf("guide/sub in the main view: %v", err)
	}
	assertFile(t, m.in("keep.txt"), "keep\n")
	assertFile(t, m.inWS("docs/a.md"), "# a\n")
	m.commit()
	assertMissing(t, m.inWS("docs"))
	assertFile(t, m.inWS("guide/a.md"), "# A\n")
}

// A branch in use by a run is not dropped from under it.
func TestBranchDropWaitsForItsRuns(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f": "f\n"}))
	m.mustCLI("branch", "busy")
	done := make(chan result, 1)
	go func() { done <- m.runInBranch("busy", "echo x > f; sleep 3; cat f") }()
	for i := 0; i < 100; i++ {
		if b, _ := os.ReadFile(filepath.Join(m.state, "branches", "busy", "mnt", "f")); string(b) == "x\n" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := m.cli("branch", "--drop", "busy"); r.code == 0 || !strings.Contains(r.stderr, "in use") {
		t.Fatalf("drop of a branch a run works in: %s", r)
	}
	if r := <-done; r.code != 0 || r.stdout != "x\n" {
		t.Fatalf("the run in the branch: %s", r)
	}
	m.mustCLI("branch", "--drop", "busy")
}

// A merge right after a tool wrote in the branch and exited: close(2)
// returns before the kernel sends the daemon the file's release, and the
// merge must wait for it, as a commit does, not report the file busy.
func TestBranchMergeRightAfterAWrite(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "0\n"}))
	c, err := control.Dial(m.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 1; i <= 15; i++ {
		name := "w" + strconv.Itoa(i)
		m.mustCLI("branch", name)
		var list control.ListBranchesResult
		if err := json.Unmarshal([]byte(m.mustCLI("branches", "--json")), &list); err != nil {
			t.Fatal(err)
		}
		mnt := ""
		for _, b := range list.Branches {
			if b.Name == name {
				mnt = b.Mount
			}
		}
		// Written and closed, then merged at once, as a host that
		// merges the moment its tool is done.
		if err := os.WriteFile(filepath.Join(mnt, "f.txt"), []byte(strconv.Itoa(i)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		res, err := c.Merge(context.Background(), control.MergeParams{Name: name, Force: true})
		if err != nil || len(res.Failed) > 0 || len(res.Merged) != 1 {
			t.Fatalf("merge %d right after the write: %v %+v", i, err, res)
		}
		m.mustCLI("branch", "--drop", name)
	}
	assertFile(t, m.in("f.txt"), "15\n")
	assertFile(t, m.inWS("f.txt"), "0\n")
}

// --branch picks the branch however the daemon is found: here from the
// workspace's own directory, with no -m and no STAGEFS_SOCKET, as the
// README runs the client. It once fell back to the main view there:
// a run wrote into main, and commit --branch committed main's changes to
// the workspace.
func TestBranchFlagFromTheWorkspaceDirectory(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}))
	m.mustCLI("branch", "b")
	inWS := func(args ...string) result {
		return runIn(t, cmdSpec{dir: m.ws}, stagefsBin, args...)
	}
	if r := inWS("run", "--branch", "b", "--", "sh", "-c", "echo agent-b > br.txt"); r.code != 0 {
		t.Fatal(r)
	}
	if r := inWS("status", "--branch", "b"); r.code != 0 || !strings.Contains(r.stdout, "br.txt") {
		t.Fatalf("the branch's status from the workspace: %s", r)
	}
	if r := inWS("status"); r.code != 0 || strings.Contains(r.stdout, "br.txt") {
		t.Fatalf("the main view's status shows the branch's write: %s", r)
	}
	assertMissing(t, m.in("br.txt"))
	if r := inWS("commit", "--branch", "b"); r.code == 0 {
		t.Fatalf("commit --branch was not refused: %s", r)
	}
	assertMissing(t, m.inWS("br.txt"))
	if r := inWS("status", "--branch", "nosuch"); r.code == 0 || !strings.Contains(r.stderr, "no branch") {
		t.Fatalf("an unknown branch: %s", r)
	}
}

// A merge carries the branch's owners and file times into the parent, as
// docs/branches.md says: make and tar rely on them.
func TestBranchMergeCarriesOwnersAndTimes(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n", "src/a.c": "int a;\n"}))
	m.mustCLI("branch", "b")
	if r := m.runInBranch("b", `echo new > n.txt; touch -d 2001-02-03T04:05:06 n.txt
echo more >> f.txt; touch -d 2002-01-01 f.txt
echo e >> src/a.c; chown 1234:2345 src/a.c
mkdir d; chown 4321:5432 d; echo in > d/x; touch -d 2003-03-03 d/x`); r.code != 0 {
		t.Fatal(r)
	}
	res, r := m.merge("b")
	if r.code != 0 || len(res.Conflicts)+len(res.Failed) > 0 {
		t.Fatalf("merge: %s", r)
	}
	branchView := filepath.Join(m.state, "branches", "b", "mnt")
	for _, p := range []string{"n.txt", "f.txt", "src/a.c", "d", "d/x"} {
		var want, got syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(branchView, p), &want); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Lstat(m.in(p), &got); err != nil {
			t.Fatal(err)
		}
		if got.Uid != want.Uid || got.Gid != want.Gid || got.Mode != want.Mode {
			t.Errorf("%s: owner %d:%d mode %o in the parent, %d:%d %o in the branch", p, got.Uid, got.Gid, got.Mode, want.Uid, want.Gid, want.Mode)
		}
		if want.Mode&syscall.S_IFMT != syscall.S_IFDIR && got.Mtim != want.Mtim {
			t.Errorf("%s: mtime %v in the parent, %v in the branch", p, time.Unix(got.Mtim.Unix()), time.Unix(want.Mtim.Unix()))
		}
	}
}

// A directory rename merges whole when the merge names any part of it:
// the new name, the old one or a path inside. Naming only the new name
// once merged its entries and forgot the old name's removal.
func TestBranchRenameMergesWholeWhenNamedInPart(t *testing.T) {
	parallel(t)
	for _, only := range []string{"guide", "docs", "guide/a.md"} {
		t.Run(only, func(t *testing.T) {
			m := mountStagefs(t, withFiles(map[string]string{"docs/a.md": "# a\n", "docs/sub/b.md": "# b\n", "keep.txt": "keep\n"}))
			m.mustCLI("branch", "r")
			if r := m.runInBranch("r", "mv docs guide && echo more >> guide/a.md"); r.code != 0 {
				t.Fatal(r)
			}
			res, r := m.merge("r", only)
			if r.code != 0 || len(res.Conflicts)+len(res.Failed) > 0 {
				t.Fatalf("merge r %s: %s", only, r)
			}
			assertMissing(t, m.in("docs"))
			assertFile(t, m.in("guide/a.md"), "# a\nmore\n")
			assertFile(t, m.in("guide/sub/b.md"), "# b\n")
			if res, r := m.merge("r"); r.code != 0 || len(res.Merged)+len(res.Conflicts)+len(res.Failed) > 0 {
				t.Fatalf("a second merge found more: %s", r)
			}
		})
	}
}

// A path --no-capture keeps out of snapshots still merges: the branch's
// fork point notes it changed, without its pre-image, so the merge holds
// it as a conflict and --force takes it. It was once never merged at all.
func TestBranchMergesNoCapturePaths(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n", "keep.bin": "old\n"}), withMountFlags("--no-capture", "*.bin"))
	m.mustCLI("branch", "b")
	if r := m.runInBranch("b", "echo new > new.bin; echo changed > keep.bin; echo b >> f.txt"); r.code != 0 {
		t.Fatal(r)
	}
	// The diff shows keep.bin against the parent's version (its version
	// at the fork is not known), so git apply takes it on the workspace.
	m.applyBranchDiff("b", "cat keep.bin new.bin f.txt")
	res, r := m.merge("b")
	if r.code != 3 || len(res.Conflicts) != 2 {
		t.Fatalf("merge: want the two .bin files in conflict (exit 3): %s", r)
	}
	assertFile(t, m.in("f.txt"), "f\nb\n")
	assertMissing(t, m.in("new.bin"))
	assertFile(t, m.in("keep.bin"), "old\n")
	if res, r := m.merge("b", "--force"); r.code != 0 || len(res.Conflicts)+len(res.Failed) > 0 {
		t.Fatalf("forced merge: %s", r)
	}
	assertFile(t, m.in("new.bin"), "new\n")
	assertFile(t, m.in("keep.bin"), "changed\n")
	assertFile(t, m.inWS("keep.bin"), "old\n")
}

// A file the branch adds under a directory the parent removed since the
// fork is a conflict: merging it would bring the directory back. --force
// does.
func TestBranchMergeIntoADirectoryTheParentRemoved(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"src/a.c": "a\n", "src/sub/z.c": "z\n"}))
	m.mustCLI("branch", "b")
	if r := m.runInBranch("b", "echo new > src/sub/new.c; mkdir made; echo m > made/m.c"); r.code != 0 {
		t.Fatal(r)
	}
	sh(t, m.mnt, "rm -rf src")
	res, r := m.merge("b")
	if r.code != 3 || len(res.Conflicts) != 1 || res.Conflicts[0].Path != "src/sub/new.c" || !strings.Contains(res.Conflicts[0].Parent, "src was removed") {
		t.Fatalf("merge: want src/sub/new.c in conflict: %s", r)
	}
	assertMissing(t, m.in("src"))
	assertFile(t, m.in("made/m.c"), "m\n") // a directory the branch made merges as ever
	if res, r := m.merge("b", "--force"); r.code != 0 || len(res.Conflicts)+len(res.Failed) > 0 || len(res.Merged) == 0 {
		t.Fatalf("forced merge: %s", r)
	}
	assertFile(t, m.in("src/sub/new.c"), "new\n")
}

// A fork answers before its copy, while the parent goes on. A file made
// with O_TMPFILE and named with linkat, written through its descriptor
// after the fork answered, bypasses the daemon: the fork must hold its
// version of the instant (the copy reaches it last here: 3,000 pending
// files before it).
func TestForkKeepsAnAnonymousFileWrittenAfterIt(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	sh(t, m.mnt, "mkdir many && cd many && seq 1 3000 | xargs -n 500 touch && mkdir -p ../zz/zz")
	dir := filepath.Join(m.mnt, "zz", "zz")
	fd, err := syscall.Open(dir, unix.O_TMPFILE|syscall.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if _, err := syscall.Write(fd, []byte("at the fork\n")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Linkat(fd, "", unix.AT_FDCWD, filepath.Join(dir, "f"), unix.AT_EMPTY_PATH); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	c := m.dial()
	if _, err := c.CreateBranch(ctx, control.BranchParams{Name: "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := syscall.Pwrite(fd, []byte("AFTER"), 0); err != nil {
		t.Fatal(err)
	}
	res, err := c.ListBranches(ctx) // waits for the branch to be served
	if err != nil || len(res.Branches) != 1 || res.Branches[0].Mount == "" {
		t.Fatalf("branches: %+v, %v", res, err)
	}
	assertFile(t, filepath.Join(res.Branches[0].Mount, "zz", "zz", "f"), "at the fork\n")
	assertFile(t, filepath.Join(dir, "f"), "AFTERe fork\n")
}
