package test

import (
	"fmt"
	"syscall"
	"testing"
)

// A pending file shows the inode number of the workspace file it was
// staged from. When the host moves that file to another name (or removes
// it and the disk gives its number to a new file), the view holds two
// files that would show one number, and the kernel took them for one: the
// moved file read as the staged one, and a write through it was staged as
// a write of the other.
func TestHostMovingAStagedFilesOriginKeepsThemApart(t *testing.T) {
	parallel(t)
	for _, flags := range [][]string{nil, {"--no-passthrough"}} {
		t.Run(fmt.Sprint(flags), func(t *testing.T) { hostMovesAStagedFilesOrigin(t, flags) })
	}
}

func hostMovesAStagedFilesOrigin(t *testing.T, flags []string) {
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "workspace a\n"}), withMountFlags(flags...))
	sh(t, m.mnt, "cat a.txt >/dev/null; echo staged > a.txt")
	sh(t, m.ws, "mv a.txt q.txt")
	assertFile(t, m.in("q.txt"), "workspace a\n")
	assertFile(t, m.in("a.txt"), "staged\n")
	var sa, sq syscall.Stat_t
	if err := syscall.Stat(m.in("a.txt"), &sa); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(m.in("q.txt"), &sq); err != nil {
		t.Fatal(err)
	}
	if sa.Ino == sq.Ino {
		t.Fatalf("a.txt and q.txt, two files, both show inode %d", sa.Ino)
	}
	sh(t, m.mnt, "echo more >> q.txt")
	assertFile(t, m.in("q.txt"), "workspace a\nmore\n")
	assertFile(t, m.in("a.txt"), "staged\n")
	assertFile(t, m.inWS("q.txt"), "workspace a\n")
	if kinds := statusKinds(m.status()); kinds["a.txt"] == "" || kinds["q.txt"] == "" {
		t.Fatalf("status: want changes of a.txt and q.txt: %v", kinds)
	}
	// Discarded, q.txt shows its own number again: the one the kernel
	// knew as a.txt's, whose cached content must not come back with it.
	m.mustCLI("discard")
	assertFile(t, m.in("q.txt"), "workspace a\n")
	if err := syscall.Stat(m.in("q.txt"), &sq); err != nil {
		t.Fatal(err)
	}
	if sq.Ino != sa.Ino {
		t.Errorf("q.txt shows %d after the discard, not its own number %d", sq.Ino, sa.Ino)
	}
	sh(t, m.mnt, "test ! -e a.txt")
}

// The same, twice over: a's origin moved to b and staged there, then b's
// moved to c. Three files, three numbers, each its own content.
func TestAChainOfMovedOriginsStaysApart(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a": "orig\n"}))
	sh(t, m.mnt, "echo staged-a >> a")
	sh(t, m.ws, "mv a b")
	sh(t, m.mnt, "echo staged-b >> b")
	sh(t, m.ws, "mv b c")
	sh(t, m.mnt, "echo via-c >> c")
	assertFile(t, m.in("a"), "orig\nstaged-a\n")
	assertFile(t, m.in("b"), "orig\nstaged-b\n")
	assertFile(t, m.in("c"), "orig\nvia-c\n")
	seen := map[uint64]string{}
	for _, p := range []string{"a", "b", "c"} {
		var st syscall.Stat_t
		if err := syscall.Stat(m.in(p), &st); err != nil {
			t.Fatal(err)
		}
		if q, ok := seen[st.Ino]; ok {
			t.Errorf("%s and %s both show inode %d", q, p, st.Ino)
		}
		seen[st.Ino] = p
	}
}
