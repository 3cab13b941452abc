package main

// stagefs commit [PATH...] [--force]: apply pending changes to the
// workspace (fs/commit_staged).

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"stagefs/control"
)

func runCommit(ctx context.Context, args []string) error {
	var force bool
	cf, paths, c, err := parseClient("commit", args, func(fs *pflag.FlagSet) {
		fs.BoolVar(&force, "force", false, "overwrite workspace changes made since staging")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	paths, err = fromHere(ctx, c, paths)
	if err != nil {
		return err
	}
	stop := watchProgress(c, cf)
	res, err := c.Commit(ctx, control.CommitParams{Paths: paths, Force: force})
	stop()
	var ce *control.Error
	if err != nil && !errors.As(err, &ce) {
		// The connection broke: the daemon stopped mid-commit. The commit
		// is all-or-nothing across that; the next mount finishes it and
		// says so.
		return fmt.Errorf("%w; the daemon stopped before answering: a commit it had begun is finished when the workspace is mounted again (stagefs mount prints what it recovered, stagefs log has the record)", err)
	}
	if err != nil {
		return err
	}
	if cf.json {
		if err := printJSON(res); err != nil {
			return err
		}
	} else {
		for _, p := range res.Committed {
			fmt.Printf("committed  %s\n", shown(p))
		}
		for _, x := range res.Conflicts {
			fmt.Printf("conflict   %s: %s%s\n", shown(x.Path), x.Reason, conflictStates("staged against", "workspace now", x))
			if x.WorkspaceHash != "" || x.StagedHash != "" {
				fmt.Printf("           workspace %s, staged %s\n", orNone(x.WorkspaceHash), orNone(x.StagedHash))
			}
		}
		for _, f := range res.Failed {
			fmt.Printf("failed     %s: %s\n", shown(f.Path), f.Reason)
		}
		if len(res.Committed)+len(res.Conflicts)+len(res.Failed) == 0 {
			fmt.Println("nothing to commit")
		}
	}
	if n := len(res.Conflicts) + len(res.Failed); n > 0 {
		return &conflictError{fmt.Sprintf("%d path(s) not committed; they stay pending (use --force to overwrite conflicts)", n)}
	}
	return nil
}

// orNone shows an empty hash as "(none)" rather than as nothing.
func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
