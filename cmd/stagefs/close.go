package main

// stagefs close SCOPE: close a tool call's snapshot (fs/close_snapshot).

import (
	"context"
)

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
