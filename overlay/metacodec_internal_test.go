package overlay

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// inodeXattrRoom is what a value may take for the meta xattr to stay in a
// 256-byte ext4 inode (measured on this project's machines: 60 bytes fit
// beside the name "stagefs.meta", 64 do not).
const inodeXattrRoom = 60

func sampleMetas() map[string]meta {
	now := time.Date(2026, 11, 26, 4, 0, 0, 123456789, time.UTC).UnixNano()
	ws := Baseline{Exists: true, Mode: syscall.S_IFREG | 0o644, Ino: 9994692, Size: 14875, Mtime: now - 3e15, Ctime: now - 3e15 + 12345}
	return map[string]meta{
		"new file":              {Kind: KindFile, Ino: 1<<62 | 12345, Pid: 30181, Comm: "bash", Time: now, Dir: 9994382, NameSum: nameSum("newf")},
		"copied workspace file": {Kind: KindFile, Ino: 9994692, Base: ws, Pid: 30181, Comm: "python3", Time: now, Dir: 9994382, NameSum: nameSum("main.go")},
		"whiteout":              {Kind: KindWhiteout, Ino: 9994692, Base: ws, Pid: 4242, Comm: "rm", Time: now, Dir: 9994382, NameSum: nameSum("x")},
		"attribute change":      {Kind: KindFile, Ino: 9994692, Base: ws, AttrOnly: true, Pid: 1, Comm: "chmod", Time: now, Dir: 2, NameSum: nameSum("x")},
		"container":             {Kind: KindDir, Container: true, Ino: 55, Base: Baseline{Exists: true, Mode: syscall.S_IFDIR | 0o755, Ino: 55}, Time: now},
		"renamed dir": {Kind: KindDir, Ino: 77, Redirect: "src/old name/ü", Opaque: true, Deleted: true, Base: ws, Pid: 9, Comm: "mv", Time: now, Dir: 3, NameSum: nameSum("new"),
			Was: &placeState{Base: ws, Redirect: "a/b", Opaque: true, Container: true, AttrOnly: true}},
		"special":      {Kind: KindSpecial, Mode: syscall.S_IFCHR | 0o600, Rdev: 0x0501, Ino: 1<<62 | 3, Time: now},
		"empty was":    {Kind: KindFile, Ino: 1<<62 | 4, Time: now, Was: &placeState{}},
		"legacy, zero": {Kind: KindSymlink},
		"negative":     {Kind: KindFile, Base: Baseline{Exists: true, Size: -1, Mtime: -5, Ctime: 7}, Time: -1, Ino: ^uint64(0)},
	}
}

func TestMetaRoundTrip(t *testing.T) {
	for name, m := range sampleMetas() {
		b := m.encode()
		got, err := decodeMeta(b)
		require.NoError(t, err, name)
		require.Equal(t, m, got, name)
	}
}

// The metas of new files, whiteouts and copied-up workspace files stay in
// the inode: a larger one costs a block per staged file and, under
// `discard`, a synchronous discard per unlink of it.
func TestMetaFitsInTheInode(t *testing.T) {
	for _, name := range []string{"new file", "copied workspace file", "whiteout", "attribute change"} {
		m := sampleMetas()[name]
		require.LessOrEqual(t, len(m.encode()), inodeXattrRoom, name)
		// A command name is at most 15 bytes.
		m.Comm = "a-long-command!"
		require.LessOrEqual(t, len(m.encode()), inodeXattrRoom+10, name)
	}
}

func TestMetaReadsJSON(t *testing.T) {
	// What session-7 stagefs wrote.
	old := `{"k":1,"ino":9994692,"b":{"e":true,"m":33188,"i":9994692,"s":2,"t":1795664843670350802,"c":1795664843670350802},"pid":30181,"comm":"bash","tm":1795664843674984429,"pd":9994382,"nm":"wf","was":{"b":{},"ao":true}}`
	m, err := decodeMeta([]byte(old))
	require.NoError(t, err)
	require.Equal(t, meta{
		Kind: KindFile, Ino: 9994692,
		Base: Baseline{Exists: true, Mode: 33188, Ino: 9994692, Size: 2, Mtime: 1795664843670350802, Ctime: 1795664843670350802},
		Pid:  30181, Comm: "bash", Time: 1795664843674984429, Dir: 9994382, NameSum: nameSum("wf"),
		Was: &placeState{AttrOnly: true},
	}, m)
}

func TestMetaRefusesDamage(t *testing.T) {
	dir := sampleMetas()["renamed dir"]
	b := dir.encode()
	for i := 1; i < len(b); i++ {
		_, err := decodeMeta(b[:i])
		require.Error(t, err, "cut at %d of %d", i, len(b))
	}
	_, err := decodeMeta(append(b, 0))
	require.Error(t, err)
	for _, bad := range [][]byte{nil, {}, {2}, {metaVersion}, {metaVersion, 0}, []byte("{"), []byte(`{"k":9}`)} {
		_, err := decodeMeta(bad)
		require.Error(t, err, "%q", bad)
	}
}

// FuzzDecodeMeta checks that no xattr value, however damaged, panics the
// decoder, and that a binary value it accepts encodes back to a value that
// decodes to the same meta. (A JSON one may carry fields its kind has no
// use for, which the binary form drops.)
func FuzzDecodeMeta(f *testing.F) {
	for _, m := range sampleMetas() {
		f.Add(m.encode())
	}
	f.Add([]byte(`{"k":1,"nm":"x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil || b[0] == '{' {
			return
		}
		again, err := decodeMeta(m.encode())
		if err != nil {
			t.Fatalf("re-encoded meta does not decode: %v", err)
		}
		require.Equal(t, m, again)
	})
}
