package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"stagefs/internal/contenthash"
)

func openStore(t *testing.T, dir string, opts Options) *Store {
	t.Helper()
	s, err := Open(dir, opts)
	require.NoError(t, err)
	return s
}

func put(t *testing.T, s *Store, content string) (contenthash.Hash, int64) {
	t.Helper()
	h, n, err := s.PutBody(strings.NewReader(content))
	require.NoError(t, err)
	require.Equal(t, int64(len(content)), n)
	return h, n
}

// addFile stores content and captures it as path's pre-image.
func addFile(t *testing.T, s *Store, scope, path, content string) contenthash.Hash {
	t.Helper()
	h, n := put(t, s, content)
	require.NoError(t, s.Add(scope, Entry{Path: path, Kind: KindFile, Hash: h, Size: n, Mode: 0o100644}))
	return h
}

func readBody(t *testing.T, s *Store, h contenthash.Hash) (string, error) {
	t.Helper()
	rc, err := s.OpenBody(h)
	require.NoError(t, err)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err
}

// blobFiles lists the hashes of the blob files on disk, sorted.
func blobFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(filepath.Join(dir, "blobs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			out = append(out, d.Name())
		}
		return nil
	})
	require.NoError(t, err)
	sort.Strings(out)
	return out
}

// sorted returns the blob names of hs, sorted.
func sorted(hs ...contenthash.Hash) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.Hex())
	}
	sort.Strings(out)
	return out
}

func manifestFile(t *testing.T, dir string, s *Store, scope string) string {
	t.Helper()
	info, ok := s.Lookup(scope)
	require.True(t, ok)
	return filepath.Join(dir, "snaps", info.ID+".jsonl")
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{}) // real fsyncs here

	created, err := s.Create("call_1", "turn-7", 4242)
	require.NoError(t, err)
	require.NoError(t, ValidID(created.ID))
	require.Equal(t, "call_1", created.ScopeID)
	require.False(t, created.Closed)
	require.Empty(t, created.Paths)

	h1, n1 := put(t, s, "hello\n")
	h2, n2 := put(t, s, "")
	entries := []Entry{
		{Path: "a.txt", Kind: KindFile, Hash: h1, Size: n1, Mode: 0o100644, Uid: 1000, Gid: 1000, Mtime: 1700000000123456789, Time: 1, Pid: 99, Comm: "sed"},
		{Path: "empty", Kind: KindFile, Hash: h2, Size: n2, Mode: 0o100600, Time: 2},
		{Path: "dir/link", Kind: KindSymlink, Target: "../a.txt", Time: 3},
		{Path: "dir", Kind: KindDir, Mode: 0o40755, Time: 4},
		{Path: "", Kind: KindDir, Mode: 0o40700, Time: 5},
		{Path: "new/file", Kind: KindAbsent, Time: 6},
		{Path: "renamed", Kind: KindMoved, From: "old/name", Time: 7},
		{Path: "again", Kind: KindFile, Hash: h1, Size: n1, Mode: 0o100644, Time: 8},
	}
	for _, e := range entries {
		require.NoError(t, s.Add("call_1", e))
	}
	closed, err := s.CloseSnapshot("call_1")
	require.NoError(t, err)
	require.True(t, closed.Closed)
	require.Equal(t, []string{"a.txt", "empty", "dir/link", "dir", "", "new/file", "renamed", "again"}, closed.Paths)
	require.Equal(t, n1+n2, closed.Bytes, "a body used twice counts once")

	// A second, still open snapshot, whose Add gets its time filled in.
	_, err = s.Create("call_2", "", 0)
	require.NoError(t, err)
	h3 := addFile(t, s, "call_2", "b.txt", "bee")
	e2, err := s.Entries("call_2")
	require.NoError(t, err)
	require.NotZero(t, e2[0].Time)

	list := s.List()
	total := s.TotalBytes()
	require.Equal(t, n1+n2+3, total)

	s2 := openStore(t, dir, Options{})
	require.Equal(t, list, s2.List())
	require.Equal(t, total, s2.TotalBytes())
	got, err := s2.Entries("call_1")
	require.NoError(t, err)
	require.Equal(t, entries, got)
	got2, err := s2.Entries("call_2")
	require.NoError(t, err)
	require.Equal(t, e2, got2)
	require.Len(t, s2.OpenSnapshots(), 1)
	require.Equal(t, "call_2", s2.OpenSnapshots()[0].ScopeID)
	require.True(t, s2.Has("call_1", "dir/link"))
	require.True(t, s2.Has("call_1", ""))
	require.False(t, s2.Has("call_1", "b.txt"))

	for h, want := range map[contenthash.Hash]string{h1: "hello\n", h2: "", h3: "bee"} {
		body, err := readBody(t, s2, h)
		require.NoError(t, err)
		require.Equal(t, want, body)
	}

	// The reopened store goes on appending to the open snapshot.
	addFile(t, s2, "call_2", "c.txt", "sea")
	_, err = s2.CloseSnapshot("call_2")
	require.NoError(t, err)
	s3 := openStore(t, dir, Options{})
	info, ok := s3.Lookup("call_2")
	require.True(t, ok)
	require.True(t, info.Closed)
	require.Equal(t, []string{"b.txt", "c.txt"}, info.Paths)
}

func TestDecodeManifestMatchesStore(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true})
	_, err := s.Create("s", "t", 1)
	require.NoError(t, err)
	addFile(t, s, "s", "x", "xx")
	require.NoError(t, s.Add("s", Entry{Path: "y", Kind: KindAbsent}))
	want, err := s.CloseSnapshot("s")
	require.NoError(t, err)
	wantEntries, err := s.Entries("s")
	require.NoError(t, err)

	data, err := os.ReadFile(manifestFile(t, dir, s, "s"))
	require.NoError(t, err)
	require.True(t, bytes.HasSuffix(data, []byte("\n{\"closed\":true}\n")))
	info, entries, err := DecodeManifest(data)
	require.NoError(t, err)
	require.Equal(t, want, info)
	require.Equal(t, wantEntries, entries)
}

func TestDedupe(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true})
	h1, _ := put(t, s, "same content")
	h2, _ := put(t, s, "same content")
	require.Equal(t, h1, h2)
	require.Equal(t, []string{h1.Hex()}, blobFiles(t, dir))

	// Two snapshots referring to one body count its bytes once.
	for _, scope := range []string{"a", "b"} {
		_, err := s.Create(scope, "", 0)
		require.NoError(t, err)
		require.NoError(t, s.Add(scope, Entry{Path: "f", Kind: KindFile, Hash: h1, Size: 12}))
	}
	require.Equal(t, int64(12), s.TotalBytes())

	// No temp files are left behind.
	des, err := os.ReadDir(filepath.Join(dir, "blobs"))
	require.NoError(t, err)
	for _, de := range des {
		require.False(t, strings.HasPrefix(de.Name(), tmpPrefix), de.Name())
	}
}

func TestOpenBodyDetectsCorruption(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true})
	content := strings.Repeat("pre-image ", 10000)
	h, _ := put(t, s, content)
	body, err := readBody(t, s, h)
	require.NoError(t, err)
	require.Equal(t, content, body)

	p := filepath.Join(dir, "blobs", h.Hex()[:2], h.Hex())
	fi, err := os.Stat(p)
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o600), fi.Mode().Perm())
	data, err := os.ReadFile(p)
	require.NoError(t, err)
	data[len(data)/2] ^= 0x01
	require.NoError(t, os.WriteFile(p, data, 0o600))

	_, err = readBody(t, s, h)
	require.ErrorIs(t, err, ErrCorrupt)

	// A truncated body is caught as well.
	require.NoError(t, os.WriteFile(p, []byte(content[:10]), 0o600))
	_, err = readBody(t, s, h)
	require.ErrorIs(t, err, ErrCorrupt)

	// Reading byte by byte still ends in the error, never in io.EOF.
	rc, err := s.OpenBody(h)
	require.NoError(t, err)
	var one [1]byte
	for err == nil {
		_, err = rc.Read(one[:])
	}
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = rc.Read(one[:])
	require.ErrorIs(t, err, ErrCorrupt, "the error is sticky")
	require.NoError(t, rc.Close())

	_, err = s.OpenBody(contenthash.Hash{1})
	require.ErrorIs(t, err, ErrNotFound)
	_, err = s.OpenBody(contenthash.Hash{}) // a name can no longer be passed: only a typed hash
	require.Error(t, err)
}

func TestFirstCaptureWins(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true})
	_, err := s.Create("s", "", 0)
	require.NoError(t, err)
	require.False(t, s.Has("s", "f"))
	h1 := addFile(t, s, "s", "f", "original")
	require.True(t, s.Has("s", "f"))
	addFile(t, s, "s", "f", "modified") // a no-op
	require.NoError(t, s.Add("s", Entry{Path: "f", Kind: KindAbsent}))

	es, err := s.Entries("s")
	require.NoError(t, err)
	require.Len(t, es, 1)
	require.Equal(t, h1, es[0].Hash)
	info, _ := s.Lookup("s")
	require.Equal(t, []string{"f"}, info.Paths)
	require.Equal(t, int64(len("original")), info.Bytes)

	// The ignored body is not referenced, so GC takes it.
	removed, err := s.GC()
	require.NoError(t, err)
	require.Equal(t, 1, removed)
	require.Equal(t, []string{h1.Hex()}, blobFiles(t, dir))

	// Only one line per path reached the manifest.
	s2 := openStore(t, dir, Options{NoSync: true})
	es2, err := s2.Entries("s")
	require.NoError(t, err)
	require.Equal(t, es, es2)
}

func TestDropAndGC(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true})
	_, err := s.Create("a", "", 0)
	require.NoError(t, err)
	_, err = s.Create("b", "", 0)
	require.NoError(t, err)
	onlyA := addFile(t, s, "a", "1", "only in a")
	shared := addFile(t, s, "a", "2", "shared")
	require.Equal(t, shared, addFile(t, s, "b", "2", "shared"))
	onlyB := addFile(t, s, "b", "3", "only in b")
	require.Equal(t, sorted(onlyA, shared, onlyB), blobFiles(t, dir))

	removed, err := s.GC()
	require.NoError(t, err)
	require.Zero(t, removed, "every blob is referenced")

	aInfo, _ := s.Lookup("a")
	require.NoError(t, s.Drop("a"))
	_, ok := s.Lookup("a")
	require.False(t, ok)
	require.NoFileExists(t, filepath.Join(dir, "snaps", aInfo.ID+".jsonl"))
	require.Equal(t, sorted(shared, onlyB), blobFiles(t, dir))
	require.Equal(t, int64(len("shared")+len("only in b")), s.TotalBytes())
	body, err := readBody(t, s, shared)
	require.NoError(t, err)
	require.Equal(t, "shared", body)

	require.ErrorIs(t, s.Drop("a"), ErrNotFound)

	// A body waiting for its Add survives a GC; once Add declined it, it
	// does not.
	pending, _ := put(t, s, "pending")
	removed, err = s.GC()
	require.NoError(t, err)
	require.Zero(t, removed)
	require.Contains(t, blobFiles(t, dir), pending.Hex())
	err = s.Add("nope", Entry{Path: "p", Kind: KindFile, Hash: pending, Size: 7})
	require.ErrorIs(t, err, ErrNotFound)
	removed, err = s.GC()
	require.NoError(t, err)
	require.Equal(t, 1, removed)
	require.Equal(t, sorted(shared, onlyB), blobFiles(t, dir))

	require.NoError(t, s.Drop("b"))
	require.Empty(t, blobFiles(t, dir))
	require.Zero(t, s.TotalBytes())
	require.Empty(t, s.List())
}

func TestOpenRemovesCrashLeftovers(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true})
	_, err := s.Create("a", "", 0)
	require.NoError(t, err)
	kept := addFile(t, s, "a", "f", "kept")
	orphan, _ := put(t, s, "never added") // a crash before its Add
	blobTmp := filepath.Join(dir, "blobs", tmpPrefix+"123")
	snapTmp := filepath.Join(dir, "snaps", tmpPrefix+"456")
	require.NoError(t, os.WriteFile(blobTmp, []byte("half a body"), 0o600))
	require.NoError(t, os.WriteFile(snapTmp, []byte("{\"id\""), 0o600))
	require.Subset(t, blobFiles(t, dir), []string{kept.Hex(), orphan.Hex(), tmpPrefix + "123"})

	s2 := openStore(t, dir, Options{NoSync: true})
	require.Equal(t, []string{kept.Hex()}, blobFiles(t, dir))
	require.NoFileExists(t, blobTmp)
	require.NoFileExists(t, snapTmp)
	require.Equal(t, int64(4), s2.TotalBytes())
}

func TestEvictionByByteCap(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true, ByteCap: 100})
	body := func(c byte, n int) string { return strings.Repeat(string(c), n) }

	// old1 and old2 are closed, busy (created between them) stays open.
	_, err := s.Create("old1", "", 0)
	require.NoError(t, err)
	h1 := addFile(t, s, "old1", "f", body('a', 30))
	_, err = s.CloseSnapshot("old1")
	require.NoError(t, err)

	_, err = s.Create("busy", "", 0)
	require.NoError(t, err)
	hBusy := addFile(t, s, "busy", "f", body('b', 30))

	_, err = s.Create("old2", "", 0)
	require.NoError(t, err)
	h2 := addFile(t, s, "old2", "f", body('c', 30))
	_, err = s.CloseSnapshot("old2")
	require.NoError(t, err)
	require.Equal(t, int64(90), s.TotalBytes())
	require.Len(t, s.List(), 3)

	// A capture that would go over the cap evicts closed snapshots, oldest
	// first, until it fits: 90+60 > 100, old1 goes (120), then old2 (90);
	// busy is older than old2 but open.
	_, err = s.Create("last", "", 0)
	require.NoError(t, err)
	hLast := addFile(t, s, "last", "f", body('d', 60))
	scopes := func() []string {
		var out []string
		for _, i := range s.List() {
			out = append(out, i.ScopeID)
		}
		return out
	}
	require.Equal(t, []string{"busy", "last"}, scopes())
	require.Equal(t, int64(90), s.TotalBytes())
	require.Equal(t, sorted(hBusy, hLast), blobFiles(t, dir))
	require.NotContains(t, blobFiles(t, dir), h1)
	require.NotContains(t, blobFiles(t, dir), h2)
	info, err := s.CloseSnapshot("last")
	require.NoError(t, err)
	require.True(t, info.Closed)
	require.Equal(t, []string{"busy", "last"}, scopes(), "nothing over the cap at close")

	// A body that can not fit even with every closed snapshot gone is
	// refused, and its blob removed, without evicting anything: 30 (busy,
	// open) + 80 > 100.
	_, err = s.Create("big", "", 0)
	require.NoError(t, err)
	hBig, n := put(t, s, body('e', 80))
	err = s.Add("big", Entry{Path: "f", Kind: KindFile, Hash: hBig, Size: n, Mode: 0o100644})
	require.ErrorIs(t, err, ErrOverCap)
	require.Equal(t, []string{"busy", "last", "big"}, scopes(), "nothing evicted in vain")
	require.Equal(t, int64(90), s.TotalBytes())
	require.Equal(t, sorted(hBusy, hLast), blobFiles(t, dir))
	require.NoError(t, s.MarkUncaptured("big", "f"))
	require.NoError(t, s.MarkUncaptured("big", "f"), "once is enough")

	// A body an open snapshot holds already costs nothing more.
	require.NoError(t, s.Add("big", Entry{Path: "g", Kind: KindFile, Hash: hBusy, Size: 30, Mode: 0o100644}))
	big, ok := s.Lookup("big")
	require.True(t, ok)
	require.Equal(t, []string{"g"}, big.Paths)
	require.Equal(t, []string{"f"}, big.Uncaptured)

	// The eviction and the uncaptured path are durable.
	s2 := openStore(t, dir, Options{NoSync: true, ByteCap: 100})
	require.Equal(t, s.List(), s2.List())
}

func TestEvictionSharedBodyCountsOnce(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true, ByteCap: 15})
	for _, scope := range []string{"one", "two"} {
		_, err := s.Create(scope, "", 0)
		require.NoError(t, err)
		addFile(t, s, scope, "f", "ten bytes!")
		_, err = s.CloseSnapshot(scope)
		require.NoError(t, err)
	}
	require.Len(t, s.List(), 2, "a shared body is counted once, so both fit")
	require.Equal(t, int64(10), s.TotalBytes())
}

func TestNoCap(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{NoSync: true, ByteCap: -1})
	for i := range 3 {
		scope := fmt.Sprint("s", i)
		_, err := s.Create(scope, "", 0)
		require.NoError(t, err)
		addFile(t, s, scope, "f", strings.Repeat(fmt.Sprint(i), 1000))
		_, err = s.CloseSnapshot(scope)
		require.NoError(t, err)
	}
	require.Len(t, s.List(), 3)
}

func TestTornLastLine(t *testing.T) {
	for name, tail := range map[string]string{
		"no newline":           `{"path":"torn","kind":"fi`,
		"invalid json":         "{\"path\":\"torn\",\"ki\x00\n",
		"zeros":                "\x00\x00\x00\x00",
		"valid but unfinished": `{"path":"torn","kind":"absent","time":1}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir, Options{NoSync: true})
			_, err := s.Create("s", "", 0)
			require.NoError(t, err)
			addFile(t, s, "s", "a", "A")
			require.NoError(t, s.Add("s", Entry{Path: "b", Kind: KindAbsent}))
			want, err := s.Entries("s")
			require.NoError(t, err)
			mf := manifestFile(t, dir, s, "s")
			good, err := os.ReadFile(mf)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(mf, append(append([]byte(nil), good...), tail...), 0o600))

			s2 := openStore(t, dir, Options{NoSync: true})
			got, err := s2.Entries("s")
			require.NoError(t, err)
			require.Equal(t, want, got)
			require.False(t, s2.Has("s", "torn"))
			after, err := os.ReadFile(mf)
			require.NoError(t, err)
			require.Equal(t, good, after, "the torn line is truncated away")

			// Appending after the repair yields a manifest that
			// reopens cleanly.
			require.NoError(t, s2.Add("s", Entry{Path: "c", Kind: KindDir, Mode: 0o40755}))
			_, err = s2.CloseSnapshot("s")
			require.NoError(t, err)
			s3 := openStore(t, dir, Options{NoSync: true})
			info, ok := s3.Lookup("s")
			require.True(t, ok)
			require.True(t, info.Closed)
			require.Equal(t, []string{"a", "b", "c"}, info.Paths)
		})
	}
}

func TestBadMiddleLineFailsOpen(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true})
	_, err := s.Create("s", "", 0)
	require.NoError(t, err)
	require.NoError(t, s.Add("s", Entry{Path: "a", Kind: KindAbsent}))
	require.NoError(t, s.Add("s", Entry{Path: "b", Kind: KindAbsent}))
	mf := manifestFile(t, dir, s, "s")
	data, err := os.ReadFile(mf)
	require.NoError(t, err)
	lines := strings.SplitAfter(string(data), "\n")
	require.Len(t, lines, 4) // header, a, b, ""
	lines[1] = "{\"path\":\"a\",\"kind\n"
	require.NoError(t, os.WriteFile(mf, []byte(strings.Join(lines, "")), 0o600))

	_, err = Open(dir, Options{NoSync: true})
	require.Error(t, err)
	require.Contains(t, err.Error(), "line 2")
	require.Contains(t, err.Error(), mf)
	after, err := os.ReadFile(mf)
	require.NoError(t, err)
	require.Equal(t, strings.Join(lines, ""), string(after), "a failed Open changes nothing")

	// A valid but meaningless last line is an error too, not a torn line.
	lines[1] = "{\"path\":\"a\",\"kind\":\"absent\"}\n"
	lines[2] = "{\"path\":\"b\",\"kind\":\"bogus\"}\n"
	require.NoError(t, os.WriteFile(mf, []byte(strings.Join(lines, "")), 0o600))
	_, err = Open(dir, Options{NoSync: true})
	require.ErrorContains(t, err, "line 3")
}

func TestDecodeManifestErrors(t *testing.T) {
	hdr := `{"id":"0000000000000001-ab","scopeId":"s","created":1}` + "\n"
	entry := `{"path":"a","kind":"absent","time":1}` + "\n"
	closed := "{\"closed\":true}\n"
	hash := strings.Repeat("ab", 32)

	info, entries, err := DecodeManifest([]byte(hdr + entry + entry + closed))
	require.NoError(t, err)
	require.True(t, info.Closed)
	require.Len(t, entries, 1, "a repeated path keeps its first capture")

	for name, data := range map[string]string{
		"empty":               "",
		"torn header":         `{"id":"0000000000000001-ab"`,
		"bad id":              `{"id":"../x","scopeId":"s","created":1}` + "\n",
		"bad scope":           `{"id":"0000000000000001-ab","scopeId":"a/b","created":1}` + "\n",
		"no created":          `{"id":"0000000000000001-ab","scopeId":"s"}` + "\n",
		"line after close":    hdr + closed + entry + entry,
		"closed with fields":  hdr + `{"closed":true,"path":"a"}` + "\n" + entry,
		"bad hash":            hdr + `{"path":"a","kind":"file","hash":"../../x"}` + "\n" + entry,
		"hash on a dir":       hdr + `{"path":"a","kind":"dir","hash":"` + hash + `"}` + "\n" + entry,
		"unclean path":        hdr + `{"path":"a/../b","kind":"absent"}` + "\n" + entry,
		"absolute path":       hdr + `{"path":"/etc","kind":"absent"}` + "\n" + entry,
		"moved from itself":   hdr + `{"path":"a","kind":"moved","from":"a"}` + "\n" + entry,
		"wrong type":          hdr + `{"path":"a","kind":"absent","time":"now"}` + "\n" + entry,
		"blank middle line":   hdr + "\n" + entry,
		"negative size":       hdr + `{"path":"a","kind":"file","hash":"` + hash + `","size":-1}` + "\n" + entry,
		"unknown kind at end": hdr + `{"path":"a","kind":"fifo"}` + "\n",
		"absent root":         hdr + `{"path":"","kind":"absent"}` + "\n",
		"moved from root":     hdr + `{"path":"a","kind":"moved"}` + "\n",
	} {
		_, _, err := DecodeManifest([]byte(data))
		require.Error(t, err, name)
	}
}

func TestValidScope(t *testing.T) {
	for _, bad := range []string{"../x", "", "a/b", strings.Repeat("a", 200), "a\x00b", ".", "..", "a b", "x\n", "é"} {
		require.Error(t, ValidScope(bad), "%q", bad)
	}
	for _, good := range []string{"call_1", "toolu_01ABC", "a.b:c@d-e", strings.Repeat("z", 128), "..."} {
		require.NoError(t, ValidScope(good), "%q", good)
	}

	s := openStore(t, t.TempDir(), Options{NoSync: true})
	_, err := s.Create("../x", "", 0)
	require.Error(t, err)
	require.Empty(t, s.List())

	require.NoError(t, ValidID("0000000000000001-ab"))
	for _, bad := range []string{"", "x", "0000000000000001", "0000000000000001-", "000000000000001-ab", "0000000000000001-AB", "0000000000000001-ab/c"} {
		require.Error(t, ValidID(bad), "%q", bad)
	}
}

func TestCreateOnOpenScope(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true})
	first, err := s.Create("s", "", 0)
	require.NoError(t, err)
	_, err = s.Create("s", "", 0)
	require.ErrorIs(t, err, ErrExists)
	old := addFile(t, s, "s", "f", "old")

	_, err = s.CloseSnapshot("s")
	require.NoError(t, err)
	_, err = s.CloseSnapshot("s")
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, s.Add("s", Entry{Path: "g", Kind: KindAbsent}), ErrClosed)

	// A closed snapshot with the same scope id is replaced.
	second, err := s.Create("s", "", 0)
	require.NoError(t, err)
	require.NotEqual(t, first.ID, second.ID)
	require.Greater(t, second.ID, first.ID, "ids sort by creation")
	require.Len(t, s.List(), 1)
	require.False(t, s.Has("s", "f"))
	require.NotContains(t, blobFiles(t, dir), old)
	require.NoFileExists(t, filepath.Join(dir, "snaps", first.ID+".jsonl"))
}

func TestAddChecks(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{NoSync: true})
	_, err := s.Create("s", "", 0)
	require.NoError(t, err)
	h, n := put(t, s, "body")

	require.ErrorIs(t, s.Add("none", Entry{Path: "a", Kind: KindAbsent}), ErrNotFound)
	require.ErrorIs(t, s.Add("s", Entry{Path: "a", Kind: KindFile, Hash: contenthash.Hash{1}}), ErrNotFound)
	require.Error(t, s.Add("s", Entry{Path: "a", Kind: KindFile, Hash: h, Size: n + 1}))
	require.Error(t, s.Add("s", Entry{Path: "a", Kind: "weird"}))
	require.Error(t, s.Add("s", Entry{Path: "../a", Kind: KindAbsent}))
	require.Error(t, s.Add("s", Entry{Path: "a", Kind: KindMoved}), "a move needs its source")
	es, err := s.Entries("s")
	require.NoError(t, err)
	require.Empty(t, es)

	_, err = s.Entries("none")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = s.CloseSnapshot("none")
	require.ErrorIs(t, err, ErrNotFound)
	_, ok := s.Lookup("none")
	require.False(t, ok)
	require.False(t, s.Has("none", "a"))
}

func TestConcurrent(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true, ByteCap: -1})
	_, err := s.Create("shared", "", 0)
	require.NoError(t, err)

	const workers, perWorker = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := fmt.Sprint("own-", w)
			if _, err := s.Create(own, "", w); err != nil {
				errs <- err
				return
			}
			for i := range perWorker {
				// Some content is the same in every worker, to race
				// the dedupe path.
				content := fmt.Sprintf("w%d-i%d", w, i)
				if i%5 == 0 {
					content = fmt.Sprint("common-", i)
				}
				for _, scope := range []string{"shared", own} {
					h, n, err := s.PutBody(strings.NewReader(content))
					if err != nil {
						errs <- err
						return
					}
					e := Entry{Path: fmt.Sprintf("w%d/f%d", w, i), Kind: KindFile, Hash: h, Size: n}
					if err := s.Add(scope, e); err != nil {
						errs <- err
						return
					}
				}
				s.Has("shared", "w0/f0")
				s.List()
				if _, err := s.GC(); err != nil {
					errs <- err
					return
				}
			}
			if _, err := s.CloseSnapshot(own); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	shared, ok := s.Lookup("shared")
	require.True(t, ok)
	require.Len(t, shared.Paths, workers*perWorker)
	require.Len(t, s.List(), workers+1)

	// Every captured body is intact and readable, also after a reopen.
	s2 := openStore(t, dir, Options{NoSync: true})
	require.Equal(t, s.List(), s2.List())
	for _, scope := range []string{"shared", "own-3"} {
		es, err := s2.Entries(scope)
		require.NoError(t, err)
		for _, e := range es {
			_, err := readBody(t, s2, e.Hash)
			require.NoError(t, err)
		}
	}
	removed, err := s2.GC()
	require.NoError(t, err)
	require.Zero(t, removed)
	// 8*25 distinct names, of which the "common" ones collapse to 5.
	require.Len(t, blobFiles(t, dir), workers*perWorker-workers*5+5)
}

func TestErrorsAreDistinct(t *testing.T) {
	all := []error{ErrCorrupt, ErrNotFound, ErrClosed, ErrExists}
	for i, a := range all {
		for j, b := range all {
			require.Equal(t, i == j, errors.Is(a, b))
		}
	}
}

// PutFile stores a file's content from its offset to its end, copied in
// the kernel, with the same hash, dedupe and pin as PutBody.
func TestPutFile(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true})
	content := strings.Repeat("kernel copy\n", 100000) // 1.2 MB: several copy calls' worth of pages
	src := filepath.Join(t.TempDir(), "src")
	require.NoError(t, os.WriteFile(src, []byte("skip"+content), 0o644))
	f, err := os.Open(src)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Seek(4, io.SeekStart)
	require.NoError(t, err)

	h, n, err := s.PutFile(int(f.Fd()))
	require.NoError(t, err)
	require.Equal(t, int64(len(content)), n)
	hb, _ := put(t, s, content)
	require.Equal(t, hb, h, "same hash as PutBody of the same bytes")
	got, err := readBody(t, s, h)
	require.NoError(t, err)
	require.Equal(t, content, got)
	require.Equal(t, []string{h.Hex()}, blobFiles(t, dir), "stored once")
}

// Where the kernel refuses to copy (here: the source is a pipe, EINVAL),
// PutFile reads and writes instead.
func TestPutFileFallsBackToReadWrite(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{NoSync: true})
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	content := strings.Repeat("through a pipe\n", 1000)
	go func() {
		w.Write([]byte(content))
		w.Close()
	}()
	h, n, err := s.PutFile(int(r.Fd()))
	require.NoError(t, err)
	require.Equal(t, int64(len(content)), n)
	got, err := readBody(t, s, h)
	require.NoError(t, err)
	require.Equal(t, content, got)
}

// A path whose pre-image could not be stored is marked uncaptured, once;
// a later Add of it (the engine knows it has not changed since) takes the
// mark back, also across a reopen.
func TestUncapturedThenCaptured(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{NoSync: true})
	_, err := s.Create("s", "", 0)
	require.NoError(t, err)
	require.NoError(t, s.MarkUncaptured("s", "big"))
	require.NoError(t, s.MarkUncaptured("s", "big"))
	require.NoError(t, s.MarkUncaptured("s", "other"))
	require.True(t, s.IsUncaptured("s", "big"))
	require.False(t, s.Has("s", "big"))
	info, _ := s.Lookup("s")
	require.Equal(t, []string{"big", "other"}, info.Uncaptured)

	addFile(t, s, "s", "big", "the pre-image after all")
	require.False(t, s.IsUncaptured("s", "big"))
	info, _ = s.Lookup("s")
	require.Equal(t, []string{"big"}, info.Paths)
	require.Equal(t, []string{"other"}, info.Uncaptured)
	require.NoError(t, s.MarkUncaptured("s", "big"), "captured: no mark")

	s = openStore(t, dir, Options{NoSync: true})
	info, _ = s.Lookup("s")
	require.Equal(t, []string{"big"}, info.Paths)
	require.Equal(t, []string{"other"}, info.Uncaptured)
}
