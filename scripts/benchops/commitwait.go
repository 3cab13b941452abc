package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"stagefs/control"
)

// measureCommitWait stages n new files, commits them all, and meanwhile
// stats names in the mount without pause: it reports how long the commit
// took and the longest a stat waited for it (a lookup of a name never seen
// before, so that the kernel must ask the daemon), beside the same stat on
// an idle mount.
func measureCommitWait(bin, root string, n int) {
	mnt, c, unmount := scratchMount(bin, root, "benchops-commit-")
	defer unmount()
	body := strings.Repeat("x", 4096)
	for i := 0; i < n; i++ {
		d := filepath.Join(mnt, fmt.Sprintf("d%02d", i/500))
		if i%500 == 0 {
			if err := os.Mkdir(d, 0o755); err != nil {
				fail(err)
			}
		}
		if err := write(filepath.Join(d, fmt.Sprintf("f%05d", i)), body); err != nil {
			fail(err)
		}
	}
	syscall.Sync()
	probe := 0
	stat := func() time.Duration {
		probe++
		s := time.Now()
		os.Lstat(filepath.Join(mnt, fmt.Sprintf("probe-%d", probe)))
		return time.Since(s)
	}
	var idle []time.Duration
	for i := 0; i < 200; i++ {
		idle = append(idle, stat())
	}
	slices.Sort(idle)

	done := make(chan error, 1)
	var took time.Duration
	go func() {
		s := time.Now()
		res, err := c.Commit(context.Background(), control.CommitParams{})
		took = time.Since(s)
		if err == nil && len(res.Committed) < n {
			err = fmt.Errorf("committed %d of %d files", len(res.Committed), n)
		}
		done <- err
	}()
	var waits []time.Duration
	for {
		select {
		case err := <-done:
			if err != nil {
				fail(err)
			}
			slices.Sort(waits)
			if len(waits) == 0 {
				waits = []time.Duration{0}
			}
			fmt.Printf("commit of %d new files: %s; %d stats meanwhile, median %s, longest %s (idle: median %s, longest %s)\n",
				n, ms(took), len(waits), ms(waits[len(waits)/2]), ms(waits[len(waits)-1]), ms(idle[len(idle)/2]), ms(idle[len(idle)-1]))
			return
		default:
			waits = append(waits, stat())
		}
	}
}
