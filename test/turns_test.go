package test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"stagefs/control"
)

// Integration tests of turns through the real mount: stagefs turn,
// checkpoints, rollback (with --diff, --force and paths) and redo, with
// real tools writing in the mount, across a restart, in immediate mode, with
// retention and with --no-capture.

// treeHash condenses a tree into one hash: the "tree hash" recorded at the
// start of each turn.
func treeHash(tr tree) string {
	keys := make([]string, 0, len(tr))
	for k := range tr {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s\t%s\n", k, tr[k])
	}
	return sha256Hex([]byte(b.String()))
}

// assertTreeHash compares got against want by hash and lists the
// differences when they differ.
func assertTreeHash(t testing.TB, what string, want, got tree) {
	t.Helper()
	if hw, hg := treeHash(want), treeHash(got); hw != hg {
		t.Errorf("%s: tree hash %.12s, want %.12s:\n%s", what, hg, hw, diffTrees(want, got))
	}
}

// startTurn runs `stagefs turn ID --label LABEL`.
func (m *stagefsMount) startTurn(id, label string) control.TurnInfo {
	m.t.Helper()
	out := m.mustCLI("turn", id, "--label", label, "--json")
	var ti control.TurnInfo
	if err := json.Unmarshal([]byte(out), &ti); err != nil {
		m.t.Fatalf("turn --json: %v\n%s", err, out)
	}
	if ti.TurnID != id || !ti.Open {
		m.t.Fatalf("stagefs turn %s = %+v", id, ti)
	}
	return ti
}

// checkpoints runs `stagefs checkpoints --json`.
func (m *stagefsMount) checkpoints() []control.TurnInfo {
	m.t.Helper()
	out := m.mustCLI("checkpoints", "--json")
	var res control.CheckpointsResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		m.t.Fatalf("checkpoints --json: %v\n%s", err, out)
	}
	return res.Turns
}

func turnIDs(ts []control.TurnInfo) []string {
	ids := []string{}
	for _, t := range ts {
		ids = append(ids, t.TurnID)
	}
	return ids
}

// rollbackJSON runs `stagefs rollback ARGS... --json` and decodes the result
// whatever the exit code (3 with conflicts).
func (m *stagefsMount) rollbackJSON(args ...string) (control.RollbackResult, result) {
	m.t.Helper()
	r := m.cliFlagsFirst(append([]string{"rollback", "--json"}, args...)...)
	var res control.RollbackResult
	if r.code == 0 || r.code == 3 {
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			m.t.Fatalf("rollback --json %v: %v\n%s", args, err, r)
		}
	}
	return res, r
}

// cliFlagsFirst is cli with -m MOUNTPOINT right after the command name, so
// that it stays a flag when args hold "-- PATH...".
func (m *stagefsMount) cliFlagsFirst(args ...string) result {
	m.t.Helper()
	return runStagefs(m.t, append([]string{args[0], "-m", m.mnt}, args[1:]...)...)
}

// mustRollback rolls back to the start of turn and fails the test unless it
// exits 0 with no conflicts and nothing failed.
func (m *stagefsMount) mustRollback(turn string) control.RollbackResult {
	m.t.Helper()
	res, r := m.rollbackJSON(turn)
	if r.code != 0 || len(res.Conflicts)+len(res.Failed) > 0 {
		m.t.Fatalf("stagefs rollback %s: %s", turn, r)
	}
	if res.TurnID != turn {
		m.t.Errorf("rollback %s: turnId %q", turn, res.TurnID)
	}
	return res
}

func (m *stagefsMount) mustRedo() control.RollbackResult {
	m.t.Helper()
	out := m.mustCLI("redo", "--json")
	var res control.RollbackResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		m.t.Fatalf("redo --json: %v\n%s", err, out)
	}
	if len(res.Failed) > 0 {
		m.t.Fatalf("redo: failed %+v", res.Failed)
	}
	return res
}

// goEnv is the environment of a go build in the mount: the build cache
// outside the mount (the default one, warm from building stagefs, when
// there is one), no network, no toolchain switch, no VCS stamping.
func goEnv(t *testing.T) []string {
	t.Helper()
	cache := strings.TrimSpace(mustRun(t, cmdSpec{}, goBin, "env", "GOCACHE"))
	if cache == "" || cache == "off" || !filepath.IsAbs(cache) {
		cache = t.TempDir()
	}
	return []string{
		"GOCACHE=" + cache,
		"GOFLAGS=-mod=mod -buildvcs=false",
		"GOTOOLCHAIN=local",
		"GOPATH=" + t.TempDir(),
		"GOWORK=off",
		"GOPROXY=off",
		"CGO_ENABLED=0",
	}
}

// blobBytes sums the stored bodies under STATE/snapshots/blobs.
func blobBytes(t *testing.T, state string) (n int, size int64) {
	t.Helper()
	dir := filepath.Join(state, "snapshots", "blobs")
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n++
			size += fi.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return n, size
}

var turnsWorkspace = map[string]string{
	"a.txt":         "alpha\nbeta\ngamma\n",
	"b.txt":         "one\ntwo\nthree\n",
	"c.txt":         "gone soon\n",
	"lib/x.txt":     "x one\nx two\n",
	"lib/sub/y.txt": "y\n",
	"repo/README":   "readme\n",
	"hello/go.mod":  "module hello\n\ngo 1.21\n",
	"hello/main.go": "package main\n\nimport \"os\"\n\nfunc main() { os.Stdout.WriteString(\"hello from turn 3\\n\") }\n",
}

// 1. Three turns of real tools; rollback to the start of each one gives the
// tree recorded there, the workspace never changes, redo gives the end.
func TestTurnsRealToolsRollbackRedo(t *testing.T) {
	parallel(t)
	requireTool(t, "git")
	requireTool(t, "sed")
	m := mountStagefs(t, withFiles(turnsWorkspace))
	ws := snapshot(t, m.ws)
	env := goEnv(t)
	var starts []tree

	starts = append(starts, snapshot(t, m.mnt))
	m.startTurn("t1", "edit and make a repo")
	sh(t, m.mnt, "sed -i s/beta/BETA/ a.txt; sed -i -e s/two/TWO/ -e '$a four' b.txt")
	repo := m.in("repo")
	git(t, repo, "init", "-q")
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-q", "-m", "first")

	starts = append(starts, snapshot(t, m.mnt))
	m.startTurn("t2", "delete and move")
	sh(t, m.mnt, "rm c.txt repo/README; mv lib lib2; sed -i 's/x two/x TWO/' lib2/x.txt")
	git(t, repo, "commit", "-q", "-a", "-m", "remove README")

	starts = append(starts, snapshot(t, m.mnt))
	m.startTurn("t3", "build")
	mustRun(t, cmdSpec{dir: m.in("hello"), env: env}, goBin, "build", "-o", "out/hello", ".")
	sh(t, m.mnt, "mkdir -p out/gen; echo built > out/stamp; for i in 1 2 3; do echo $i > out/gen/f$i; done")
	if out := mustRun(t, cmdSpec{dir: m.in("hello")}, "./out/hello"); out != "hello from turn 3\n" {
		t.Fatalf("the built binary printed %q", out)
	}
	end := snapshot(t, m.mnt)
	assertSameTree(t, "workspace after three turns", ws, snapshot(t, m.ws))

	// checkpoints: newest first, labels, file counts.
	cps := m.checkpoints()
	if got := turnIDs(cps); strings.Join(got, " ") != "t3 t2 t1" {
		t.Fatalf("checkpoints: turns %v, want t3 t2 t1", got)
	}
	labels := map[string]string{"t1": "edit and make a repo", "t2": "delete and move", "t3": "build"}
	for i, c := range cps {
		if c.Label != labels[c.TurnID] || c.Files == 0 || c.Files != len(c.Paths) || c.Started == "" || c.Open != (i == 0) {
			t.Errorf("checkpoint %d = %+v, want label %q, files > 0 and = len(paths), open only for the newest", i, c, labels[c.TurnID])
		}
		if i > 0 && c.Started > cps[i-1].Started {
			t.Errorf("checkpoints not newest first: %s started %s after %s (%s)", c.TurnID, c.Started, cps[i-1].TurnID, cps[i-1].Started)
		}
	}
	for _, want := range [][2]string{
		{"t1", "a.txt"}, {"t1", "b.txt"}, {"t1", "repo/.git"},
		{"t2", "c.txt"}, {"t2", "repo/README"}, {"t2", "lib"}, {"t2", "lib2"}, {"t2", "lib2/x.txt"},
		{"t3", "hello/out/hello"}, {"t3", "out/stamp"},
	} {
		for _, c := range cps {
			if c.TurnID == want[0] && !contains(c.Paths, want[1]) {
				t.Errorf("checkpoint %s does not list %s: %v", want[0], want[1], c.Paths)
			}
		}
	}
	for _, c := range cps {
		if c.TurnID != "t1" && contains(c.Paths, "a.txt") {
			t.Errorf("checkpoint %s lists a.txt, which only t1 changed", c.TurnID)
		}
	}

	for k := 2; k >= 0; k-- {
		id := fmt.Sprintf("t%d", k+1)
		res := m.mustRollback(id)
		if len(res.RestoredPaths) == 0 {
			t.Errorf("rollback %s restored nothing", id)
		}
		assertTreeHash(t, "mount after rollback to the start of "+id, starts[k], snapshot(t, m.mnt))
		assertSameTree(t, "workspace after rollback "+id, ws, snapshot(t, m.ws))
		m.mustRedo()
		assertTreeHash(t, "mount after redo of rollback "+id, end, snapshot(t, m.mnt))
		assertSameTree(t, "workspace after redo "+id, ws, snapshot(t, m.ws))
		if t.Failed() {
			t.FailNow()
		}
	}
	if out := mustRun(t, cmdSpec{dir: m.in("hello")}, "./out/hello"); out != "hello from turn 3\n" {
		t.Errorf("the built binary after the redos printed %q", out)
	}
	if out := git(t, repo, "log", "--format=%s"); out != "remove README\nfirst\n" {
		t.Errorf("git log after the redos: %q", out)
	}
	if r := runIn(t, cmdSpec{dir: repo}, "git", "fsck", "--full", "--strict"); r.code != 0 {
		t.Errorf("git fsck after the redos: %s", r)
	}
	// The turns are all still there; committing the end state lands it.
	if got := turnIDs(m.checkpoints()); strings.Join(got, " ") != "t3 t2 t1" {
		t.Errorf("checkpoints after rollbacks and redos: %v", got)
	}
	m.commit()
	assertSameTree(t, "workspace after commit vs the end of t3", end, snapshot(t, m.ws))
}

// applyDiff copies the mount's tree to a new directory, applies diff there
// with git apply and returns the resulting tree.
func applyDiff(t *testing.T, m *stagefsMount, diff string) tree {
	t.Helper()
	dir := t.TempDir()
	sh(t, "/", fmt.Sprintf("cp -a %q/. %q/", m.mnt, dir))
	patch := filepath.Join(t.TempDir(), "rollback.diff")
	if err := os.WriteFile(patch, []byte(diff), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := runIn(t, cmdSpec{dir: dir}, "git", "apply", "-p1", patch); r.code != 0 {
		t.Fatalf("git apply of the rollback diff: %s\ndiff:\n%s", r, diff)
	}
	return snapshot(t, dir)
}

// 2. rollback --diff changes nothing; its output, applied with git apply to
// a copy of the view, gives the tree at the turn's start.
func TestTurnsRollbackDiff(t *testing.T) {
	parallel(t)
	requireTool(t, "git")
	m := mountStagefs(t, withFiles(map[string]string{
		"a.txt": "alpha\nbeta\n", "b.txt": "one\ntwo\n", "c.txt": "gone\n", "d/x.txt": "x\n", "d/y.txt": "y\n",
	}))
	m.startTurn("t1", "edit")
	sh(t, m.mnt, "sed -i s/beta/BETA/ a.txt; echo new > n.txt")
	s2 := snapshot(t, m.mnt)
	m.startTurn("t2", "delete and edit")
	sh(t, m.mnt, "rm c.txt; sed -i s/two/TWO/ b.txt; rm d/y.txt; echo x2 >> d/x.txt")
	m.startTurn("t3", "generate")
	sh(t, m.mnt, "mkdir -p out/sub; echo o > out/o; echo p > out/sub/p; sed -i s/alpha/ALPHA/ a.txt; chmod +x b.txt")
	end := snapshot(t, m.mnt)
	pending := statusKinds(m.status())

	r := m.cli("rollback", "--diff", "t2")
	if r.code != 0 {
		t.Fatalf("rollback --diff t2: %s", r)
	}
	for _, p := range []string{"a.txt", "b.txt", "c.txt", "d/x.txt", "d/y.txt", "out/o", "out/sub/p"} {
		if !strings.Contains(r.stdout, "diff --git a/"+p+" b/"+p+"\n") {
			t.Errorf("rollback --diff t2 does not show %s:\n%s", p, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "n.txt") {
		t.Errorf("rollback --diff t2 shows n.txt, which t1 created:\n%s", r.stdout)
	}
	assertTreeHash(t, "mount after rollback --diff", end, snapshot(t, m.mnt))
	assertPending(t, m, "after rollback --diff", pending)
	if got := turnIDs(m.checkpoints()); strings.Join(got, " ") != "t3 t2 t1" {
		t.Errorf("checkpoints after rollback --diff: %v", got)
	}
	if !m.checkpoints()[0].Open {
		t.Errorf("rollback --diff ended the open turn")
	}
	// With --json the diff is in the result.
	res, rj := m.rollbackJSON("--diff", "t2")
	if rj.code != 0 || res.Diff != r.stdout || len(res.RestoredPaths) != 0 {
		t.Errorf("rollback --diff --json: diff differs from the text output or restored %v: %s", res.RestoredPaths, rj)
	}

	assertTreeHash(t, "the view with the rollback diff applied vs the start of t2", s2, applyDiff(t, m, r.stdout))
	// And the real rollback agrees.
	m.mustRollback("t2")
	assertTreeHash(t, "mount after rollback t2", s2, snapshot(t, m.mnt))
}

// 2b. rollback --diff across a directory move: applied, the diff must give
// the tree at the turn's start, with the directory back at its old name.
func TestTurnsRollbackDiffDirMove(t *testing.T) {
	parallel(t)
	requireTool(t, "git")
	m := mountStagefs(t, withFiles(map[string]string{
		"a.txt": "a\n", "lib/x": "x1\n", "lib/y": "y\n",
	}))
	start := snapshot(t, m.mnt)
	m.startTurn("t1", "move")
	sh(t, m.mnt, "mv lib lib2; echo x2 > lib2/x")
	end := snapshot(t, m.mnt)

	r := m.cli("rollback", "--diff", "t1")
	if r.code != 0 {
		t.Fatalf("rollback --diff t1: %s", r)
	}
	assertTreeHash(t, "mount after rollback --diff", end, snapshot(t, m.mnt))
	for _, p := range []string{"lib/x", "lib/y"} {
		if !strings.Contains(r.stdout, " b/"+p+"\n") {
			t.Errorf("rollback --diff t1 does not bring back %s (lib2 moves back to lib):\n%s", p, r.stdout)
		}
	}
	assertTreeHash(t, "the view with the rollback diff applied vs the start of t1", start, applyDiff(t, m, r.stdout))
	m.mustRollback("t1")
	assertTreeHash(t, "mount after rollback t1", start, snapshot(t, m.mnt))
}

// 3. A user's edit made directly in the workspace after the turns were
// committed is a conflict: kept in the view and reported (exit 3), until
// --force.
func TestTurnsConflictWithWorkspaceEdit(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a0\n", "b.txt": "b0\n", "c.txt": "c0\n"}))
	start := snapshot(t, m.mnt)
	m.startTurn("t1", "edit a and b")
	sh(t, m.mnt, "sed -i s/a0/a1/ a.txt; sed -i s/b0/b1/ b.txt")
	m.startTurn("t2", "edit c")
	sh(t, m.mnt, "echo c2 > c.txt")
	m.startTurn("t3", "")
	if cr := m.commit(); len(cr.Conflicts)+len(cr.Failed) != 0 {
		t.Fatalf("commit: %+v", cr)
	}
	assertFile(t, m.inWS("b.txt"), "b1\n")
	assertNothingPending(t, m, "after commit")

	// The user edits b.txt in the workspace.
	if err := os.WriteFile(m.inWS("b.txt"), []byte("user\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { b, _ := os.ReadFile(m.in("b.txt")); return string(b) == "user\n" }) {
		t.Fatalf("the workspace edit does not show through the mount: %q", readFile(t, m.in("b.txt")))
	}

	// --diff --json reports the conflict and changes nothing.
	res, rj := m.rollbackJSON("--diff", "t1")
	if rj.code != 0 || len(res.Conflicts) != 1 || res.Conflicts[0].Path != "b.txt" || res.Conflicts[0].Reason == "" {
		t.Errorf("rollback --diff --json t1: want one conflict on b.txt: %+v\n%s", res, rj)
	}
	if !strings.Contains(res.Diff, "b/a.txt") || !strings.Contains(res.Diff, "b/c.txt") {
		t.Errorf("rollback --diff t1 should show a.txt and c.txt:\n%s", res.Diff)
	}
	assertFile(t, m.in("a.txt"), "a1\n")
	assertFile(t, m.in("b.txt"), "user\n")

	r := m.cli("rollback", "t1")
	if r.code != 3 {
		t.Fatalf("rollback t1 over a workspace edit: want exit 3, got %s", r)
	}
	if !strings.Contains(r.stdout, "conflict  b.txt") || !strings.Contains(r.stderr, "--force") {
		t.Errorf("rollback t1 does not report the conflict on b.txt: %s", r)
	}
	if strings.Contains(r.stdout, "conflict  a.txt") || strings.Contains(r.stdout, "conflict  c.txt") {
		t.Errorf("rollback t1 reports conflicts on unchanged paths: %s", r)
	}
	assertFile(t, m.in("b.txt"), "user\n")
	assertFile(t, m.in("a.txt"), "a0\n")
	assertFile(t, m.in("c.txt"), "c0\n")
	assertFile(t, m.inWS("b.txt"), "user\n")
	assertFile(t, m.inWS("a.txt"), "a1\n") // staged: the workspace keeps the commit

	// --force overwrites it.
	res, rj = m.rollbackJSON("t1", "--force")
	if rj.code != 0 || len(res.Conflicts)+len(res.Failed) != 0 || !contains(res.RestoredPaths, "b.txt") {
		t.Fatalf("rollback t1 --force: %+v\n%s", res, rj)
	}
	assertFile(t, m.in("b.txt"), "b0\n")
	assertTreeHash(t, "mount after rollback t1 --force", start, snapshot(t, m.mnt))
	assertFile(t, m.inWS("b.txt"), "user\n")
}

// 3b. An edit made through the mount outside any turn (after a rollback
// ended the open one) is a conflict too.
func TestTurnsConflictWithEditOutsideTurn(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a0\n", "b.txt": "b0\n", "c.txt": "c0\n"}))
	m.startTurn("t1", "")
	sh(t, m.mnt, "echo a1 > a.txt; echo b1 > b.txt")
	m.startTurn("t2", "")
	sh(t, m.mnt, "echo c2 > c.txt")
	m.mustRollback("t2") // ends t2; no turn is open now
	if cps := m.checkpoints(); len(cps) != 2 || cps[0].Open {
		t.Errorf("after a rollback no turn should be open: %+v", cps)
	}
	sh(t, m.mnt, "echo mine > b.txt")

	r := m.cliFlagsFirst("rollback", "t1", "--", "b.txt", "a.txt")
	if r.code != 3 || !strings.Contains(r.stdout, "conflict  b.txt") {
		t.Fatalf("rollback t1 over an edit outside a turn: want exit 3 and a conflict on b.txt: %s", r)
	}
	assertFile(t, m.in("b.txt"), "mine\n")
	assertFile(t, m.in("a.txt"), "a0\n")
}

// 4. The first write after a rollback clears redo.
func TestTurnsWriteAfterRollbackClearsRedo(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a0\n", "b.txt": "b0\n"}))
	if r := m.cli("redo"); r.code == 0 || !strings.Contains(r.stderr, "nothing to redo") {
		t.Errorf("redo with no rollback: want a failure saying nothing to redo: %s", r)
	}
	m.startTurn("t1", "")
	sh(t, m.mnt, "echo a1 > a.txt")
	m.startTurn("t2", "")
	sh(t, m.mnt, "echo b2 > b.txt")
	m.mustRollback("t2")
	assertFile(t, m.in("b.txt"), "b0\n")

	sh(t, m.mnt, "echo new > new.txt")
	r := m.cli("redo")
	if r.code == 0 {
		t.Fatalf("redo after a new write succeeded: %s", r)
	}
	if msg := r.stdout + r.stderr; !strings.Contains(msg, "redo was cleared") && !strings.Contains(msg, "nothing to redo") {
		t.Errorf("redo after a new write: the message does not say redo was cleared: %s", r)
	}
	assertFile(t, m.in("b.txt"), "b0\n")
	assertFile(t, m.in("a.txt"), "a1\n")
	assertFile(t, m.in("new.txt"), "new\n")
	// It stays cleared.
	if r := m.cli("redo"); r.code == 0 {
		t.Errorf("a second redo succeeded: %s", r)
	}
	assertFile(t, m.in("b.txt"), "b0\n")
}

// 5. Turns survive a restart between turns.
func TestTurnsRestartBetweenTurns(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{
		"a.txt": "a0\n", "c.txt": "c\n", "d/x": "x\n", "d/sub/y": "y\n",
	}))
	ws := snapshot(t, m.ws)
	var starts []tree
	starts = append(starts, snapshot(t, m.mnt))
	m.startTurn("t1", "edit")
	sh(t, m.mnt, "sed -i s/a0/a1/ a.txt; echo n > n.txt")
	starts = append(starts, snapshot(t, m.mnt))
	m.startTurn("t2", "move")
	sh(t, m.mnt, "rm c.txt; mv d d2; echo x2 > d2/x")

	m.unmount()
	m.mount()

	if cps := m.checkpoints(); strings.Join(turnIDs(cps), " ") != "t2 t1" || cps[1].Label != "edit" {
		t.Errorf("checkpoints after restart: %+v", cps)
	}
	starts = append(starts, snapshot(t, m.mnt))
	m.startTurn("t3", "after restart")
	sh(t, m.mnt, "sed -i s/a1/a3/ a.txt; mkdir out; echo o > out/o; rm d2/sub/y")
	end := snapshot(t, m.mnt)
	if got := turnIDs(m.checkpoints()); strings.Join(got, " ") != "t3 t2 t1" {
		t.Errorf("checkpoints: %v", got)
	}

	m.mustRollback("t1")
	assertTreeHash(t, "mount after rollback t1", starts[0], snapshot(t, m.mnt))
	assertSameTree(t, "workspace", ws, snapshot(t, m.ws))
	assertNothingPending(t, m, "rolled back to the start of t1")
	m.mustRedo()
	assertTreeHash(t, "mount after redo", end, snapshot(t, m.mnt))
	m.mustRollback("t3")
	assertTreeHash(t, "mount after rollback t3", starts[2], snapshot(t, m.mnt))
	assertSameTree(t, "workspace at the end", ws, snapshot(t, m.ws))
}

// 6a. --max-turns keeps the newest turns.
func TestTurnsPruneByCount(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f0\n"}), withMountFlags("--max-turns", "3"))
	for i := 1; i <= 6; i++ {
		m.startTurn(fmt.Sprintf("t%d", i), fmt.Sprintf("turn %d", i))
		sh(t, m.mnt, fmt.Sprintf("echo f%d > f.txt; echo %d > g%d.txt", i, i, i))
	}
	cps := m.checkpoints()
	if got := turnIDs(cps); strings.Join(got, " ") != "t6 t5 t4" {
		t.Fatalf("checkpoints with --max-turns 3: %v, want t6 t5 t4", got)
	}
	if cps[2].Label != "turn 4" {
		t.Errorf("the oldest kept turn: %+v", cps[2])
	}
	if r := m.cli("rollback", "t1"); r.code == 0 || r.code == 3 {
		t.Errorf("rollback to a pruned turn: want an error, got %s", r)
	}
	m.mustRollback("t4")
	assertFile(t, m.in("f.txt"), "f3\n")
	for i := 1; i <= 6; i++ {
		p := m.in(fmt.Sprintf("g%d.txt", i))
		if i <= 3 {
			assertFile(t, p, fmt.Sprintf("%d\n", i))
		} else {
			assertMissing(t, p)
		}
	}
}

// 6b. --max-turn-age prunes old turns at the next turn start, and their
// bodies.
func TestTurnsPruneByAge(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f0\n", "g.txt": "g0\n"}), withMountFlags("--max-turn-age", "1s"))
	m.startTurn("t1", "")
	sh(t, m.mnt, "echo f1 > f.txt")
	m.startTurn("t2", "")
	sh(t, m.mnt, "echo g2 > g.txt")
	if got := turnIDs(m.checkpoints()); strings.Join(got, " ") != "t2 t1" {
		t.Fatalf("checkpoints before the turns age: %v", got)
	}
	if n, _ := blobBytes(t, m.state); n == 0 {
		t.Errorf("no bodies stored for the two turns")
	}
	time.Sleep(1200 * time.Millisecond)
	m.startTurn("t3", "")
	if got := turnIDs(m.checkpoints()); strings.Join(got, " ") != "t3" {
		t.Errorf("checkpoints after 1.2s with --max-turn-age 1s: %v, want t3 alone", got)
	}
	if n, size := blobBytes(t, m.state); n != 0 {
		t.Errorf("the pruned turns' bodies were not collected: %d blob(s), %d bytes", n, size)
	}
	if r := m.cli("rollback", "t1"); r.code == 0 || r.code == 3 {
		t.Errorf("rollback to a pruned turn: want an error, got %s", r)
	}
	assertFile(t, m.in("f.txt"), "f1\n")
}

// 6c. --snapshot-cap evicts the oldest closed turns.
func TestTurnsPruneByBytes(t *testing.T) {
	parallel(t)
	const byteCap, fileSize, turns = 4096, 3 << 10, 6
	files := map[string]string{}
	for i := 1; i <= turns; i++ {
		files[fmt.Sprintf("f%d", i)] = strings.Repeat(fmt.Sprintf("%d", i), fileSize)
	}
	m := mountStagefs(t, withFiles(files), withMountFlags("--snapshot-cap", fmt.Sprint(byteCap)))
	for i := 1; i <= turns; i++ {
		m.startTurn(fmt.Sprintf("t%d", i), "")
		// A 3 KiB pre-image per turn, distinct bodies.
		sh(t, m.mnt, fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x%d > f%d", fileSize, i, i))
	}
	m.startTurn("t-last", "")
	cps := m.checkpoints()
	if len(cps) >= turns+1 || len(cps) == 0 || cps[0].TurnID != "t-last" {
		t.Errorf("checkpoints with --snapshot-cap %d: %v, want the oldest turns evicted", byteCap, turnIDs(cps))
	}
	for _, c := range cps {
		if c.TurnID == "t1" || c.TurnID == "t2" {
			t.Errorf("turn %s kept past the byte cap: %v", c.TurnID, turnIDs(cps))
		}
	}
	n, size := blobBytes(t, m.state)
	t.Logf("--snapshot-cap %d: turns kept %v, %d bodies, %d bytes", byteCap, turnIDs(cps), n, size)
	if size > byteCap+fileSize {
		t.Errorf("blobs hold %d bytes in %d bodies, want at most the cap %d plus one turn's %d", size, n, byteCap, fileSize)
	}
	// The newest kept turn still rolls back.
	if len(cps) > 1 {
		id := cps[1].TurnID
		m.mustRollback(id)
		i := strings.TrimPrefix(id, "t")
		assertFile(t, m.in("f"+i), files["f"+i])
	}
}

// 7. In immediate mode a turn writes the workspace and rollback writes the
// workspace back.
func TestTurnsImmediateMode(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{
		"a.txt": "alpha\nbeta\n", "c.txt": "c\n", "d/x": "x\n", "d/sub/y": "y\n",
	}), withMountFlags("--mode", "immediate"))
	var starts []tree
	starts = append(starts, snapshot(t, m.ws))
	m.startTurn("t1", "")
	sh(t, m.mnt, "sed -i s/beta/BETA/ a.txt; rm c.txt; mkdir -p out; echo o > out/o")
	assertFile(t, m.inWS("a.txt"), "alpha\nBETA\n")
	assertMissing(t, m.inWS("c.txt"))
	starts = append(starts, snapshot(t, m.ws))
	m.startTurn("t2", "")
	sh(t, m.mnt, "mv d d2; echo x2 > d2/x; sed -i s/alpha/ALPHA/ a.txt")
	assertFile(t, m.inWS("d2/x"), "x2\n")
	end := snapshot(t, m.ws)
	assertNothingPending(t, m, "immediate mode")

	m.mustRollback("t2")
	assertTreeHash(t, "workspace after rollback t2", starts[1], snapshot(t, m.ws))
	assertTreeHash(t, "mount after rollback t2", starts[1], snapshot(t, m.mnt))
	m.mustRedo()
	assertTreeHash(t, "workspace after redo", end, snapshot(t, m.ws))
	m.mustRollback("t1")
	assertTreeHash(t, "workspace after rollback t1", starts[0], snapshot(t, m.ws))
	assertTreeHash(t, "mount after rollback t1", starts[0], snapshot(t, m.mnt))
	assertNothingPending(t, m, "immediate mode after rollback")
}

// 8. --no-capture: a matching tree is staged but not captured, so rollback
// leaves it.
func TestTurnsNoCapture(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a0\n"}), withMountFlags("--no-capture", "node_modules"))
	m.startTurn("t1", "install")
	sh(t, m.mnt, "mkdir -p node_modules/pkg; echo x > node_modules/x; echo p > node_modules/pkg/index.js; echo a1 > a.txt")
	cps := m.checkpoints()
	if len(cps) != 1 || !contains(cps[0].Paths, "a.txt") {
		t.Fatalf("checkpoints: %+v", cps)
	}
	for _, p := range cps[0].Paths {
		if strings.Contains(p, "node_modules") {
			t.Errorf("turn t1 captured %s despite --no-capture node_modules", p)
		}
	}
	m.mustRollback("t1")
	assertFile(t, m.in("a.txt"), "a0\n")
	assertFile(t, m.in("node_modules/x"), "x\n")
	assertFile(t, m.in("node_modules/pkg/index.js"), "p\n")
	assertPending(t, m, "after rollback", map[string]string{
		"node_modules": "mkdir", "node_modules/x": "create", "node_modules/pkg": "mkdir", "node_modules/pkg/index.js": "create",
	})
}

// 9. Stepping back one turn at a time: each rollback goes one turn further
// back without conflicts, and repeating one changes nothing. A path a
// previous rollback already put back is at the rollback's target, not
// "changed after the turn by someone else".
func TestTurnsSuccessiveRollbacks(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a0\n", "b.txt": "b0\n", "c.txt": "c0\n"}))
	var starts []tree
	for i, f := range []string{"a.txt", "b.txt", "c.txt"} {
		starts = append(starts, snapshot(t, m.mnt))
		m.startTurn(fmt.Sprintf("t%d", i+1), "")
		sh(t, m.mnt, fmt.Sprintf("sed -i s/0/%d/ %s; echo %d > new%d.txt", i+1, f, i+1, i+1))
	}
	for k := 2; k >= 0; k-- {
		id := fmt.Sprintf("t%d", k+1)
		res, r := m.rollbackJSON(id)
		if r.code != 0 || len(res.Conflicts)+len(res.Failed) > 0 {
			t.Errorf("rollback %s after rolling back the later turns: want exit 0 and no conflicts: %s", id, r)
		}
		assertTreeHash(t, "mount after rollback "+id, starts[k], snapshot(t, m.mnt))
	}
	if res, r := m.rollbackJSON("t1"); r.code != 0 || len(res.Conflicts) > 0 {
		t.Errorf("rollback t1 repeated: want exit 0 and no conflicts: %s", r)
	}
	assertTreeHash(t, "mount after a repeated rollback t1", starts[0], snapshot(t, m.mnt))
	assertNothingPending(t, m, "rolled back to the start of t1")
}

// 10. Redo of a rolled-back directory move puts the move back, not a copy:
// the pending set is the one before the rollback, and rolling back again
// leaves nothing pending.
func TestTurnsRedoDirMoveKeepsRename(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"lib/x": "x\n", "lib/sub/y": "y\n"}))
	start := snapshot(t, m.mnt)
	m.startTurn("t1", "move")
	sh(t, m.mnt, "mv lib lib2")
	end := snapshot(t, m.mnt)
	moved := statusKinds(m.status())
	if moved["lib2"] != "rename<-lib" {
		t.Fatalf("status after mv lib lib2: %v", moved)
	}

	m.mustRollback("t1")
	assertTreeHash(t, "mount after rollback", start, snapshot(t, m.mnt))
	assertNothingPending(t, m, "after rollback")
	m.mustRedo()
	assertTreeHash(t, "mount after redo", end, snapshot(t, m.mnt))
	assertPending(t, m, "after redo", moved)
	m.mustRollback("t1")
	assertTreeHash(t, "mount after the second rollback", start, snapshot(t, m.mnt))
	assertNothingPending(t, m, "after the second rollback")
}

// 11. rollback --diff shows what the rollback would change: a conflicting
// path, which the rollback keeps (without --force), is reported as a
// conflict and is not in the diff.
func TestTurnsRollbackDiffOmitsConflicts(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a0\n", "b.txt": "b0\n"}))
	m.startTurn("t1", "")
	sh(t, m.mnt, "echo a1 > a.txt; echo b1 > b.txt")
	m.startTurn("t2", "")
	m.commit()
	if err := os.WriteFile(m.inWS("b.txt"), []byte("user\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, r := m.rollbackJSON("--diff", "t1")
	if r.code != 0 || len(res.Conflicts) != 1 || res.Conflicts[0].Path != "b.txt" {
		t.Fatalf("rollback --diff t1: want one conflict on b.txt: %s", r)
	}
	if !strings.Contains(res.Diff, "b/a.txt") {
		t.Errorf("rollback --diff t1 does not show a.txt:\n%s", res.Diff)
	}
	if strings.Contains(res.Diff, "b.txt") {
		t.Errorf("rollback --diff t1 shows b.txt going back to b0, but the rollback keeps the user's edit there (a conflict):\n%s", res.Diff)
	}
	view := snapshot(t, m.mnt)
	if r := m.cli("rollback", "t1"); r.code != 3 {
		t.Fatalf("rollback t1: want exit 3: %s", r)
	}
	// What the rollback changed is exactly what the diff (as shown) says.
	view["a.txt"] = snapshot(t, m.mnt)["a.txt"]
	assertTreeHash(t, "mount after rollback t1: only a.txt changed", view, snapshot(t, m.mnt))
	assertFile(t, m.in("b.txt"), "user\n")
}

// assertFileSoon waits for the mount to show path's content as want: an
// edit made in the workspace reaches the kernel's cache by inotify.
func assertFileSoon(t *testing.T, path, want string) {
	t.Helper()
	if !waitFor(5*time.Second, func() bool { b, _ := os.ReadFile(path); return string(b) == want }) {
		t.Errorf("%s: %q, want %q", path, readFile(t, path), want)
	}
}

// 12. The host's edits through the control socket (stagefs patch, i.e.
// fs/safe_text_patch) are the agent's: part of the turn, taken back by its
// rollback, and one made after a rollback clears redo.
func TestTurnsHostPatch(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a0\n", "b.txt": "b0\n"}))
	m.startTurn("t1", "")
	m.mustCLI("patch", "a.txt", "--expect", contentHash([]byte("a0\n")), "--edit", "a0=a1")
	sh(t, m.mnt, "echo b1 > b.txt")
	if cps := m.checkpoints(); len(cps) != 1 || !contains(cps[0].Paths, "a.txt") {
		t.Fatalf("turn t1 does not list a.txt, which the host patched: %+v", cps)
	}
	m.mustRollback("t1")
	assertFile(t, m.in("a.txt"), "a0\n")
	assertFile(t, m.in("b.txt"), "b0\n")

	m.mustCLI("patch", "a.txt", "--expect", contentHash([]byte("a0\n")), "--edit", "a0=mine")
	if r := m.cli("redo"); r.code == 0 {
		t.Errorf("redo after the host's patch succeeded: %s", r)
	}
	assertFile(t, m.in("a.txt"), "mine\n")
	assertFile(t, m.in("b.txt"), "b0\n")
}

// 13. In immediate mode, edits made directly in the workspace: one made
// while the turn is open, to a file the turn changed, is a conflict for
// the turn's rollback; one made after the rollback is a conflict for redo.
// --force overwrites each.
func TestTurnsWorkspaceEditsImmediate(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a0\n", "b.txt": "b0\n"}), withMountFlags("--mode", "immediate"))
	m.startTurn("t1", "")
	sh(t, m.mnt, "echo a1 > a.txt; echo b1 > b.txt")
	// Past the release of the shell's files, which the kernel sends
	// after close returns.
	time.Sleep(200 * time.Millisecond)
	if err := os.WriteFile(m.inWS("b.txt"), []byte("user\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, r := m.rollbackJSON("t1")
	if r.code != 3 || len(res.Conflicts) != 1 || res.Conflicts[0].Path != "b.txt" {
		t.Fatalf("rollback t1 over an edit made during the turn: want exit 3 and a conflict on b.txt: %s", r)
	}
	assertFile(t, m.inWS("a.txt"), "a0\n")
	assertFile(t, m.inWS("b.txt"), "user\n")
	assertFileSoon(t, m.in("b.txt"), "user\n")

	if err := os.WriteFile(m.inWS("a.txt"), []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = m.cli("redo")
	if r.code != 3 || !strings.Contains(r.stdout, "conflict  a.txt") || !strings.Contains(r.stderr, "--force") {
		t.Fatalf("redo over an edit made after the rollback: want exit 3 and a conflict on a.txt: %s", r)
	}
	assertFile(t, m.inWS("a.txt"), "mine\n")
	m.mustCLI("redo", "--force")
	assertFile(t, m.inWS("a.txt"), "a1\n")
	assertFileSoon(t, m.in("a.txt"), "a1\n")
	assertFile(t, m.inWS("b.txt"), "user\n")
}

// A turn moved a directory away and made a new one at its name; the user
// then put work in the workspace under that name. The move rolls back
// whole or not at all: a rollback once skipped moving the directory back
// (its name held a conflict) yet removed it at its new name, with the
// workspace files it held, and once moved it back over a user's edit it
// had reported as kept. Immediate mode: the losses were the workspace's.
func TestTurnsRollbackKeepsAConflictedMoveWhole(t *testing.T) {
	parallel(t)
	for _, c := range []struct{ name, turn, user, kept string }{
		{"a new file in the new directory", "mv d e; mkdir d", "echo mine > d/notes", "d/notes"},
		{"an edit of a file the turn made there", "mv d e; mkdir d; echo generated > d/z", "echo 'USER EDIT' > d/z", "d/z"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := mountStagefs(t, withFiles(map[string]string{"d/f1": "precious1\n", "d/f2": "precious2\n"}), withMountFlags("--mode", "immediate"))
			m.startTurn("t1", "move d")
			sh(t, m.mnt, c.turn)
			m.startTurn("t2", "")
			sh(t, m.ws, c.user)
			userFile := readFile(t, m.inWS(c.kept))
			res, r := m.rollbackJSON("t1")
			if r.code != 3 || len(res.Conflicts) == 0 {
				t.Fatalf("rollback t1: want conflicts (exit 3): %s", r)
			}
			// Nothing of the move is undone: the user's file and the
			// moved files are where they were.
			assertFile(t, m.inWS(c.kept), userFile)
			assertFile(t, m.inWS("e/f1"), "precious1\n")
			assertFile(t, m.inWS("e/f2"), "precious2\n")
			// --force takes the rollback through.
			if res, r := m.rollbackJSON("t1", "--force"); r.code != 0 || len(res.Failed) != 0 {
				t.Fatalf("rollback t1 --force: %s", r)
			}
			assertFile(t, m.inWS("d/f1"), "precious1\n")
			assertMissing(t, m.inWS("e"))
		})
	}
}

// Redo after a rollback of a turn that moved directories brings back what
// the turn did inside them: an edit before the move, and a directory it
// made, filled and renamed. Redo once moved the directories again but
// put back only the state from before the turn inside them.
func TestTurnsRedoRestoresInsideMovedDirectories(t *testing.T) {
	parallel(t)
	for _, mode := range []string{"staged", "immediate"} {
		t.Run(mode, func(t *testing.T) { redoInsideMovedDirectories(t, mode) })
	}
}

func redoInsideMovedDirectories(t *testing.T, mode string) {
	m := mountStagefs(t, withFiles(map[string]string{"d/a": "a\n", "d/keep": "k\n"}), withMountFlags("--mode", mode))
	m.startTurn("t1", "move things")
	sh(t, m.mnt, "echo a2 > d/a; mv d e; mkdir x; echo important > x/f; mv x y")
	after := snapshot(t, m.mnt)
	m.mustRollback("t1")
	assertFile(t, m.in("d/a"), "a\n")
	assertMissing(t, m.in("y"))
	if res := m.mustRedo(); len(res.Conflicts)+len(res.Failed) != 0 {
		t.Fatalf("redo: %+v", res)
	}
	assertFile(t, m.in("e/a"), "a2\n")
	assertFile(t, m.in("y/f"), "important\n")
	assertMissing(t, m.in("d"))
	assertTreeHash(t, "mount after rollback and redo", after, snapshot(t, m.mnt))
}
