package overlay

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReadProcStatus(t *testing.T) {
	self := readProcStatus(os.Getpid())
	require.Equal(t, os.Getpid(), self.tgid)
	require.Equal(t, os.Getppid(), self.ppid)
	exe, err := os.Executable()
	require.NoError(t, err)
	name := filepath.Base(exe)
	if len(name) > 15 {
		name = name[:15] // the kernel keeps 15 bytes of a command name
	}
	require.Equal(t, name, self.comm)

	// A child that has exited and been reaped is gone: zero values.
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	require.Equal(t, procInfo{}, readProcStatus(cmd.Process.Pid))
}
