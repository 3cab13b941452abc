package overlay

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A shown number belongs to one workspace inode: committing a path again
// takes its number away from the inode it had, so a reused inode never
// shows another file's number (the kernel would merge the two files).
func TestInoMapIsOneToOne(t *testing.T) {
	dir := t.TempDir()
	m, err := loadInoMap(dir)
	require.NoError(t, err)
	const s, r1, r2 = 500, 101, 102
	require.NoError(t, m.add([][2]uint64{{r1, s}}))
	require.NoError(t, m.add([][2]uint64{{r2, s}})) // the path committed again
	require.Equal(t, uint64(s), m.shownFor(r2))
	require.Equal(t, uint64(r1), m.shownFor(r1), "the old inode keeps no number")
	require.Equal(t, uint64(s|reservedBit), m.shownFor(s), "a workspace inode numbered like a shown number")

	// r1 reused by another committed file whose shown number is r1 itself:
	// it shows r1, and s stays with r2.
	require.NoError(t, m.add([][2]uint64{{r1, r1}}))
	require.Equal(t, uint64(r1), m.shownFor(r1))
	require.Equal(t, uint64(s), m.shownFor(r2))

	// r2 reused by a file that takes r1's old number: r2 loses s.
	require.NoError(t, m.add([][2]uint64{{r2, 700}}))
	require.Equal(t, uint64(700), m.shownFor(r2))
	require.Equal(t, uint64(s), m.shownFor(s), "s is free again")

	again, err := loadInoMap(dir)
	require.NoError(t, err)
	require.Equal(t, m.byReal, again.byReal)
	require.Equal(t, m.byShown, again.byShown)
}

func TestInoMapCompactsAtLoad(t *testing.T) {
	dir := t.TempDir()
	m, err := loadInoMap(dir)
	require.NoError(t, err)
	for i := uint64(0); i < 3000; i++ {
		require.NoError(t, m.add([][2]uint64{{1000 + i, 1 << 62}}))
	}
	// A torn last line is ignored.
	f, err := os.OpenFile(filepath.Join(dir, "inomap"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("77")
	require.NoError(t, err)
	require.NoError(t, f.Close())

	again, err := loadInoMap(dir)
	require.NoError(t, err)
	require.Equal(t, map[uint64]uint64{3999: 1 << 62}, again.byReal)
	require.Equal(t, 1, again.lines)
	b, err := os.ReadFile(filepath.Join(dir, "inomap"))
	require.NoError(t, err)
	require.Equal(t, "3999 4611686018427387904\n", string(b))
}
