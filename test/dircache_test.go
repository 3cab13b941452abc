package test

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// lsNames lists dir through a real `ls -a`, one name per line.
func lsNames(t *testing.T, dir string) []string {
	t.Helper()
	out := strings.Fields(mustRun(t, cmdSpec{dir: "/"}, "ls", "-a1", dir))
	sort.Strings(out)
	return out
}

// Directory listings may be cached by the kernel, but what a listing shows
// follows every change: through the mount at once, from stagefs's own
// commit and discard at once, and from edits made directly in the
// workspace within the cache timeout (1 s), for directories with and
// without pending entries.
func TestDirListingCache(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{
		"plain/a": "a\n", "plain/b": "b\n",
		"mixed/a": "a\n", "mixed/b": "b\n",
	}))
	sh(t, m.mnt, "echo staged > mixed/a")
	for i := 0; i < 3; i++ { // warm whatever the kernel keeps
		lsNames(t, m.in("plain"))
		lsNames(t, m.in("mixed"))
	}

	// Through the mount: seen at once.
	sh(t, m.mnt, "touch plain/new; rm plain/b")
	if got := lsNames(t, m.in("plain")); !contains(got, "new") || contains(got, "b") {
		t.Errorf("after touch plain/new; rm plain/b: ls plain = %v", got)
	}
	// stagefs's own changes: seen at once.
	m.mustCLI("discard", "plain")
	if got := lsNames(t, m.in("plain")); contains(got, "new") || !contains(got, "b") {
		t.Errorf("after discard plain: ls plain = %v", got)
	}
	lsNames(t, m.in("plain")) // cached again, now untouched

	// Edits in the workspace, in both directories: seen within the
	// cache timeout.
	for _, d := range []string{"plain", "mixed"} {
		if err := os.WriteFile(m.inWS(d+"/outside"), []byte("o\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(m.inWS(d + "/b")); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for _, d := range []string{"plain", "mixed"} {
		ok := waitFor(5*time.Second, func() bool {
			got := lsNames(t, m.in(d))
			return contains(got, "outside") && !contains(got, "b")
		})
		if !ok {
			t.Errorf("ls %s after edits in the workspace = %v after %v; want outside and no b", d, lsNames(t, m.in(d)), time.Since(start))
		} else if took := time.Since(start); took > 2500*time.Millisecond {
			t.Errorf("ls %s showed the workspace edits only after %v (cache timeout 1 s)", d, took)
		}
	}
	if got := lsNames(t, m.in("mixed")); !contains(got, "a") || !contains(got, "outside") {
		t.Errorf("ls mixed = %v", got)
	}
	assertFile(t, m.in("mixed/a"), "staged\n")
}

// dirOpenRequest matches a received OPENDIR or RELEASEDIR in go-fuse's
// debug log ("rx 52: OPENDIR n1 ...").
var dirOpenRequest = regexp.MustCompile(`rx \d+: (OPENDIR|RELEASEDIR) `)

// The daemon answers OPENDIR with ENOSYS, so the kernel stops sending
// OPENDIR and RELEASEDIR and serves directory opens itself: a warm `ls -R`
// or `git status` costs the daemon no round trip per directory. The
// listings it caches still follow changes (TestDirListingCache and the
// watch tests).
func TestDirOpensNeverReachDaemon(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{
		"a/1": "1\n", "a/b/2": "2\n", "c/3": "3\n",
	}), withMountFlags("--debug"))
	sh(t, m.mnt, "echo new > a/b/new && mkdir d && echo x > d/x")
	for i := 0; i < 2; i++ {
		out := mustRun(t, cmdSpec{dir: m.mnt}, "ls", "-R", ".")
		for _, name := range []string{"new", "x", "3", "2"} {
			if !strings.Contains(out, name) {
				t.Fatalf("ls -R does not show %s:\n%s", name, out)
			}
		}
	}
	log := m.daemonLog()
	if !strings.Contains(log, "READDIR") {
		t.Fatalf("the debug log shows no READDIR; is --debug logging requests?\n%.2000s", log)
	}
	if n := len(dirOpenRequest.FindAllString(log, -1)); n > 1 {
		// The first OPENDIR is answered ENOSYS; the kernel sends none after.
		t.Errorf("the daemon got %d OPENDIR/RELEASEDIR requests; want at most the first OPENDIR", n)
	}
}

// Under a directory renamed in the pending set nothing watches the
// workspace's original: the kernel's cached listing there is dropped after
// the cache timeout, so a file made in the workspace shows in `ls` within it.
func TestDirListingUnderRenamedDirFollowsWorkspace(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a/one.txt": "1\n"}))
	sh(t, m.mnt, "mv a b && echo staged > b/staged.txt")
	if got := lsNames(t, m.in("b")); !contains(got, "one.txt") || !contains(got, "staged.txt") {
		t.Fatalf("ls b = %v", got)
	}
	writeTree(t, m.ws, map[string]string{"a/two.txt": "2\n"})
	start := time.Now()
	if !waitFor(5*time.Second, func() bool { return contains(lsNames(t, m.in("b")), "two.txt") }) {
		t.Fatalf("ls b = %v 5s after a/two.txt was made in the workspace", lsNames(t, m.in("b")))
	}
	if took := time.Since(start); took > 2500*time.Millisecond {
		t.Errorf("ls b showed the workspace's new file only after %v (cache timeout 1 s)", took)
	}
}

// A listing longer than one READDIR reply is served in parts from one
// listing: every name once, the staged and the workspace's alike.
func TestLargeDirListing(t *testing.T) {
	parallel(t)
	files := map[string]string{}
	for i := 0; i < 3000; i++ {
		files[fmt.Sprintf("big/workspace-file-with-a-long-name-%05d", i)] = "w\n"
	}
	m := mountStagefs(t, withFiles(files))
	sh(t, m.mnt, "for i in $(seq 1 500); do echo s > big/staged-$i; done; rm big/workspace-file-with-a-long-name-00007")
	for round := 0; round < 2; round++ { // cold, then from the kernel's cache
		names := lsNames(t, m.in("big"))
		seen := map[string]int{}
		for _, n := range names {
			seen[n]++
			if seen[n] > 1 {
				t.Fatalf("round %d: %s listed twice", round, n)
			}
		}
		if want := 3000 - 1 + 500 + 2; len(names) != want {
			t.Fatalf("round %d: ls -a big lists %d names, want %d", round, len(names), want)
		}
		if seen["workspace-file-with-a-long-name-00007"] != 0 || seen["staged-500"] != 1 || seen["workspace-file-with-a-long-name-02999"] != 1 {
			t.Fatalf("round %d: wrong names listed", round)
		}
	}
}

// A reader that removes what it has read and goes on later (git clean,
// remove_dir_recurse) sees every other name once: it goes on in the
// listing its offsets come from, not in a fresh one that the removals
// shifted.
func TestDirReadWhileRemoving(t *testing.T) {
	parallel(t)
	files := map[string]string{}
	for i := 0; i < 2000; i++ {
		files[fmt.Sprintf("d/entry-with-a-long-enough-name-%05d", i)] = "x\n"
	}
	m := mountStagefs(t, withFiles(files))
	dir, err := os.Open(m.in("d"))
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	seen := map[string]bool{}
	first, err := dir.ReadDir(300)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range first {
		seen[e.Name()] = true
		if err := os.Remove(m.in("d/" + e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1500 * time.Millisecond) // a slow reader
	rest, err := dir.ReadDir(-1)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range rest {
		if seen[e.Name()] {
			if _, err := os.Lstat(m.in("d/" + e.Name())); err == nil {
				t.Fatalf("%s listed twice", e.Name())
			}
			continue // removed after it was listed: may show again
		}
		seen[e.Name()] = true
	}
	if len(seen) != 2000 {
		t.Fatalf("the reader saw %d names in all, want 2000", len(seen))
	}
}
