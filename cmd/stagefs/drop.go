package main

// stagefs drop SCOPE: delete a tool call's snapshot (fs/drop_snapshot).

import (
	"context"
	"fmt"
)

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
