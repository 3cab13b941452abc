package test

import (
	"os"
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
