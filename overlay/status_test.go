package overlay_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"stagefs/overlay"
)

// changeOf returns the pending change at p.
func changeOf(t *testing.T, h *harness, p string) overlay.Change {
	t.Helper()
	for _, c := range h.e.Pending(nil) {
		if c.Path == p {
			return c
		}
	}
	t.Fatalf("%s is not pending: %v", p, h.pending())
	return overlay.Change{}
}

// who is the process status names for a change: "pid comm".
func who(c overlay.Change) string { return strconv.Itoa(c.Pid) + " " + c.Comm }

// Status names the process that changed a path last, with the command name
// it had then, and a clean restart keeps both.
func TestStatusNamesLastChanger(t *testing.T) {
	h := newHarness(t)
	h.baseFile("f", "base\n")
	h.baseFile("g", "base\n")
	h.baseFile("x", "base\n")
	h.baseDir("d")
	first := overlay.Caller{Pid: 1001, Comm: "sh"}
	second := overlay.Caller{Pid: 1002, Comm: "tee"}

	// A write-open of a path staged already.
	f, err := h.e.Open("f", unix.O_WRONLY|unix.O_TRUNC, first)
	require.NoError(t, err)
	h.e.Release("f", f, first)
	require.Equal(t, "1001 sh", who(changeOf(t, h, "f")))
	f, err = h.e.Open("f", unix.O_WRONLY|unix.O_APPEND, second)
	require.NoError(t, err)
	h.e.Release("f", f, second)
	require.Equal(t, "1002 tee", who(changeOf(t, h, "f")))

	// setattr and xattrs of staged paths, a directory's included.
	f, err = h.e.Open("g", unix.O_WRONLY, first)
	require.NoError(t, err)
	h.e.Release("g", f, first)
	_, err = h.e.Setattr("g", -1, overlay.SetAttr{Mode: u32(0o600)}, overlay.Caller{Pid: 1003, Comm: "chmod"})
	require.NoError(t, err)
	require.Equal(t, "1003 chmod", who(changeOf(t, h, "g")))
	_, err = h.e.Setattr("d", -1, overlay.SetAttr{Mode: u32(0o700)}, first)
	require.NoError(t, err)
	require.NoError(t, h.e.Setxattr("d", "user.k", []byte("v"), 0, overlay.Caller{Pid: 1004, Comm: "setfattr"}))
	require.Equal(t, "1004 setfattr", who(changeOf(t, h, "d")))

	// A rename names its process at the new path (and the deletion at
	// the old one).
	f, err = h.e.Open("x", unix.O_WRONLY, first)
	require.NoError(t, err)
	h.e.Release("x", f, first)
	require.NoError(t, h.e.Rename("x", "y", 0, overlay.Caller{Pid: 1005, Comm: "mv"}))
	require.Equal(t, "1005 mv", who(changeOf(t, h, "y")))
	require.Equal(t, "1005 mv", who(changeOf(t, h, "x")))

	before := map[string]string{}
	for _, c := range h.e.Pending(nil) {
		before[c.Path] = who(c)
	}
	h.restart()
	after := map[string]string{}
	for _, c := range h.e.Pending(nil) {
		after[c.Path] = who(c)
	}
	require.Equal(t, before, after, "last changers after a restart")
}

// Without a name from the caller, the engine reads it from /proc while the
// process makes the change.
func TestStatusReadsCommandAtChange(t *testing.T) {
	h := newHarness(t)
	h.baseFile("f", "base\n")
	f, err := h.e.Open("f", unix.O_WRONLY, caller)
	require.NoError(t, err)
	h.e.Release("f", f, caller)
	comm, err := os.ReadFile("/proc/self/comm")
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(os.Getpid())+" "+strings.TrimSpace(string(comm)), who(changeOf(t, h, "f")))
}
