// Command benchops measures stagefs's own operations on workspaces of
// growing size with the same small change, to show that their cost follows
// what changed rather than the workspace's size. scripts/bench runs it.
//
//	benchops -stagefs PATH [-sizes 1000,10000,100000] [-dir DIR]
//	benchops -stagefs PATH -sandbox [-dir DIR]
//	benchops -journal 1000000 [-dir DIR]
//	benchops -stagefs PATH -commitwait 10000 [-dir DIR]
//	benchops -stagefs PATH -fork 100,1000,10000 [-dir DIR]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"stagefs/control"
)

func main() {
	bin := flag.String("stagefs", "stagefs", "the stagefs binary")
	sizes := flag.String("sizes", "100,1000,10000,100000", "workspace sizes in files")
	dir := flag.String("dir", os.TempDir(), "where to make the workspaces")
	sandbox := flag.Bool("sandbox", false, "measure starting a command in stagefs run's sandbox instead")
	journalRecords := flag.Int("journal", 0, "measure opening and reading a journal of this many records instead")
	commitWait := flag.Int("commitwait", 0, "measure how long a stat waits during a commit of this many files instead")
	fork := flag.String("fork", "", "measure forking a branch of main views with these many pending files instead")
	flag.Parse()
	if *fork != "" {
		measureFork(*bin, *dir, *fork)
		return
	}
	if *commitWait > 0 {
		measureCommitWait(*bin, *dir, *commitWait)
		return
	}
	if *sandbox {
		measureSandbox(*bin, *dir)
		return
	}
	if *journalRecords > 0 {
		measureJournal(*dir, *journalRecords)
		return
	}
	var rows [][]string
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			fail(err)
		}
		rows = append(rows, measure(*bin, *dir, n))
	}
	fmt.Printf("%-8s %9s %9s %11s %13s %15s %13s %13s %14s %12s\n", "files", "status", "diff", "commit(10)", "snapshot o/c", "capture 64MiB", "restore(100)", "rollback(10)", "commit(1000)", "daemon RSS")
	for _, r := range rows {
		fmt.Printf("%-8s %9s %9s %11s %13s %15s %13s %13s %14s %12s\n", r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9])
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "benchops:", err)
	os.Exit(1)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

// timed runs fn several times and returns the median duration.
func timed(fn func() error) time.Duration {
	return timedPart(func() (time.Duration, error) {
		s := time.Now()
		err := fn()
		return time.Since(s), err
	})
}

// reps is how many times each operation runs: the median of seven is
// steady enough for the sub-millisecond ones on a noisy machine.
const reps = 7

// timedPart runs fn reps times and returns the median of the durations it
// reports (the part it measures).
func timedPart(fn func() (time.Duration, error)) time.Duration {
	var ds []time.Duration
	for i := 0; i < reps; i++ {
		d, err := fn()
		if err != nil {
			fail(err)
		}
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func write(p, s string) error { return os.WriteFile(p, []byte(s), 0o644) }

func measure(bin, root string, n int) []string {
	base, err := os.MkdirTemp(root, "benchops-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(base)
	ws, mnt, st := filepath.Join(base, "ws"), filepath.Join(base, "mnt"), filepath.Join(base, "st")
	for i := 0; i < n; i++ {
		d := filepath.Join(ws, fmt.Sprintf("d%03d", i/100%1000), fmt.Sprintf("e%03d", i/100000))
		if i%100 == 0 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				fail(err)
			}
		}
		if err := write(filepath.Join(d, fmt.Sprintf("f%d.txt", i)), fmt.Sprintf("file %d\n", i)); err != nil {
			fail(err)
		}
	}
	// One large file, whose pre-image a snapshot captures at its
	// write-open: the capture's cost follows its bytes.
	if err := write(filepath.Join(ws, "big.bin"), strings.Repeat("0123456789abcdef", 4<<20)); err != nil {
		fail(err)
	}
	// The workspace's creation is setup: flushed now, so that a commit's
	// syncfs below does not pay for writing it out.
	syscall.Sync()
	os.MkdirAll(mnt, 0o755)
	if out, err := exec.Command(bin, "mount", ws, mnt, "--state", st).CombinedOutput(); err != nil {
		fail(fmt.Errorf("mount: %v: %s", err, out))
	}
	defer exec.Command(bin, "unmount", "--lazy", mnt).Run()
	c, err := control.Dial(filepath.Join(st, "control.sock"))
	if err != nil {
		fail(err)
	}
	defer c.Close()
	ctx := context.Background()
	file := func(i int) string {
		return filepath.Join(fmt.Sprintf("d%03d", i/100%1000), fmt.Sprintf("e%03d", i/100000), fmt.Sprintf("f%d.txt", i))
	}
	edit := func(from, count int, tag string) error {
		for i := from; i < from+count && i < n; i++ {
			if err := write(filepath.Join(mnt, file(i)), tag+"\n"); err != nil {
				return err
			}
		}
		return nil
	}
	row := []string{strconv.Itoa(n)}

	if err := edit(0, 10, "changed"); err != nil {
		fail(err)
	}
	row = append(row, ms(timed(func() error { _, err := c.Status(ctx, nil); return err })))
	row = append(row, ms(timed(func() error { _, err := c.Diff(ctx, nil); return err })))
	i := 0
	row = append(row, ms(timed(func() error {
		i++
		if err := edit(0, 10, fmt.Sprintf("commit %d", i)); err != nil {
			return err
		}
		_, err := c.Commit(ctx, control.CommitParams{})
		return err
	})))
	row = append(row, ms(timed(func() error {
		i++
		scope := fmt.Sprintf("oc%d", i)
		if _, err := c.Snapshot(ctx, control.SnapshotParams{ScopeID: scope, Pid: os.Getpid()}); err != nil {
			return err
		}
		_, err := c.CloseSnapshot(ctx, scope)
		return err
	})))
	row = append(row, ms(timedPart(func() (time.Duration, error) {
		// The O_TRUNC open of the file stages it without copying: what
		// it costs here is the capture of its 64 MiB pre-image.
		i++
		scope := fmt.Sprintf("cap%d", i)
		if _, err := c.Snapshot(ctx, control.SnapshotParams{ScopeID: scope, Pid: os.Getpid()}); err != nil {
			return 0, err
		}
		s := time.Now()
		f, err := os.OpenFile(filepath.Join(mnt, "big.bin"), os.O_WRONLY|os.O_TRUNC, 0)
		d := time.Since(s)
		if err != nil {
			return 0, err
		}
		f.Close()
		if _, err := c.CloseSnapshot(ctx, scope); err != nil {
			return 0, err
		}
		if _, err := c.Restore(ctx, scope); err != nil {
			return 0, err
		}
		_, err = c.DropSnapshot(ctx, scope)
		return d, err
	})))
	row = append(row, ms(timedPart(func() (time.Duration, error) {
		i++
		scope := fmt.Sprintf("r%d", i)
		if _, err := c.Snapshot(ctx, control.SnapshotParams{ScopeID: scope, Pid: os.Getpid()}); err != nil {
			return 0, err
		}
		if err := edit(100, 100, scope); err != nil {
			return 0, err
		}
		if _, err := c.CloseSnapshot(ctx, scope); err != nil {
			return 0, err
		}
		s := time.Now()
		_, err := c.Restore(ctx, scope)
		return time.Since(s), err
	})))
	row = append(row, ms(timedPart(func() (time.Duration, error) {
		i++
		if _, err := c.Turn(ctx, control.TurnParams{}); err != nil {
			return 0, err
		}
		if err := edit(300, 10, fmt.Sprintf("turn %d", i)); err != nil {
			return 0, err
		}
		s := time.Now()
		_, err := c.Rollback(ctx, control.RollbackParams{})
		return time.Since(s), err
	})))
	if n >= 1000 {
		c.Discard(ctx, nil)
		if err := edit(0, 1000, "bulk"); err != nil {
			fail(err)
		}
		s := time.Now()
		if _, err := c.Commit(ctx, control.CommitParams{}); err != nil {
			fail(err)
		}
		row = append(row, ms(time.Since(s)))
	} else {
		row = append(row, "-")
	}
	// Peak memory after walking the whole mount.
	exec.Command("find", mnt, "-type", "f", "-size", "+1k").Run()
	pid, _ := os.ReadFile(filepath.Join(st, "pid"))
	status, _ := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/status")
	rss := "?"
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			rss = strings.Join(strings.Fields(l)[1:], " ")
		}
	}
	row = append(row, rss)
	return row
}
