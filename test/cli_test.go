package test

import (
	"encoding/json"
	"math/rand"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"stagefs/control"
)

func TestCLIClients(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "alpha\nbeta\n", "g.txt": "g\n"}))
	before := snapshot(t, m.ws)

	if r := runStagefs(t, "--version"); r.code != 0 || !strings.HasPrefix(r.stdout, "stagefs ") {
		t.Errorf("--version: %s", r)
	}
	if r := runStagefs(t, "--help"); r.code != 0 || !strings.Contains(r.stdout, "commit") {
		t.Errorf("--help: %s", r)
	}

	// Nothing pending yet.
	if out := m.mustCLI("status"); !strings.Contains(out, "nothing pending") {
		t.Errorf("status on a fresh mount: %q", out)
	}
	if out := m.mustCLI("diff"); out != "" {
		t.Errorf("diff on a fresh mount: %q", out)
	}

	// read: the view's content on stdout, its hash on stderr.
	r := m.cli("read", "f.txt")
	sum := contentHash([]byte("alpha\nbeta\n"))
	if r.code != 0 || r.stdout != "alpha\nbeta\n" || !strings.Contains(r.stderr, sum) {
		t.Errorf("read f.txt: %s", r)
	}
	var rt control.ReadTextResult
	if err := json.Unmarshal([]byte(m.mustCLI("read", "--json", "f.txt")), &rt); err != nil || rt.SHA256 != sum || !rt.Exists {
		t.Errorf("read --json: %+v, %v", rt, err)
	}
	if r := m.cli("read", "missing.txt"); r.code != 1 {
		t.Errorf("read of a missing file: exit %d, want 1\n%s", r.code, r)
	}
	if r := m.cli("read", "../outside"); r.code != 1 || !strings.Contains(r.stderr, "path_outside_workspace") {
		t.Errorf("read ../outside: %s", r)
	}

	// patch: a stale hash exits 3 and changes nothing.
	r = m.cli("patch", "f.txt", "--expect", contentHash([]byte("other")), "--edit", "beta=BETA")
	if r.code != 3 || !strings.Contains(r.stdout+r.stderr, "stale_base") {
		t.Errorf("patch with a stale hash: exit %d, want 3\n%s", r.code, r)
	}
	assertFile(t, m.in("f.txt"), "alpha\nbeta\n")
	// The right hash applies.
	r = m.cli("patch", "f.txt", "--expect", sum, "--edit", "beta=BETA")
	if r.code != 0 || !strings.Contains(r.stdout, "applied") {
		t.Errorf("patch --edit: %s", r)
	}
	assertFile(t, m.in("f.txt"), "alpha\nBETA\n")
	// --content-file, creating a file (no --expect: it must not exist).
	content := filepath.Join(t.TempDir(), "c")
	os.WriteFile(content, []byte("from a file\n"), 0o644)
	var pr control.SafeTextPatchResult
	if err := json.Unmarshal([]byte(m.mustCLI("patch", "--json", "new.txt", "--expect", "none", "--content-file", content)), &pr); err != nil ||
		pr.Result != control.PatchApplied || pr.SHA256 != contentHash([]byte("from a file\n")) {
		t.Errorf("patch --content-file: %+v, %v", pr, err)
	}
	assertFile(t, m.in("new.txt"), "from a file\n")
	// Creating over an existing file (--expect none) is stale; without
	// --expect it is a usage error.
	if r := m.cli("patch", "g.txt", "--content-file", content); r.code != 2 {
		t.Errorf("patch without --expect: exit %d, want 2\n%s", r.code, r)
	}
	if r := m.cli("patch", "g.txt", "--expect", "none", "--content-file", content); r.code != 3 {
		t.Errorf("patch of an existing file expecting none: exit %d, want 3\n%s", r.code, r)
	}
	// Usage errors.
	if r := m.cli("patch", "g.txt", "--expect", "none", "--content-file", content, "--edit", "a=b"); r.code != 2 {
		t.Errorf("patch with both a content file and edits: exit %d, want 2", r.code)
	}
	if r := m.cli("patch", "g.txt", "--expect", sum, "--edit", "no-equals-sign"); r.code != 2 {
		t.Errorf("patch --edit without =: exit %d, want 2", r.code)
	}

	// status, human form.
	out := m.mustCLI("status")
	for _, want := range []string{"2 pending change(s)", "write", "f.txt", "create", "new.txt"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}

	// The client finds the daemon from the current directory, from
	// --socket and from $STAGEFS_SOCKET.
	if err := os.Mkdir(m.in("sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]result{
		"cwd in the mount":   runIn(t, cmdSpec{dir: m.in("sub")}, stagefsBin, "status", "--json"),
		"--socket":           runStagefs(t, "status", "--json", "--socket", m.sock),
		"STAGEFS_SOCKET env": runIn(t, cmdSpec{env: []string{"STAGEFS_SOCKET=" + m.sock}}, stagefsBin, "status", "--json"),
	} {
		var st control.StatusResult
		if r.code != 0 {
			t.Errorf("status via %s: %s", name, r)
		} else if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.PendingCount != 3 {
			t.Errorf("status via %s: %+v, %v", name, st, err)
		}
	}
	if r := runIn(t, cmdSpec{dir: "/"}, stagefsBin, "status"); r.code != 4 {
		t.Errorf("status outside any mount: exit %d, want 4\n%s", r.code, r)
	}
	if r := runStagefs(t, "status", "-m", m.ws); r.code != 4 {
		t.Errorf("status -m on a plain directory: exit %d, want 4", r.code)
	}

	// log.
	var lr control.LogResult
	if err := json.Unmarshal([]byte(m.mustCLI("log", "--json", "f.txt")), &lr); err != nil || len(lr.Records) == 0 {
		t.Errorf("log --json f.txt: %+v, %v", lr, err)
	}
	for _, rec := range lr.Records {
		if rec.Path != "f.txt" && rec.Path2 != "f.txt" && !strings.Contains(rec.Detail, "f.txt") {
			t.Errorf("log f.txt lists a record of another path: %+v", rec)
		}
	}
	if err := json.Unmarshal([]byte(m.mustCLI("log", "--json", "--limit", "2")), &lr); err != nil || len(lr.Records) != 2 {
		t.Errorf("log --limit 2: %d records, %v", len(lr.Records), err)
	}

	// diff of one path.
	d := m.mustCLI("diff", "f.txt")
	if !strings.Contains(d, "-beta") || !strings.Contains(d, "+BETA") || strings.Contains(d, "new.txt") {
		t.Errorf("diff f.txt:\n%s", d)
	}
	assertSameTree(t, "workspace before commit", before, snapshot(t, m.ws))

	// discard everything.
	var dr control.DiscardResult
	if err := json.Unmarshal([]byte(m.mustCLI("discard", "--json")), &dr); err != nil || len(dr.Discarded) != 3 {
		t.Errorf("discard --json: %+v, %v", dr, err)
	}
	assertSameTree(t, "mount after discarding everything", before, snapshot(t, m.mnt))
	if out := m.mustCLI("commit"); !strings.Contains(out, "nothing to commit") {
		t.Errorf("commit with nothing pending: %q", out)
	}
	if out := m.mustCLI("discard"); !strings.Contains(out, "nothing to discard") {
		t.Errorf("discard with nothing pending: %q", out)
	}
	if r := m.cli("mode", "bogus"); r.code == 0 {
		t.Errorf("mode bogus accepted: %s", r)
	}
	assertSameTree(t, "workspace at the end", before, snapshot(t, m.ws))
}

// TestCLIDiffNonUTF8 checks that stagefs diff never garbles content that
// is not UTF-8. The diff travels in a JSON string, where invalid bytes
// become U+FFFD: shown as text, a Latin-1 file would reach git apply as
// other bytes. Such files must be written as git binary patches, and the
// whole diff must apply with git apply, byte for byte.
func TestCLIDiffNonUTF8(t *testing.T) {
	requireTool(t, "git")
	textOld := "one\ntwo\nthree\n"
	latin1Old := "caf\xe9\nna\xefve\n" // "café", "naïve" in Latin-1
	m := mountStagefs(t, withFiles(map[string]string{"text.txt": textOld, "latin1.txt": latin1Old}))

	textNew := "one\nzwei ✓\nthree\nfour" // multi-byte UTF-8, no final newline
	latin1New := "caf\xe9\nna\xefve!\n\xa9 2024\n"
	random := make([]byte, 4096)
	rand.New(rand.NewSource(3)).Read(random)
	// No NUL bytes: git's own rule (a NUL in the first 8000 bytes) would
	// call the file binary already; this one must be caught as non-UTF-8.
	for i, b := range random {
		if b == 0 {
			random[i] = 0xff
		}
	}
	for name, data := range map[string][]byte{"text.txt": []byte(textNew), "latin1.txt": []byte(latin1New), "rand.bin": random} {
		if err := os.WriteFile(m.in(name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	d := m.mustCLI("diff")
	if !utf8.ValidString(d) || strings.ContainsRune(d, utf8.RuneError) {
		t.Errorf("diff has invalid UTF-8 or U+FFFD (garbled content):\n%q", d)
	}
	for _, want := range []string{
		"diff --git a/latin1.txt b/latin1.txt\nindex ",
		"diff --git a/rand.bin b/rand.bin\nnew file mode 100644\nindex 0000000000000000000000000000000000000000..",
		"GIT binary patch\nliteral 4096\n",
		"+++ b/text.txt\n",
	} {
		if !strings.Contains(d, want) {
			t.Errorf("diff lacks %q:\n%q", want, d)
		}
	}
	for _, bad := range []string{"+++ b/latin1.txt", "+++ b/rand.bin"} {
		if strings.Contains(d, bad) {
			t.Errorf("diff shows a non-UTF-8 file as text (%q):\n%q", bad, d)
		}
	}
	var dr control.DiffResult
	if err := json.Unmarshal([]byte(m.mustCLI("diff", "--json")), &dr); err != nil || dr.Diff != d {
		t.Errorf("diff --json differs from the human diff: %v\n%q", err, dr.Diff)
	}

	// git apply of the whole diff on a copy of the workspace gives the
	// view's bytes.
	cp := t.TempDir()
	mustRun(t, cmdSpec{}, "cp", "-a", m.ws+"/.", cp)
	patch := filepath.Join(t.TempDir(), "staged.diff")
	if err := os.WriteFile(patch, []byte(d), 0o644); err != nil {
		t.Fatal(err)
	}
	gitEnv := cmdSpec{dir: cp, env: []string{"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1"}}
	mustRun(t, gitEnv, "git", "init", "-q", ".")
	// git itself reads the created random file as binary ("-" counts).
	if out := mustRun(t, gitEnv, "git", "apply", "--numstat", patch); !strings.Contains(out, "-\t-\trand.bin\n") {
		t.Errorf("git apply --numstat does not count rand.bin as binary:\n%s", out)
	}
	mustRun(t, gitEnv, "git", "apply", patch)
	assertFile(t, filepath.Join(cp, "text.txt"), textNew)
	assertFile(t, filepath.Join(cp, "latin1.txt"), latin1New)
	assertFile(t, filepath.Join(cp, "rand.bin"), string(random))
}

// TestCLIControlCallerInJournal checks that commits, discards, mode
// switches and patches asked for over the control socket are journaled
// with the client's pid and command, not as pid 0.
func TestCLIControlCallerInJournal(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a\n", "b.txt": "b\n"}))
	var before control.LogResult
	if err := json.Unmarshal([]byte(m.mustCLI("log", "--json")), &before); err != nil {
		t.Fatal(err)
	}
	var since uint64
	if n := len(before.Records); n > 0 {
		since = before.Records[n-1].Seq
	}

	if err := os.WriteFile(m.in("a.txt"), []byte("A\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m.mustCLI("commit", "a.txt")
	if err := os.WriteFile(m.in("b.txt"), []byte("B\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m.mustCLI("discard")
	m.mustCLI("mode", "immediate")
	m.mustCLI("mode", "staged")
	m.mustCLI("patch", "b.txt", "--expect", contentHash([]byte("b\n")), "--edit", "b=bee")

	var lr control.LogResult
	out := m.mustCLI("log", "--json", "--since", strconv.FormatUint(since, 10))
	if err := json.Unmarshal([]byte(out), &lr); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"commit_begin": 1, "commit_end": 1, "discard": 1, "set_mode": 2, "patch": 1}
	got := map[string]int{}
	for _, r := range lr.Records {
		if _, ok := want[r.Op]; !ok {
			continue
		}
		got[r.Op]++
		if r.PID == 0 || r.PID == m.daemonPid() || r.Comm != "stagefs" {
			t.Errorf("record %d (%s): pid %d, command %q; want the stagefs client's (daemon is %d)", r.Seq, r.Op, r.PID, r.Comm, m.daemonPid())
		}
	}
	for op, n := range want {
		if got[op] != n {
			t.Errorf("%d %s record(s) since %d, want %d\n%s", got[op], op, since, n, out)
		}
	}
}

// TestCLIStatusAgeAndColor checks the age column of the human status and
// that diff --color takes only auto, always and never.
func TestCLIStatusAgeAndColor(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "old\n"}))
	if err := os.WriteFile(m.in("f.txt"), []byte("new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := m.mustCLI("status")
	if !regexp.MustCompile(`(?m)^  write +f\.txt  4 B  [0-9]+s\b`).MatchString(out) {
		t.Errorf("status lacks the entry's age (like 3s):\n%s", out)
	}

	// A bad --color is a usage error, found before looking for a daemon.
	for name, r := range map[string]result{
		"with a daemon":    m.cli("diff", "--color", "bogus"),
		"without a daemon": runIn(t, cmdSpec{dir: "/"}, stagefsBin, "diff", "--color=yes"),
	} {
		if r.code != 2 || !strings.Contains(r.stderr, "auto, always or never") {
			t.Errorf("diff --color with a bad value %s: exit %d, want 2 and the valid values\n%s", name, r.code, r)
		}
	}
	if d := m.mustCLI("diff", "--color", "always"); !strings.Contains(d, "\x1b[32m+new") {
		t.Errorf("diff --color always has no color:\n%q", d)
	}
	// Standard output is a pipe here: auto, like never, must not color.
	for _, mode := range []string{"never", "auto"} {
		if d := m.mustCLI("diff", "--color", mode); strings.Contains(d, "\x1b[") || !strings.Contains(d, "+new\n") {
			t.Errorf("diff --color %s:\n%q", mode, d)
		}
	}
}

// A patch swaps the pending body whole (a rename in the pending set). A
// process that had the file open reads what every later open reads, as
// when the body was rewritten in place: the daemon points its handle at
// the new body. (With passthrough, reads of a pending body are the
// kernel's and go on in the body the handle was opened on.)
func TestPatchReachesOpenReaders(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "alpha\n"}), withMountFlags("--no-passthrough"))
	sh(t, m.mnt, "echo beta > f.txt")
	f, err := os.Open(m.in("f.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64)
	if n, _ := f.ReadAt(buf, 0); string(buf[:n]) != "beta\n" {
		t.Fatalf("before the patch the open file reads %q", buf[:n])
	}
	m.mustCLI("patch", "f.txt", "--expect", contentHash([]byte("beta\n")), "--edit", "beta=gamma")
	if n, _ := f.ReadAt(buf, 0); string(buf[:n]) != "gamma\n" {
		t.Errorf("after the patch the file opened before it reads %q, want the patched body", buf[:n])
	}
	assertFile(t, m.in("f.txt"), "gamma\n")
}
