package main

import (
	"context"
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

// measureFork stages n new small files in a mount's main view for each n
// of sizes, then times forking a branch of it (branch/create), a merge
// of one changed file back, and dropping the branch: the fork's cost
// follows the pending set, never the workspace.
func measureFork(bin, root, sizes string) {
	// fork: until the fork answers (its instant); parent write: a write
	// of a pending file in the parent right after, while the copy runs
	// (and before the fork, for comparison); served: until listing the
	// branches, which waits for the copy and the mount, shows it served.
	fmt.Printf("%-10s %10s %14s %10s %10s %12s %10s\n", "pending", "fork", "write before", "write after", "served", "merge(1)", "drop")
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			fail(err)
		}
		forkRow(bin, root, n)
	}
}

func forkRow(bin, root string, n int) {
	mnt, c, done := scratchMount(bin, root, "benchops-fork-")
	defer done()
	for i := 0; i < n; i++ {
		d := filepath.Join(mnt, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.Mkdir(d, 0o755); err != nil {
				fail(err)
			}
		}
		if err := write(filepath.Join(d, fmt.Sprintf("f%05d", i)), fmt.Sprintf("file %d\n", i)); err != nil {
			fail(err)
		}
	}
	ctx := context.Background()
	var quietWrite, fork, parentWrite, served, merge, drop []time.Duration
	for i := 0; i < reps; i++ {
		name := fmt.Sprintf("b%d", i)
		// Staging (and the last round's drop) is setup: flushed now, so
		// that the fork's syncfs does not pay for writing it out.
		syscall.Sync()
		w := time.Now()
		if err := write(filepath.Join(mnt, fmt.Sprintf("d%03d/f%05d", (n-1)/100, n-1)), "changed in the parent\n"); err != nil {
			fail(err)
		}
		quietWrite = append(quietWrite, time.Since(w))
		s := time.Now()
		_, err := c.CreateBranch(ctx, control.BranchParams{Name: name})
		fork = append(fork, time.Since(s))
		if err != nil {
			fail(err)
		}
		// The file the copy reaches last.
		w = time.Now()
		if err := write(filepath.Join(mnt, fmt.Sprintf("d%03d/f%05d", (n-1)/100, n-1)), "changed in the parent\n"); err != nil {
			fail(err)
		}
		parentWrite = append(parentWrite, time.Since(w))
		info := servedBranch(c, name)
		served = append(served, time.Since(s))
		if err := write(filepath.Join(info.Mount, "d000", "f00000"), fmt.Sprintf("changed in %s\n", name)); err != nil {
			fail(err)
		}
		s = time.Now()
		res, err := c.Merge(ctx, control.MergeParams{Name: name, Force: true})
		merge = append(merge, time.Since(s))
		if err != nil || len(res.Merged) != 1 {
			fail(fmt.Errorf("merge: %v %+v", err, res))
		}
		s = time.Now()
		if _, err := c.DropBranch(ctx, name); err != nil {
			fail(err)
		}
		drop = append(drop, time.Since(s))
	}
	fmt.Printf("%-10d %10s %14s %10s %10s %12s %10s\n", n, ms(median(fork)), ms(median(quietWrite)), ms(median(parentWrite)), ms(median(served)), ms(median(merge)), ms(median(drop)))
}

// servedBranch waits for the branch name to be served and describes it.
func servedBranch(c *control.Client, name string) control.BranchInfo {
	res, err := c.ListBranches(context.Background())
	if err != nil {
		fail(err)
	}
	for _, b := range res.Branches {
		if b.Name == name && b.Mount != "" {
			return b
		}
	}
	fail(fmt.Errorf("branch %s is not served: %+v", name, res.Branches))
	return control.BranchInfo{}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// scratchMount mounts an empty workspace in a new directory under root and
// dials its daemon; done unmounts and removes everything.
func scratchMount(bin, root, prefix string) (mnt string, c *control.Client, done func()) {
	base, err := os.MkdirTemp(root, prefix)
	if err != nil {
		fail(err)
	}
	ws, mnt, st := filepath.Join(base, "ws"), filepath.Join(base, "mnt"), filepath.Join(base, "st")
	for _, d := range []string{ws, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fail(err)
		}
	}
	if out, err := exec.Command(bin, "mount", ws, mnt, "--state", st).CombinedOutput(); err != nil {
		fail(fmt.Errorf("mount: %v: %s", err, out))
	}
	c, err = control.Dial(filepath.Join(st, "control.sock"))
	if err != nil {
		exec.Command(bin, "unmount", "--lazy", mnt).Run()
		fail(err)
	}
	return mnt, c, func() {
		c.Close()
		// A plain unmount returns once the daemon is gone, so the
		// state dir can go too; lazily only if something holds it.
		if exec.Command(bin, "unmount", mnt).Run() != nil {
			exec.Command(bin, "unmount", "--lazy", mnt).Run()
		}
		os.RemoveAll(base)
	}
}
