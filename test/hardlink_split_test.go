package test

import (
	"syscall"
	"testing"
)

// A staged hard link committed through one name only: the committed file
// and the name left pending are two files from then on, and must show two
// inode numbers, or the kernel serves them as one (a write to one showing
// in the other, and a commit writing what the view did not show).
func TestCommitOfOneNameOfAStagedHardLink(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	sh(t, m.mnt, "echo v1 > a && ln a b")
	if cr := m.commit("a"); len(cr.Committed) != 1 {
		t.Fatalf("commit a: %+v", cr)
	}
	sh(t, m.mnt, "echo more >> a")
	assertFile(t, m.in("a"), "v1\nmore\n")
	assertFile(t, m.in("b"), "v1\n")
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(m.in("a"), &sa); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(m.in("b"), &sb); err != nil {
		t.Fatal(err)
	}
	if sa.Ino == sb.Ino {
		t.Errorf("a and b, two files now, both show inode %d", sa.Ino)
	}
	m.commit()
	assertFile(t, m.inWS("a"), "v1\nmore\n")
	assertFile(t, m.inWS("b"), "v1\n")
}
