package test

// The README's two set-up commands, run as a new user runs them: on a
// fresh clone, in a scratch directory.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReadmeTwoCommands(t *testing.T) {
	parallel(t)
	requireFUSE(t)
	if testing.Short() {
		t.Skip("builds and tests a fresh clone")
	}
	top, err := exec.Command("git", "-C", "..", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	base := shortTempDir(t)
	clone := filepath.Join(base, "clone")
	mustRun(t, cmdSpec{}, "git", "clone", "-q", strings.TrimSpace(string(top)), clone)
	ws, mnt := filepath.Join(base, "ws"), filepath.Join(base, "not-yet", "mnt")
	writeTree(t, ws, map[string]string{"f.txt": "one\n"})

	// 1. scripts/stagefs mount WORKSPACE MOUNTPOINT: set-up, build, make
	// the mount point, mount.
	bin := filepath.Join(clone, "bin", "stagefs")
	r := runIn(t, cmdSpec{dir: base, env: []string{"XDG_STATE_HOME=" + filepath.Join(base, "state")}}, filepath.Join(clone, "scripts", "stagefs"), "mount", ws, mnt)
	if r.code != 0 {
		t.Fatalf("scripts/stagefs mount: %s", r)
	}
	t.Cleanup(func() {
		if isMounted(mnt) {
			runIn(t, cmdSpec{}, bin, "unmount", mnt)
			forceUnmount(mnt)
		}
	})
	if !isMounted(mnt) {
		t.Fatalf("scripts/stagefs mount returned 0 but %s is not mounted: %s", mnt, r)
	}
	if err := os.WriteFile(filepath.Join(mnt, "f.txt"), []byte("two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := runIn(t, cmdSpec{dir: ws}, filepath.Join(clone, "scripts", "stagefs"), "status"); r.code != 0 || !strings.Contains(r.stdout, "f.txt") {
		t.Errorf("scripts/stagefs status from the workspace: %s", r)
	}
	assertFile(t, filepath.Join(ws, "f.txt"), "one\n")
	if r := runIn(t, cmdSpec{}, bin, "unmount", mnt); r.code != 0 {
		t.Errorf("unmount: %s", r)
	}

	// 2. scripts/test: the tests start (one quick test of each kind).
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(clone, "scripts", "test"), "-run", "^(TestCLIHelp|TestColorFlag)$")
	cmd.Dir = clone
	cmd.Env = baseEnv()
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok  \tstagefs/test\t") || !strings.Contains(string(out), "ok  \tstagefs/cmd/stagefs\t") {
		t.Errorf("scripts/test in the fresh clone: %v\n%s", err, out)
	}
}
