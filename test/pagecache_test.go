package test

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
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
		withMountFlags("--debug", "--cache-timeout", "30s"), withDaemonEnv("STAGEFS_PAGE_SETTLE=1s"))
	sh(t, m.mnt, "mv a b")
	time.Sleep(1100 * time.Millisecond) // the files' ctime settles
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

// A handle still open on a staged body that discard threw away keeps
// reading that body; what it reads passes through the node's page cache,
// which later opens of the workspace's file must not keep.
func TestDiscardedBodyReadLaterStaysOutOfNewOpens(t *testing.T) {
	parallel(t)
	const size = 4 << 20
	ws := strings.Repeat("A", size)
	for _, pass := range []string{"passthrough", "--no-passthrough"} {
		t.Run(pass, func(t *testing.T) {
			flags := []string{}
			if pass != "passthrough" {
				flags = append(flags, pass)
			}
			m := mountStagefs(t, withFiles(map[string]string{"f": ws}), withMountFlags(flags...), withDaemonEnv("STAGEFS_PAGE_SETTLE=0s"))
			if err := os.WriteFile(m.in("f"), []byte(strings.Repeat("B", size)), 0o644); err != nil {
				t.Fatal(err)
			}
			old, err := os.Open(m.in("f"))
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			m.mustCLI("discard")
			head := make([]byte, 4096)
			f, err := os.Open(m.in("f"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.ReadAt(head, 0); err != nil {
				t.Fatal(err)
			}
			f.Close()
			if head[0] != 'A' {
				t.Fatalf("after discard the file reads %q", head[:8])
			}
			// The read made the kernel ask for the attributes again: they
			// are the workspace file's, not those of the body the old
			// handle still holds (removed, so without a link).
			var st syscall.Stat_t
			if err := syscall.Stat(m.in("f"), &st); err != nil {
				t.Fatal(err)
			}
			if st.Nlink != 1 {
				t.Errorf("stat after discard, while a handle on the discarded body is open: %d links, want the workspace file's 1", st.Nlink)
			}
			// The old handle reads on, past what the new open read.
			if _, err := old.ReadAt(make([]byte, 1<<20), 3<<20); err != nil {
				t.Fatal(err)
			}
			old.Close()
			for i := 0; i < 2; i++ {
				b, err := os.ReadFile(m.in("f"))
				if err != nil {
					t.Fatal(err)
				}
				if at := bytes.IndexByte(b, 'B'); at >= 0 || len(b) != size {
					t.Fatalf("open %d after discard: %d bytes, a discarded byte at %d", i, len(b), at)
				}
			}
		})
	}
}

// A process outside the mount writing a workspace file through a shared
// mmap changes its ctime only at its first write to a clean page; later
// writes show through the mount all the same.
func TestWorkspaceMmapWritesShowThrough(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f": strings.Repeat(".", 8192)}))
	for i := 0; i < 2; i++ { // a stamp for the node, then a second open
		assertFile(t, m.in("f"), strings.Repeat(".", 8192))
	}
	f, err := os.OpenFile(m.inWS("f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, 8192, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	for _, c := range []byte("XYZ") {
		mem[0] = c
		b, err := os.ReadFile(m.in("f"))
		if err != nil {
			t.Fatal(err)
		}
		if b[0] != c {
			t.Fatalf("after the workspace's mmap wrote %q the mount reads %q", c, b[0])
		}
	}
}
