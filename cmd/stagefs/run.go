package main

// stagefs run: one command in the sandbox (package sandbox), in which the
// workspace's own path shows the staged view. This side talks to the
// daemon, works out the paths, opens the tool call's snapshot bound to
// its own pid (the sandbox's processes are its descendants) and reports.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"stagefs/control"
	"stagefs/sandbox"
)

// runResult is what `stagefs run --json` prints as the last line of stdout.
type runResult struct {
	ExitCode int    `json:"exitCode"`
	Started  bool   `json:"started"`         // false: the namespace or the exec failed
	Error    string `json:"error,omitempty"` // why it did not start
	Workdir  string `json:"workdir"`
	// With --scope (else null): the close_snapshot result and the pending
	// changes at (or below) the paths the command touched, as
	// fs/staged_status gives them.
	Snapshot *control.SnapshotInfo `json:"snapshot"`
	Changes  []control.StatusEntry `json:"changes"`
}

func runRun(ctx context.Context, args []string) error {
	const usage = "usage: stagefs run [-m MOUNTPOINT] [--scope ID] [--workdir DIR] [--json] -- CMD [ARGS...]"
	var scope, workdir string
	fs, cf := newClientFlags("run")
	fs.StringVar(&scope, "scope", "", "open a snapshot for this tool call while CMD runs and summarize what it changed")
	fs.StringVar(&workdir, "workdir", "", "working directory, inside the workspace or the mount (default: the current directory if it is inside either, else the workspace root)")
	// Flags end at CMD, so `stagefs run ls -l` works without "--".
	fs.SetInterspersed(false)
	if err := fs.Parse(args); err != nil {
		return usagef("run: %v", err)
	}
	if fs.NArg() == 0 {
		return usagef(usage)
	}
	if fs.Changed("scope") && scope == "" {
		return usagef("run: --scope needs an id (an empty one would run the command with no snapshot)")
	}
	argv := fs.Args()

	c, err := cf.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	init, err := c.Initialize(ctx)
	if err != nil {
		return err
	}
	ws, mnt := init.Workspace, init.Mount
	m, ok := isMounted(mnt)
	if !ok || !strings.HasPrefix(m.source, stagefsSourcePrefix) {
		return fmt.Errorf("the daemon's mount point %s is not a stagefs mount in this mount namespace", mnt)
	}
	state := strings.TrimPrefix(m.source, stagefsSourcePrefix)
	dir, err := runWorkdir(workdir, ws, mnt)
	if err != nil {
		return err
	}

	if scope != "" {
		// Bound to our own pid: the command descends from us, so it and
		// everything it starts are captured, and nothing else is.
		if _, err := c.Snapshot(ctx, control.SnapshotParams{ScopeID: scope, Pid: os.Getpid()}); err != nil {
			return err
		}
	}

	sres, err := sandbox.Run(sandbox.Spec{Workspace: ws, Mount: mnt, State: state, Workdir: dir, Argv: argv, Forward: forwardSignal})
	res := runResult{Workdir: dir, Started: sres.Started, Error: sres.Error}
	code := sres.Code
	if err != nil {
		if scope != "" {
			// Nothing ran: drop the empty snapshot rather than leave it
			// open.
			c.DropSnapshot(context.Background(), scope)
		}
		return err
	}
	return finishRun("run", c, scope, code, &res, cf.json)
}

// finishRun ends a run or exec of a command that exited with code: it
// closes the command's snapshot (scope, "" for none), prints the summary
// or the JSON result, and returns the status the CLI exits with.
func finishRun(name string, c *control.Client, scope string, code int, res *runResult, asJSON bool) error {
	if scope != "" {
		// Not the command's context: a signal we forwarded may have
		// cancelled it, and the snapshot must be closed all the same. A
		// failure here is only reported: CMD's exit status is what the
		// caller needs most.
		bg, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := closeRunSnapshot(bg, c, scope, res); err != nil {
			// The daemon died or the mount went away while CMD ran: what
			// CMD did was not captured as promised, so the run failed,
			// whatever CMD's own status.
			res.Error = fmt.Sprintf("closing the snapshot %s: %v (the daemon may have stopped: mount again, nothing staged is lost)", scope, err)
			fmt.Fprintf(os.Stderr, "stagefs %s: %s\n", name, res.Error)
			if code == 0 {
				code = exitError
			}
		} else if !asJSON {
			printRunSummary(scope, *res.Snapshot, res.Changes)
		}
	}
	res.ExitCode = code
	if asJSON {
		// CMD's output, then a newline, then one line of JSON: a host
		// recovers CMD's exact output by cutting the last line and the
		// newline before it.
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		fmt.Printf("\n%s\n", b)
	}
	if code != 0 {
		return &exitStatus{code}
	}
	return nil
}

// closeRunSnapshot closes the tool call's snapshot and looks up the pending
// changes at the paths it touched.
func closeRunSnapshot(ctx context.Context, c *control.Client, scope string, res *runResult) error {
	info, err := c.CloseSnapshot(ctx, scope)
	if err != nil {
		return err
	}
	changes := []control.StatusEntry{}
	if len(info.Paths) > 0 {
		// Status with no paths means all of them; only ask for ours.
		st, err := c.Status(ctx, info.Paths)
		if err != nil {
			return err
		}
		changes = st.Entries
	}
	res.Snapshot, res.Changes = &info, changes
	return nil
}

// daemonForWorkspacePath connects to the daemon whose workspace holds p
// (the innermost, if workspaces nest) and returns its initialize result;
// nil if none does.
func daemonForWorkspacePath(ctx context.Context, p string) (*control.Client, control.InitializeResult) {
	if real, err := filepath.EvalSymlinks(p); err == nil {
		p = real
	}
	ms, _ := readMounts()
	var best *control.Client
	var bestInit control.InitializeResult
	for _, m := range ms {
		if !strings.HasPrefix(m.source, stagefsSourcePrefix) {
			continue
		}
		cand, derr := control.Dial(socketPath(strings.TrimPrefix(m.source, stagefsSourcePrefix)))
		if derr != nil {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		init, ierr := cand.Initialize(ictx)
		cancel()
		if ierr != nil || !within(p, init.Workspace) || len(init.Workspace) <= len(bestInit.Workspace) {
			cand.Close()
			continue
		}
		if best != nil {
			best.Close()
		}
		best, bestInit = cand, init
	}
	return best, bestInit
}

// runWorkdir picks the command's working directory as a path under the
// workspace: --workdir if given, else the current directory if it is in
// the workspace or the mount, else the workspace root.
func runWorkdir(flag, ws, mnt string) (string, error) {
	if flag != "" {
		abs, err := filepath.Abs(flag)
		if err != nil {
			return "", err
		}
		dir, ok := intoWorkspace(abs, ws, mnt)
		if !ok {
			return "", usagef("--workdir %s is outside the workspace %s and the mount %s", flag, ws, mnt)
		}
		if !isStagedDir(dir, ws, mnt) {
			return "", fmt.Errorf("--workdir %s is not a directory in the staged view", flag)
		}
		return dir, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return ws, nil
	}
	dir, ok := intoWorkspace(wd, ws, mnt)
	if !ok {
		return ws, nil
	}
	if !isStagedDir(dir, ws, mnt) {
		// E.g. the directory was deleted in the staged view.
		fmt.Fprintf(os.Stderr, "stagefs: %s is not a directory in the staged view; starting %s\n", dir, ws)
		return ws, nil
	}
	return dir, nil
}

// intoWorkspace maps p, a path in the workspace or in the mount, to the
// same place under the workspace path. A path that is neither is tried
// again with its symlinks resolved.
func intoWorkspace(p, ws, mnt string) (string, bool) {
	try := func(p string) (string, bool) {
		for _, root := range []string{ws, mnt} {
			if within(p, root) {
				rel, err := filepath.Rel(root, p)
				if err != nil {
					return "", false
				}
				return filepath.Join(ws, rel), true
			}
		}
		return "", false
	}
	p = filepath.Clean(p)
	if dir, ok := try(p); ok {
		return dir, true
	}
	if real, err := filepath.EvalSymlinks(p); err == nil {
		return try(real)
	}
	return "", false
}

// isStagedDir reports whether dir (under ws) is a directory in the staged
// view, which outside the namespace is the mount.
func isStagedDir(dir, ws, mnt string) bool {
	rel, err := filepath.Rel(ws, dir)
	if err != nil {
		return false
	}
	st, err := os.Stat(filepath.Join(mnt, rel))
	return err == nil && st.IsDir()
}

// forwardSignal decides whether a signal run received goes on to the
// command. SIGTERM always does. SIGINT, SIGQUIT and SIGHUP come from the
// terminal to its whole foreground process group, the command included,
// so when run is in that group they are not sent a second time (a second
// Ctrl-C means "force quit" to some tools); sent to run alone (an agent
// host's kill), they are forwarded.
func forwardSignal(s os.Signal) bool {
	if s == syscall.SIGTERM {
		return true
	}
	return !inTerminalForeground()
}

func inTerminalForeground() bool {
	tty, err := os.Open("/dev/tty") // fails without a controlling terminal
	if err != nil {
		return false
	}
	defer tty.Close()
	fg, err := unix.IoctlGetInt(int(tty.Fd()), unix.TIOCGPGRP)
	return err == nil && fg == syscall.Getpgrp()
}

// summaryLines caps the summary: a build can touch thousands of paths, and
// an agent reads all of stderr.
const summaryLines = 40

// printRunSummary tells the user on stderr what the tool call changed: the
// pending changes at the paths it touched, then the touched paths that
// have none now (marked "(none)": a temporary file renamed or removed
// again, or a change committed or discarded meanwhile).
func printRunSummary(scope string, info control.SnapshotInfo, changes []control.StatusEntry) {
	fmt.Fprintf(os.Stderr, "stagefs: %s touched %d path(s)\n", scope, len(info.Paths))
	var lines []string
	pending := map[string]bool{}
	for _, e := range changes {
		pending[e.Path] = true
		what := e.Path
		if e.From != "" {
			what = e.From + " -> " + e.Path
		}
		lines = append(lines, fmt.Sprintf("  %-9s %s  %s", e.Kind, what, humanBytes(e.Bytes)))
	}
	for _, p := range info.Paths {
		if !pending[p] {
			lines = append(lines, fmt.Sprintf("  %-9s %s", "(none)", p))
		}
	}
	if len(lines) > summaryLines {
		more := len(lines) - summaryLines
		lines = append(lines[:summaryLines], fmt.Sprintf("  ... and %d more (stagefs snapshots, stagefs status)", more))
	}
	for _, l := range lines {
		fmt.Fprintln(os.Stderr, l)
	}
}
