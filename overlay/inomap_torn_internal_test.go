package overlay

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A kill in the middle of an append leaves a last line without its
// newline whose numbers may be cut short: "123 46" of "123 4611…". It used
// to be read as a mapping, and the next append was glued onto it, so the
// mount showed wrong inode numbers.
func TestInoMapTornLastLine(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "inomap")
	m, err := loadInoMap(dir)
	require.NoError(t, err)
	require.NoError(t, m.add([][2]uint64{{100, 4611686018427387905}}))
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("123 46")
	require.NoError(t, err)
	require.NoError(t, f.Close())

	m, err = loadInoMap(dir)
	require.NoError(t, err)
	require.Equal(t, map[uint64]uint64{100: 4611686018427387905}, m.byReal, "the torn line is not read")
	require.Equal(t, uint64(123), m.shownFor(123))

	// The commit that was writing it appends its line again, and more.
	require.NoError(t, m.add([][2]uint64{{123, 4611686018427387906}, {124, 4611686018427387907}}))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "100 4611686018427387905\n123 4611686018427387906\n124 4611686018427387907\n", string(b))

	again, err := loadInoMap(dir)
	require.NoError(t, err)
	require.Equal(t, map[uint64]uint64{
		100: 4611686018427387905,
		123: 4611686018427387906,
		124: 4611686018427387907,
	}, again.byReal)
}

// An append that failed half way in this process (a full disk) leaves a
// torn line too: the next append cuts it off instead of finishing it.
func TestInoMapAppendAfterTornAppend(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "inomap")
	m, err := loadInoMap(dir)
	require.NoError(t, err)
	require.NoError(t, m.add([][2]uint64{{100, 200}}))
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("123 46")
	require.NoError(t, err)
	require.NoError(t, f.Close())

	require.NoError(t, m.add([][2]uint64{{300, 400}}))
	again, err := loadInoMap(dir)
	require.NoError(t, err)
	require.Equal(t, map[uint64]uint64{100: 200, 300: 400}, again.byReal)
}
