package main

// stagefs restore SCOPE: put a tool call's pre-images back (fs/restore).

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"stagefs/control"
)

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
			fmt.Printf("restored  %s\n", shown(p))
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
			fmt.Printf("failed    %s: %s\n", shown(f.Path), f.Reason)
		}
	}
	if len(res.Failed) > 0 {
		return &conflictError{fmt.Sprintf("%d path(s) could not be restored", len(res.Failed))}
	}
	return nil
}
