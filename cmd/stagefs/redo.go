package main

// stagefs redo: take back the last rollback (session/redo).

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"stagefs/control"
)

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
			fmt.Printf("restored  %s\n", shown(r))
		}
		for _, x := range res.Conflicts {
			fmt.Printf("conflict  %s: %s%s\n", shown(x.Path), x.Reason, conflictStates("rollback left", "now", x))
		}
		for _, f := range res.Failed {
			fmt.Printf("failed    %s: %s\n", shown(f.Path), f.Reason)
		}
	}
	if len(res.Conflicts)+len(res.Failed) > 0 {
		return &conflictError{fmt.Sprintf("%d path(s) were not redone (use --force to overwrite conflicts)", len(res.Conflicts)+len(res.Failed))}
	}
	return nil
}
