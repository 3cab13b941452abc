package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"stagefs/control"
)

// progressAfter is how long an operation runs before its progress shows:
// a quick one prints nothing extra. STAGEFS_PROGRESS_AFTER sets it (the
// tests use it).
var progressAfter = envDuration("STAGEFS_PROGRESS_AFTER", time.Second)

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}

// watchProgress shows, on a terminal, how far a long commit, discard,
// restore, rollback or redo has come, as rsync and restic do: paths and
// bytes done of the total, and the rate, on one line of stderr rewritten in
// place. Never with --json, and never when stderr is not a terminal. The
// returned stop clears the line; call it when the operation has answered.
func watchProgress(c *control.Client, cf *clientFlags) (stop func()) {
	if cf.json || !isTerminal(os.Stderr) {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	events, err := c.Subscribe(ctx)
	if err != nil {
		cancel()
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		shown := false
		for {
			select {
			case <-ctx.Done():
				if shown {
					fmt.Fprint(os.Stderr, "\r\x1b[K")
				}
				return
			case ev, ok := <-events:
				if !ok || ev.Kind != control.EventProgress || time.Since(start) < progressAfter {
					continue
				}
				shown = true
				fmt.Fprintf(os.Stderr, "\r\x1b[K%s", progressLine(ev, time.Since(start)))
			}
		}
	}()
	return func() { cancel(); <-done }
}

// progressLine is one progress report: "commit: 1200/17471 paths, 120 MiB,
// 40 MiB/s".
func progressLine(ev control.Event, elapsed time.Duration) string {
	line := fmt.Sprintf("%s: %d/%d paths", ev.Detail, ev.Done, ev.Total)
	if ev.Bytes > 0 {
		line += ", " + humanBytes(ev.Bytes)
		if s := elapsed.Seconds(); s > 0 {
			line += fmt.Sprintf(", %s/s", humanBytes(int64(float64(ev.Bytes)/s)))
		}
	}
	return line
}
