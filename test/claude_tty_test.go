package test

// stagefs claude with Claude Code's interactive UI: no -p, a terminal of
// its own (a pseudo-terminal the test drives), a prompt typed in and /exit
// at the end, as a person would use it.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode"

	"golang.org/x/sys/unix"

	"stagefs/test/agentsim"
)

// seedClaudeConfig writes the global config Claude Code keeps in
// CLAUDE_CONFIG_DIR (home/.claude, see agentsim.ClaudeEnv) as it stands
// after a person has been through the first run's dialogs: onboarding
// done (else a theme choice and a check that api.anthropic.com is
// reachable, which fails offline), the API key from the environment
// approved (else "Detected a custom API key ... Do you want to use this
// API key?", answered No by default), and the workspace trusted (else
// "Is this a project you created or one you trust?", answered "No, exit"
// by default). Keys Claude Code does not find take their defaults.
func seedClaudeConfig(t *testing.T, home, workspace, apiKey string) {
	t.Helper()
	dir := filepath.Join(home, ".claude")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	config := map[string]any{
		"hasCompletedOnboarding": true,
		"theme":                  "dark",
		// Claude Code stores the last 20 characters of an approved key.
		"customApiKeyResponses": map[string]any{"approved": []string{lastN(apiKey, 20)}, "rejected": []string{}},
		"projects": map[string]any{
			workspace: map[string]any{"hasTrustDialogAccepted": true},
		},
	}
	b, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".claude.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func lastN(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// envValue returns the value of the last KEY=... in env.
func envValue(env []string, key string) string {
	v := ""
	for _, e := range env {
		if k, val, ok := strings.Cut(e, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// ---------------------------------------------------------------------------
// A pseudo-terminal session.

// ttyProc is a command running with a pseudo-terminal as its controlling
// terminal and standard streams; the test holds the master side. A
// goroutine reads the master all the time, so the command never blocks
// on output.
type ttyProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	master *os.File

	mu  sync.Mutex
	out []byte // everything the command wrote to the terminal

	readDone chan struct{} // the reader saw EOF or EIO
	exited   chan struct{} // Wait returned; waitErr is set
	waitErr  error
}

// openPty opens a new pseudo-terminal pair with the given window size.
func openPty(rows, cols uint16) (master, slave *os.File, err error) {
	// os.OpenFile puts the master in the runtime's poller, so Close
	// interrupts a Read blocked in the reader goroutine.
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	var n uint32
	var ioErr error
	// Not master.Fd(), which would put the file in blocking mode.
	rc, err := master.SyscallConn()
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	err = rc.Control(func(fd uintptr) {
		if ioErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ioErr != nil { // unlockpt
			ioErr = fmt.Errorf("unlock the pty: %w", ioErr)
			return
		}
		if n, ioErr = unix.IoctlGetUint32(int(fd), unix.TIOCGPTN); ioErr != nil { // ptsname
			ioErr = fmt.Errorf("pty number: %w", ioErr)
			return
		}
		if ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); ioErr != nil {
			ioErr = fmt.Errorf("set the window size: %w", ioErr)
		}
	})
	if err == nil {
		err = ioErr
	}
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

// startTTY starts name with args in a new session whose controlling
// terminal is a new pseudo-terminal of rows x cols. env replaces baseEnv's
// entries of the same name. Cleanup kills the session's process group if
// it is still running and closes the terminal.
func startTTY(t *testing.T, rows, cols uint16, dir string, env []string, name string, args ...string) *ttyProc {
	t.Helper()
	master, slave, err := openPty(rows, cols)
	if err != nil {
		t.Fatalf("pseudo-terminal: %v", err)
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = ttyEnv(env)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	// A session of its own, with the terminal as its controlling terminal
	// (Ctty is the child's descriptor: its stdin); the command is the
	// session's leader and its process group the terminal's foreground.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		master.Close()
		slave.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	// Only the command holds the slave now: when it and its children have
	// exited, the master reads EIO.
	slave.Close()
	p := &ttyProc{t: t, cmd: cmd, master: master, readDone: make(chan struct{}), exited: make(chan struct{})}
	go p.read()
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.stop)
	return p
}

// ttyEnv is baseEnv with env applied, minus COLUMNS and LINES, which
// would override the terminal's window size.
func ttyEnv(env []string) []string {
	set := map[string]bool{"COLUMNS": true, "LINES": true}
	for _, e := range env {
		k, _, _ := strings.Cut(e, "=")
		set[k] = true
	}
	var out []string
	for _, e := range baseEnv() {
		k, _, _ := strings.Cut(e, "=")
		if !set[k] {
			out = append(out, e)
		}
	}
	return append(out, env...)
}

func (p *ttyProc) read() {
	defer close(p.readDone)
	buf := make([]byte, 32<<10)
	for {
		n, err := p.master.Read(buf)
		if n > 0 {
			p.mu.Lock()
			p.out = append(p.out, buf[:n]...)
			p.mu.Unlock()
		}
		if err != nil {
			return // EIO once no process holds the slave; or the master closed
		}
	}
}

// stop kills what is left of the session and closes the terminal.
func (p *ttyProc) stop() {
	select {
	case <-p.exited:
	default:
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			p.t.Errorf("%s still running 10s after SIGKILL", p.cmd.Path)
		}
	}
	// Anything the command left in its process group goes too.
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.master.Close()
	select {
	case <-p.readDone:
	case <-time.After(10 * time.Second):
		p.t.Errorf("reading the terminal of %s did not stop after it was closed", p.cmd.Path)
	}
}

// raw returns what the command wrote so far.
func (p *ttyProc) raw() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.out...)
}

// mark is where the output ends now: the from of a later wait.
func (p *ttyProc) mark() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.out)
}

// text returns the output from offset from on, with the terminal's
// escape sequences taken out.
func (p *ttyProc) text(from int) string {
	b := p.raw()
	if from > len(b) {
		from = len(b)
	}
	return stripANSI(string(b[from:]))
}

// tail is the last n bytes of the output without escape sequences, for
// failure messages. A terminal UI moves the cursor instead of writing
// newlines; moves to another row show as line breaks here.
func (p *ttyProc) tail(n int) string {
	s := rowMoveRE.ReplaceAllString(string(p.raw()), "\n")
	s = stripANSI(strings.ReplaceAll(s, "\r", ""))
	s = blankLinesRE.ReplaceAllString(s, "\n")
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}

// rowMoveRE matches the cursor moves to another row: down, next line,
// position, line position.
var rowMoveRE = regexp.MustCompile(`\x1b\[[0-9;]*[BEHfd]`)

var blankLinesRE = regexp.MustCompile(`\n[ \t]*(\n[ \t]*)+`)

// resize sets the terminal's window size, as a terminal emulator does
// when its window changes: the kernel sends SIGWINCH to the terminal's
// foreground process group.
func (p *ttyProc) resize(rows, cols uint16) {
	p.t.Helper()
	rc, err := p.master.SyscallConn()
	if err == nil {
		err = rc.Control(func(fd uintptr) {
			err = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
		})
	}
	if err != nil {
		p.t.Fatalf("resize the terminal: %v", err)
	}
}

// send types s into the terminal.
func (p *ttyProc) send(s string) {
	p.t.Helper()
	if _, err := p.master.Write([]byte(s)); err != nil {
		p.t.Fatalf("typing %q: %v\nterminal so far:\n%s", s, err, p.tail(4096))
	}
}

// waitFor waits until the output after from, escape sequences taken out,
// satisfies ok, or fails the test at deadline with the end of the output.
func (p *ttyProc) waitFor(what string, from int, deadline time.Time, ok func(text string) bool) {
	p.t.Helper()
	last := -1
	for {
		if n := p.mark(); n != last {
			last = n
			if ok(p.text(from)) {
				return
			}
		}
		select {
		case <-p.exited:
			// Whatever the command wrote before it exited is in the
			// buffer once the reader is done with it.
			select {
			case <-p.readDone:
			case <-time.After(2 * time.Second):
			}
			if ok(p.text(from)) {
				return
			}
			p.t.Fatalf("waiting for %s: %s exited (%v); the terminal's last 4 KiB:\n%s", what, p.cmd.Path, p.waitErr, p.tail(4096))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) && !ok(p.text(from)) {
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			p.t.Fatalf("waiting for %s: timed out; the terminal's last 4 KiB:\n%s", what, p.tail(4096))
		}
	}
}

// waitText waits for s to appear in the output after from. Blanks do
// not count: a terminal UI moves the cursor over cells that are blank
// already rather than write spaces there.
func (p *ttyProc) waitText(what string, from int, deadline time.Time, s string) {
	p.t.Helper()
	s = squash(s)
	p.waitFor(what, from, deadline, func(text string) bool { return strings.Contains(squash(text), s) })
}

// squash takes the white space out of s.
func squash(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) {
			return -1
		}
		return r
	}, s)
}

// wait waits for the command to exit and the reader to drain the
// terminal, and returns the exit status (-1 for a signal).
func (p *ttyProc) wait(deadline time.Time) int {
	p.t.Helper()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-p.exited:
	case <-timer.C:
		select {
		case <-p.exited: // just in time
		default:
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			p.t.Fatalf("%s did not exit in time; the terminal's last 4 KiB:\n%s", p.cmd.Path, p.tail(4096))
		}
	}
	select {
	case <-p.readDone:
	case <-time.After(5 * time.Second):
		// A process that left the session's process group may hold the
		// terminal; what the command itself wrote has been read by now.
	}
	var ee *exec.ExitError
	switch {
	case p.waitErr == nil:
		return 0
	case errors.As(p.waitErr, &ee):
		return ee.ExitCode()
	default:
		p.t.Fatalf("wait %s: %v", p.cmd.Path, p.waitErr)
		return -1
	}
}

// ansiRE matches the terminal's escape sequences: CSI (cursor, colours,
// modes), OSC (titles, hyperlinks), DCS and the like up to their string
// terminator, and the two-byte escapes.
var ansiRE = regexp.MustCompile(`\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[PX^_][^\x1b]*\x1b\\|[()*+][0-9A-Za-z]|[@-Z\\-_=>78])`)

func stripANSI(s string) string {
	return ansiRE.ReplaceAllString(s, "")
}

// runs returns the lengths of the runs of r in s (maximal ones: a run of
// 5 counts as 5, not also as 4), and the longest.
func runs(s string, r rune) (lengths map[int]bool, longest int) {
	lengths = map[int]bool{}
	n := 0
	for _, c := range s + "\x00" {
		if c == r {
			n++
			continue
		}
		if n > 0 {
			lengths[n] = true
			longest = max(longest, n)
		}
		n = 0
	}
	return lengths, longest
}

// ---------------------------------------------------------------------------

// TestClaudeInteractive runs Claude Code's interactive UI through stagefs
// claude on a pseudo-terminal: one prompt typed in, whose Bash tool call
// is staged as its own snapshot in the prompt's turn, then /exit. The
// terminal is the UI's own (its window size reaches Claude Code) and
// stagefs's summary follows on it.
func TestClaudeInteractive(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"readme.txt": "interactive\n"}))
	const (
		key    = "agentsim-tty-1"
		prompt = key + " write tty.txt"
		reply  = "7QXZ-REPLY-KJV9"
		// Unusual widths, so that a rule drawn across the whole
		// window shows the size reached Claude Code.
		rows, cols, newCols = 40, 117, 101
	)
	s := newClaudeSession(t, m, agentsim.Scripts{
		key: {
			agentsim.Call("Bash", map[string]any{"command": "echo hi > tty.txt", "description": "write tty.txt"}),
			agentsim.Text(reply),
		},
	})
	env := append(s.srv.ClaudeEnv(s.home), "PWD="+m.ws, "TERM=xterm-256color")
	seedClaudeConfig(t, s.home, m.ws, envValue(env, "ANTHROPIC_API_KEY"))
	before := snapshot(t, m.ws)

	deadline := time.Now().Add(60 * time.Second)
	term := startTTY(t, rows, cols, m.ws, env, stagefsBin,
		"claude", "--claude", s.claude, "--", "--permission-mode", "default", "--allowedTools", "Bash")

	// The UI is up when its input box is: a rule across the window, then
	// the prompt sign.
	box := regexp.MustCompile(`─{20,}❯`)
	term.waitFor("Claude Code's input box", 0, deadline, func(text string) bool {
		return box.MatchString(squash(text))
	})
	if _, got := runs(term.text(0), '─'); got != cols {
		t.Errorf("Claude Code's rules are %d columns wide; the terminal has %d: the window size did not reach it", got, cols)
	}

	// Type the prompt; Enter only once the box shows it, or Claude Code
	// could take the Enter as part of a paste.
	at := term.mark()
	term.send(prompt)
	term.waitText("the prompt in the input box", at, deadline, prompt)
	at = term.mark()
	term.send("\r")
	term.waitText("the model's reply", at, deadline, reply)

	// A window that changes size: SIGWINCH reaches Claude Code in the
	// sandbox, which draws its rules again at the new width.
	at = term.mark()
	term.resize(rows, newCols)
	term.waitFor(fmt.Sprintf("rules %d columns wide after the resize", newCols), at, deadline, func(text string) bool {
		lengths, _ := runs(text, '─')
		return lengths[newCols]
	})

	at = term.mark()
	term.send("/exit")
	term.waitText("/exit in the input box", at, deadline, "/exit")
	at = term.mark()
	term.send("\r")
	code := term.wait(deadline)
	out := term.text(at)
	if code != 0 {
		t.Errorf("stagefs claude exited with status %d; the terminal's last 4 KiB:\n%s", code, term.tail(4096))
	}
	if !strings.Contains(out, "stagefs: claude exited (status 0)") || !strings.Contains(out, "1 turn(s), 1 tool call(s)") {
		t.Errorf("no exit summary on the terminal after /exit; the terminal's last 4 KiB:\n%s", term.tail(4096))
	}

	// The model saw the tool's result.
	ids := s.srv.ToolUseIDs()
	results := s.srv.ToolResults()
	if len(ids) != 1 || len(results) != 1 || results[0].ID != ids[0] || results[0].IsError {
		t.Fatalf("tool calls %v, results %+v: want one call and its result", ids, results)
	}

	// Staged, not in the workspace.
	assertFile(t, m.in("tty.txt"), "hi\n")
	if kinds := statusKinds(m.status()); kinds["tty.txt"] != "create" || len(kinds) != 1 {
		t.Errorf("pending: %v, want tty.txt created", kinds)
	}
	assertMissing(t, m.inWS("tty.txt"))
	assertSameTree(t, "the real workspace after the session", before, snapshot(t, m.ws))

	// The prompt is a turn, the tool call a snapshot.
	turns := m.checkpoints()
	if len(turns) != 1 || !strings.HasPrefix(turns[0].Label, prompt) {
		t.Errorf("checkpoints: %+v, want one turn labelled %q", turns, prompt)
	}
	snap, ok := m.snapshotsByScope()[ids[0]]
	if !ok {
		t.Fatalf("the tool call %s has no snapshot", ids[0])
	}
	if snap.Label != "Bash: echo hi > tty.txt" {
		t.Errorf("label of the tool call's snapshot: %q", snap.Label)
	}
	if len(snap.Paths) != 1 || snap.Paths[0] != "tty.txt" {
		t.Errorf("the tool call's snapshot holds %v, want [tty.txt]", snap.Paths)
	}
}
