package main

// stagefs discard [PATH...]: drop pending changes (fs/discard_staged).

import (
	"context"
	"fmt"
)

func runDiscard(ctx context.Context, args []string) error {
	cf, paths, c, err := parseClient("discard", args, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	paths, err = fromHere(ctx, c, paths)
	if err != nil {
		return err
	}
	stop := watchProgress(c, cf)
	res, err := c.Discard(ctx, paths)
	stop()
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	for _, p := range res.Discarded {
		fmt.Printf("discarded  %s\n", shown(p))
	}
	if len(res.Discarded) == 0 {
		fmt.Println("nothing to discard")
	}
	return nil
}
