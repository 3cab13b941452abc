package test

import (
	"testing"
)

// Committing the removal or rename of one name of a workspace hard link
// changes the file's ctime, which the other name's staged change records:
// every commit of that name then failed with "the workspace changed since
// this path was staged", for good. rsync -aH --delete does this.
func TestCommitAfterRemovingOneNameOfAHardLink(t *testing.T) {
	parallel(t)
	for _, c := range []struct{ name, script, f, hl string }{
		{"rm hl, edit f", "rm hl; echo new > f", "new\n", ""},
		{"chmod f, rm hl", "chmod 600 f; rm hl", "1\n", ""},
		{"mv hl hl2, append to f", "mv hl hl2; echo q >> f", "1\nq\n", ""},
		{"rm f, append to hl", "rm f; echo q >> hl", "", "1\nq\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := mountStagefs(t, withFiles(map[string]string{"f": "1\n"}))
			sh(t, m.ws, "ln f hl")
			sh(t, m.mnt, c.script)
			if cr := m.commit(); len(cr.Conflicts)+len(cr.Failed) != 0 {
				t.Fatalf("commit: %+v", cr)
			}
			for name, want := range map[string]string{"f": c.f, "hl": c.hl} {
				if want == "" {
					assertMissing(t, m.inWS(name))
				} else {
					assertFile(t, m.inWS(name), want)
				}
			}
			assertNothingPending(t, m, "after the commit")
		})
	}
}

// One name of a workspace hard link committed alone (a rename over it),
// then the other: the first commit moved the file's ctime, and the second
// once reported a conflict it could never clear.
func TestCommitOneNameOfAHardLinkThenTheOther(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f": "1\n"}))
	sh(t, m.ws, "ln f hl")
	sh(t, m.mnt, "echo new > f; chmod 600 hl")
	if cr := m.commit("f"); len(cr.Conflicts)+len(cr.Failed) != 0 {
		t.Fatalf("commit f: %+v", cr)
	}
	if cr := m.commit("hl"); len(cr.Conflicts)+len(cr.Failed) != 0 {
		t.Fatalf("commit hl: %+v", cr)
	}
	assertFile(t, m.inWS("f"), "new\n")
	if got := modeOf(t, m.inWS("hl")); got != 0o600 {
		t.Errorf("hl: mode %o, want 600", got)
	}
}
