package test

// The CLI's sharp edges a new user hit (issue #19), each with the case
// that showed it.

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Relative paths are resolved from the current directory when it is in
// the mount or the workspace, like git; elsewhere from the workspace root.
func TestCLIPathsFromCurrentDirectory(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"package.json": "{}\n", "node_modules/ms/package.json": "{}\n", "src/fmt/print.go": "package fmt\n"}))
	for _, p := range []string{"package.json", "node_modules/ms/package.json", "src/fmt/print.go"} {
		if err := os.WriteFile(m.in(p), []byte("changed\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{m.in("src/fmt"), m.inWS("src/fmt")} {
		r := runIn(t, cmdSpec{dir: dir}, stagefsBin, "status", "--json", "print.go")
		var st struct {
			Entries []struct{ Path string }
		}
		if err := json.Unmarshal([]byte(r.stdout), &st); r.code != 0 || err != nil || len(st.Entries) != 1 || st.Entries[0].Path != "src/fmt/print.go" {
			t.Errorf("stagefs status print.go in %s: want src/fmt/print.go, got %s", dir, r)
		}
	}
	// discard package.json in node_modules/ms discards that one, not the
	// root's.
	if r := runIn(t, cmdSpec{dir: m.in("node_modules/ms")}, stagefsBin, "discard", "package.json"); r.code != 0 {
		t.Fatalf("discard in node_modules/ms: %s", r)
	}
	kinds := statusKinds(m.status())
	if _, ok := kinds["node_modules/ms/package.json"]; ok {
		t.Errorf("node_modules/ms/package.json still pending: %v", kinds)
	}
	if kinds["package.json"] != "write" {
		t.Errorf("the root package.json was discarded instead: %v", kinds)
	}
	// Outside both, relative paths are the workspace's.
	if r := runIn(t, cmdSpec{dir: "/"}, stagefsBin, "status", "-m", m.mnt, "--json", "package.json"); r.code != 0 || !strings.Contains(r.stdout, `"path": "package.json"`) {
		t.Errorf("status package.json from /: %s", r)
	}
}

// Every client finds the daemon from the workspace directory too.
func TestCLIFindsDaemonFromWorkspace(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"sub/f.txt": "f\n"}))
	os.WriteFile(m.in("sub/f.txt"), []byte("g\n"), 0o644)
	for _, args := range [][]string{{"status"}, {"diff"}, {"snapshots"}, {"checkpoints"}, {"log", "--limit", "1"}} {
		if r := runIn(t, cmdSpec{dir: m.inWS("sub")}, stagefsBin, args...); r.code != 0 {
			t.Errorf("stagefs %v from the workspace: %s", args, r)
		}
	}
	// With no daemon the message says how to mount again.
	r := runIn(t, cmdSpec{dir: "/"}, stagefsBin, "status")
	if r.code != 4 || !strings.Contains(r.stderr, "stagefs mount") {
		t.Errorf("stagefs status with no daemon: %s", r)
	}
}

// A scope id whose snapshot is closed is refused: reusing it used to drop
// the first snapshot's pre-images without a record.
func TestCLIScopeIDReuseRefused(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}))
	m.mustRunIn(m.ws, "--scope", "tc1", "--", "sh", "-c", "echo one > f.txt")
	r := m.run(m.ws, "--scope", "tc1", "--", "sh", "-c", "echo two > f.txt")
	if r.code != 1 || !strings.Contains(r.stderr, "earlier tool call") {
		t.Errorf("a second run --scope tc1: %s", r)
	}
	assertFile(t, m.in("f.txt"), "one\n")
	if s := m.snapshotInfo("tc1"); len(s.Paths) != 1 {
		t.Errorf("tc1 after the refused reuse: %+v", s)
	}
	m.mustCLI("drop", "tc1")
	m.mustRunIn(m.ws, "--scope", "tc1", "--", "sh", "-c", "echo two > f.txt")
}

// run --scope --json reports an error and fails when the daemon dies
// while the command runs.
func TestCLIRunReportsDaemonDeath(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}))
	done := make(chan result, 1)
	go func() {
		done <- m.run(m.ws, "--scope", "k", "--json", "--", "sh", "-c", "touch started; sleep 2")
	}()
	if !waitFor(20*time.Second, func() bool { _, err := os.Stat(m.in("started")); return err == nil }) {
		t.Fatalf("the command never started: %s", <-done)
	}
	syscall.Kill(m.daemonPid(), syscall.SIGKILL)
	r := <-done
	var res runResultJSON
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || r.code == 0 || res.ExitCode == 0 || res.Error == "" {
		t.Errorf("run --json with the daemon killed: %+v %v\n%s", res, err, r)
	}
	m.mount()
}

// Every command's --help is its synopsis, flags and an example, on
// standard output, with status 0.
func TestCLIHelp(t *testing.T) {
	parallel(t)
	for _, c := range []string{"mount", "unmount", "status", "diff", "commit", "discard", "mode", "log", "events", "read", "patch",
		"snapshot", "close", "restore", "snapshots", "drop", "exec", "turn", "checkpoints", "rollback", "redo", "user", "run",
		"claude", "codex", "gemini", "acp", "hook"} {
		r := runStagefs(t, c, "--help")
		if r.code != 0 || !strings.HasPrefix(r.stdout, "usage: stagefs "+c) || !strings.Contains(r.stdout, "example:") || r.stderr != "" {
			t.Errorf("stagefs %s --help: %s", c, r)
		}
	}
	r := runStagefs(t, "--help")
	for _, want := range []string{"log [--since SEQ] [--limit N | --tail N]", "restore SCOPE [--keep-later]", "redo [--force]", "unmount MOUNTPOINT [--lazy]"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stagefs --help lacks %q", want)
		}
	}
}

// mount makes a missing mount point.
func TestCLIMountMakesMountPoint(t *testing.T) {
	parallel(t)
	requireFUSE(t)
	base := shortTempDir(t)
	ws, mnt, st := filepath.Join(base, "ws"), filepath.Join(base, "new", "mnt"), filepath.Join(base, "st")
	os.Mkdir(ws, 0o755)
	m := &stagefsMount{t: t, base: base, ws: ws, mnt: mnt, state: st, bin: stagefsBin, sock: filepath.Join(st, "control.sock")}
	t.Cleanup(m.cleanup)
	m.mount()
	if !isMounted(mnt) {
		t.Errorf("%s is not mounted", mnt)
	}
}

// exec and run give one result: the same --json shape, summary and exit
// statuses (127 for a command not found).
func TestCLIExecMatchesRun(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	for _, how := range []string{"exec", "run"} {
		args := []string{how, "-m", m.mnt, "--scope", how + "-nf", "--json", "--", "no-such-command-here"}
		if how == "exec" {
			args = append([]string{how, "-C", m.mnt}, args[1:]...)
		}
		r := runIn(t, cmdSpec{dir: m.ws}, stagefsBin, args...)
		if r.code != 127 {
			t.Errorf("%s of a missing command: %s, want exit 127", how, r)
		}
		args = []string{how, "-m", m.mnt, "--scope", how + "-ok", "--json", "--", "sh", "-c", "echo x > " + how + ".txt; exit 3"}
		r = runIn(t, cmdSpec{dir: m.ws}, stagefsBin, args...)
		var res runResultJSON
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || r.code != 3 || res.ExitCode != 3 || !res.Started ||
			res.Snapshot == nil || len(res.Changes) != 1 || res.Changes[0].Path != how+".txt" {
			t.Errorf("%s --json: %+v %v\n%s", how, res, err, r)
		}
		r = runIn(t, cmdSpec{dir: m.ws}, stagefsBin, how, "-m", m.mnt, "--scope", how+"-sum", "--", "sh", "-c", "echo y > "+how+"2.txt")
		if !strings.Contains(r.stderr, how+"-sum touched 1 path(s)") || !strings.Contains(r.stderr, "create    "+how+"2.txt") {
			t.Errorf("%s summary: %s", how, r)
		}
	}
}

// log --since N --limit K pages forward; --tail K is the newest K.
func TestCLILogPaging(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	for i := 0; i < 8; i++ {
		os.WriteFile(m.in(fmt.Sprintf("f%d.txt", i)), []byte("x\n"), 0o644)
	}
	page := func(args ...string) []uint64 {
		var lr struct{ Records []struct{ Seq uint64 } }
		if err := json.Unmarshal([]byte(m.mustCLI(append([]string{"log", "--json"}, args...)...)), &lr); err != nil {
			t.Fatal(err)
		}
		var seqs []uint64
		for _, r := range lr.Records {
			seqs = append(seqs, r.Seq)
		}
		return seqs
	}
	all := seqsOf(settledLog(t, m))
	if len(all) < 8 {
		t.Fatalf("log: %v", all)
	}
	first := page("--limit", "3")
	next := page("--since", fmt.Sprint(first[len(first)-1]), "--limit", "3")
	tail := page("--tail", "2")
	if fmt.Sprint(first) != fmt.Sprint(all[:3]) || fmt.Sprint(next) != fmt.Sprint(all[3:6]) || fmt.Sprint(tail) != fmt.Sprint(all[len(all)-2:]) {
		t.Errorf("log pages: all %v, --limit 3 %v, next %v, --tail 2 %v", all, first, next, tail)
	}
	if r := m.cli("log", "--limit", "2", "--tail", "2"); r.code == 0 {
		t.Errorf("log --limit and --tail together: %s", r)
	}
}

// Redo is a stack, as in an editor: two rollbacks, two redos, and the
// view is back where it was; a new change clears it.
func TestCLIRedoStack(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "0\n"}))
	for i, id := range []string{"t1", "t2", "t3"} {
		m.mustCLI("turn", id)
		sh(t, m.mnt, fmt.Sprintf("echo %d > f.txt; echo %d > n%d.txt", i+1, i+1, i+1))
	}
	m.mustCLI("turn", "t4") // ends t3
	view := snapshot(t, m.mnt)
	m.mustCLI("rollback", "t3")
	assertFile(t, m.in("f.txt"), "2\n")
	m.mustCLI("rollback", "t2")
	assertFile(t, m.in("f.txt"), "1\n")
	m.mustCLI("redo")
	assertFile(t, m.in("f.txt"), "2\n")
	assertMissing(t, m.in("n3.txt"))
	m.mustCLI("redo")
	assertSameTree(t, "the view after two rollbacks and two redos", view, snapshot(t, m.mnt))
	if r := m.cli("redo"); r.code == 0 || !strings.Contains(r.stderr, "nothing to redo") {
		t.Errorf("a third redo: %s", r)
	}
	// A new change clears the stack.
	m.mustCLI("rollback", "t3")
	m.mustCLI("rollback", "t2")
	sh(t, m.mnt, "echo new > new.txt")
	if r := m.cli("redo"); r.code == 0 || !strings.Contains(r.stderr, "changed after the rollback") {
		t.Errorf("redo after a new change: %s", r)
	}
}

// The smaller edges: usage errors, messages, --json for mount and
// unmount, warnings, and what a mount after a crash recovered.
func TestCLISmallEdges(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}))
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"patch", "f.txt", "--edit", "f=g"}, 2, "--expect"},
		{[]string{"mode", "bogus"}, 2, "staged|immediate"},
		{[]string{"user", "999999999"}, 1, "no process 999999999"},
		{[]string{"turn", "bad id"}, 1, `turnId: turn id "bad id"`},
	} {
		r := m.cli(tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, "turn:") {
			t.Errorf("stagefs %v: want exit %d and %q, got %s", tc.args, tc.code, tc.want, r)
		}
	}
	if r := m.run(m.ws, "--scope", "", "--", "touch", "x"); r.code != 2 {
		t.Errorf("run --scope '': %s", r)
	}
	r := m.cli("read", "f.txt")
	if r.code != 0 || !strings.HasPrefix(r.stderr, "sha256:") || strings.Contains(r.stderr, "sha256 sha256") {
		t.Errorf("read prints the hash once: %s", r)
	}
	// A binary change over 1 MiB: diff says it leaves it out.
	big := make([]byte, 2<<20)
	big[0] = 0
	os.WriteFile(m.in("big.bin"), big, 0o644)
	if r := m.cli("diff"); r.code != 0 || !strings.Contains(r.stderr, "leaves out 1 binary change") || !strings.Contains(r.stderr, "big.bin") {
		t.Errorf("diff with a big binary: %s", r)
	}
	// Kill the daemon with a change pending and a tool call open; the next
	// mount says what it kept.
	m.mustCLI("snapshot", "open-call")
	os.WriteFile(m.in("f.txt"), []byte("changed\n"), 0o644)
	syscall.Kill(m.daemonPid(), syscall.SIGKILL)
	waitProcessGone(m.daemonPid(), 10*time.Second)
	r = runIn(t, cmdSpec{}, stagefsBin, "mount", m.ws, m.mnt, "--state", m.state, "--json")
	var mounted struct {
		Mount     string
		Recovered struct{ Pending, OpenSnapshots int }
	}
	if err := json.Unmarshal([]byte(r.stdout), &mounted); r.code != 0 || err != nil || mounted.Mount != m.mnt || mounted.Recovered.Pending != 2 || mounted.Recovered.OpenSnapshots != 1 {
		t.Errorf("mount --json after a crash: %+v %v\n%s", mounted, err, r)
	}
	m.setPid(readPid(m.state))
	if r := runStagefs(t, "unmount", m.mnt, "--json"); r.code != 0 || !strings.Contains(r.stdout, `"unmounted"`) {
		t.Errorf("unmount --json: %s", r)
	}
	// A second mount of the same workspace with another state dir, over
	// a non-empty directory: warned.
	other := filepath.Join(m.base, "other")
	writeTree(t, other, map[string]string{"x": "x\n"})
	m.mount()
	r = runIn(t, cmdSpec{}, stagefsBin, "mount", m.ws, other, "--state", filepath.Join(m.base, "st2"))
	if r.code != 0 || !strings.Contains(r.stderr, "is not empty") || !strings.Contains(r.stderr, "already served at "+m.mnt) {
		t.Errorf("a second mount of the workspace over a non-empty directory: %s", r)
	}
	runIn(t, cmdSpec{}, stagefsBin, "unmount", other)
}

// A long commit shows its progress on a terminal, and nowhere else.
func TestCLIProgressOnTerminal(t *testing.T) {
	parallel(t)
	// Reports every millisecond: a quick commit on a fast machine still
	// makes some.
	m := mountStagefs(t, withDaemonEnv("STAGEFS_PROGRESS_EVERY=1ms"))
	os.Mkdir(m.in("many"), 0o755)
	for i := 0; i < 1500; i++ {
		if err := os.WriteFile(m.in(fmt.Sprintf("many/f%04d", i)), []byte("some content\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Not a terminal: nothing but the result.
	r := runIn(t, cmdSpec{env: []string{"STAGEFS_PROGRESS_AFTER=0s"}}, stagefsBin, "commit", "-m", m.mnt, "many/f0000")
	if r.code != 0 || strings.Contains(r.stderr, "paths") {
		t.Errorf("commit with stderr not a terminal: %s", r)
	}
	// On a terminal: "commit: N/1499 paths" while it runs (the directory
	// went with the first file).
	master, slave, err := openPty(24, 80)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	defer master.Close()
	cmd := exec.Command(stagefsBin, "commit", "-m", m.mnt)
	cmd.Env = append(baseEnv(), "STAGEFS_PROGRESS_AFTER=0s")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	out := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(master) // ends with EIO once the command has gone
		out <- string(b)
	}()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("commit on a terminal: %v", err)
	}
	var text string
	select {
	case text = <-out:
	case <-time.After(10 * time.Second):
		t.Fatal("no end of output from the terminal")
	}
	if !strings.Contains(text, "commit: ") || !strings.Contains(text, "/1499 paths") {
		t.Errorf("no progress on the terminal:\n%q", text)
	}
}

// A pre-image that cannot be stored during a turn shows in checkpoints and
// in the log.
func TestCLIUncapturedTurnShown(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"big.bin": strings.Repeat("x", 300<<10)}), withMountFlags("--snapshot-cap", "100000"))
	m.mustCLI("turn", "t1")
	sh(t, m.mnt, "echo changed > big.bin")
	var cp struct {
		Turns []struct {
			TurnID     string
			Uncaptured []string
		}
	}
	if err := json.Unmarshal([]byte(m.mustCLI("checkpoints", "--json")), &cp); err != nil || len(cp.Turns) != 1 || fmt.Sprint(cp.Turns[0].Uncaptured) != "[big.bin]" {
		t.Errorf("checkpoints --json: %+v %v", cp, err)
	}
	if out := m.mustCLI("checkpoints"); !strings.Contains(out, "incomplete: 1 path(s) not captured") {
		t.Errorf("checkpoints:\n%s", out)
	}
	var lr struct {
		Records []struct{ Op, Path, Detail string }
	}
	json.Unmarshal([]byte(m.mustCLI("log", "--json")), &lr)
	found := false
	for _, r := range lr.Records {
		found = found || (r.Op == "capture_failed" && r.Path == "big.bin" && strings.HasPrefix(r.Detail, "t1: "))
	}
	if !found {
		t.Errorf("no capture_failed record for big.bin in the log: %+v", lr.Records)
	}
}

// A turn id used before is refused: a new turn under it would drop the
// old one's pre-images.
func TestCLITurnIDReuseRefused(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "0\n"}))
	m.mustCLI("turn", "t1")
	sh(t, m.mnt, "echo 1 > f.txt")
	m.mustCLI("turn", "t2")
	if r := m.cli("turn", "t1"); r.code != 1 || !strings.Contains(r.stderr, "earlier turn") {
		t.Errorf("stagefs turn t1 again: %s", r)
	}
	m.mustCLI("rollback", "t1")
	assertFile(t, m.in("f.txt"), "0\n")
}
