package test

import (
	"os"
	"testing"
	"time"
)

// Changing a file of a workspace directory (a chmod, an append: a copy-up)
// leaves the directory's times alone, in the view and after the commit,
// as on a local disk: the copy-up once moved the directory's mtime (and
// the root's), and the commit wrote that time into the workspace.
func TestCopyUpKeepsDirectoryTimes(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"d/old": "old\n", "d/sub/deep": "deep\n"}))
	old := time.Date(2004, 4, 4, 4, 4, 4, 0, time.UTC)
	for _, d := range []string{"d", "d/sub"} {
		if err := os.Chtimes(m.inWS(d), old, old); err != nil {
			t.Fatal(err)
		}
	}
	sh(t, m.mnt, "chmod 600 d/old && echo more >> d/sub/deep")
	time.Sleep(50 * time.Millisecond)
	for _, d := range []string{"d", "d/sub"} {
		for _, p := range []string{m.in(d), m.inWS(d)} {
			if st, err := os.Stat(p); err != nil || !st.ModTime().Equal(old) {
				t.Errorf("%s before the commit: mtime %v, want %v (%v)", p, st.ModTime(), old, err)
			}
		}
	}
	m.commit()
	for _, d := range []string{"d", "d/sub"} {
		if st, err := os.Stat(m.inWS(d)); err != nil || !st.ModTime().Equal(old) {
			t.Errorf("%s after the commit: mtime %v, want %v (%v)", m.inWS(d), st.ModTime(), old, err)
		}
	}
	assertFile(t, m.inWS("d/sub/deep"), "deep\nmore\n")
}
