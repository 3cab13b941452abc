package main

// stagefs status [PATH...]: the pending changes (fs/staged_status).

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

func runStatus(ctx context.Context, args []string) error {
	cf, paths, c, err := parseClient("status", args, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	paths, err = fromHere(ctx, c, paths)
	if err != nil {
		return err
	}
	res, err := c.Status(ctx, paths)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	if len(res.Policy.Deny)+len(res.Policy.Hide) > 0 {
		fmt.Printf("policy: deny %v, hide %v\n", res.Policy.Deny, res.Policy.Hide)
	}
	if sb := res.Sandbox; sb != nil && sb.Scratch != nil && sb.Scratch.Entries > 0 {
		fmt.Printf("scratch layer: %d path(s), %s under $HOME, /tmp and /var/tmp, kept out of the real ones (stagefs scratch)\n", sb.Scratch.Entries, humanBytes(sb.Scratch.Bytes))
	}
	if res.PendingCount == 0 {
		fmt.Printf("nothing pending (mode %s)\n", res.Mode)
		return nil
	}
	fmt.Printf("%d pending change(s), %s, oldest %s ago (mode %s)\n", res.PendingCount, humanBytes(res.TotalBytes),
		(time.Duration(res.OldestPendingAgeMs) * time.Millisecond).Round(time.Second), res.Mode)
	for _, e := range res.Entries {
		what := shown(e.Path)
		if e.From != "" {
			what = shown(e.From) + " -> " + what
		}
		who := ""
		if e.PID != 0 {
			who = fmt.Sprintf("  (%s[%d])", e.Comm, e.PID)
		}
		fmt.Printf("  %-9s %s  %s  %s%s\n", e.Kind, what, humanBytes(e.Bytes), shortAge(e.AgeMs), who)
	}
	return nil
}

// shortAge writes how long ago a change was staged in one unit, rounded
// down, so the column stays short: 45s, 3m, 2h, 5d.
func shortAge(ms int64) string {
	d := time.Duration(max(ms, 0)) * time.Millisecond
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", d/time.Second)
	case d < time.Hour:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh", d/time.Hour)
	}
	return fmt.Sprintf("%dd", d/(24*time.Hour))
}

// shown is a path as the CLI prints it in its lists: as it is, unless it
// holds a control character (a newline would split its line in two),
// then quoted with Go's escapes.
func shown(p string) string {
	for i := 0; i < len(p); i++ {
		if p[i] < 0x20 || p[i] == 0x7f {
			return strconv.Quote(p)
		}
	}
	return p
}
