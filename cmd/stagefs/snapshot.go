package main

// stagefs snapshot SCOPE [PATH...]: open a tool call's snapshot
// (fs/snapshot).

import (
	"context"

	"github.com/spf13/pflag"

	"stagefs/control"
)

func runSnapshot(ctx context.Context, args []string) error {
	var pid int
	var label string
	cf, rest, c, err := parseClient("snapshot", args, func(fs *pflag.FlagSet) {
		fs.IntVar(&pid, "pid", 0, "capture only mutations by this process and its descendants")
		fs.StringVar(&label, "label", "", "what the tool call is, for people (a tool and its command or file)")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) < 1 {
		return usagef("usage: stagefs snapshot SCOPE [PATH...] [--pid PID] [--label TEXT]")
	}
	paths, err := fromHere(ctx, c, rest[1:])
	if err != nil {
		return err
	}
	res, err := c.Snapshot(ctx, control.SnapshotParams{ScopeID: rest[0], Paths: paths, Pid: pid, Label: label})
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	printSnapshot("snapshot", res)
	return nil
}
