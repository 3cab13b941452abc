package test

import (
	"strings"
	"testing"
)

// chown -h and touch -h on a workspace symlink (rsync -a sends the latter
// when only a link's time differs) are committed like any change: the
// commit once saw the same target in the workspace, took the link as
// committed already and dropped the change, and the mount showed the old
// owner and time again.
func TestSymlinkOwnerAndTimesCommit(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f": "1\n"}), withSymlink("s", "f"))
	sh(t, m.mnt, "touch -h -d 2006-06-06T06:06:06 s && chown -h 99:98 s")
	want := "99:98 2006-06-06 06:06:06"
	stat := func(path string) string {
		return strings.TrimSpace(sh(t, "/", "stat -c '%u:%g %y' "+path+" | cut -c1-25"))
	}
	if got := stat(m.in("s")); got != want {
		t.Fatalf("the mount shows %q, want %q", got, want)
	}
	if got := stat(m.inWS("s")); got == want {
		t.Fatalf("the workspace changed before the commit: %q", got)
	}
	m.commit()
	if got := stat(m.inWS("s")); got != want {
		t.Errorf("the workspace after the commit: %q, want %q", got, want)
	}
	if got := stat(m.in("s")); got != want {
		t.Errorf("the mount after the commit: %q, want %q", got, want)
	}
}
