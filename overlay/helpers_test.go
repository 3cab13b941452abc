package overlay_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"stagefs/overlay"
)

// caller is the process every test operation is made by.
var caller = overlay.Caller{Pid: os.Getpid()}

// harness is a workspace, a state dir and an engine over them, with helpers
// that fail the test on any unexpected error.
type harness struct {
	t     testing.TB
	ws    string // the workspace (the base) on disk
	state string // the state dir; upper/ and work/ live here
	opts  overlay.Options
	e     *overlay.Engine
}

// newHarness makes an empty workspace and state dir and opens a staged
// engine over them. Base content can be added with the base* helpers
// afterwards: the engine reads the base lazily.
func newHarness(t testing.TB, hidden ...string) *harness {
	t.Helper()
	h := &harness{t: t, ws: t.TempDir(), state: t.TempDir()}
	h.opts = overlay.Options{Workspace: h.ws, StateDir: h.state, Mode: overlay.Staged, Hidden: hidden}
	h.open()
	t.Cleanup(func() {
		if h.e != nil {
			h.e.Close()
		}
	})
	return h
}

// open (re)creates the engine over the same workspace and state dir.
func (h *harness) open() {
	h.t.Helper()
	e, err := overlay.New(h.opts)
	require.NoError(h.t, err)
	h.e = e
}

// restart closes the engine and opens a new one on the same state dir, as
// after a daemon restart.
func (h *harness) restart() {
	h.t.Helper()
	require.NoError(h.t, h.e.Close())
	h.e = nil
	h.open()
}

// --- the workspace on disk ---

func (h *harness) wsPath(rel string) string { return filepath.Join(h.ws, filepath.FromSlash(rel)) }

func (h *harness) baseFile(rel, content string) {
	h.t.Helper()
	p := h.wsPath(rel)
	require.NoError(h.t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(h.t, os.WriteFile(p, []byte(content), 0o644))
}

func (h *harness) baseDir(rel string) {
	h.t.Helper()
	require.NoError(h.t, os.MkdirAll(h.wsPath(rel), 0o755))
}

func (h *harness) baseSymlink(rel, target string) {
	h.t.Helper()
	require.NoError(h.t, os.Symlink(target, h.wsPath(rel)))
}

// baseRead returns the content of a workspace file on disk.
func (h *harness) baseRead(rel string) string {
	h.t.Helper()
	b, err := os.ReadFile(h.wsPath(rel))
	require.NoError(h.t, err)
	return string(b)
}

// baseIno returns the inode number of a workspace entry on disk.
func (h *harness) baseIno(rel string) uint64 {
	h.t.Helper()
	var st unix.Stat_t
	require.NoError(h.t, unix.Lstat(h.wsPath(rel), &st))
	return st.Ino
}

func (h *harness) requireBaseMissing(rel string) {
	h.t.Helper()
	_, err := os.Lstat(h.wsPath(rel))
	require.ErrorIs(h.t, err, fs.ErrNotExist, "workspace still has %s", rel)
}

// snapshot describes a directory tree on disk: type, permission bits and
// content (or link target) of every entry, by slash-separated relative path.
// The format is the one view uses, so a committed workspace can be compared
// with the merged view that preceded the commit.
func snapshot(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "link " + target
		case fi.IsDir():
			out[rel] = fmt.Sprintf("dir %o", fi.Mode().Perm())
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("file %o %q", fi.Mode().Perm(), b)
		default:
			out[rel] = "other " + fi.Mode().String()
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

func (h *harness) wsSnapshot() map[string]string { return snapshot(h.t, h.ws) }

// upperEntries lists what the state dir's upper tree holds.
func (h *harness) upperEntries() []string {
	h.t.Helper()
	m := snapshot(h.t, filepath.Join(h.state, "upper"))
	var out []string
	for p := range m {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// --- the merged view, through the engine ---

// create creates (or truncates) p through the engine and writes content.
func (h *harness) create(p, content string) {
	h.t.Helper()
	f, st, err := h.e.Create(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644, caller)
	require.NoError(h.t, err, "create %s", p)
	require.NotNil(h.t, st)
	h.pwrite(p, f, content)
}

// overwrite opens the existing p for writing with O_TRUNC and writes
// content, as `echo content > p` does.
func (h *harness) overwrite(p, content string) {
	h.t.Helper()
	f, err := h.e.Open(p, unix.O_WRONLY|unix.O_TRUNC, caller)
	require.NoError(h.t, err, "open %s for writing", p)
	h.pwrite(p, f, content)
}

func (h *harness) pwrite(p string, f *overlay.File, content string) {
	h.t.Helper()
	require.True(h.t, f.Writable)
	n, err := unix.Pwrite(f.Fd, []byte(content), 0)
	require.NoError(h.t, err)
	require.Equal(h.t, len(content), n)
	h.e.Release(p, f, caller)
}

// read returns p's content in the merged view; p must exist.
func (h *harness) read(p string) string {
	h.t.Helper()
	b, ok, err := h.e.ReadFile(p)
	require.NoError(h.t, err, "read %s", p)
	require.True(h.t, ok, "%s does not exist in the view", p)
	return string(b)
}

func (h *harness) mkdir(p string) {
	h.t.Helper()
	_, err := h.e.Mkdir(p, 0o755, caller)
	require.NoError(h.t, err, "mkdir %s", p)
}

func (h *harness) unlink(p string) {
	h.t.Helper()
	require.NoError(h.t, h.e.Unlink(p, caller), "unlink %s", p)
}

func (h *harness) rmdir(p string) {
	h.t.Helper()
	require.NoError(h.t, h.e.Rmdir(p, caller), "rmdir %s", p)
}

func (h *harness) rename(a, b string) {
	h.t.Helper()
	require.NoError(h.t, h.e.Rename(a, b, 0, caller), "rename %s %s", a, b)
}

func (h *harness) stat(p string) *syscall.Stat_t {
	h.t.Helper()
	st, err := h.e.Stat(p)
	require.NoError(h.t, err, "stat %s", p)
	return st
}

func (h *harness) requireMissing(p string) {
	h.t.Helper()
	_, err := h.e.Stat(p)
	require.ErrorIs(h.t, err, syscall.ENOENT, "%s still exists in the view", p)
}

// names lists the directory p of the view, sorted, and checks that no name
// appears twice.
func (h *harness) names(p string) []string {
	h.t.Helper()
	ents, err := h.e.ReadDir(p)
	require.NoError(h.t, err, "readdir %q", p)
	seen := map[string]bool{}
	names := []string{}
	for _, d := range ents {
		require.False(h.t, seen[d.Name], "readdir %q lists %s twice", p, d.Name)
		seen[d.Name] = true
		names = append(names, d.Name)
	}
	sort.Strings(names)
	return names
}

// view describes the whole merged view in snapshot's format. It also checks
// that ReadDir and Stat agree on each entry's type and inode number.
func (h *harness) view() map[string]string {
	h.t.Helper()
	out := map[string]string{}
	var walk func(dir string)
	walk = func(dir string) {
		ents, err := h.e.ReadDir(dir)
		require.NoError(h.t, err, "readdir %q", dir)
		seen := map[string]bool{}
		for _, d := range ents {
			require.False(h.t, seen[d.Name], "readdir %q lists %s twice", dir, d.Name)
			seen[d.Name] = true
			p := d.Name
			if dir != "" {
				p = dir + "/" + d.Name
			}
			st := h.stat(p)
			require.Equal(h.t, st.Mode&syscall.S_IFMT, d.Mode, "type of %s: readdir and stat differ", p)
			require.Equal(h.t, st.Ino, d.Ino, "inode of %s: readdir and stat differ", p)
			switch st.Mode & syscall.S_IFMT {
			case syscall.S_IFDIR:
				out[p] = fmt.Sprintf("dir %o", st.Mode&0o777)
				walk(p)
			case syscall.S_IFLNK:
				target, err := h.e.Readlink(p)
				require.NoError(h.t, err)
				out[p] = "link " + target
			case syscall.S_IFREG:
				out[p] = fmt.Sprintf("file %o %q", st.Mode&0o777, h.read(p))
			default:
				out[p] = fmt.Sprintf("other %o", st.Mode)
			}
		}
	}
	walk("")
	return out
}

// pending returns the pending set as "kind path" strings (renames as
// "renamed path<-from"), sorted by path.
func (h *harness) pending(paths ...string) []string {
	h.t.Helper()
	out := []string{}
	for _, c := range h.e.Pending(paths) {
		s := c.Kind + " " + c.Path
		if c.From != "" {
			s += "<-" + c.From
		}
		out = append(out, s)
	}
	return out
}

// commit commits paths (all when none) and requires that nothing
// conflicted or failed.
func (h *harness) commit(paths ...string) overlay.CommitResult {
	h.t.Helper()
	res := h.e.Commit(paths, false, caller)
	require.Empty(h.t, res.Conflicts, "conflicts")
	require.Empty(h.t, res.Failed, "failures")
	return res
}

// commitAll commits everything and checks the result: the workspace now is
// what the view showed, the view has not changed, and nothing is left in
// the pending set or in the upper tree.
func (h *harness) commitAll() {
	h.t.Helper()
	before := h.view()
	h.commit()
	require.Equal(h.t, before, h.wsSnapshot(), "workspace after commit differs from the view before it")
	require.Equal(h.t, before, h.view(), "view changed by commit")
	require.Empty(h.t, h.pending(), "pending set after commit of all")
	require.Zero(h.t, h.e.PendingCount())
	require.Empty(h.t, h.upperEntries(), "upper tree after commit of all")
}
