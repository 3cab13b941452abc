package main

// stagefs log: the journal, oldest first, a page at a time (session/log).

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"stagefs/control"
)

func runLog(ctx context.Context, args []string) error {
	var since uint64
	var limit, tail int
	cf, paths, c, err := parseClient("log", args, func(fs *pflag.FlagSet) {
		fs.Uint64Var(&since, "since", 0, "only records after this sequence number")
		fs.IntVar(&limit, "limit", 0, "at most N records, oldest first: page forward with --since the last seq shown")
		fs.IntVar(&tail, "tail", 0, "only the newest N records")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	paths, err = fromHere(ctx, c, paths)
	if err != nil {
		return err
	}
	res, err := c.Log(ctx, control.LogParams{Since: since, Paths: paths, Limit: limit, Tail: tail})
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	for _, r := range res.Records {
		what := r.Path
		if r.Path2 != "" {
			what += " -> " + r.Path2
		}
		extra := ""
		if r.Size != 0 {
			extra += fmt.Sprintf(" size=%d", r.Size)
		}
		if r.Detail != "" {
			extra += " " + r.Detail
		}
		who := ""
		if r.PID != 0 {
			who = fmt.Sprintf(" %s[%d]", r.Comm, r.PID)
		}
		fmt.Printf("%6d %s %-12s %s%s%s\n", r.Seq, r.Time, r.Op, what, extra, who)
	}
	return nil
}
