package agentsim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// Run runs an agent: the command name with args, in dir, with env added to
// the test's environment (later entries win, so env overrides), stdin from
// /dev/null, and at most timeout. The command runs in a process group of
// its own, which Run kills when the time is up and again once the command
// has exited, so no shell the agent started outlives the test (unless it
// left the group, as a daemon does). It returns what the command wrote to
// stdout and stderr and its error, which says so when the timeout ended it.
func Run(t testing.TB, timeout time.Duration, dir string, env []string, name string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	// Files, not pipes, take the output: with a pipe, a child that kept it
	// open would hold Wait up after the agent itself exited.
	outFile := tempFile(t, "stdout")
	errFile := tempFile(t, "stderr")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = outFile
	cmd.Stderr = errFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	start := time.Now()
	err = cmd.Run()
	if cmd.Process != nil {
		// Whatever the agent left running (a shell, a server) is still in
		// the group. With nothing left the group is gone and this fails
		// harmlessly; its id is not handed out again that soon.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("%s timed out after %v: %w", name, timeout, err)
	}
	t.Logf("agentsim: %s ran %v", name, time.Since(start).Round(time.Millisecond))
	return readFile(t, outFile), readFile(t, errFile), err
}

// tempFile creates a file in the test's temporary directory, closed when
// the test ends.
func tempFile(t testing.TB, name string) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), name)
	if err != nil {
		t.Fatalf("agentsim: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func readFile(t testing.TB, f *os.File) string {
	t.Helper()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatalf("agentsim: %v", err)
	}
	return string(b)
}
