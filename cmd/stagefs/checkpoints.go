package main

// stagefs checkpoints: the turns, newest first (session/checkpoints).

import (
	"context"
	"fmt"
	"strings"
)

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
