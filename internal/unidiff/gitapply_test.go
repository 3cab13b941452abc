package unidiff

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// trickyLines are lines that could confuse a diff writer or reader: empty
// and blank lines, lines that look like diff syntax, carriage returns and
// trailing whitespace.
var trickyLines = []string{
	"\n", " \n", "\t\n", "-\n", "+\n", "--- a/x\n", "+++ b/x\n", "@@ -1 +1 @@\n",
	"\\ No newline at end of file\n", "diff --git a/x b/x\n", "\r\n", "crlf\r\n",
	"trailing space \n", "}\n", "{\n",
}

// trickyNames are file name parts that need quoting or contain spaces.
var trickyNames = []string{
	"plain", "with space", "quo\"te", `back\slash`, "tab\there", "new\nline",
	"ünï", "dollar$", "-dash", "semi;colon",
}

// gitTestLine returns a random line for the git apply test.
func gitTestLine(rng *rand.Rand) []byte {
	if rng.Intn(4) == 0 {
		return []byte(trickyLines[rng.Intn(len(trickyLines))])
	}
	return vocabularyLine(rng, 12)
}

func gitTestText(rng *rand.Rand) []byte {
	var b []byte
	for n := rng.Intn(30); n > 0; n-- {
		b = append(b, gitTestLine(rng)...)
	}
	if len(b) > 0 && rng.Intn(4) == 0 {
		b = b[:len(b)-1] // no final newline
	}
	return b
}

// randomChange returns a random change whose paths are unique to id.
func randomChange(rng *rand.Rand, id int) FileChange {
	name := func(role string) string {
		return fmt.Sprintf("d%d/%s-%s%d", id%3, trickyNames[rng.Intn(len(trickyNames))], role, id)
	}
	text := func() []byte {
		if rng.Intn(8) == 0 {
			// Binary: random bytes (NUL or invalid UTF-8 make it so),
			// sometimes larger than a base85 line or several.
			b := make([]byte, rng.Intn(300))
			rng.Read(b)
			return b
		}
		return gitTestText(rng)
	}
	edit := func(old []byte) []byte {
		if rng.Intn(5) == 0 {
			return text() // unrelated new content
		}
		return mutate(rng, old, func() []byte { return gitTestLine(rng) })
	}
	target := func() []byte { return fmt.Appendf(nil, "../target/%d", rng.Intn(5)) }
	regularMode := func() uint32 {
		if rng.Intn(4) == 0 {
			return 0100755
		}
		return 0100644
	}

	c := FileChange{Path: name("f")}
	switch k := rng.Intn(100); {
	case k < 65: // modify, sometimes with a mode change
		c.Old = text()
		c.New = edit(c.Old)
		c.OldMode = regularMode()
		c.NewMode = c.OldMode
		if rng.Intn(6) == 0 {
			c.NewMode = regularMode()
		}
	case k < 73: // create, sometimes empty
		c.New = text()
		c.NewMode = regularMode()
	case k < 81: // delete, sometimes empty
		c.Old = text()
		c.OldMode = regularMode()
	case k < 89: // rename, with or without an edit
		c.OldPath = name("r")
		c.Old = text()
		c.New = c.Old
		if rng.Intn(2) == 0 {
			c.New = edit(c.Old)
		}
		c.OldMode = regularMode()
		c.NewMode = regularMode()
	case k < 95: // symlink created, retargeted or deleted
		switch rng.Intn(3) {
		case 0:
			c.New, c.NewMode = target(), 0120000
		case 1:
			c.Old, c.OldMode = target(), 0120000
			c.New, c.NewMode = target(), 0120000
		default:
			c.Old, c.OldMode = target(), 0120000
		}
	default: // type change between file and symlink
		if rng.Intn(2) == 0 {
			c.Old, c.OldMode = text(), regularMode()
			c.New, c.NewMode = target(), 0120000
		} else {
			c.Old, c.OldMode = target(), 0120000
			c.New, c.NewMode = text(), regularMode()
		}
	}
	return c
}

// TestWriteGitApply writes diffs of random changes and checks that
// "git apply" accepts them and reproduces the new content exactly.
func TestWriteGitApply(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not on PATH:", err)
	}
	rng := rand.New(rand.NewSource(3))
	const cases = 300
	const perRepo = 15 // several files per repository keeps the test fast
	for first := 0; first < cases; first += perRepo {
		var changes []FileChange
		for id := first; id < first+perRepo; id++ {
			changes = append(changes, randomChange(rng, id))
		}
		checkGitApply(t, changes)
	}
}

// checkGitApply commits the old side of changes to a fresh repository,
// applies the diff of changes with git apply and compares the result with
// the new side.
func checkGitApply(t *testing.T, changes []FileChange) {
	t.Helper()
	repo := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t"}, args...)...)
		cmd.Dir = repo
		// Keep the user's and the system's configuration out.
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	git("init", "-q", ".")
	for _, c := range changes {
		if !c.oldPresent() {
			continue
		}
		oldPath := c.Path
		if c.OldPath != "" {
			oldPath = c.OldPath
		}
		writeWorktreeFile(t, filepath.Join(repo, filepath.FromSlash(oldPath)), c.Old, c.OldMode)
	}
	// An empty commit is fine when every change creates a file.
	git("add", "-A")
	git("commit", "-q", "--allow-empty", "-m", "old")

	var patch bytes.Buffer
	if err := Write(&patch, changes); err != nil {
		t.Fatal(err)
	}
	patchFile := filepath.Join(t.TempDir(), "change.diff")
	if err := os.WriteFile(patchFile, patch.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("patch:\n%s", patch.String())
		}
	}()
	git("apply", "--check", patchFile)
	git("apply", patchFile)

	for _, c := range changes {
		if c.OldPath != "" && c.OldPath != c.Path {
			if _, err := os.Lstat(filepath.Join(repo, filepath.FromSlash(c.OldPath))); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%q: rename source still exists (%v)", c.OldPath, err)
			}
		}
		checkWorktreeFile(t, filepath.Join(repo, filepath.FromSlash(c.Path)), c)
	}
}

func writeWorktreeFile(t *testing.T, path string, data []byte, mode uint32) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if mode == 0120000 {
		if err := os.Symlink(string(data), path); err != nil {
			t.Fatal(err)
		}
		return
	}
	perm := os.FileMode(0o644)
	if mode&0111 != 0 {
		perm = 0o755
	}
	if err := os.WriteFile(path, data, perm); err != nil {
		t.Fatal(err)
	}
	// WriteFile's permissions are subject to the umask.
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
}

func checkWorktreeFile(t *testing.T, path string, c FileChange) {
	t.Helper()
	info, err := os.Lstat(path)
	if !c.newPresent() {
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%q: deleted file still exists (%v)", c.Path, err)
		}
		return
	}
	if err != nil {
		t.Errorf("%q: %v", c.Path, err)
		return
	}
	if c.NewMode == 0120000 {
		if info.Mode()&fs.ModeSymlink == 0 {
			t.Errorf("%q: is %v, want a symlink", c.Path, info.Mode())
			return
		}
		got, err := os.Readlink(path)
		if err != nil {
			t.Errorf("%q: %v", c.Path, err)
		} else if got != string(c.New) {
			t.Errorf("%q: symlink target %q, want %q", c.Path, got, c.New)
		}
		return
	}
	if !info.Mode().IsRegular() {
		t.Errorf("%q: is %v, want a regular file", c.Path, info.Mode())
		return
	}
	if gotExec, wantExec := info.Mode()&0o100 != 0, c.NewMode&0111 != 0; gotExec != wantExec {
		t.Errorf("%q: executable %v, want %v", c.Path, gotExec, wantExec)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("%q: %v", c.Path, err)
	} else if !bytes.Equal(got, c.New) {
		t.Errorf("%q: content %q, want %q", c.Path, got, c.New)
	}
}
