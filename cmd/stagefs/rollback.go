package main

// stagefs rollback [TURN]: return to the start of a turn
// (session/rollback).

import (
	"context"
	"fmt"
	"os"

	"stagefs/control"
)

func runRollback(ctx context.Context, args []string) error {
	var force, diff bool
	fs, cf := newClientFlags("rollback")
	fs.BoolVar(&force, "force", false, "overwrite paths changed after the turn by someone else")
	fs.BoolVar(&diff, "diff", false, "show what the rollback would change, change nothing")
	if err := fs.Parse(args); err != nil {
		return usagef("rollback: %v", err)
	}
	p := control.RollbackParams{Force: force, Diff: diff}
	rest := fs.Args()
	if n := fs.ArgsLenAtDash(); n >= 0 {
		p.Paths = rest[n:]
		rest = rest[:n]
	}
	if len(rest) > 1 {
		return usagef("usage: stagefs rollback [TURN] [--force] [--diff] [-- PATH...]")
	}
	if len(rest) == 1 {
		p.TurnID = rest[0]
	}
	c, err := cf.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	if p.Paths, err = fromHere(ctx, c, p.Paths); err != nil {
		return err
	}
	stop := watchProgress(c, cf)
	res, err := c.Rollback(ctx, p)
	stop()
	if err != nil {
		return err
	}
	if cf.json {
		if err := printJSON(res); err != nil {
			return err
		}
	} else if diff {
		fmt.Print(res.Diff)
	} else {
		for _, r := range res.RestoredPaths {
			fmt.Printf("restored  %s\n", shown(r))
		}
	}
	if !cf.json {
		// With --diff, stdout is the patch alone: the notes go to stderr.
		notes := os.Stdout
		if diff {
			notes = os.Stderr
		}
		for _, x := range res.Conflicts {
			fmt.Fprintf(notes, "conflict  %s: %s%s\n", shown(x.Path), x.Reason, conflictStates("turn left", "now", x))
		}
		for _, f := range res.Failed {
			fmt.Fprintf(notes, "failed    %s: %s\n", shown(f.Path), f.Reason)
		}
	}
	if !diff && len(res.Conflicts)+len(res.Failed) > 0 {
		return &conflictError{fmt.Sprintf("%d path(s) were not rolled back (use --force to overwrite conflicts)", len(res.Conflicts)+len(res.Failed))}
	}
	return nil
}
