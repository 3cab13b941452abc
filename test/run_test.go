package test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"stagefs/control"
)

// runResultJSON is what `stagefs run --json` prints as its last line.
type runResultJSON struct {
	ExitCode int                   `json:"exitCode"`
	Started  bool                  `json:"started"`
	Error    string                `json:"error"`
	Workdir  string                `json:"workdir"`
	Snapshot *control.SnapshotInfo `json:"snapshot"`
	Changes  []control.StatusEntry `json:"changes"`
}

// run runs `stagefs run -m MNT ARGS...` from dir ("" = /), with $PWD set
// to dir as a shell sets it.
func (m *stagefsMount) run(dir string, args ...string) result {
	m.t.Helper()
	if dir == "" {
		dir = "/"
	}
	return runIn(m.t, cmdSpec{dir: dir, env: []string{"PWD=" + dir}}, stagefsBin, append([]string{"run", "-m", m.mnt}, args...)...)
}

func (m *stagefsMount) mustRunIn(dir string, args ...string) string {
	m.t.Helper()
	r := m.run(dir, args...)
	if r.code != 0 {
		m.t.Fatalf("stagefs run %s: %s", strings.Join(args, " "), r)
	}
	return r.stdout
}

func TestRunShowsStagedViewAtWorkspacePath(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "one\n", "sub/g.txt": "g\n"}))
	// An absolute symlink into the workspace must lead to the staged view.
	os.Symlink(m.inWS("f.txt"), m.inWS("abs-link"))
	before := snapshot(t, m.ws)

	// pwd, realpath and $PWD all say the workspace, wherever run starts.
	for _, dir := range []string{"/", m.ws, m.mnt} {
		out := m.mustRunIn(dir, "--", "sh", "-c", `pwd; realpath .; echo "$PWD"`)
		want := strings.Repeat(m.ws+"\n", 3)
		if out != want {
			t.Errorf("run from %s: pwd, realpath ., $PWD = %q, want %q", dir, out, want)
		}
	}
	// Without -m, from the workspace: run finds the daemon by its workspace.
	r := runIn(t, cmdSpec{dir: filepath.Join(m.ws, "sub")}, stagefsBin, "run", "--", "pwd")
	if r.code != 0 || r.stdout != filepath.Join(m.ws, "sub")+"\n" {
		t.Errorf("run from the workspace without -m: %s", r)
	}

	// Writes through the workspace path are staged.
	m.mustRunIn(m.ws, "--", "sh", "-c", `echo two >> f.txt && echo new > new.txt && rm sub/g.txt && cat "`+m.inWS("abs-link")+`"`)
	kinds := statusKinds(m.status())
	if kinds["f.txt"] != "write" || kinds["new.txt"] != "create" || kinds["sub/g.txt"] != "delete" || len(kinds) != 3 {
		t.Errorf("pending after run: %v", kinds)
	}
	assertSameTree(t, "the real workspace after run", before, snapshot(t, m.ws))
	assertFile(t, m.in("f.txt"), "one\ntwo\n")
	assertFile(t, m.in("new.txt"), "new\n")
	// Inside, the absolute symlink and absolute paths see the staged content.
	if out := m.mustRunIn("", "--", "cat", m.inWS("abs-link"), m.inWS("new.txt")); out != "one\ntwo\nnew\n" {
		t.Errorf("cat through an absolute symlink and path inside run: %q", out)
	}
	// The private namespace leaves nothing behind in ours.
	if isMounted(m.ws) {
		t.Errorf("%s is a mount point outside the run namespace", m.ws)
	}
	// The command keeps the caller's stdin, and its SIGINT/SIGQUIT are not
	// ignored (run forwards or leaves them to the terminal).
	r = runIn(t, cmdSpec{stdin: "from stdin\n"}, stagefsBin, "run", "-m", m.mnt, "--", "sh", "-c", `cat; grep SigIgn /proc/self/status`)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "from stdin\nSigIgn:") {
		t.Fatalf("stdin and SigIgn: %s", r)
	}
	ign, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(strings.Split(r.stdout, "\n")[1], "SigIgn:")), 16, 64)
	if err != nil || ign&(1<<(int(syscall.SIGINT)-1)|1<<(int(syscall.SIGQUIT)-1)) != 0 {
		t.Errorf("the command ignores SIGINT or SIGQUIT: %q (%v)", r.stdout, err)
	}
}

func TestRunHidesStateDir(t *testing.T) {
	for _, tc := range []struct {
		name, stateRel string
	}{
		{"outside the workspace", "st"},
		{"under the workspace", "ws/.stagefs-state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parallel(t)
			m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}), withStateRel(tc.stateRel))
			if _, err := os.Stat(m.sock); err != nil {
				t.Fatalf("the socket is not there outside: %v", err)
			}
			script := `S=$1
stat "$S/control.sock" >/dev/null 2>&1 && echo SOCKET-REACHABLE
stat "$S/journal.log" >/dev/null 2>&1 && echo JOURNAL-REACHABLE
touch "$S/x" 2>/dev/null && echo STATE-WRITABLE
ls -A "$S" 2>/dev/null
ls -A "` + m.ws + `"
true`
			out := m.mustRunIn(m.ws, "--", "sh", "-c", script, "sh", m.state)
			if out != "f.txt\n" {
				t.Errorf("inside run the state dir shows:\n%s\nwant only the workspace listing f.txt", out)
			}
			// The control socket cannot be dialled from inside either.
			r := m.run(m.ws, "--", stagefsBin, "status", "--socket", m.sock)
			if r.code != 4 {
				t.Errorf("stagefs status --socket STATE/control.sock inside run: exit %d, want 4 (no daemon)\n%s", r.code, r)
			}
			// Outside, nothing changed: the daemon still answers.
			if st := m.status(); st.PendingCount != 0 {
				t.Errorf("pending after the probes: %+v", st)
			}
		})
	}
}

func TestRunExitStatusAndSignals(t *testing.T) {
	parallel(t)
	// The commands signal that they started by a file outside the
	// workspace, which the sandbox lets them write only with --outside rw.
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}), withMountFlags("--outside", "rw"))

	if r := m.run("", "--", "sh", "-c", "exit 5"); r.code != 5 {
		t.Errorf("exit 5: got %s", r)
	}
	if r := m.run("", "--", "sh", "-c", "kill -TERM $$"); r.code != 128+int(syscall.SIGTERM) {
		t.Errorf("killed by SIGTERM: got %s, want exit 143", r)
	}
	if r := m.run("", "--", "no-such-command-here"); r.code != 127 || !strings.Contains(r.stderr, "command not found") {
		t.Errorf("a missing command: got %s, want exit 127", r)
	}
	if r := m.run("", "--", "f.txt"); r.code != 127 {
		t.Errorf("a file that is not on PATH: got %s, want exit 127", r)
	}
	if r := m.run(m.ws, "--", "./f.txt"); r.code != 126 {
		t.Errorf("a file that is not executable: got %s, want exit 126", r)
	}
	// --json without --scope: the status and where it ran; a command that
	// could not start says why.
	for _, tc := range []struct {
		args    []string
		code    int
		started bool
	}{
		{[]string{"sh", "-c", "exit 4"}, 4, true},
		{[]string{"no-such-command-here"}, 127, false},
	} {
		r := m.run(m.ws, append([]string{"--json", "--"}, tc.args...)...)
		var res runResultJSON
		lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || r.code != tc.code || res.ExitCode != tc.code ||
			res.Started != tc.started || (res.Error != "") == tc.started || res.Workdir != m.ws || res.Snapshot != nil || res.Changes != nil {
			t.Errorf("--json %v: %+v (%v)\n%s", tc.args, res, err, r)
		}
	}
	if r := runStagefs(t, "run", "-m", m.mnt); r.code != 2 {
		t.Errorf("run without a command: got %s, want exit 2", r)
	}
	// The internal child command refuses to mount over the workspace in
	// the caller's own namespace.
	ns, _ := os.Readlink("/proc/self/ns/mnt")
	r := runStagefs(t, "__run-child", "--workspace", m.ws, "--mount", m.mnt, "--state", m.state, "--workdir", m.ws, "--outer-ns", ns, "--", "true")
	if r.code == 0 || isMounted(m.ws) {
		t.Errorf("__run-child in the caller's namespace: %s (workspace mounted: %v)", r, isMounted(m.ws))
	}

	// Signals sent to stagefs run (not from a terminal) reach the command.
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		ready := filepath.Join(m.base, "ready-"+strconv.Itoa(int(sig)))
		script := `trap 'exit 7' TERM INT HUP; touch "$1"; while :; do sleep 0.05; done`
		ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
		cmd := exec.CommandContext(ctx, stagefsBin, "run", "-m", m.mnt, "--", "sh", "-c", script, "sh", ready)
		cmd.Env = baseEnv()
		// Its own process group: not the terminal's foreground group even
		// when the tests run in a terminal.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.WaitDelay = 5 * time.Second
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			cancel()
			t.Fatal(err)
		}
		if !waitFor(20*time.Second, func() bool { _, err := os.Stat(ready); return err == nil }) {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			cmd.Wait()
			cancel()
			t.Fatalf("%v: the command never started: %s", sig, stderr.String())
		}
		cmd.Process.Signal(sig)
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		var err error
		select {
		case err = <-waited:
		case <-time.After(10 * time.Second):
			// Not forwarded: end the whole group, the command included.
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			err = <-waited
		}
		cancel()
		if code := cmd.ProcessState.ExitCode(); code != 7 {
			t.Errorf("%v sent to stagefs run: exit %d (%v), want 7 from the command's trap\n%s", sig, code, err, stderr.String())
		}
	}
}

func TestRunScopes(t *testing.T) {
	parallel(t)
	// The two calls meet in a directory outside the workspace, which the
	// sandbox lets them write only with --outside rw.
	m := mountStagefs(t, withFiles(map[string]string{"shared.txt": "base\n", "keep.txt": "keep\n"}), withMountFlags("--outside", "rw"))
	before := snapshot(t, m.ws)
	syncDir := filepath.Join(m.base, "sync") // outside the workspace: reachable inside
	os.Mkdir(syncDir, 0o755)

	// Two tool calls at once, each waiting for the other mid-way, so their
	// writes interleave.
	call := func(me, other string) string {
		return `set -e
echo ` + me + ` > ` + me + `1.txt
echo ` + me + ` >> shared-` + me + `.txt
touch "` + syncDir + `/` + me + `"
i=0; while [ ! -e "` + syncDir + `/` + other + `" ]; do sleep 0.02; i=$((i+1)); [ $i -lt 1000 ]; done
mkdir -p dir-` + me + ` && echo ` + me + ` > dir-` + me + `/f.txt`
	}
	var wg sync.WaitGroup
	results := make([]result, 2)
	for i, who := range [][2]string{{"a", "b"}, {"b", "a"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = m.run(m.ws, "--scope", "call-"+who[0], "--", "sh", "-c", call(who[0], who[1]))
		}()
	}
	wg.Wait()
	for i, r := range results {
		if r.code != 0 {
			t.Fatalf("tool call %d: %s", i, r)
		}
	}
	// Each summary names its own files and not the other's.
	if s := results[0].stderr; !strings.Contains(s, "call-a touched") || !strings.Contains(s, "a1.txt") || strings.Contains(s, "b1.txt") {
		t.Errorf("summary of call-a:\n%s", s)
	}
	if s := results[1].stderr; !strings.Contains(s, "b1.txt") || strings.Contains(s, "a1.txt") {
		t.Errorf("summary of call-b:\n%s", s)
	}

	// Restoring call-a undoes exactly what it did; call-b's changes stay.
	var rr control.RestoreResult
	if err := json.Unmarshal([]byte(m.mustCLI("restore", "--json", "call-a")), &rr); err != nil || len(rr.Failed) != 0 {
		t.Fatalf("restore call-a: %+v %v", rr, err)
	}
	kinds := statusKinds(m.status())
	for _, p := range []string{"a1.txt", "shared-a.txt", "dir-a", "dir-a/f.txt"} {
		if _, ok := kinds[p]; ok {
			t.Errorf("%s still pending after restoring call-a: %v", p, kinds)
		}
		assertMissing(t, m.in(p))
	}
	for _, p := range []string{"b1.txt", "shared-b.txt", "dir-b/f.txt"} {
		if _, ok := kinds[p]; !ok {
			t.Errorf("%s of call-b lost by restoring call-a: %v", p, kinds)
		}
		assertFile(t, m.in(p), "b\n")
	}
	assertSameTree(t, "the real workspace", before, snapshot(t, m.ws))

	// --json: CMD's exact output, a newline, then the result on one line.
	r := m.run(m.ws, "--json", "--scope", "call-c", "--", "sh", "-c", `printf 'no newline'; echo c > c.txt; exit 3`)
	if r.code != 3 {
		t.Fatalf("--json run: %s", r)
	}
	body := strings.TrimSuffix(r.stdout, "\n")
	i := strings.LastIndexByte(body, '\n')
	if i < 0 || body[:i] != "no newline" {
		t.Fatalf("--json stdout %q: want the command's output, a newline and one JSON line", r.stdout)
	}
	var res runResultJSON
	if err := json.Unmarshal([]byte(body[i+1:]), &res); err != nil {
		t.Fatalf("--json result %q: %v", body[i+1:], err)
	}
	if res.ExitCode != 3 || !res.Started || res.Workdir != m.ws || res.Snapshot == nil || res.Snapshot.ScopeID != "call-c" ||
		res.Snapshot.Open || len(res.Changes) != 1 || res.Changes[0].Path != "c.txt" || res.Changes[0].Kind != "create" {
		t.Errorf("--json result: %+v", res)
	}
	if r.stderr != "" {
		t.Errorf("--json also wrote a summary to stderr: %q", r.stderr)
	}
	// A big tool call's summary is capped.
	r = m.run(m.ws, "--scope", "call-d", "--", "sh", "-c", `mkdir many && for i in $(seq 100); do echo $i > many/f$i; done`)
	if r.code != 0 || !strings.Contains(r.stderr, "call-d touched 101 path(s)") || !strings.Contains(r.stderr, "and 61 more") ||
		strings.Count(r.stderr, "\n") != 42 {
		t.Errorf("summary of 101 paths: %s", r)
	}
	// A scope whose snapshot is still open is refused before the command
	// runs.
	m.mustCLI("snapshot", "busy")
	if r := m.run(m.ws, "--scope", "busy", "--", "touch", "d.txt"); r.code != 1 || !strings.Contains(r.stderr, "busy") {
		t.Errorf("run with a scope already open: %s, want exit 1 (busy)", r)
	}
	assertMissing(t, m.in("d.txt"))
	m.mustCLI("close", "busy")
}

func TestRunWorkdir(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"sub/deep/f.txt": "f\n", "top.txt": "t\n"}))
	if err := os.Mkdir(m.in("staged-only"), 0o755); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(m.ws, "sub")
	for _, tc := range []struct {
		from, workdir, want string
	}{
		{m.ws, "sub", sub}, // relative to the caller's directory
		{m.in("sub"), "deep", filepath.Join(sub, "deep")}, // relative, from inside the mount
		{"/", m.in("sub"), sub},                           // the mount's path maps to the workspace's
		{"/", sub, sub},                                   // the workspace's own path
		{"/", m.in("staged-only"), filepath.Join(m.ws, "staged-only")},
		{m.in("sub/deep"), "", filepath.Join(sub, "deep")}, // default: the caller's place
		{"/tmp", "", m.ws},                                 // default outside both: the workspace root
	} {
		args := []string{"--", "pwd"}
		if tc.workdir != "" {
			args = append([]string{"--workdir", tc.workdir}, args...)
		}
		if out := m.mustRunIn(tc.from, args...); out != tc.want+"\n" {
			t.Errorf("from %s with --workdir %q: pwd = %q, want %q", tc.from, tc.workdir, out, tc.want)
		}
	}
	if r := m.run("/", "--workdir", "/etc", "--", "pwd"); r.code != 2 || !strings.Contains(r.stderr, "outside the workspace") {
		t.Errorf("--workdir outside: %s, want exit 2", r)
	}
	if r := m.run("/", "--workdir", m.in("missing"), "--", "pwd"); r.code != 1 || !strings.Contains(r.stderr, "not a directory") {
		t.Errorf("--workdir missing: %s, want exit 1", r)
	}
	if r := m.run("/", "--workdir", m.in("top.txt"), "--", "pwd"); r.code != 1 {
		t.Errorf("--workdir naming a file: %s, want exit 1", r)
	}
}

func TestAgentHostDemo(t *testing.T) {
	requireFUSE(t)
	requireTool(t, "git")
	requireTool(t, "cc") // the demo's build step
	parallel(t)
	script, err := filepath.Abs("../scripts/agent-host-demo.sh")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := runIn(t, cmdSpec{env: []string{"STAGEFS=" + stagefsBin, "TMPDIR=" + shortTempDir(t)}}, "bash", script)
	if r.code != 0 || !strings.Contains(r.stdout, "agent-host-demo: OK") {
		t.Fatalf("scripts/agent-host-demo.sh: %s", r)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the demo took %v; it must stay under 20s for CI", d)
	}
}
