package test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"stagefs/control"
)

// basicFiles is the workspace of TestBasic.
var basicFiles = map[string]string{
	"a.txt":          "hello\n",
	"b.txt":          "line1\nfoo\nline3\n",
	"rmme.txt":       "remove me\n",
	"t.txt":          "link target\n",
	"script.sh":      "#!/bin/sh\necho hi\n",
	"dir1/x.txt":     "x\n",
	"dir1/sub/y.txt": "y\n",
	"dir2/z.txt":     "z\n",
	"dir2/deep/w":    "w\n",
	"keep/k.txt":     "untouched\n",
}

func TestBasic(t *testing.T) {
	m := mountStagefs(t, withFiles(basicFiles))
	before := snapshot(t, m.ws)

	// The mount shows the workspace as it is.
	assertSameTree(t, "fresh mount vs workspace", before, snapshot(t, m.mnt))

	sh(t, m.mnt, `
echo appended >> a.txt
sed -i 's/foo/bar/' b.txt
echo new > new.txt
mkdir -p p/q/r
echo deep > p/q/r/deep.txt
rm rmme.txt
rm -rf dir1
mv dir2 dir3
ln -s a.txt sym
ln t.txt hard
chmod +x script.sh
`)

	// The merged view.
	assertFile(t, m.in("a.txt"), "hello\nappended\n")
	assertFile(t, m.in("b.txt"), "line1\nbar\nline3\n")
	assertFile(t, m.in("new.txt"), "new\n")
	assertFile(t, m.in("p/q/r/deep.txt"), "deep\n")
	assertMissing(t, m.in("rmme.txt"))
	assertMissing(t, m.in("dir1"))
	assertMissing(t, m.in("dir2"))
	assertFile(t, m.in("dir3/z.txt"), "z\n")
	assertFile(t, m.in("dir3/deep/w"), "w\n")
	// The renamed directory lists its contents (readdir, not only lookup).
	if got := strings.Fields(sh(t, m.mnt, "ls -1A dir3")); strings.Join(got, " ") != "deep z.txt" {
		t.Errorf("ls -A dir3 (renamed from dir2) = %v, want [deep z.txt]", got)
	}
	if target, err := os.Readlink(m.in("sym")); err != nil || target != "a.txt" {
		t.Errorf("readlink sym = %q, %v; want a.txt", target, err)
	}
	assertFile(t, m.in("sym"), "hello\nappended\n")
	var st1, st2 syscall.Stat_t
	if err := syscall.Stat(m.in("t.txt"), &st1); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(m.in("hard"), &st2); err != nil {
		t.Fatal(err)
	}
	if st1.Ino != st2.Ino || st1.Nlink != 2 || st2.Nlink != 2 {
		t.Errorf("hard link: t.txt ino %d nlink %d, hard ino %d nlink %d; want the same inode with nlink 2", st1.Ino, st1.Nlink, st2.Ino, st2.Nlink)
	}
	// Writing through one name shows through the other.
	if err := os.WriteFile(m.in("hard"), []byte("via hard\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	assertFile(t, m.in("t.txt"), "via hard\n")
	if fi, err := os.Stat(m.in("script.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("script.sh mode = %v, %v; want 0755", fi.Mode(), err)
	}
	// ls and stat from outside the test process agree.
	ls := sh(t, m.mnt, `ls -1A`)
	if got, want := strings.Fields(ls), []string{"a.txt", "b.txt", "dir3", "hard", "keep", "new.txt", "p", "script.sh", "sym", "t.txt"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("ls -A mnt = %v, want %v", got, want)
	}

	// The workspace is untouched.
	assertSameTree(t, "workspace before commit", before, snapshot(t, m.ws))

	// status --json lists the changes.
	kinds := statusKinds(m.status())
	want := map[string]string{
		"a.txt":     "write",
		"b.txt":     "write",
		"new.txt":   "create",
		"p":         "mkdir",
		"rmme.txt":  "delete",
		"dir1":      "rmdir",
		"dir3":      "rename<-dir2",
		"sym":       "symlink",
		"hard":      "create",
		"t.txt":     "write",
		"script.sh": "meta",
	}
	for p, k := range want {
		got, ok := kinds[p]
		switch {
		case !ok:
			t.Errorf("status: %s missing (want %s); got %v", p, k, kinds)
		case got != k:
			t.Errorf("status: %s is %q, want %q", p, got, k)
		}
	}
	for _, p := range []string{"keep", "keep/k.txt", ".", ""} {
		if k, ok := kinds[p]; ok {
			t.Errorf("status lists untouched %q as %s", p, k)
		}
	}

	view := snapshot(t, m.mnt)

	// diff applies with git apply onto a fresh copy of the workspace and
	// yields the mount's tree.
	diff := m.mustCLI("diff")
	if !strings.Contains(diff, "diff --git") {
		t.Fatalf("stagefs diff printed no diff:\n%s", diff)
	}
	requireTool(t, "git")
	cp := filepath.Join(t.TempDir(), "copy")
	mustRun(t, cmdSpec{}, "cp", "-a", m.ws, cp)
	patch := filepath.Join(t.TempDir(), "p.diff")
	if err := os.WriteFile(patch, []byte(diff), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := runIn(t, cmdSpec{dir: cp}, "git", "apply", "--verbose", patch); r.code != 0 {
		t.Errorf("git apply of stagefs diff failed: %s\ndiff:\n%s", r, diff)
	} else if d := diffTrees(view, snapshot(t, cp)); d != "" {
		t.Errorf("workspace + stagefs diff != mount view:\n%s\ndiff:\n%s", d, diff)
	}
	// diff --json agrees with the plain diff.
	var dr control.DiffResult
	if err := json.Unmarshal([]byte(m.mustCLI("diff", "--json")), &dr); err != nil {
		t.Fatal(err)
	}
	if dr.Diff != diff || dr.Files == 0 {
		t.Errorf("diff --json: files=%d, same text=%v", dr.Files, dr.Diff == diff)
	}

	// Commit makes the workspace equal to the view.
	assertSameTree(t, "workspace still untouched after diff", before, snapshot(t, m.ws))
	cr := m.commit()
	if len(cr.Conflicts) != 0 || len(cr.Failed) != 0 || len(cr.Committed) == 0 {
		t.Errorf("commit: %+v", cr)
	}
	assertSameTree(t, "workspace after commit vs view before commit", view, snapshot(t, m.ws))
	assertSameTree(t, "mount after commit vs view before commit", view, snapshot(t, m.mnt))
	if st := m.status(); st.PendingCount != 0 || len(st.Entries) != 0 {
		t.Errorf("status after commit: %+v", st)
	}
	if target, err := os.Readlink(m.inWS("sym")); err != nil || target != "a.txt" {
		t.Errorf("workspace sym after commit: %q, %v", target, err)
	}
}

func TestPartialCommitAndDiscard(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{
		"a.txt":   "A0\n",
		"b.txt":   "B0\n",
		"c.txt":   "C0\n",
		"del.txt": "D0\n",
		"d/e.txt": "E0\n",
	}))
	before := snapshot(t, m.ws)
	// Read everything through the mount first, so the kernel has it cached.
	for _, p := range []string{"a.txt", "b.txt", "c.txt", "del.txt", "d/e.txt"} {
		readFile(t, m.in(p))
	}
	sh(t, m.mnt, `
echo A1 > a.txt
echo B1 > b.txt
echo C1 > c.txt
rm del.txt
echo new > new.txt
echo E1 > d/e.txt
`)
	for p, want := range map[string]string{"a.txt": "A1\n", "b.txt": "B1\n", "c.txt": "C1\n", "new.txt": "new\n", "d/e.txt": "E1\n"} {
		assertFile(t, m.in(p), want)
	}
	assertSameTree(t, "workspace before commit", before, snapshot(t, m.ws))

	// Commit one path.
	cr := m.commit("a.txt")
	if strings.Join(cr.Committed, ",") != "a.txt" {
		t.Errorf("commit a.txt committed %v", cr.Committed)
	}
	assertFile(t, m.inWS("a.txt"), "A1\n")
	assertFile(t, m.inWS("b.txt"), "B0\n")
	assertFile(t, m.inWS("c.txt"), "C0\n")
	assertFile(t, m.inWS("del.txt"), "D0\n")
	assertMissing(t, m.inWS("new.txt"))
	assertFile(t, m.in("a.txt"), "A1\n")
	kinds := statusKinds(m.status())
	if _, ok := kinds["a.txt"]; ok {
		t.Errorf("a.txt still pending after its commit: %v", kinds)
	}
	for _, p := range []string{"b.txt", "c.txt", "del.txt", "new.txt", "d/e.txt"} {
		if _, ok := kinds[p]; !ok {
			t.Errorf("%s no longer pending after committing only a.txt: %v", p, kinds)
		}
	}

	// Discard one path at a time; the mount shows the workspace version at
	// once (the kernel cache must have been invalidated).
	m.mustCLI("discard", "b.txt")
	if got := sh(t, m.mnt, "cat b.txt"); got != "B0\n" {
		t.Errorf("cat b.txt right after discard = %q, want %q", got, "B0\n")
	}
	assertFile(t, m.in("b.txt"), "B0\n")
	m.mustCLI("discard", "new.txt")
	if r := runIn(t, cmdSpec{dir: m.mnt}, "cat", "new.txt"); r.code == 0 {
		t.Errorf("cat new.txt right after discarding its creation succeeded: %q", r.stdout)
	}
	assertMissing(t, m.in("new.txt"))
	m.mustCLI("discard", "del.txt")
	if got := sh(t, m.mnt, "cat del.txt"); got != "D0\n" {
		t.Errorf("cat del.txt right after discarding its deletion = %q, want %q", got, "D0\n")
	}
	m.mustCLI("discard", "d/e.txt")
	if got := sh(t, m.mnt, "cat d/e.txt"); got != "E0\n" {
		t.Errorf("cat d/e.txt right after discard = %q, want %q", got, "E0\n")
	}

	// Only c.txt is left.
	kinds = statusKinds(m.status())
	if len(kinds) != 1 || kinds["c.txt"] != "write" {
		t.Errorf("status after partial discard = %v, want only c.txt modified", kinds)
	}
	assertFile(t, m.in("c.txt"), "C1\n")
	assertFile(t, m.inWS("c.txt"), "C0\n")
	assertFile(t, m.inWS("b.txt"), "B0\n")

	// Repeated write/read/discard/read: never a stale page or attribute.
	for i := 0; i < 30; i++ {
		content := strings.Repeat("staged content that is longer than the base\n", i+1)
		if err := os.WriteFile(m.in("b.txt"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		assertFile(t, m.in("b.txt"), content)
		var dr control.DiscardResult
		if err := json.Unmarshal([]byte(m.mustCLI("discard", "--json", "b.txt")), &dr); err != nil {
			t.Fatal(err)
		}
		if strings.Join(dr.Discarded, ",") != "b.txt" {
			t.Errorf("round %d: discard b.txt discarded %v", i, dr.Discarded)
		}
		if got := readFile(t, m.in("b.txt")); got != "B0\n" {
			t.Fatalf("round %d: b.txt right after discard = %q, want %q", i, got, "B0\n")
		}
		if fi, err := os.Stat(m.in("b.txt")); err != nil || fi.Size() != 3 {
			t.Fatalf("round %d: stat b.txt right after discard: size %v, %v; want 3", i, fi.Size(), err)
		}
	}
}

func TestConflict(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{"f": "base\n", "g": "g0\n"}))
	if err := os.WriteFile(m.in("f"), []byte("staged\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.in("g"), []byte("g1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The user edits f directly in the workspace.
	if err := os.WriteFile(m.inWS("f"), []byte("user\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	r := m.cli("commit")
	if r.code != 3 {
		t.Errorf("commit with a conflict: exit %d, want 3\n%s", r.code, r)
	}
	if !strings.Contains(r.stdout+r.stderr, "conflict") || !strings.Contains(r.stdout, "f") {
		t.Errorf("commit output does not report the conflict on f:\n%s", r)
	}
	assertFile(t, m.inWS("f"), "user\n")
	// The other path went through.
	assertFile(t, m.inWS("g"), "g1\n")
	kinds := statusKinds(m.status())
	if _, ok := kinds["f"]; !ok {
		t.Errorf("f not pending after the conflict: %v", kinds)
	}
	if _, ok := kinds["g"]; ok {
		t.Errorf("g still pending after it was committed: %v", kinds)
	}
	assertFile(t, m.in("f"), "staged\n")

	// --json reports it too, with the same exit code.
	r = m.cli("commit", "--json")
	if r.code != 3 {
		t.Errorf("commit --json with a conflict: exit %d, want 3", r.code)
	}
	var cr control.CommitResult
	if err := json.Unmarshal([]byte(r.stdout), &cr); err != nil {
		t.Fatalf("commit --json: %v\n%s", err, r)
	}
	if len(cr.Conflicts) != 1 || cr.Conflicts[0].Path != "f" || cr.Conflicts[0].Reason == "" {
		t.Errorf("commit --json conflicts = %+v, want one on f with a reason", cr.Conflicts)
	}
	assertFile(t, m.inWS("f"), "user\n")

	// --force applies.
	r = m.cli("commit", "--force")
	if r.code != 0 {
		t.Fatalf("commit --force: %s", r)
	}
	assertFile(t, m.inWS("f"), "staged\n")
	assertFile(t, m.in("f"), "staged\n")
	if st := m.status(); st.PendingCount != 0 {
		t.Errorf("pending after commit --force: %+v", st)
	}
}

func TestStateDirInsideWorkspace(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a\n"}), withStateRel("ws/.stagefs-state"))
	const hidden = ".stagefs-state"
	if _, err := os.Stat(m.inWS(hidden + "/control.sock")); err != nil {
		t.Fatalf("the state dir is not in the workspace: %v", err)
	}
	before := snapshot(t, m.ws, hidden)

	ls := sh(t, m.mnt, "ls -a")
	if strings.Contains(ls, hidden) {
		t.Errorf("ls -a mnt shows the state dir:\n%s", ls)
	}
	ents, err := os.ReadDir(m.mnt)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == hidden {
			t.Errorf("readdir of the mount lists %s", hidden)
		}
	}
	if _, err := os.Lstat(m.in(hidden)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lstat mnt/%s: %v, want ENOENT", hidden, err)
	}
	if _, err := os.Lstat(m.in(hidden + "/control.sock")); err == nil {
		t.Errorf("mnt/%s/control.sock is reachable through the mount", hidden)
	}
	if err := os.Mkdir(m.in(hidden), 0o755); err == nil {
		t.Errorf("mkdir mnt/%s succeeded", hidden)
	}
	if err := os.WriteFile(m.in(hidden), []byte("x"), 0o644); err == nil {
		t.Errorf("creating the file mnt/%s succeeded", hidden)
	}
	if err := os.Symlink("a.txt", m.in(hidden)); err == nil {
		t.Errorf("symlink at mnt/%s succeeded", hidden)
	}
	if err := os.Rename(m.in("a.txt"), m.in(hidden)); err == nil {
		t.Errorf("rename onto mnt/%s succeeded", hidden)
	}

	// Normal writes work, and status does not list the state dir, whose
	// contents change with every write.
	sh(t, m.mnt, "echo b > b.txt; echo more >> a.txt; mkdir sub; echo s > sub/s")
	kinds := statusKinds(m.status())
	for p := range kinds {
		if p == hidden || strings.HasPrefix(p, hidden+"/") {
			t.Errorf("status lists the state dir: %s (%v)", p, kinds)
		}
	}
	if kinds["b.txt"] != "create" || kinds["a.txt"] != "write" {
		t.Errorf("status = %v", kinds)
	}
	if diff := m.mustCLI("diff"); strings.Contains(diff, hidden) {
		t.Errorf("diff mentions the state dir:\n%s", diff)
	}
	if out := sh(t, m.mnt, "find ."); strings.Contains(out, hidden) {
		t.Errorf("find in the mount shows the state dir:\n%s", out)
	}
	assertSameTree(t, "workspace before commit", before, snapshot(t, m.ws, hidden))

	view := snapshot(t, m.mnt)
	m.commit()
	assertSameTree(t, "workspace after commit", view, snapshot(t, m.ws, hidden))
	if _, err := os.Stat(m.inWS(hidden + "/control.sock")); err != nil {
		t.Errorf("the state dir was damaged by commit: %v", err)
	}
	if st := m.status(); st.PendingCount != 0 {
		t.Errorf("pending after commit: %+v", st)
	}
}

func TestImmediateMode(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a0\n", "gone.txt": "g\n"}))
	if err := os.WriteFile(m.in("a.txt"), []byte("a1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := strings.TrimSpace(m.mustCLI("mode")); out != "staged" {
		t.Errorf("stagefs mode = %q, want staged", out)
	}
	r := m.cli("mode", "immediate")
	if r.code == 0 {
		t.Fatalf("mode immediate with a pending change succeeded: %s", r)
	}
	if !strings.Contains(r.stderr, "pending") {
		t.Errorf("mode immediate refusal does not mention the pending changes: %s", r)
	}
	if out := strings.TrimSpace(m.mustCLI("mode")); out != "staged" {
		t.Errorf("after the refusal, mode = %q, want staged", out)
	}
	assertFile(t, m.inWS("a.txt"), "a0\n")

	m.commit()
	assertFile(t, m.inWS("a.txt"), "a1\n")
	m.mustCLI("mode", "immediate")
	if out := strings.TrimSpace(m.mustCLI("mode")); out != "immediate" {
		t.Errorf("mode = %q, want immediate", out)
	}

	// Writes go straight to the workspace.
	sh(t, m.mnt, `
echo n > new.txt
echo a2 >> a.txt
mkdir -p dir/sub
echo s > dir/sub/s.txt
rm gone.txt
ln -s new.txt link
`)
	assertFile(t, m.inWS("new.txt"), "n\n")
	assertFile(t, m.inWS("a.txt"), "a1\na2\n")
	assertFile(t, m.inWS("dir/sub/s.txt"), "s\n")
	assertMissing(t, m.inWS("gone.txt"))
	if target, err := os.Readlink(m.inWS("link")); err != nil || target != "new.txt" {
		t.Errorf("workspace link = %q, %v", target, err)
	}
	assertSameTree(t, "immediate mode: mount vs workspace", snapshot(t, m.ws), snapshot(t, m.mnt))
	if st := m.status(); st.PendingCount != 0 {
		t.Errorf("immediate mode has pending changes: %+v", st)
	}
	var st control.StatusResult
	if err := json.Unmarshal([]byte(m.mustCLI("status", "--json")), &st); err != nil || st.Mode != "immediate" {
		t.Errorf("status mode = %q, %v", st.Mode, err)
	}

	// And back to staged.
	m.mustCLI("mode", "staged")
	if err := os.WriteFile(m.in("new.txt"), []byte("staged again\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	assertFile(t, m.inWS("new.txt"), "n\n")
	assertFile(t, m.in("new.txt"), "staged again\n")
	if k := statusKinds(m.status()); k["new.txt"] != "write" {
		t.Errorf("status after switching back to staged = %v", k)
	}
}

// TestStatusAttribution checks that status names the process behind each
// change, also for changes to existing files (copy-up on open).
func TestStatusAttribution(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a\n", "b.txt": "b\n"}))
	pids := map[string]int{}
	for file, script := range map[string]string{
		"a.txt":   "echo more >> a.txt",
		"b.txt":   "echo replaced > b.txt",
		"new.txt": "echo new > new.txt",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
		cmd := exec.CommandContext(ctx, "sh", "-c", script)
		cmd.Dir = m.mnt
		if out, err := cmd.CombinedOutput(); err != nil {
			cancel()
			t.Fatalf("%s: %v: %s", script, err, out)
		}
		cancel()
		pids[file] = cmd.Process.Pid
	}
	st := m.status()
	if len(st.Entries) != 3 {
		t.Fatalf("status: %+v", st)
	}
	for _, e := range st.Entries {
		if e.PID != pids[e.Path] || e.Comm != "sh" {
			t.Errorf("status %s (%s): pid %d comm %q, want pid %d comm sh", e.Path, e.Kind, e.PID, e.Comm, pids[e.Path])
		}
	}
}

// TestWorkspaceEditsShowThrough checks that edits made directly in the
// workspace to paths without pending changes show in the mount once the
// kernel's cache timeout (1s by default) has passed, also when the kernel
// had the old pages cached.
func TestWorkspaceEditsShowThrough(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{"same.txt": "aaaa\n", "grow.txt": "x\n", "gone.txt": "g\n"}))
	for _, p := range []string{"same.txt", "grow.txt", "gone.txt"} {
		readFile(t, m.in(p))
	}
	if err := os.WriteFile(m.inWS("same.txt"), []byte("bbbb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.inWS("grow.txt"), []byte("longer now\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Remove(m.inWS("gone.txt"))
	os.WriteFile(m.inWS("added.txt"), []byte("added\n"), 0o644)
	ok := waitFor(5*time.Second, func() bool {
		a, _ := os.ReadFile(m.in("same.txt"))
		b, _ := os.ReadFile(m.in("grow.txt"))
		c, _ := os.ReadFile(m.in("added.txt"))
		_, err := os.Stat(m.in("gone.txt"))
		return string(a) == "bbbb\n" && string(b) == "longer now\n" && string(c) == "added\n" && errors.Is(err, os.ErrNotExist)
	})
	if !ok {
		a, _ := os.ReadFile(m.in("same.txt"))
		b, _ := os.ReadFile(m.in("grow.txt"))
		t.Errorf("workspace edits not visible in the mount after 5s: same.txt=%q grow.txt=%q", a, b)
	}
	if st := m.status(); st.PendingCount != 0 {
		t.Errorf("workspace edits show as pending: %+v", st)
	}
}

// --journal-sync lets staging records wait for a ticker instead of an
// fdatasync each: they are still all in the log, also after the daemon is
// killed, and bad values are refused.
func TestJournalSyncFlag(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a\n"}), withMountFlags("--journal-sync", "100ms"))
	sh(t, m.mnt, "echo b > b.txt; mkdir d; mv a.txt d/; chmod 600 b.txt")
	view := snapshot(t, m.mnt)
	pid := m.daemonPid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !waitProcessGone(pid, 10*time.Second) {
		t.Fatalf("daemon %d survived SIGKILL", pid)
	}
	m.mount("--journal-sync", "100ms")
	assertSameTree(t, "the view after a kill and a restart", view, snapshot(t, m.mnt))
	var lr control.LogResult
	if err := json.Unmarshal([]byte(m.mustCLI("log", "--json")), &lr); err != nil {
		t.Fatal(err)
	}
	ops := map[string]bool{}
	for _, r := range lr.Records {
		ops[r.Op+" "+r.Path] = true
	}
	for _, want := range []string{"create b.txt", "mkdir d", "rename a.txt", "setattr b.txt"} {
		if !ops[want] {
			t.Errorf("journal after the kill lacks %q: %v", want, ops)
		}
	}
	other := filepath.Join(m.base, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"-1s", "2m", "soon"} {
		r := runStagefs(t, "mount", m.ws, other, "--journal-sync", bad)
		if r.code != 2 {
			t.Errorf("mount --journal-sync %s: %s, want a usage error (exit 2)", bad, r)
		}
	}
}

// A workspace file held open read-only and then opened for writing: the
// write is staged, never written through to the workspace (the trap of a
// kernel backing file shared per inode), and the read-only handle sees the
// staged copy from then on.
func TestReadOnlyThenWriteStages(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "workspace\n"}))
	r, err := os.Open(m.in("a.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, 64)
	if n, err := r.ReadAt(buf, 0); string(buf[:n]) != "workspace\n" {
		t.Fatalf("read-only handle reads %q (%v)", buf[:n], err)
	}
	w, err := os.OpenFile(m.in("a.txt"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("staged write\n"); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	// Another write through a second writable handle, opened while the
	// first is still open.
	w2, err := os.OpenFile(m.in("a.txt"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w2.WriteString("more\n"); err != nil {
		t.Fatal(err)
	}
	w2.Close()
	w.Close()
	assertFile(t, m.inWS("a.txt"), "workspace\n")
	assertFile(t, m.in("a.txt"), "staged write\nmore\n")
	if n, err := r.ReadAt(buf, 0); string(buf[:n]) != "staged write\nmore\n" {
		t.Errorf("the read-only handle opened before the write reads %q (%v)", buf[:n], err)
	}
	if kinds := statusKinds(m.status()); kinds["a.txt"] != "write" {
		t.Errorf("status = %v, want a.txt staged as a write", kinds)
	}
}
