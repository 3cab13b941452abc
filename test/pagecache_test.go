package test

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
)

// readRequest matches a READ the daemon received in go-fuse's debug log.
var readRequest = regexp.MustCompile(`rx \d+: READ `)

// An unchanged workspace file read again through the mount comes from the
// kernel's page cache (FOPEN_KEEP_CACHE): no READ reaches the daemon. A
// file changed in the workspace, in place and at the same size, reads new
// at once, even where nothing watches it (under a directory renamed in
// the pending set) and well inside the attribute timeout.
func TestUnchangedFilesReadFromPageCache(t *testing.T) {
	parallel(t)
	old := strings.Repeat("old content\n", 6000)
	m := mountStagefs(t, withFiles(map[string]string{"a/f.txt": old, "w/g.txt": old}),
		withMountFlags("--debug", "--cache-timeout", "30s"))
	sh(t, m.mnt, "mv a b")
	for _, p := range []string{"b/f.txt", "w/g.txt"} {
		assertFile(t, m.in(p), old)
		before := len(readRequest.FindAllString(m.daemonLog(), -1))
		if before == 0 {
			t.Fatalf("the debug log shows no READ after reading %s", p)
		}
		assertFile(t, m.in(p), old)
		if after := len(readRequest.FindAllString(m.daemonLog(), -1)); after != before {
			t.Errorf("reading unchanged %s again sent the daemon %d READs; want none", p, after-before)
		}
	}
	// The same size, new bytes, written in place (same inode).
	fresh := strings.Repeat("NEW content\n", 6000)
	for _, p := range []string{"a/f.txt", "w/g.txt"} {
		f, err := os.OpenFile(m.inWS(p), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte(fresh), 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	for _, p := range []string{"b/f.txt", "w/g.txt"} {
		b, err := os.ReadFile(m.in(p))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, []byte(fresh)) {
			t.Errorf("%s read through the mount right after the workspace changed it shows the old content", p)
		}
	}
}
