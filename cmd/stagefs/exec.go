package main

// stagefs exec --scope SCOPE -- CMD: run CMD in the mount as one tool
// call, its snapshot bound to this process while it runs.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/pflag"

	"stagefs/control"
	"stagefs/sandbox"
)

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
	return finishRun("exec", c, scope, code, &res, cf.json)
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
