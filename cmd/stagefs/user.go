package main

// stagefs user PID: mark a process tree as the user's
// (session/mark_user).

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/pflag"

	"stagefs/control"
)

func runUser(ctx context.Context, args []string) error {
	var remove bool
	cf, rest, c, err := parseClient("user", args, func(fs *pflag.FlagSet) {
		fs.BoolVar(&remove, "remove", false, "unmark the process")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) != 1 {
		return usagef("usage: stagefs user PID [--remove]")
	}
	pid, err := strconv.Atoi(rest[0])
	if err != nil {
		return usagef("user: %q is not a process id", rest[0])
	}
	res, err := c.MarkUser(ctx, control.MarkUserParams{Pid: pid, Remove: remove})
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	if res.User {
		fmt.Printf("process %d and its descendants are the user's: their changes are never rolled back silently\n", pid)
	} else {
		fmt.Printf("process %d is no longer marked as the user's\n", pid)
	}
	return nil
}
