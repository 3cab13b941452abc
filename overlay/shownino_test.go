package overlay_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// A pending file shows the number of the workspace file it was staged
// from. When the host moves that file elsewhere (or removes it and the
// file system gives its number to a new file), the workspace entry must
// not show the same number as the pending one: the kernel would take
// the two for one file.
func TestAWorkspaceFileNeverSharesAPendingFilesNumber(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a", "workspace a\n")
	h.overwrite("a", "staged a\n")
	require.Equal(t, h.baseIno("a"), h.stat("a").Ino, "a copy-up keeps the workspace file's number")

	require.NoError(t, os.Rename(h.wsPath("a"), h.wsPath("q")))
	pending, moved := h.stat("a"), h.stat("q")
	require.NotEqual(t, pending.Ino, moved.Ino, "two files in the view show one inode number")
	h.view() // readdir's numbers agree with stat's

	// Staging the moved file keeps the number it was shown with, and so
	// does a restart.
	h.overwrite("q", "staged q\n")
	require.Equal(t, moved.Ino, h.stat("q").Ino)
	h.restart()
	require.Equal(t, pending.Ino, h.stat("a").Ino)
	require.Equal(t, moved.Ino, h.stat("q").Ino)
	require.Equal(t, "staged a\n", h.read("a"))
	require.Equal(t, "staged q\n", h.read("q"))

	// Once nothing pending shows the number, the workspace file shows
	// its own again.
	h.e.Discard([]string{"a", "q"}, caller)
	require.Equal(t, h.baseIno("q"), h.stat("q").Ino)
}

// A chain: stage a, move its origin to b, stage b, move that origin to c.
// a shows the origin's number, b its reserved one; c must show neither.
func TestAChainOfMovedOriginsShowsThreeNumbers(t *testing.T) {
	h := newHarness(t)
	h.baseFile("a", "orig\n")
	h.overwrite("a", "staged a\n")
	require.NoError(t, os.Rename(h.wsPath("a"), h.wsPath("b")))
	h.overwrite("b", "staged b\n")
	require.NoError(t, os.Rename(h.wsPath("b"), h.wsPath("c")))
	a, b, c := h.stat("a").Ino, h.stat("b").Ino, h.stat("c").Ino
	require.NotEqual(t, a, b)
	require.NotEqual(t, b, c, "b and c, two files, show one number")
	require.NotEqual(t, a, c)
	h.view() // readdir's numbers agree with stat's
	require.Equal(t, "staged b\n", h.read("b"))
	require.Equal(t, "orig\n", h.read("c"))
}
