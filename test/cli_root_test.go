package test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"stagefs/control"
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

// fs/safe_text_patch refuses more than 1,000 edits in one patch: each is a
// scan of the whole file, and the patch once held the lock every change in
// the mount waits for while it worked through tens of thousands.
func TestSafeTextPatchBoundsItsEdits(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "Z\n"}))
	c := m.dial()
	defer c.Close()
	read, err := c.ReadText(context.Background(), "f.txt")
	if err != nil {
		t.Fatal(err)
	}
	edits := make([]control.TextEdit, 1001)
	for i := range edits {
		edits[i] = control.TextEdit{OldText: "Z", NewText: "Z"}
	}
	_, err = c.SafeTextPatch(context.Background(), control.SafeTextPatchParams{Path: "f.txt", ExpectedHash: read.SHA256, Edits: edits})
	var ce *control.Error
	if !errors.As(err, &ce) || ce.Code != control.CodeInvalidParams || !strings.Contains(ce.Message, "at most 1000") {
		t.Fatalf("1,001 edits: %v", err)
	}
	res, err := c.SafeTextPatch(context.Background(), control.SafeTextPatchParams{Path: "f.txt", ExpectedHash: read.SHA256, Edits: edits[:1000]})
	if err != nil || res.Result != control.PatchNoOp {
		t.Fatalf("1,000 edits: %+v, %v", res, err)
	}
}

// session/mark_user refuses a pid past the kernel's largest: kill(2) saw
// it cut to 32 bits (2^32+1 became init), found it alive, and marked a
// process that could never match.
func TestMarkUserRefusesAPidPastTheKernelsLargest(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	c := m.dial()
	defer c.Close()
	for _, pid := range []int{1<<32 + 1, 1 << 32, 1<<32 - 1} {
		_, err := c.MarkUser(context.Background(), control.MarkUserParams{Pid: pid})
		var ce *control.Error
		if !errors.As(err, &ce) || ce.Code != control.CodeNotFound {
			t.Errorf("mark_user %d: %v", pid, err)
		}
	}
}

// A name with a newline prints on one line, quoted, in the CLI's lists
// (status, commit): printed as it is, it split its entry in two.
func TestCLIListsQuoteControlCharacters(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	sh(t, m.mnt, "printf x > \"$(printf 'a\\nb')\"")
	r := m.cli("status")
	if r.code != 0 || !strings.Contains(r.stdout, `"a\nb"`) {
		t.Fatalf("status: %s", r)
	}
	r = m.cli("commit")
	if r.code != 0 || !strings.Contains(r.stdout, `committed  "a\nb"`) {
		t.Fatalf("commit: %s", r)
	}
	assertFile(t, m.inWS("a\nb"), "x")
}
