package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"stagefs/control"
	"stagefs/internal/unidiff"
	"stagefs/overlay"
)

func (b *backend) registerTurns(s *control.Server) {
	s.Handle(control.MethodTurn, control.Typed(b.turn))
	s.Handle(control.MethodCheckpoints, control.Typed(b.checkpoints))
	s.Handle(control.MethodRollback, control.Typed(b.rollback))
	s.Handle(control.MethodRedo, control.Typed(b.redo))
	s.Handle(control.MethodMarkUser, control.Typed(b.markUser))
}

func turnInfo(t overlay.Turn) control.TurnInfo {
	return control.TurnInfo{TurnID: t.ID, Label: t.Label, Started: t.Started.UTC().Format(time.RFC3339Nano), Open: t.Open, Files: len(t.Paths), Bytes: t.Bytes, Paths: t.Paths, Uncaptured: t.Uncaptured}
}

func (b *backend) turn(ctx context.Context, p control.TurnParams) (control.TurnInfo, error) {
	// A turn id used before is refused, as a scope id is: a new turn
	// under it would replace the old one and drop its pre-images.
	if p.TurnID != "" {
		for _, t := range b.eng.Turns() {
			if t.ID == p.TurnID {
				return control.TurnInfo{}, control.Errorf(control.CodeBusy, "turn id %q names an earlier turn; choose a new id, or leave it out and stagefs numbers the turn", p.TurnID)
			}
		}
	}
	t, err := b.eng.StartTurn(p.TurnID, shortLabel(p.Label))
	if err != nil {
		return control.TurnInfo{}, snapshotError("turn:"+p.TurnID, err)
	}
	return turnInfo(t), nil
}

func (b *backend) checkpoints(ctx context.Context, _ struct{}) (control.CheckpointsResult, error) {
	res := control.CheckpointsResult{Turns: []control.TurnInfo{}}
	for _, t := range b.eng.Turns() {
		res.Turns = append(res.Turns, turnInfo(t))
	}
	return res, nil
}

func rollbackResult(r overlay.RollbackResult) control.RollbackResult {
	out := control.RollbackResult{TurnID: r.Turn, RestoredPaths: nonNil(r.Restored), Conflicts: []control.Conflict{}, Failed: []control.Failure{}}
	for _, c := range r.Conflicts {
		out.Conflicts = append(out.Conflicts, control.Conflict{Path: c.Path, Reason: c.Reason, Expected: c.Expected, Actual: c.Actual})
	}
	for _, f := range r.Failed {
		out.Failed = append(out.Failed, control.Failure{Path: f.Path, Reason: f.Reason})
	}
	return out
}

func (b *backend) rollback(ctx context.Context, p control.RollbackParams) (control.RollbackResult, error) {
	rel, err := b.relPaths(p.Paths)
	if err != nil {
		return control.RollbackResult{}, err
	}
	if p.Diff {
		changes, conflicts, err := b.eng.RollbackDiff(p.TurnID, rel, p.Force)
		if err != nil {
			return control.RollbackResult{}, snapshotError("turn:"+p.TurnID, err)
		}
		var buf bytes.Buffer
		if err := unidiff.Write(&buf, changes); err != nil {
			return control.RollbackResult{}, err
		}
		out := rollbackResult(overlay.RollbackResult{Turn: p.TurnID, Conflicts: conflicts})
		out.Diff = buf.String()
		return out, nil
	}
	r, err := b.eng.Rollback(p.TurnID, rel, p.Force, ctlCaller(ctx))
	if err != nil {
		return control.RollbackResult{}, snapshotError("turn:"+p.TurnID, err)
	}
	b.fs.Invalidate(r.Restored)
	b.publish(control.Event{Kind: control.EventRolledBack, Paths: r.Restored, Detail: "rollback to the start of " + r.Turn})
	if len(r.Conflicts) > 0 {
		var ps []string
		for _, c := range r.Conflicts {
			ps = append(ps, c.Path)
		}
		b.publish(control.Event{Kind: "conflict", Paths: ps})
	}
	return rollbackResult(r), nil
}

func (b *backend) redo(ctx context.Context, p control.RedoParams) (control.RollbackResult, error) {
	r, err := b.eng.Redo(p.Force, ctlCaller(ctx))
	if err != nil {
		return control.RollbackResult{}, snapshotError("redo", err)
	}
	b.fs.Invalidate(r.Restored)
	b.publish(control.Event{Kind: control.EventRolledBack, Paths: r.Restored, Detail: "redo"})
	if len(r.Conflicts) > 0 {
		var ps []string
		for _, c := range r.Conflicts {
			ps = append(ps, c.Path)
		}
		b.publish(control.Event{Kind: "conflict", Paths: ps})
	}
	return rollbackResult(r), nil
}

func (b *backend) markUser(ctx context.Context, p control.MarkUserParams) (control.MarkUserResult, error) {
	if !p.Remove && syscall.Kill(p.Pid, 0) == syscall.ESRCH {
		return control.MarkUserResult{}, control.Errorf(control.CodeNotFound, "no process %d", p.Pid)
	}
	b.eng.MarkUser(p.Pid, !p.Remove)
	return control.MarkUserResult{Pid: p.Pid, User: !p.Remove}, nil
}

func runUser(ctx context.Context, args []string) error {
	var remove bool
	cf, rest, c, err := parseClient("user", args, func(fs *pflag.FlagSet) {
		fs.BoolVar(&remove, "remove", false, "unmark the process")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) != 1 {
		return usagef("usage: stagefs user PID [--remove]")
	}
	pid, err := strconv.Atoi(rest[0])
	if err != nil {
		return usagef("user: %q is not a process id", rest[0])
	}
	res, err := c.MarkUser(ctx, control.MarkUserParams{Pid: pid, Remove: remove})
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	if res.User {
		fmt.Printf("process %d and its descendants are the user's: their changes are never rolled back silently\n", pid)
	} else {
		fmt.Printf("process %d is no longer marked as the user's\n", pid)
	}
	return nil
}

func runTurn(ctx context.Context, args []string) error {
	var label string
	cf, rest, c, err := parseClient("turn", args, func(fs *pflag.FlagSet) {
		fs.StringVar(&label, "label", "", "a label shown by checkpoints (e.g. the user's message)")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) > 1 {
		return usagef("usage: stagefs turn [ID] [--label TEXT]")
	}
	p := control.TurnParams{Label: label}
	if len(rest) == 1 {
		p.TurnID = rest[0]
	}
	res, err := c.Turn(ctx, p)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	fmt.Printf("turn %s started\n", res.TurnID)
	return nil
}

func runCheckpoints(ctx context.Context, args []string) error {
	cf, _, c, err := parseClient("checkpoints", args, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := c.Checkpoints(ctx)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	for _, t := range res.Turns {
		state := ""
		if t.Open {
			state = " (open)"
		}
		if n := len(t.Uncaptured); n > 0 {
			state += fmt.Sprintf(" (incomplete: %d path(s) not captured, rollback cannot restore them: %s)", n, strings.Join(t.Uncaptured, ", "))
		}
		fmt.Printf("%-12s %s  %d file(s)  %s  %s%s\n", t.TurnID, t.Started, t.Files, humanBytes(t.Bytes), t.Label, state)
	}
	return nil
}

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
			fmt.Printf("restored  %s\n", r)
		}
	}
	if !cf.json {
		// With --diff, stdout is the patch alone: the notes go to stderr.
		notes := os.Stdout
		if diff {
			notes = os.Stderr
		}
		for _, x := range res.Conflicts {
			fmt.Fprintf(notes, "conflict  %s: %s%s\n", x.Path, x.Reason, conflictStates("turn left", "now", x))
		}
		for _, f := range res.Failed {
			fmt.Fprintf(notes, "failed    %s: %s\n", f.Path, f.Reason)
		}
	}
	if !diff && len(res.Conflicts)+len(res.Failed) > 0 {
		return &conflictError{fmt.Sprintf("%d path(s) were not rolled back (use --force to overwrite conflicts)", len(res.Conflicts)+len(res.Failed))}
	}
	return nil
}

func runRedo(ctx context.Context, args []string) error {
	var force bool
	cf, rest, c, err := parseClient("redo", args, func(fs *pflag.FlagSet) {
		fs.BoolVar(&force, "force", false, "overwrite paths changed after the rollback by someone else")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) > 0 {
		return usagef("usage: stagefs redo [--force]")
	}
	stop := watchProgress(c, cf)
	res, err := c.Redo(ctx, control.RedoParams{Force: force})
	stop()
	if err != nil {
		return err
	}
	if cf.json {
		if err := printJSON(res); err != nil {
			return err
		}
	} else {
		for _, r := range res.RestoredPaths {
			fmt.Printf("restored  %s\n", r)
		}
		for _, x := range res.Conflicts {
			fmt.Printf("conflict  %s: %s%s\n", x.Path, x.Reason, conflictStates("rollback left", "now", x))
		}
		for _, f := range res.Failed {
			fmt.Printf("failed    %s: %s\n", f.Path, f.Reason)
		}
	}
	if len(res.Conflicts)+len(res.Failed) > 0 {
		return &conflictError{fmt.Sprintf("%d path(s) were not redone (use --force to overwrite conflicts)", len(res.Conflicts)+len(res.Failed))}
	}
	return nil
}
