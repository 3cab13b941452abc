package test

import (
	"strings"
	"testing"
)

// The workspace's root given as a path ("." in the mount, "..", the
// mount's or the workspace's own path) selects everything, as no path
// does: it once matched nothing, and `stagefs commit .` said there was
// nothing to commit.
func TestClientPathOfTheRootSelectsAll(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a\n", "src/b.txt": "b\n"}))
	sh(t, m.mnt, "echo new > a.txt; echo new > src/b.txt")
	inMount := func(dir string, args ...string) result {
		return runIn(t, cmdSpec{dir: dir}, stagefsBin, args...)
	}
	for _, c := range []struct{ dir, path string }{{m.mnt, "."}, {m.in("src"), ".."}, {"/", m.mnt}, {"/", m.ws}} {
		r := inMount(c.dir, "status", "-m", m.mnt, c.path)
		if r.code != 0 || !strings.Contains(r.stdout, "a.txt") || !strings.Contains(r.stdout, "src/b.txt") {
			t.Errorf("status %s (in %s): %s", c.path, c.dir, r)
		}
	}
	if r := inMount(m.mnt, "commit", "."); r.code != 0 {
		t.Fatalf("commit .: %s", r)
	}
	assertFile(t, m.inWS("a.txt"), "new\n")
	assertFile(t, m.inWS("src/b.txt"), "new\n")
	assertNothingPending(t, m, "after commit .")
}
