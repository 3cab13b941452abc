// Command stagefs mounts a staged overlay over a workspace and controls it.
// See the README for the commands, the protocol and the exit codes.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"stagefs/control"
	"stagefs/sandbox"
)

// Exit codes, documented in the README; mapped here and nowhere else.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitConflict = 3 // commit left conflicts or failures; patch was stale
	exitNoDaemon = 4
)

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// conflictError reports a command that ran but left something undone.
type conflictError struct{ msg string }

func (e *conflictError) Error() string { return e.msg }

// noDaemonError reports that no daemon could be reached.
type noDaemonError struct{ err error }

func (e *noDaemonError) Error() string { return e.err.Error() }
func (e *noDaemonError) Unwrap() error { return e.err }

// exitStatus carries a child's exit status out of exec, run, the agent
// commands and hook: stagefs exits with it.
type exitStatus struct{ code int }

func (e *exitStatus) Error() string { return fmt.Sprintf("exit status %d", e.code) }

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string) error
}

var commands []command

func init() {
	commands = []command{
		{"mount", "mount WORKSPACE MOUNTPOINT: lay a staged overlay over WORKSPACE at MOUNTPOINT", runMount},
		{"unmount", "unmount MOUNTPOINT [--lazy]: unmount; the pending set is kept", runUnmount},
		{"status", "status [PATH...]: list pending changes", runStatus},
		{"diff", "diff [PATH...] [--color auto|always|never]: unified diff of pending changes (git apply compatible)", runDiff},
		{"commit", "commit [PATH...] [--force]: apply pending changes to the workspace", runCommit},
		{"discard", "discard [PATH...]: drop pending changes", runDiscard},
		{"mode", "mode [staged|immediate]: show or switch the write mode", runMode},
		{"log", "log [--since SEQ] [--limit N | --tail N] [PATH...]: show the journal, oldest first", runLog},
		{"events", "events: follow session/update events", runEvents},
		{"read", "read PATH: print a file as the mount shows it, with its sha256", runRead},
		{"patch", "patch PATH --expect SHA256 (--content-file F | --edit OLD=NEW): compare-and-swap write", runPatch},
		{"snapshot", "snapshot SCOPE [PATH...] [--pid PID] [--label TEXT]: open a tool call's snapshot (capture now with PATHs)", runSnapshot},
		{"close", "close SCOPE: close a snapshot; prints the captured paths", runClose},
		{"restore", "restore SCOPE [--keep-later]: put a tool call's pre-images back", runRestore},
		{"snapshots", "snapshots: list snapshots, oldest first", runSnapshots},
		{"drop", "drop SCOPE: delete a snapshot", runDrop},
		{"exec", "exec --scope SCOPE [-C DIR] -- CMD [ARGS...]: run CMD in the mount as one tool call", runExec},
		{"turn", "turn [ID] [--label TEXT]: start a turn (ends the previous one)", runTurn},
		{"checkpoints", "checkpoints: list turns, newest first", runCheckpoints},
		{"rollback", "rollback [TURN] [--force] [--diff] [-- PATH...]: return to the start of a turn", runRollback},
		{"redo", "redo [--force]: take back the last rollback", runRedo},
		{"user", "user PID [--remove]: mark a process tree as the user's (never rolled back silently)", runUser},
		{"run", "run [-m MOUNT] [--scope ID] [--workdir DIR] -- CMD [ARGS...]: run CMD at the workspace's own path, staged", runRun},
		{"claude", "claude [-m MOUNT | mount flags] [--workspace DIR] [--claude PATH] [-- CLAUDE_ARGS...]: Claude Code in the staged view; every prompt a turn, every tool call a snapshot", runClaude},
		{"codex", "codex [-m MOUNT | mount flags] [--workspace DIR] [--codex PATH] [-- CODEX_ARGS...]: Codex CLI in the staged view (docs/agents.md)", runCodex},
		{"gemini", "gemini [-m MOUNT | mount flags] [--workspace DIR] [--gemini PATH] [-- GEMINI_ARGS...]: Gemini CLI in the staged view (docs/agents.md)", runGemini},
		{"acp", "acp [-m MOUNT | mount flags] [--workspace DIR] -- AGENT_CMD [ARGS...]: an ACP agent that runs AGENT_CMD in the staged view (docs/acp.md)", runACP},
		{"hook", "hook AGENT | hook bind SCOPE: what an agent's hooks run (wired by stagefs claude)", runHook},
		{"branch", "branch NAME [--from BRANCH] | branch --drop NAME: fork the view into a branch with its own pending set and mount (docs/branches.md)", runBranch},
		{"branches", "branches: list the mount's branches", runBranches},
		{"merge", "merge NAME [--into PARENT] [--force] [PATH...]: apply what a branch changed since its fork to its parent", runMerge},
		{"scratch", "scratch [--drop]: list (or delete) what runs wrote under $HOME, /tmp and /var/tmp: the mount's scratch layer", runScratch},
	}
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(os.Stdout)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	if args[0] == "--version" || args[0] == "version" {
		fmt.Println("stagefs", version)
		return exitOK
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == args[0] {
			cmd = &commands[i]
		}
	}
	switch args[0] {
	case daemonCommand:
		cmd = &command{name: daemonCommand, run: runDaemon}
	case sandbox.InitCommand:
		return sandbox.InitMain(args[1:])
	}
	if cmd == nil {
		fmt.Fprintf(os.Stderr, "stagefs: unknown command %q (see stagefs --help)\n", args[0])
		return exitUsage
	}
	if cmd.name == "hook" && wantsHelp(args[1:]) {
		printCommandHelp(os.Stdout, cmd.name, nil)
		return exitOK
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cmd.run(ctx, args[1:])
	if helpShown {
		return exitOK
	}
	return exitCode(err)
}

func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var es *exitStatus
	if errors.As(err, &es) {
		return es.code
	}
	var ue *usageError
	var ce *conflictError
	var nd *noDaemonError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "stagefs: %v\n", err)
		return exitUsage
	case errors.As(err, &ce):
		fmt.Fprintf(os.Stderr, "stagefs: %v\n", err)
		return exitConflict
	case errors.As(err, &nd):
		fmt.Fprintf(os.Stderr, "stagefs: %v\n", err)
		return exitNoDaemon
	}
	var re *control.Error
	if errors.As(err, &re) {
		if k := re.Kind(); k != "" {
			fmt.Fprintf(os.Stderr, "stagefs: %s (%s)\n", re.Message, k)
		} else {
			fmt.Fprintf(os.Stderr, "stagefs: %s\n", re.Message)
		}
		if re.Code == control.CodeStaleBase || re.Code == control.CodeConflict {
			return exitConflict
		}
		return exitError
	}
	fmt.Fprintf(os.Stderr, "stagefs: %v\n", err)
	return exitError
}

func printUsage(w *os.File) {
	fmt.Fprintln(w, "stagefs: a staged overlay filesystem for agent workspaces")
	fmt.Fprintln(w, "\nusage: stagefs COMMAND [ARGS...]  (each command takes --help; clients take --json)")
	fmt.Fprintln(w)
	for _, c := range commands {
		fmt.Fprintf(w, "  %s\n", c.summary)
	}
	fmt.Fprintln(w, "\nClients find the daemon by -m/--mount, --socket, $STAGEFS_SOCKET, or the mount holding the current directory.")
}
