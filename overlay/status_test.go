package overlay_test

import (
	"os"
	"strconv"
	"strings"
	"sync"
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

// A workspace file whose attributes alone changed is a metadata change;
// once its body is opened for writing, truncated, moved or linked it is a
// write. Both survive a restart.
func TestStatusMetaThenWrite(t *testing.T) {
	h := newHarness(t)
	for _, p := range []string{"chmod", "touch", "xattr", "trunc", "moved", "linked"} {
		h.baseFile(p, "base\n")
	}
	now := unix.Timespec{Nsec: unix.UTIME_NOW}
	_, err := h.e.Setattr("chmod", -1, overlay.SetAttr{Mode: u32(0o755)}, caller)
	require.NoError(t, err)
	_, err = h.e.Setattr("touch", -1, overlay.SetAttr{Atime: &now, Mtime: &now}, caller)
	require.NoError(t, err)
	require.NoError(t, h.e.Setxattr("xattr", "user.k", []byte("v"), 0, caller))
	for _, p := range []string{"trunc", "moved", "linked"} {
		_, err = h.e.Setattr(p, -1, overlay.SetAttr{Mode: u32(0o600)}, caller)
		require.NoError(t, err)
	}
	meta := []string{"metadata chmod", "metadata linked", "metadata moved", "metadata touch", "metadata trunc", "metadata xattr"}
	require.Equal(t, meta, h.pending())
	h.restart()
	require.Equal(t, meta, h.pending(), "after a restart")

	// Opening for writing without writing a byte counts: the engine does
	// not see the writes themselves.
	f, err := h.e.Open("chmod", unix.O_WRONLY|unix.O_APPEND, caller)
	require.NoError(t, err)
	h.e.Release("chmod", f, caller)
	h.overwrite("touch", "new\n")
	f, err = h.e.Open("xattr", unix.O_RDONLY, caller)
	require.NoError(t, err)
	h.e.Release("xattr", f, caller) // a read changes nothing
	one := uint64(1)
	_, err = h.e.Setattr("trunc", -1, overlay.SetAttr{Size: &one}, caller)
	require.NoError(t, err)
	h.rename("moved", "moved2")
	_, err = h.e.Link("linked", "linked2", caller)
	require.NoError(t, err)
	want := []string{"modified chmod", "modified linked", "created linked2", "deleted moved", "created moved2", "modified touch", "modified trunc", "metadata xattr"}
	require.Equal(t, want, h.pending())
	h.restart()
	require.Equal(t, want, h.pending(), "after a restart")

	// Moved over a workspace file, a metadata-only copy is a write there.
	h.baseFile("src", "src\n")
	h.baseFile("dst", "dst\n")
	_, err = h.e.Setattr("src", -1, overlay.SetAttr{Mode: u32(0o600)}, caller)
	require.NoError(t, err)
	h.rename("src", "dst")
	require.Contains(t, h.pending(), "modified dst")

	h.commitAll()
	require.Equal(t, "base\n", h.baseRead("chmod"))
	fi, err := os.Stat(h.wsPath("chmod"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), fi.Mode().Perm())
	require.Equal(t, "b", h.baseRead("trunc"))
	require.Equal(t, "new\n", h.baseRead("touch"))
}

// recordingJournal keeps what the engine appends.
type recordingJournal struct {
	mu   sync.Mutex
	recs []overlay.Record
}

func (j *recordingJournal) Append(b []byte) (uint64, error) { return j.AppendNoWait(b) }

func (j *recordingJournal) AppendNoWait(b []byte) (uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	r, err := overlay.DecodeRecord(uint64(len(j.recs)+1), b)
	if err != nil {
		return 0, err
	}
	j.recs = append(j.recs, r)
	return r.Seq, nil
}

func (j *recordingJournal) Sync() error { return nil }

// details returns the op and detail of the records of path p.
func (j *recordingJournal) details(p string) []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []string
	for _, r := range j.recs {
		if r.Path == p {
			out = append(out, r.Op+" "+r.Detail)
		}
	}
	return out
}

// A setattr record says which attributes changed and to what.
func TestSetattrRecordDetail(t *testing.T) {
	h := newHarness(t)
	j := &recordingJournal{}
	h.opts.Journal = j
	h.restart()
	h.baseFile("f", "base\n")
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	mtime := unix.Timespec{Sec: 1_000_000_000, Nsec: 5}
	now := unix.Timespec{Nsec: unix.UTIME_NOW}
	omit := unix.Timespec{Nsec: unix.UTIME_OMIT}
	size := uint64(2)
	for _, a := range []overlay.SetAttr{
		{Mode: u32(0o755)},
		{Mode: u32(0o4700)},
		{Uid: &uid, Gid: &gid},
		{Atime: &omit, Mtime: &mtime},
		{Atime: &now, Mtime: &now},
		{Size: &size},
	} {
		_, err := h.e.Setattr("f", -1, a, overlay.Caller{Pid: 77, Comm: "tool"})
		require.NoError(t, err)
	}
	require.Equal(t, []string{
		"setattr mode=0755",
		"setattr mode=4700",
		"setattr uid=" + strconv.FormatUint(uint64(uid), 10) + " gid=" + strconv.FormatUint(uint64(gid), 10),
		"setattr mtime=2001-09-09T01:46:40.000000005Z",
		"setattr atime=now mtime=now",
		"truncate size=2",
	}, j.details("f"))
	for _, r := range j.recs {
		require.Equal(t, "tool", r.Comm, "record %s", r.Op)
	}
}
