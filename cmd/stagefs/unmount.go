package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"stagefs/branch"
)

func runUnmount(ctx context.Context, args []string) error {
	var lazy, asJSON bool
	fs := newFlagSet("unmount")
	fs.BoolVar(&lazy, "lazy", false, "detach now even if files are open; the daemon serves until the last one is closed")
	fs.BoolVar(&asJSON, "json", false, "print the result as JSON")
	if err := fs.Parse(args); err != nil {
		return usagef("%v", err)
	}
	if fs.NArg() != 1 {
		return usagef("usage: stagefs unmount MOUNTPOINT [--lazy]")
	}
	mp, err := filepath.Abs(fs.Arg(0))
	if err != nil {
		return err
	}
	if real, err := filepath.EvalSymlinks(mp); err == nil {
		mp = real
	}
	m, ok := isMounted(mp)
	if !ok {
		return fmt.Errorf("%s is not mounted", mp)
	}
	if !strings.HasPrefix(m.source, stagefsSourcePrefix) {
		return fmt.Errorf("%s is not a stagefs mount (%s)", mp, m.fstype)
	}
	if name, main, ok := branch.OfStateDir(strings.TrimPrefix(m.source, stagefsSourcePrefix)); ok {
		return fmt.Errorf("%s is branch %s of a mount: it goes with `stagefs branch --drop %s` (pending changes and all), or stays until the mount itself is unmounted (its state dir: %s)", mp, name, name, main)
	}
	if err := unmountPath(mp, lazy); err != nil {
		if errors.Is(err, syscall.EBUSY) {
			return fmt.Errorf("%s is busy: a process has a file or its working directory in it; close them, or use --lazy to detach now", mp)
		}
		return fmt.Errorf("unmount %s: %w", mp, err)
	}
	// Wait for the daemon to let go of the state dir, so a new mount can
	// start right away.
	state := strings.TrimPrefix(m.source, stagefsSourcePrefix)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && !lazy && daemonHolds(state) {
		time.Sleep(20 * time.Millisecond)
	}
	if asJSON {
		return printJSON(map[string]any{"unmounted": mp, "state": state, "lazy": lazy})
	}
	fmt.Printf("unmounted %s; the pending set is kept in %s\n", mp, state)
	return nil
}

func unmountPath(mp string, lazy bool) error {
	if os.Geteuid() == 0 {
		flags := 0
		if lazy {
			flags = syscall.MNT_DETACH
		}
		return syscall.Unmount(mp, flags)
	}
	args := []string{"-u"}
	if lazy {
		args = append(args, "-z")
	}
	out, err := exec.Command("fusermount3", append(args, mp)...).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "busy") {
			return syscall.EBUSY
		}
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// daemonHolds reports whether a daemon still holds the state dir's lock.
func daemonHolds(state string) bool {
	f, err := os.OpenFile(filepath.Join(state, "lock"), os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return true
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}
