package test

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// With a long --cache-timeout the kernel would serve what it cached for
// 30 s; edits made directly in the workspace must still show at once,
// because the daemon watches the directories the kernel has looked up and
// drops what each edit changed. Without the watcher this test waits in
// vain.
func TestWorkspaceEditsInvalidateLongCaches(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{
		"same.txt":       "aaaa\n",
		"mode.txt":       "m\n",
		"gone.txt":       "g\n",
		"d/in.txt":       "in\n",
		"d/deep/x.txt":   "x\n",
		"old/keep.txt":   "k\n",
		"staged.txt":     "s0\n",
		"plain/file.txt": "p\n",
	}), withMountFlags("--cache-timeout", "30s"))
	sh(t, m.mnt, "echo s1 > staged.txt")
	// Let the kernel cache names, attributes, listings and pages, and a
	// name that does not exist yet.
	for _, p := range []string{"same.txt", "mode.txt", "gone.txt", "d/in.txt", "d/deep/x.txt", "old/keep.txt", "plain/file.txt"} {
		readFile(t, m.in(p))
	}
	for _, d := range []string{".", "d", "d/deep", "old", "plain"} {
		if _, err := os.ReadDir(m.in(d)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Lstat(m.in("d/deep/added.txt")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("added.txt before it is made: %v", err)
	}

	start := time.Now()
	writeTree(t, m.ws, map[string]string{"same.txt": "bbbb\n", "d/deep/added.txt": "added\n", "staged.txt": "workspace\n"})
	must(t, os.Chmod(m.inWS("mode.txt"), 0o600))
	must(t, os.Remove(m.inWS("gone.txt")))
	must(t, os.Rename(m.inWS("old"), m.inWS("new")))
	must(t, os.Rename(m.inWS("plain/file.txt"), m.inWS("plain/moved.txt")))

	check := func() string {
		var bad []string
		for p, want := range map[string]string{"same.txt": "bbbb\n", "d/deep/added.txt": "added\n", "new/keep.txt": "k\n", "plain/moved.txt": "p\n", "staged.txt": "s1\n"} {
			if b, err := os.ReadFile(m.in(p)); err != nil || string(b) != want {
				bad = append(bad, fmt.Sprintf("%s=%q (%v)", p, b, err))
			}
		}
		for _, p := range []string{"gone.txt", "old", "plain/file.txt"} {
			if _, err := os.Lstat(m.in(p)); !errors.Is(err, fs.ErrNotExist) {
				bad = append(bad, fmt.Sprintf("%s still there (%v)", p, err))
			}
		}
		if st, err := os.Stat(m.in("mode.txt")); err != nil || st.Mode().Perm() != 0o600 {
			bad = append(bad, fmt.Sprintf("mode.txt mode %v (%v)", st.Mode(), err))
		}
		names := func(d string) string {
			ents, _ := os.ReadDir(m.in(d))
			var s []string
			for _, e := range ents {
				s = append(s, e.Name())
			}
			return strings.Join(s, " ")
		}
		if got := names("d/deep"); got != "added.txt x.txt" {
			bad = append(bad, "listing of d/deep: "+got)
		}
		if got := names("plain"); got != "moved.txt" {
			bad = append(bad, "listing of plain: "+got)
		}
		return strings.Join(bad, "; ")
	}
	var last string
	if !waitFor(3*time.Second, func() bool { last = check(); return last == "" }) {
		t.Fatalf("workspace edits not visible in the mount 3s after, with --cache-timeout 30s: %s", last)
	}
	t.Logf("workspace edits visible after %v", time.Since(start).Round(time.Millisecond))
	if log := m.daemonLog(); strings.Contains(log, "inotify") {
		t.Errorf("the daemon could not watch the workspace:\n%s", log)
	}
	// The pending file is still the pending one; the workspace's edit of
	// it is a conflict for commit to find, not a change of the view.
	if kinds := statusKinds(m.status()); len(kinds) != 1 || kinds["staged.txt"] == "" {
		t.Errorf("pending after the workspace edits: %v", kinds)
	}
	if b, err := os.ReadFile(filepath.Join(m.ws, "staged.txt")); err != nil || string(b) != "workspace\n" {
		t.Errorf("workspace staged.txt: %q %v", b, err)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A directory made through the mount has no workspace directory to watch;
// its names are cached long too, because the workspace can add to it only
// by making that directory, which the parent's watch reports.
func TestWorkspaceEditsReachPendingDirs(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"top.txt": "t\n"}), withMountFlags("--cache-timeout", "30s"))
	sh(t, m.mnt, "mkdir -p new/sub && echo mine > new/sub/mine.txt")
	for _, p := range []string{"new/ext.txt", "new/sub/ext.txt"} {
		if _, err := os.Lstat(m.in(p)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s before it is made: %v", p, err)
		}
	}
	if _, err := os.ReadDir(m.in("new/sub")); err != nil {
		t.Fatal(err)
	}
	writeTree(t, m.ws, map[string]string{"new/ext.txt": "ext\n", "new/sub/ext.txt": "sub ext\n"})
	check := func() string {
		var bad []string
		for p, want := range map[string]string{"new/ext.txt": "ext\n", "new/sub/ext.txt": "sub ext\n", "new/sub/mine.txt": "mine\n"} {
			if b, err := os.ReadFile(m.in(p)); err != nil || string(b) != want {
				bad = append(bad, fmt.Sprintf("%s=%q (%v)", p, b, err))
			}
		}
		ents, _ := os.ReadDir(m.in("new/sub"))
		if len(ents) != 2 {
			bad = append(bad, fmt.Sprintf("new/sub lists %d entries", len(ents)))
		}
		return strings.Join(bad, "; ")
	}
	var last string
	if !waitFor(3*time.Second, func() bool { last = check(); return last == "" }) {
		t.Fatalf("workspace additions under a pending directory not visible 3s after, with --cache-timeout 30s: %s", last)
	}
}

// Under a directory renamed in the pending set the view shows the
// workspace's original at another path, which nothing watches for that
// path: names there are cached for --cache-timeout only, and a name looked
// up and missing is not cached at all.
func TestWorkspaceEditsUnderRenamedDir(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a/one.txt": "1\n"}))
	sh(t, m.mnt, "mv a b")
	if _, err := os.Lstat(m.in("b/two.txt")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("b/two.txt before it is made: %v", err)
	}
	writeTree(t, m.ws, map[string]string{"a/two.txt": "2\n"})
	if !waitFor(3*time.Second, func() bool {
		b, err := os.ReadFile(m.in("b/two.txt"))
		return err == nil && string(b) == "2\n"
	}) {
		t.Fatalf("a file made in the workspace under a directory renamed in the mount did not show within 3s")
	}
}

// A directory that hid the workspace's (deleted and made again through the
// mount) is committed: the view of it is the workspace's again, so the
// workspace's later edits in it must show at once, as anywhere else.
func TestWorkspaceEditsAfterCommitOfOpaqueDir(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"build/old.txt": "old\n"}), withMountFlags("--cache-timeout", "30s"))
	sh(t, m.mnt, "rm -rf build && mkdir build && echo a > build/a.txt && ls build >/dev/null")
	if _, err := os.Lstat(m.in("build/b.txt")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("build/b.txt before it is made: %v", err)
	}
	m.mustCLI("commit")
	writeTree(t, m.ws, map[string]string{"build/b.txt": "b\n"})
	if !waitFor(3*time.Second, func() bool {
		b, err := os.ReadFile(m.in("build/b.txt"))
		ents, _ := os.ReadDir(m.in("build"))
		return err == nil && string(b) == "b\n" && len(ents) == 2
	}) {
		t.Fatalf("a file made in the workspace in a committed directory did not show within 3s (--cache-timeout 30s)")
	}
}

// A directory renamed through the mount takes along what the kernel cached
// below it, a missing name included; the workspace's original, which the
// view still shows, is edited afterwards.
func TestWorkspaceEditsAfterRenameThroughMount(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"lib/a.go": "a\n"}), withMountFlags("--cache-timeout", "30s"))
	readFile(t, m.in("lib/a.go"))
	if _, err := os.Lstat(m.in("lib/b.go")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("lib/b.go before it is made: %v", err)
	}
	sh(t, m.mnt, "mv lib pkg")
	writeTree(t, m.ws, map[string]string{"lib/b.go": "b\n", "lib/a.go": "a changed\n"})
	check := func() bool {
		b, err1 := os.ReadFile(m.in("pkg/b.go"))
		a, err2 := os.ReadFile(m.in("pkg/a.go"))
		return err1 == nil && err2 == nil && string(b) == "b\n" && string(a) == "a changed\n"
	}
	if !waitFor(3*time.Second, check) {
		t.Fatalf("edits in the workspace's original of a directory renamed in the mount did not show within 3s (--cache-timeout 30s)")
	}
}

// The attributes the kernel gets from an fstat of an open file (tar's,
// after it read the file) are cached as long as a stat of the path would
// be: a later stat of the same file (find, a rebuild) is not a round trip
// again once --cache-timeout has passed. A workspace edit still shows at
// once.
func TestFstatOfOpenFileKeepsTheLongCache(t *testing.T) {
	parallel(t)
	getattr := regexp.MustCompile(`rx \d+: GETATTR `)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "workspace\n", "d/b.txt": "deeper\n"}),
		withMountFlags("--debug", "--cache-timeout", "100ms"))
	sh(t, m.mnt, "echo staged > s.txt")
	paths := []string{"a.txt", "d/b.txt", "s.txt"}
	for _, p := range paths {
		f, err := os.Open(m.in(p))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(f); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Stat(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	time.Sleep(300 * time.Millisecond) // past --cache-timeout
	before := len(getattr.FindAllString(m.daemonLog(), -1))
	for _, p := range paths {
		if _, err := os.Lstat(m.in(p)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(getattr.FindAllString(m.daemonLog(), -1)) - before; n != 0 {
		t.Errorf("stat of %d files fstat'ed open a moment before sent the daemon %d GETATTRs; want none", len(paths), n)
	}
	writeTree(t, m.ws, map[string]string{"a.txt": "workspace, edited\n"})
	if !waitFor(3*time.Second, func() bool {
		st, err := os.Lstat(m.in("a.txt"))
		return err == nil && st.Size() == int64(len("workspace, edited\n"))
	}) {
		t.Errorf("a workspace edit of a.txt did not reach stat through the mount within 3 s")
	}
}

// A process outside the mount appends to a workspace file it keeps open
// (a log): a reader in the mount that holds the file open too (tail -f)
// sees it grow at once, by fstat, by reading on and by stat of the path,
// although the kernel caches attributes for 30 s here.
func TestWorkspaceAppendsReachOpenReaders(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"log.txt": "one\n"}), withMountFlags("--cache-timeout", "30s"))
	r, err := os.Open(m.in("log.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if b, err := io.ReadAll(r); err != nil || string(b) != "one\n" {
		t.Fatalf("first read: %q %v", b, err)
	}
	if st, err := r.Stat(); err != nil || st.Size() != 4 {
		t.Fatalf("fstat before the append: %v %v", st, err)
	}
	if _, err := os.Lstat(m.in("log.txt")); err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(m.inWS("log.txt"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.WriteString("two\n"); err != nil {
		t.Fatal(err)
	}
	var got []byte
	var fsize, psize int64
	if !waitFor(3*time.Second, func() bool {
		if st, err := r.Stat(); err == nil {
			fsize = st.Size()
		}
		if st, err := os.Lstat(m.in("log.txt")); err == nil {
			psize = st.Size()
		}
		b, _ := io.ReadAll(r)
		got = append(got, b...)
		return fsize == 8 && psize == 8 && string(got) == "two\n"
	}) {
		t.Errorf("3 s after an append outside, with the writer still open: fstat size %d, stat size %d, read on %q; want 8, 8, %q", fsize, psize, got, "two\n")
	}
}
