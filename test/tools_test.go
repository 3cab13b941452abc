package test

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// git runs git with a fixed identity (and no user or system config, see
// baseEnv) and fails the test unless it exits 0.
func git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	return mustRun(t, cmdSpec{dir: dir}, "git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"}, args...)...)
}

func TestToolGit(t *testing.T) {
	parallel(t)
	requireTool(t, "git")
	m := mountStagefs(t)
	before := snapshot(t, m.ws)

	git(t, m.mnt, "init", "-q")
	writeTree(t, m.mnt, map[string]string{
		"README":      "hello\n",
		"src/main.go": "package main\n\nfunc main() {}\n",
		"src/util.go": "package main\n",
	})
	git(t, m.mnt, "add", "-A")
	git(t, m.mnt, "commit", "-q", "-m", "first")
	git(t, m.mnt, "branch", "feature")
	git(t, m.mnt, "checkout", "-q", "feature")
	sh(t, m.mnt, "echo more >> README; echo new > NEW; rm src/util.go")
	git(t, m.mnt, "add", "-A")
	git(t, m.mnt, "commit", "-q", "-m", "second")

	if out := git(t, m.mnt, "status", "--porcelain"); out != "" {
		t.Errorf("git status --porcelain in the mount: %q", out)
	}
	if out := strings.Fields(git(t, m.mnt, "log", "--format=%s")); strings.Join(out, " ") != "second first" {
		t.Errorf("git log in the mount: %v", out)
	}
	// Switching branches rewrites the work tree through the mount.
	git(t, m.mnt, "checkout", "-q", "main")
	assertFile(t, m.in("README"), "hello\n")
	assertMissing(t, m.in("NEW"))
	assertFile(t, m.in("src/util.go"), "package main\n")
	git(t, m.mnt, "checkout", "-q", "feature")
	assertFile(t, m.in("README"), "hello\nmore\n")
	if out := git(t, m.mnt, "status", "--porcelain"); out != "" {
		t.Errorf("git status --porcelain after checkouts: %q", out)
	}
	if r := runIn(t, cmdSpec{dir: m.mnt}, "git", "fsck", "--full", "--strict"); r.code != 0 {
		t.Errorf("git fsck in the mount: %s", r)
	}
	// gc packs objects and deletes loose ones: renames and unlinks.
	git(t, m.mnt, "gc", "-q", "--prune=now")
	if r := runIn(t, cmdSpec{dir: m.mnt}, "git", "fsck", "--full", "--strict"); r.code != 0 {
		t.Errorf("git fsck after gc in the mount: %s", r)
	}

	// The workspace is still empty.
	assertSameTree(t, "workspace before commit", before, snapshot(t, m.ws))
	if st := m.status(); st.PendingCount == 0 {
		t.Errorf("nothing pending after git work in the mount")
	}

	view := snapshot(t, m.mnt)
	cr := m.commit()
	if len(cr.Conflicts)+len(cr.Failed) != 0 {
		t.Errorf("commit: %+v", cr)
	}
	assertSameTree(t, "workspace after commit vs mount", view, snapshot(t, m.ws))
	if out := strings.Split(strings.TrimSpace(git(t, m.ws, "log", "--oneline")), "\n"); len(out) != 2 {
		t.Errorf("git -C workspace log --oneline: %q, want 2 commits", out)
	}
	if r := runIn(t, cmdSpec{dir: m.ws}, "git", "fsck", "--full", "--strict"); r.code != 0 {
		t.Errorf("git fsck in the workspace after commit: %s", r)
	}
	if out := git(t, m.ws, "status", "--porcelain"); out != "" {
		t.Errorf("git status --porcelain in the workspace after commit: %q", out)
	}
	if out := strings.TrimSpace(git(t, m.ws, "rev-parse", "--abbrev-ref", "HEAD")); out != "feature" {
		t.Errorf("workspace HEAD = %q, want feature", out)
	}
}

func goRoot(t testing.TB) string {
	t.Helper()
	out := mustRun(t, cmdSpec{}, goBin, "env", "GOROOT")
	return strings.TrimSpace(out)
}

// fileMtimes maps each regular file under root to its mtime.
func fileMtimes(t testing.TB, root string) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			t.Errorf("walk %s: %v", p, err)
			return nil
		}
		if info.Mode().IsRegular() {
			rel, _ := filepath.Rel(root, p)
			out[rel] = info.ModTime()
		}
		return nil
	})
	return out
}

func assertSameMtimes(t testing.TB, what string, want, got map[string]time.Time) {
	t.Helper()
	n := 0
	for p, w := range want {
		if g, ok := got[p]; ok && !g.Equal(w) {
			t.Errorf("%s: mtime of %s is %v, want %v", what, p, g, w)
			if n++; n > 5 {
				return
			}
		}
	}
}

// goSourceTarball writes a tar of a few Go source packages (over 600
// entries) into dir and returns its path; it skips the test when the Go
// source tree is missing.
func goSourceTarball(t *testing.T, dir string) string {
	t.Helper()
	src := filepath.Join(goRoot(t), "src")
	if _, err := os.Stat(filepath.Join(src, "go", "ast")); err != nil {
		t.Skipf("no Go source tree to tar: %v", err)
	}
	tarball := filepath.Join(dir, "src.tar")
	mustRun(t, cmdSpec{dir: src}, "tar", "-cf", tarball, "go", "strings", "fmt")
	return tarball
}

func TestToolTar(t *testing.T) {
	parallel(t)
	requireTool(t, "tar")
	requireTool(t, "sha256sum")
	m := mountStagefs(t)
	before := snapshot(t, m.ws)

	tmp := t.TempDir()
	tarball := goSourceTarball(t, tmp)

	plain := filepath.Join(tmp, "plain")
	for _, d := range []string{filepath.Join(plain, "x"), m.in("x")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		mustRun(t, cmdSpec{dir: d}, "tar", "-xf", tarball)
	}
	want := snapshot(t, filepath.Join(plain, "x"))
	if len(want) < 300 {
		t.Fatalf("the tarball has only %d entries", len(want))
	}
	assertSameTree(t, "tar -x into the mount vs into a plain dir", want, snapshot(t, m.in("x")))
	assertSameMtimes(t, "tar -x mtimes", fileMtimes(t, filepath.Join(plain, "x")), fileMtimes(t, m.in("x")))

	// tar c the tree back out of the mount: same list, same contents.
	list := func(dir string) string {
		out := sh(t, dir, "tar -cf - x | tar -tf - | sort")
		return out
	}
	sums := func(dir string) string {
		return sh(t, dir, "find x -type f | LC_ALL=C sort | xargs sha256sum")
	}
	if a, b := list(plain), list(m.mnt); a != b {
		t.Errorf("tar -t of the mount differs from the plain dir (%d vs %d bytes)", len(b), len(a))
	}
	if a, b := sums(plain), sums(m.mnt); a != b {
		t.Errorf("sha256sums of the mount differ from the plain dir")
	}
	back := filepath.Join(tmp, "back")
	os.MkdirAll(back, 0o755)
	sh(t, m.mnt, "tar -cf - x | tar -C "+back+" -xf -")
	assertSameTree(t, "tar round trip through the mount", want, snapshot(t, filepath.Join(back, "x")))

	assertSameTree(t, "workspace before commit", before, snapshot(t, m.ws))
	if st := m.status(); st.PendingCount == 0 {
		t.Errorf("nothing pending after tar -x")
	}
}

// Reading a tree through the mount, its stats stay what they were when
// the reader first saw them: tar compares each file's stat before and after
// reading it and fails with "file changed as we read it" when they differ.
// The tree holds workspace files (served by the daemon, their attributes
// cached from READDIRPLUS, then from the fstat after the read) and staged
// ones (passed through), read twice over (cold and cached).
func TestTarReadsAStableTree(t *testing.T) {
	parallel(t)
	requireTool(t, "tar")
	m := mountStagefs(t)
	tmp := t.TempDir()
	tarball := goSourceTarball(t, tmp)
	for _, d := range []string{filepath.Join(m.ws, "pre"), m.in("new")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		mustRun(t, cmdSpec{dir: d}, "tar", "-xf", tarball)
	}
	out := filepath.Join(tmp, "out.tar")
	for round := 1; round <= 2; round++ {
		r := runIn(t, cmdSpec{dir: m.mnt}, "tar", "-cf", out, ".")
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("round %d: tar -c of the mount: %s", round, r)
		}
		list := mustRun(t, cmdSpec{}, "tar", "-tf", out)
		if n := strings.Count(list, "\n"); n < 600 {
			t.Fatalf("round %d: the archive has only %d entries", round, n)
		}
	}
}

// An archive made with "tar -cf A ." holds "./": extracting it into the
// mount's root sets the root's times (and mode and owner, unchanged here).
// The root is the workspace's own directory, so nothing may reach the
// workspace, and the call must not fail (it once panicked with the
// engine's lock held, which hung the mount).
func TestToolTarIntoRoot(t *testing.T) {
	parallel(t)
	requireTool(t, "tar")
	m := mountStagefs(t, withFiles(map[string]string{"keep.txt": "kept\n"}))
	if err := os.Chmod(m.ws, 0o755); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, m.ws)
	wsInfo, err := os.Stat(m.ws)
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "new.txt"), []byte("new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(src, 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2001, 9, 9, 1, 46, 40, 0, time.UTC)
	if err := os.Chtimes(src, old, old); err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(t.TempDir(), "dot.tar")
	mustRun(t, cmdSpec{dir: src}, "tar", "-cf", tarball, ".")
	mustRun(t, cmdSpec{dir: m.mnt}, "tar", "-xf", tarball)

	if b, err := os.ReadFile(m.in("new.txt")); err != nil || string(b) != "new\n" {
		t.Fatalf("new.txt in the mount: %q, %v", b, err)
	}
	// The mount still serves after the root's SETATTR.
	sh(t, m.mnt, "echo more > more.txt && cat keep.txt")
	assertSameTree(t, "workspace after tar -x into the root", before, snapshot(t, m.ws))
	after, err := os.Stat(m.ws)
	if err != nil {
		t.Fatal(err)
	}
	if !after.ModTime().Equal(wsInfo.ModTime()) || after.Mode() != wsInfo.Mode() {
		t.Errorf("the workspace root changed: %v %v -> %v %v", wsInfo.Mode(), wsInfo.ModTime(), after.Mode(), after.ModTime())
	}
	// A real mode change of the root is refused, not staged.
	if r := runIn(t, cmdSpec{dir: m.mnt}, "chmod", "700", "."); r.code == 0 {
		t.Errorf("chmod 700 of the mount root succeeded in staged mode")
	}
	kinds := statusKinds(m.status())
	if len(kinds) != 2 || kinds["new.txt"] == "" || kinds["more.txt"] == "" {
		t.Errorf("pending after tar -x into the root: %v", kinds)
	}
}

func TestToolSQLiteWAL(t *testing.T) {
	parallel(t)
	requireTool(t, "sqlite3")
	m := mountStagefs(t, withFiles(map[string]string{"keep.txt": "k\n"}))
	before := snapshot(t, m.ws)

	var b strings.Builder
	b.WriteString("PRAGMA journal_mode=WAL;\nCREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL);\n")
	for tx := 0; tx < 20; tx++ {
		b.WriteString("BEGIN;\n")
		for i := 0; i < 100; i++ {
			n := tx*100 + i
			fmt.Fprintf(&b, "INSERT INTO t(v) VALUES('row %d %s');\n", n, strings.Repeat("x", n%50))
		}
		b.WriteString("COMMIT;\n")
	}
	out := mustRun(t, cmdSpec{dir: m.mnt, stdin: b.String()}, "sqlite3", "db.sqlite")
	if !strings.Contains(out, "wal") {
		t.Errorf("PRAGMA journal_mode=WAL answered %q", out)
	}
	query := func(dir, sql string) string {
		return strings.TrimSpace(mustRun(t, cmdSpec{dir: dir}, "sqlite3", "db.sqlite", sql))
	}
	if got := query(m.mnt, "PRAGMA integrity_check;"); got != "ok" {
		t.Errorf("integrity_check in the mount = %q", got)
	}
	if got := query(m.mnt, "SELECT count(*) FROM t;"); got != "2000" {
		t.Errorf("count in the mount = %q, want 2000", got)
	}
	if got := query(m.mnt, "PRAGMA journal_mode;"); got != "wal" {
		t.Errorf("journal_mode in the mount = %q, want wal", got)
	}
	// A reader and a writer at the same time (WAL's shared memory).
	r := runIn(t, cmdSpec{dir: m.mnt, stdin: "BEGIN; INSERT INTO t(v) VALUES('extra'); SELECT count(*) FROM t; COMMIT;\n"}, "sqlite3", "db.sqlite")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "2001" {
		t.Errorf("second session: %s", r)
	}
	assertSameTree(t, "workspace before commit", before, snapshot(t, m.ws))

	m.commit()
	if got := query(m.ws, "PRAGMA integrity_check;"); got != "ok" {
		t.Errorf("integrity_check in the workspace after commit = %q", got)
	}
	if got := query(m.ws, "SELECT count(*) FROM t;"); got != "2001" {
		t.Errorf("count in the workspace after commit = %q, want 2001", got)
	}
}

func TestToolGoBuild(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{
		"hello/go.mod":  "module hello\n\ngo 1.21\n",
		"hello/main.go": "package main\n\nimport \"os\"\n\nfunc main() { os.Stdout.WriteString(\"hello from stagefs\\n\") }\n",
	}))
	before := snapshot(t, m.ws)
	env := []string{
		"GOCACHE=" + t.TempDir(),
		"GOFLAGS=-mod=mod",
		"GOTOOLCHAIN=local",
		"GOPATH=" + t.TempDir(),
		"GOWORK=off",
		"CGO_ENABLED=0",
	}
	dir := m.in("hello")
	mustRun(t, cmdSpec{dir: dir, env: env}, goBin, "build", "-o", "hello", ".")
	if out := mustRun(t, cmdSpec{dir: dir}, "./hello"); out != "hello from stagefs\n" {
		t.Errorf("./hello printed %q", out)
	}
	mustRun(t, cmdSpec{dir: dir, env: env}, goBin, "vet", ".")
	if fi, err := os.Stat(filepath.Join(dir, "hello")); err != nil || fi.Mode().Perm()&0o100 == 0 {
		t.Errorf("built binary: %v, %v", fi, err)
	}
	assertSameTree(t, "workspace before commit", before, snapshot(t, m.ws))
	if k := statusKinds(m.status()); k["hello/hello"] != "create" {
		t.Errorf("status does not list the binary as created: %v", k)
	}
}

func TestToolAtomicSave(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"doc.txt": "original\n", "other.txt": "o\n"}))
	before := snapshot(t, m.ws)
	readFile(t, m.in("doc.txt")) // cache it

	// The editor pattern from a shell: write a temp file, mv -f over.
	sh(t, m.mnt, `
i=1
while [ $i -le 50 ]; do
	printf 'version %d\n' $i > .doc.txt.tmp
	mv -f .doc.txt.tmp doc.txt
	i=$((i+1))
done
`)
	assertFile(t, m.in("doc.txt"), "version 50\n")
	assertMissing(t, m.in(".doc.txt.tmp"))

	// And from this process, reading back after every rename: the kernel
	// must never show the replaced file's pages or size.
	for i := 1; i <= 50; i++ {
		want := fmt.Sprintf("go version %d %s\n", i, strings.Repeat("+", i))
		tmp := m.in(fmt.Sprintf(".other.%d.tmp", i))
		if err := os.WriteFile(tmp, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, m.in("other.txt")); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, m.in("other.txt")); got != want {
			t.Fatalf("round %d: other.txt = %q, want %q", i, got, want)
		}
	}
	ents, _ := os.ReadDir(m.mnt)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	if strings.Join(names, " ") != "doc.txt other.txt" {
		t.Errorf("mount lists %v after the saves", names)
	}
	kinds := statusKinds(m.status())
	if len(kinds) != 2 || kinds["doc.txt"] != "write" || kinds["other.txt"] != "write" {
		t.Errorf("status after atomic saves = %v, want doc.txt and other.txt modified", kinds)
	}
	assertSameTree(t, "workspace before commit", before, snapshot(t, m.ws))

	m.commit()
	assertFile(t, m.inWS("doc.txt"), "version 50\n")
	assertSameTree(t, "workspace after commit", snapshot(t, m.mnt), snapshot(t, m.ws))
}

func TestToolRsyncCp(t *testing.T) {
	parallel(t)
	requireTool(t, "rsync")
	m := mountStagefs(t,
		withFiles(map[string]string{
			"src/a.txt":         "a\n",
			"src/sub/b.txt":     "b\n",
			"src/sub/deep/c":    strings.Repeat("c", 100000),
			"src/run.sh":        "#!/bin/sh\n",
			"src/empty/":        "",
			"src/sub/ro.txt":    "read only\n",
			"src/.hidden":       "h\n",
			"src/sub/deep/e.md": "",
		}),
		withSymlink("src/link", "sub/b.txt"),
		withSymlink("src/dangling", "nowhere"),
		withMode("src/run.sh", 0o755),
		withMode("src/sub/ro.txt", 0o444),
		withMode("src/sub", 0o750),
	)
	// Distinct mtimes, to see that they are copied.
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	filepath.Walk(m.inWS("src"), func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode()&os.ModeSymlink == 0 {
			os.Chtimes(p, old, old)
		}
		return nil
	})
	before := snapshot(t, m.ws)
	want := snapshot(t, m.inWS("src"))
	wantTimes := fileMtimes(t, m.inWS("src"))

	mustRun(t, cmdSpec{dir: m.mnt}, "rsync", "-a", "src/", "rsynced/")
	assertSameTree(t, "rsync -a in the mount", want, snapshot(t, m.in("rsynced")))
	assertSameMtimes(t, "rsync -a", wantTimes, fileMtimes(t, m.in("rsynced")))
	// A second run finds nothing to do.
	if out := mustRun(t, cmdSpec{dir: m.mnt}, "rsync", "-ai", "src/", "rsynced/"); out != "" {
		t.Errorf("second rsync -a transferred something:\n%s", out)
	}

	mustRun(t, cmdSpec{dir: m.mnt}, "cp", "-a", "src", "copied")
	assertSameTree(t, "cp -a in the mount", want, snapshot(t, m.in("copied")))
	assertSameMtimes(t, "cp -a", wantTimes, fileMtimes(t, m.in("copied")))

	assertSameTree(t, "workspace before commit", before, snapshot(t, m.ws))
	view := snapshot(t, m.mnt)
	m.commit()
	assertSameTree(t, "workspace after commit", view, snapshot(t, m.ws))
	assertSameMtimes(t, "rsynced after commit", wantTimes, fileMtimes(t, m.inWS("rsynced")))
}
