package snapshot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// toolCalls is the Lazy predicate the daemon uses, in the small: scopes
// starting with "turn:" are kept durable, all others are lazy.
func toolCalls(scope string) bool { return !strings.HasPrefix(scope, "turn:") }

func haveBootID(t *testing.T) {
	if _, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err != nil {
		t.Skip("no boot id on this system: nothing is lazy")
	}
}

// Opening and closing a tool call's snapshot asks for no fsync at all; the
// first captured entry makes the header durable with it (file and
// directory), and every entry after that costs one fsync. A durable scope
// pays for its header and close marker.
func TestLazySnapshotFlushes(t *testing.T) {
	haveBootID(t)
	s := openStore(t, t.TempDir(), Options{NoSync: true, Lazy: toolCalls})
	flushes := func(f func()) int64 {
		before := s.flushes.Load()
		f()
		return s.flushes.Load() - before
	}
	require.Zero(t, flushes(func() {
		_, err := s.Create("empty", "", 0)
		require.NoError(t, err)
		_, err = s.CloseSnapshot("empty")
		require.NoError(t, err)
	}), "open+close of an empty tool-call snapshot")

	_, err := s.Create("tc", "", 0)
	require.NoError(t, err)
	require.Equal(t, int64(2), flushes(func() {
		require.NoError(t, s.Add("tc", Entry{Path: "a", Kind: KindAbsent}))
	}), "first entry: the manifest and its directory")
	require.Equal(t, int64(1), flushes(func() {
		require.NoError(t, s.Add("tc", Entry{Path: "b", Kind: KindAbsent}))
	}), "later entries: the manifest")
	require.Zero(t, flushes(func() {
		_, err := s.CloseSnapshot("tc")
		require.NoError(t, err)
	}), "close marker of a tool call")

	require.Equal(t, int64(3), flushes(func() {
		_, err := s.Create("turn:1", "1", 0)
		require.NoError(t, err)
		_, err = s.CloseSnapshot("turn:1")
		require.NoError(t, err)
	}), "a durable scope: header file, directory, close marker")
}

// A lazy manifest whose header never reached the disk (a power loss before
// its first entry) is removed at Open; with a header it loads as usual.
func TestLostLazyHeader(t *testing.T) {
	for name, data := range map[string]string{
		"empty":   "",
		"partial": `{"id":"0000000000000001-abcd`,
		"zeros":   "\x00\x00\x00\x00\x00\x00\x00\x00",
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir, Options{NoSync: true, Lazy: toolCalls})
			_, err := s.Create("kept", "", 0)
			require.NoError(t, err)
			_, err = s.Create("lost", "", 0)
			require.NoError(t, err)
			mf := manifestFile(t, dir, s, "lost")
			require.NoError(t, os.WriteFile(mf, []byte(data), 0o600))

			s2 := openStore(t, dir, Options{NoSync: true, Lazy: toolCalls})
			_, ok := s2.Lookup("lost")
			require.False(t, ok)
			require.NoFileExists(t, mf)
			info, ok := s2.Lookup("kept")
			require.True(t, ok)
			require.False(t, info.Closed, "same boot: an open snapshot stays open")
		})
	}
}

// After a reboot, open tool-call snapshots are closed (their close marker
// may have been lost, their processes are gone); open durable ones stay
// open. Within one boot a reopened store keeps every open snapshot open.
func TestCloseAfterReboot(t *testing.T) {
	haveBootID(t)
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true, Lazy: toolCalls})
	for _, scope := range []string{"bound", "unbound", "turn:7"} {
		pid := 0
		if scope == "bound" {
			pid = 4242
		}
		_, err := s.Create(scope, "", pid)
		require.NoError(t, err)
		require.NoError(t, s.Add(scope, Entry{Path: scope + ".txt", Kind: KindAbsent}))
	}
	open := func(s *Store) []string {
		var out []string
		for _, i := range s.OpenSnapshots() {
			out = append(out, i.ScopeID)
		}
		return out
	}

	s = openStore(t, dir, Options{NoSync: true, Lazy: toolCalls})
	require.ElementsMatch(t, []string{"bound", "unbound", "turn:7"}, open(s), "same boot")

	// Another boot id on record stands for a reboot since the last Open.
	require.NoError(t, os.WriteFile(filepath.Join(dir, bootFile), []byte("another boot\n"), 0o600))
	s = openStore(t, dir, Options{NoSync: true, Lazy: toolCalls})
	require.Equal(t, []string{"turn:7"}, open(s), "after a reboot")
	info, ok := s.Lookup("unbound")
	require.True(t, ok)
	require.Equal(t, []string{"unbound.txt"}, info.Paths, "what it captured is kept")

	// The close is on disk, not only in memory.
	s = openStore(t, dir, Options{NoSync: true, Lazy: toolCalls})
	require.Equal(t, []string{"turn:7"}, open(s))

	// Without Lazy nothing is closed by a reboot.
	s = openStore(t, dir, Options{NoSync: true})
	_, err := s.Create("late", "", 0)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, bootFile), []byte("a third boot\n"), 0o600))
	s = openStore(t, dir, Options{NoSync: true})
	require.ElementsMatch(t, []string{"turn:7", "late"}, open(s))
}

// A store without a boot record (new, or from before boot ids were kept,
// when every close marker was fsynced) closes nothing: it only records
// this boot.
func TestNoBootRecordClosesNothing(t *testing.T) {
	haveBootID(t)
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true, Lazy: toolCalls})
	_, err := s.Create("tc", "", 0)
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(dir, bootFile)))
	s = openStore(t, dir, Options{NoSync: true, Lazy: toolCalls})
	require.Len(t, s.OpenSnapshots(), 1)
	require.FileExists(t, filepath.Join(dir, bootFile))
}
