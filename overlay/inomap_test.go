package overlay_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// After a commit the view is unchanged, inode numbers included, and stays
// so after a restart; d_ino matches st_ino throughout (view() checks it).
func TestCommitKeepsInodeNumbers(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a.txt", "a0\n")
	h.baseFile("d/b.txt", "b0\n")
	h.overwrite("a.txt", "a1\n")
	h.create("new.txt", "n\n")
	h.mkdir("nd")
	h.create("nd/x", "x\n")
	inos := map[string]uint64{}
	for _, p := range []string{"a.txt", "new.txt", "nd", "nd/x", "d/b.txt"} {
		inos[p] = h.stat(p).Ino
	}
	before := h.view()
	h.commitAll()
	require.Equal(t, before, h.view())
	for p, ino := range inos {
		require.Equal(t, ino, h.stat(p).Ino, "inode number of %s after commit", p)
	}
	h.restart()
	for p, ino := range inos {
		require.Equal(t, ino, h.stat(p).Ino, "inode number of %s after restart", p)
	}
	// Numbers stay unique: a new workspace file never shows one of them.
	seen := map[uint64]string{}
	h.baseFile("later.txt", "l\n")
	for _, p := range []string{"a.txt", "new.txt", "nd", "nd/x", "d/b.txt", "later.txt", "d"} {
		ino := h.stat(p).Ino
		require.NotContains(t, seen, ino, "%s shows the number of %s", p, seen[ino])
		seen[ino] = p
	}
}
