package main

// stagefs scratch: what the mount's scratch layer holds (what the
// sandboxes of its runs wrote under $HOME, /tmp and /var/tmp), and --drop
// to delete it. The layer is in the state dir, which this client reads
// directly: the daemon only names the state dir (the mount's source).

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"stagefs/sandbox"
)

func runScratch(ctx context.Context, args []string) error {
	var drop bool
	fs, cf := newClientFlags("scratch")
	fs.BoolVar(&drop, "drop", false, "delete everything the scratch layer holds (refused while a run uses it)")
	if err := fs.Parse(args); err != nil {
		return usagef("scratch: %v", err)
	}
	if fs.NArg() != 0 {
		return usagef("usage: stagefs scratch [-m MOUNTPOINT] [--drop] [--json]")
	}
	c, err := cf.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	init, err := c.Initialize(ctx)
	if err != nil {
		return err
	}
	m, ok := isMounted(init.Mount)
	if !ok || !strings.HasPrefix(m.source, stagefsSourcePrefix) {
		return fmt.Errorf("the daemon's mount point %s is not a stagefs mount in this mount namespace", init.Mount)
	}
	state := strings.TrimPrefix(m.source, stagefsSourcePrefix)

	sc, err := sandbox.ListScratch(state)
	if err != nil {
		return fmt.Errorf("read the scratch layer: %w", err)
	}
	if drop {
		if err := sandbox.DropScratch(state); err != nil {
			if errors.Is(err, sandbox.ErrScratchInUse) {
				return &conflictError{err.Error()}
			}
			return fmt.Errorf("drop the scratch layer: %w", err)
		}
		if cf.json {
			return printJSON(map[string]any{"dropped": sc})
		}
		n := 0
		for _, a := range sc.Areas {
			n += len(a.Entries)
		}
		fmt.Printf("dropped the scratch layer: %d path(s), %s\n", n, humanBytes(sc.Bytes))
		return nil
	}
	if cf.json {
		return printJSON(sc)
	}
	printScratch(sc, init.Sandbox.Outside)
	return nil
}

// printScratch lists the layer by place, the highest changed paths with
// their sizes.
func printScratch(sc sandbox.Scratch, outside string) {
	if outside == sandbox.OutsideWritable {
		fmt.Println("this mount's runs write outside the workspace for real (--outside rw): they add nothing to the scratch layer")
	}
	if len(sc.Areas) == 0 {
		fmt.Printf("the scratch layer is empty (%s)\n", sc.Dir)
		return
	}
	inUse := ""
	if sc.InUse {
		inUse = ", in use by a run now"
	}
	fmt.Printf("scratch layer: %s in %s%s\n", humanBytes(sc.Bytes), sc.Dir, inUse)
	for _, a := range sc.Areas {
		what := a.Path
		if a.Home {
			what = "$HOME " + a.Path
		}
		fmt.Printf("%s: %s\n", what, humanBytes(a.Bytes))
		for _, e := range a.Entries {
			fmt.Printf("  %-8s %s  %s\n", e.Kind, e.Path, humanBytes(e.Bytes))
		}
	}
	fmt.Println("(the real files are unchanged; stagefs scratch --drop deletes the layer)")
}
