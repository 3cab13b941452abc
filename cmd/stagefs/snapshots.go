package main

// stagefs snapshots: the tool calls' snapshots, oldest first
// (fs/list_snapshots).

import (
	"context"
	"fmt"
)

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
