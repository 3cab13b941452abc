package main

// stagefs events: follow session/update events (events/subscribe).

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"stagefs/control"
)

func runEvents(ctx context.Context, args []string) error {
	cf, _, c, err := parseClient("events", args, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	ch, err := c.Subscribe(ctx)
	if err != nil {
		return err
	}
	for ev := range ch {
		if cf.json {
			b, _ := json.Marshal(ev)
			fmt.Println(string(b))
			continue
		}
		parts := []string{ev.Time, ev.Kind}
		if ev.Kind == control.EventStagedWritesPending {
			parts = append(parts, fmt.Sprintf("pending=%d bytes=%d", ev.PendingCount, ev.TotalBytes))
		}
		if len(ev.Paths) > 0 {
			ps := append([]string(nil), ev.Paths...)
			sort.Strings(ps)
			parts = append(parts, strings.Join(ps, " "))
		}
		if ev.Missed > 0 {
			parts = append(parts, fmt.Sprintf("missed=%d", ev.Missed))
		}
		fmt.Println(strings.Join(parts, " "))
	}
	return nil
}
