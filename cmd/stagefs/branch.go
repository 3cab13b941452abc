package main

// stagefs branch NAME [--from BRANCH] | --drop NAME, stagefs branches and
// stagefs merge NAME: a mount's branches (package branch).

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"stagefs/control"
)

func runBranch(ctx context.Context, args []string) error {
	var from string
	var drop bool
	cf, rest, c, err := parseClient("branch", args, func(fs *pflag.FlagSet) {
		fs.StringVar(&from, "from", "", "the view to fork: main (the default) or a branch")
		fs.BoolVar(&drop, "drop", false, "remove the branch NAME with everything pending in it")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) != 1 {
		return usagef("branch: give one NAME")
	}
	var info control.BranchInfo
	if drop {
		info, err = c.DropBranch(ctx, rest[0])
	} else {
		info, err = c.CreateBranch(ctx, control.BranchParams{Name: rest[0], From: from})
	}
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(info)
	}
	if drop {
		fmt.Printf("dropped branch %s (%d pending change(s) with it)\n", info.Name, info.Pending)
		return nil
	}
	// The fork answers at its instant; its copy and mount follow, and
	// listing the branches waits for them.
	if info, err = served(ctx, c, info.Name); err != nil {
		return err
	}
	fmt.Printf("branch %s forked from %s: %d pending change(s), mounted at %s\n", info.Name, info.Parent, info.Pending, info.Mount)
	fmt.Printf("  work in it: stagefs run --branch %s -- CMD   (at the workspace's own path)\n", info.Name)
	fmt.Printf("  merge it:   stagefs merge %s\n", info.Name)
	return nil
}

// served returns the branch name once it is served, or why it is not.
func served(ctx context.Context, c *control.Client, name string) (control.BranchInfo, error) {
	res, err := c.ListBranches(ctx)
	if err != nil {
		return control.BranchInfo{}, err
	}
	for _, b := range res.Branches {
		if b.Name != name {
			continue
		}
		if b.Mount == "" {
			return b, fmt.Errorf("branch %s was forked but is not served: %s", name, b.NotServed)
		}
		return b, nil
	}
	return control.BranchInfo{}, fmt.Errorf("branch %s was forked, but its copy failed and it was removed (the daemon's log says why)", name)
}

func runBranches(ctx context.Context, args []string) error {
	cf, _, c, err := parseClient("branches", args, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := c.ListBranches(ctx)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	if len(res.Branches) == 0 {
		fmt.Println("no branches (make one: stagefs branch NAME)")
		return nil
	}
	fmt.Printf("%-20s %-20s %-20s %8s %10s  %s\n", "BRANCH", "PARENT", "FORKED", "PENDING", "BYTES", "MOUNT")
	for _, b := range res.Branches {
		forked := time.Unix(0, b.ForkedAt).Format("2006-01-02 15:04:05")
		mount := b.Mount
		if mount == "" {
			// Registered, but it could not be served at the daemon's
			// start; its pending set is kept (daemon.log says why).
			mount = "(not served: " + b.NotServed + ")"
		}
		fmt.Printf("%-20s %-20s %-20s %8d %10s  %s\n", b.Name, b.Parent, forked, b.Pending, humanBytes(b.PendingBytes), mount)
	}
	return nil
}

func runMerge(ctx context.Context, args []string) error {
	var into string
	var force bool
	cf, rest, c, err := parseClient("merge", args, func(fs *pflag.FlagSet) {
		fs.StringVar(&into, "into", "", "the branch's parent (checked: a branch merges only into the view it was forked from)")
		fs.BoolVar(&force, "force", false, "apply conflicting paths too: the branch's version wins")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) < 1 {
		return usagef("merge: give the branch's NAME, then optionally PATHs")
	}
	paths, err := fromHere(ctx, c, rest[1:])
	if err != nil {
		return err
	}
	res, err := c.Merge(ctx, control.MergeParams{Name: rest[0], Into: into, Paths: paths, Force: force})
	if err != nil {
		return err
	}
	if cf.json {
		if err := printJSON(res); err != nil {
			return err
		}
	} else {
		for _, p := range res.Merged {
			fmt.Printf("merged    %s\n", shown(p))
		}
		for _, x := range res.Conflicts {
			fmt.Printf("conflict  %s\n  at the fork: %s\n  branch:      %s\n  parent now:  %s\n", shown(x.Path), x.Fork, x.Branch, x.Parent)
		}
		for _, f := range res.Failed {
			fmt.Printf("failed    %s: %s\n", shown(f.Path), f.Reason)
		}
		if len(res.Merged)+len(res.Conflicts)+len(res.Failed) == 0 {
			fmt.Printf("nothing to merge: %s changed nothing since its fork point\n", rest[0])
		}
	}
	if n := len(res.Conflicts) + len(res.Failed); n > 0 {
		return &conflictError{fmt.Sprintf("%d path(s) not merged; they stay in the branch (stagefs merge %s --force takes the branch's versions of conflicts)", n, rest[0])}
	}
	return nil
}
