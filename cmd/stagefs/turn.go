package main

// stagefs turn [ID]: start a turn (session/turn).

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"stagefs/control"
)

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
