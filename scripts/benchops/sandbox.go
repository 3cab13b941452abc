package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// measureSandbox times starting a command in `stagefs run`'s sandbox
// against starting it directly, on an empty workspace: what the
// namespaces, the mounts and the dropped capabilities add to every tool
// call. Each figure is the median of reps starts of `true`.
func measureSandbox(bin, root string) {
	base, err := os.MkdirTemp(root, "benchsandbox-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(base)
	ws, mnt, st := filepath.Join(base, "ws"), filepath.Join(base, "mnt"), filepath.Join(base, "st")
	for _, d := range []string{ws, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fail(err)
		}
	}
	if out, err := exec.Command(bin, "mount", ws, mnt, "--state", st).CombinedOutput(); err != nil {
		fail(fmt.Errorf("mount: %v: %s", err, out))
	}
	defer exec.Command(bin, "unmount", "--lazy", mnt).Run()
	start := func(name string, args ...string) func() error {
		return func() error {
			cmd := exec.Command(name, args...)
			cmd.Dir = ws
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("%s %v: %v: %s", name, args, err, out)
			}
			return nil
		}
	}
	direct := timed(start("true"))
	run := timed(start(bin, "run", "-m", mnt, "--", "true"))
	scoped := 0
	scope := func() error {
		scoped++
		return start(bin, "run", "-m", mnt, "--scope", fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), scoped), "--", "true")()
	}
	withScope := timed(scope)
	fmt.Printf("%-34s %9s\n", "true, started directly", ms(direct))
	fmt.Printf("%-34s %9s\n", "stagefs run -- true", ms(run))
	fmt.Printf("%-34s %9s\n", "stagefs run --scope ID -- true", ms(withScope))
}
