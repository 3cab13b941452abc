package main

// stagefs mode [staged|immediate]: show or switch the write mode
// (session/initialize, fs/set_mode).

import (
	"context"
	"fmt"
)

func runMode(ctx context.Context, args []string) error {
	cf, rest, c, err := parseClient("mode", args, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) > 1 || (len(rest) == 1 && rest[0] != "staged" && rest[0] != "immediate") {
		return usagef("usage: stagefs mode [staged|immediate]")
	}
	if len(rest) == 0 {
		res, err := c.Initialize(ctx)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(map[string]string{"mode": res.Mode})
		}
		fmt.Println(res.Mode)
		return nil
	}
	res, err := c.SetMode(ctx, rest[0])
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	fmt.Printf("mode %s (was %s)\n", res.Mode, res.Previous)
	return nil
}
