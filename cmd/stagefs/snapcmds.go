package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"stagefs/control"
	"stagefs/sandbox"
)

func printSnapshot(verb string, s control.SnapshotInfo) {
	state := "closed"
	if s.Open {
		state = "open"
	}
	fmt.Printf("%s %s (%s, %s, %d path(s), %s)\n", verb, s.ScopeID, s.SnapshotID, state, len(s.Paths), humanBytes(s.Bytes))
	for _, p := range s.Paths {
		fmt.Printf("  %s\n", p)
	}
}

func runSnapshot(ctx context.Context, args []string) error {
	var pid int
	var label string
	cf, rest, c, err := parseClient("snapshot", args, func(fs *pflag.FlagSet) {
		fs.IntVar(&pid, "pid", 0, "capture only mutations by this process and its descendants")
		fs.StringVar(&label, "label", "", "what the tool call is, for people (a tool and its command or file)")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) < 1 {
		return usagef("usage: stagefs snapshot SCOPE [PATH...] [--pid PID] [--label TEXT]")
	}
	paths, err := fromHere(ctx, c, rest[1:])
	if err != nil {
		return err
	}
	res, err := c.Snapshot(ctx, control.SnapshotParams{ScopeID: rest[0], Paths: paths, Pid: pid, Label: label})
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	printSnapshot("snapshot", res)
	return nil
}

func scopeCommand(name string, args []string) (*clientFlags, string, *control.Client, error) {
	cf, rest, c, err := parseClient(name, args, nil)
	if err != nil {
		return nil, "", nil, err
	}
	if len(rest) != 1 {
		c.Close()
		return nil, "", nil, usagef("usage: stagefs %s SCOPE", name)
	}
	return cf, rest[0], c, nil
}

func runClose(ctx context.Context, args []string) error {
	cf, scope, c, err := scopeCommand("close", args)
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := c.CloseSnapshot(ctx, scope)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	printSnapshot("closed", res)
	return nil
}

func runRestore(ctx context.Context, args []string) error {
	var keepLater bool
	cf, rest, c, err := parseClient("restore", args, func(fs *pflag.FlagSet) {
		fs.BoolVar(&keepLater, "keep-later", false, "leave alone paths changed after the snapshot closed")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) != 1 {
		return usagef("usage: stagefs restore SCOPE [--keep-later]")
	}
	stop := watchProgress(c, cf)
	res, err := c.RestoreWith(ctx, control.RestoreParams{ScopeID: rest[0], KeepLater: keepLater})
	stop()
	if err != nil {
		return err
	}
	if cf.json {
		if err := printJSON(res); err != nil {
			return err
		}
	} else {
		for _, p := range res.RestoredPaths {
			fmt.Printf("restored  %s\n", p)
		}
		for _, p := range res.Overwritten {
			fmt.Printf("overwrote %s (changed after the tool call; --keep-later leaves such paths)\n", p)
		}
		for _, p := range res.Kept {
			fmt.Printf("kept      %s (changed after the tool call)\n", p)
		}
		for _, p := range res.Uncaptured {
			fmt.Printf("lost      %s (its pre-image could not be stored: not restored)\n", p)
		}
		for _, f := range res.Failed {
			fmt.Printf("failed    %s: %s\n", f.Path, f.Reason)
		}
	}
	if len(res.Failed) > 0 {
		return &conflictError{fmt.Sprintf("%d path(s) could not be restored", len(res.Failed))}
	}
	return nil
}

func runSnapshots(ctx context.Context, args []string) error {
	cf, _, c, err := parseClient("snapshots", args, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := c.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	for _, s := range res.Snapshots {
		state := "closed"
		if s.Open {
			state = "open"
		}
		fmt.Printf("%-24s %-6s %s  %d path(s)  %s  %s\n", s.ScopeID, state, s.Created, len(s.Paths), humanBytes(s.Bytes), s.Label)
	}
	return nil
}

func runDrop(ctx context.Context, args []string) error {
	cf, scope, c, err := scopeCommand("drop", args)
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := c.DropSnapshot(ctx, scope)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	fmt.Printf("dropped %s\n", scope)
	return nil
}

// exitStatus carries a child's exit status out of exec.
type exitStatus struct{ code int }

func (e *exitStatus) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// runExec runs one command as a tool call: a snapshot bound to this process
// (so to the command and everything it starts) is open while it runs.
func runExec(ctx context.Context, args []string) error {
	var scope, dir string
	cf, rest, c, err := parseClient("exec", args, func(fs *pflag.FlagSet) {
		fs.StringVar(&scope, "scope", "", "the tool call's scope id (required)")
		fs.StringVarP(&dir, "dir", "C", "", "working directory inside the mount (default: the mount's root)")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if scope == "" || len(rest) == 0 {
		return usagef("usage: stagefs exec --scope SCOPE [-C DIR] -- CMD [ARGS...]")
	}
	init, err := c.Initialize(ctx)
	if err != nil {
		return err
	}
	if dir == "" {
		dir = init.Mount
	} else if dir, err = filepath.Abs(dir); err != nil {
		return err
	}
	// The command's writes are what the scope is for: a directory outside
	// the mount would stage nothing and capture nothing.
	if real, err := filepath.EvalSymlinks(dir); err != nil {
		return fmt.Errorf("exec: -C %s: %w", dir, err)
	} else if !within(real, init.Mount) {
		return usagef("exec: -C %s is not inside the mount %s", dir, init.Mount)
	}
	if _, err := c.Snapshot(ctx, control.SnapshotParams{ScopeID: scope, Pid: os.Getpid()}); err != nil {
		return err
	}
	// The same result, summary and statuses as stagefs run: the two differ
	// only in where the command runs.
	res := runResult{Workdir: dir}
	code := runInMount(rest, dir, &res)
	bg, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := closeRunSnapshot(bg, c, scope, &res); err != nil {
		res.Error = fmt.Sprintf("closing the snapshot %s: %v (the daemon may have stopped: mount again, nothing staged is lost)", scope, err)
		fmt.Fprintf(os.Stderr, "stagefs exec: %s\n", res.Error)
		if code == 0 {
			code = exitError
		}
	} else if !cf.json {
		printRunSummary(scope, *res.Snapshot, res.Changes)
	}
	res.ExitCode = code
	if cf.json {
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

// runInMount runs argv in dir, in this mount namespace, and returns its
// status as a shell gives it: 128+N for signal N, 127 not found, 126 not
// executable. A command that could not start is noted in res.
func runInMount(argv []string, dir string, res *runResult) int {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// The terminal delivers Ctrl-C to the command itself; exec only waits.
	// Catching (not ignoring) the signals keeps the command's defaults:
	// an ignored signal would be inherited ignored.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	go func() {
		for range sigs {
		}
	}()
	err := cmd.Start()
	if err != nil {
		code := sandbox.ExitCannotExec
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code, res.Error = sandbox.ExitNotFound, fmt.Sprintf("%s: command not found", argv[0])
		} else {
			res.Error = fmt.Sprintf("%s: %v", argv[0], err)
		}
		fmt.Fprintf(os.Stderr, "stagefs exec: %s\n", res.Error)
		return code
	}
	res.Started = true
	err = cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws := ee.Sys().(syscall.WaitStatus); ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		return exitError
	}
	return 0
}
