package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// passthroughAvailable reports whether the kernel can pass pending bodies
// through: root on Linux 6.9+ (the daemon also checks what the kernel
// offers at mount time).
func passthroughAvailable() bool {
	if os.Geteuid() != 0 {
		return false
	}
	var major, minor int
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return false
	}
	if _, err := fmt.Sscanf(string(b), "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 6 || major == 6 && minor >= 9
}

// passthroughState is what the daemon logged at start: "on", or "off
// (why)".
func passthroughState(t *testing.T, m *stagefsMount) string {
	t.Helper()
	const prefix = "passthrough of pending bodies: "
	for _, line := range strings.Split(m.daemonLog(), "\n") {
		if _, v, ok := strings.Cut(line, prefix); ok {
			return v
		}
	}
	t.Fatalf("the daemon did not log its passthrough state:\n%s", m.daemonLog())
	return ""
}

// requirePassthrough skips t when the kernel cannot pass files through,
// and fails it when the kernel could but the daemon did not turn it on
// (say, a registration refused for a reason stagefs should handle).
func requirePassthrough(t *testing.T, m *stagefsMount) {
	t.Helper()
	state := passthroughState(t, m)
	switch {
	case state == "on":
	case strings.Contains(state, "kernel does not offer"):
		t.Skipf("passthrough %s", state)
	default:
		t.Fatalf("passthrough %s, on a kernel that offers it to root", state)
	}
}

// processIO reads a counter ("wchar", "rchar") of /proc/PID/io: the bytes
// the process moved with read and write system calls.
func processIO(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+": "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/io", field, pid)
	return 0
}

// TestPassthroughStagedWrites writes and reads back 64 MiB through the
// mount and measures what the daemon itself read and wrote: with
// passthrough the kernel moves the data into the pending body without the
// daemon; with --no-passthrough every byte goes through it. Either way
// the data is right, staged, and the workspace untouched.
func TestPassthroughStagedWrites(t *testing.T) {
	if !passthroughAvailable() {
		t.Skip("FUSE passthrough needs root and Linux 6.9+")
	}
	const size = 64 << 20
	data := make([]byte, size)
	rand.Read(data)
	for _, tc := range []struct {
		name   string
		flags  []string
		direct bool
	}{
		{"passthrough", nil, true},
		{"no-passthrough", []string{"--no-passthrough"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mountStagefs(t, withFiles(map[string]string{"keep.txt": "workspace\n"}), withMountFlags(tc.flags...))
			if tc.direct {
				requirePassthrough(t, m)
			} else if state := passthroughState(t, m); state != "off (--no-passthrough)" {
				t.Fatalf("with --no-passthrough the daemon says passthrough %s", state)
			}
			pid := m.daemonPid()
			wrote := processIO(t, pid, "wchar")
			f, err := os.Create(m.in("big.bin"))
			if err != nil {
				t.Fatal(err)
			}
			for off := 0; off < size; off += 1 << 20 {
				if _, err := f.Write(data[off : off+1<<20]); err != nil {
					t.Fatal(err)
				}
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			wrote = processIO(t, pid, "wchar") - wrote
			read := processIO(t, pid, "rchar")
			got, err := os.ReadFile(m.in("big.bin"))
			if err != nil {
				t.Fatal(err)
			}
			read = processIO(t, pid, "rchar") - read
			if !bytes.Equal(got, data) {
				t.Fatalf("read back %d bytes that differ from the %d written", len(got), size)
			}
			t.Logf("the daemon wrote %d KiB and read %d KiB for 64 MiB written and read back", wrote>>10, read>>10)
			if tc.direct && (wrote > size/8 || read > size/8) {
				t.Errorf("with passthrough the daemon still moved the data: wrote %d, read %d bytes", wrote, read)
			}
			if !tc.direct && (wrote < size || read < size) {
				t.Errorf("without passthrough the daemon should move every byte: wrote %d, read %d bytes", wrote, read)
			}
			assertMissing(t, m.inWS("big.bin"))
			if kinds := statusKinds(m.status()); kinds["big.bin"] != "create" {
				t.Errorf("status = %v, want big.bin created", kinds)
			}
		})
	}
}

// TestPassthroughAcrossCommitAndDiscard holds a staged file open for
// reading (a passthrough handle on its pending body) while the body is
// committed, staged again and discarded. The kernel allows one backing
// file per inode and go-fuse keeps it while any handle is open, so each
// new open must get a node of its own: a write after the commit must land
// in the new pending body, not in the committed one's leftover, and a read
// after the discard must see the workspace.
func TestPassthroughAcrossCommitAndDiscard(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "v0\n"}))
	if passthroughAvailable() {
		requirePassthrough(t, m)
	}
	if err := os.WriteFile(m.in("a.txt"), []byte("v1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	held, err := os.Open(m.in("a.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	readAt := func(f *os.File) string {
		buf := make([]byte, 64)
		n, err := f.ReadAt(buf, 0)
		if n == 0 && err != nil {
			t.Fatalf("read %s: %v", f.Name(), err)
		}
		return string(buf[:n])
	}
	if got := readAt(held); got != "v1\n" {
		t.Fatalf("held handle reads %q", got)
	}

	if cr := m.commit(); len(cr.Committed) != 1 {
		t.Fatalf("commit = %+v", cr)
	}
	assertFile(t, m.inWS("a.txt"), "v1\n")
	// Staged again while the handle on the committed body is still open.
	if err := os.WriteFile(m.in("a.txt"), []byte("v2\n"), 0o644); err != nil {
		t.Fatalf("write after commit with a handle held: %v", err)
	}
	assertFile(t, m.in("a.txt"), "v2\n")
	assertFile(t, m.inWS("a.txt"), "v1\n")
	// The pending body itself, as the daemon reads it (not through the
	// kernel, which could be reading a stale backing file).
	client := m.dial()
	if rt, err := client.ReadText(context.Background(), "a.txt"); err != nil || rt.Content != "v2\n" {
		t.Fatalf("pending body of a.txt = %q (%v), want v2", rt.Content, err)
	}
	if kinds := statusKinds(m.status()); kinds["a.txt"] != "write" {
		t.Errorf("status = %v, want a.txt staged as a write", kinds)
	}

	held2, err := os.Open(m.in("a.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer held2.Close()
	if got := readAt(held2); got != "v2\n" {
		t.Fatalf("second held handle reads %q", got)
	}
	m.mustCLI("discard", "a.txt")
	assertFile(t, m.in("a.txt"), "v1\n")
	// And staged once more, with both old handles still open.
	f, err := os.OpenFile(m.in("a.txt"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("write-open after discard with handles held: %v", err)
	}
	if _, err := f.WriteString("v3\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	assertFile(t, m.in("a.txt"), "v1\nv3\n")
	assertFile(t, m.inWS("a.txt"), "v1\n")
	if rt, err := client.ReadText(context.Background(), "a.txt"); err != nil || rt.Content != "v1\nv3\n" {
		t.Fatalf("pending body of a.txt = %q (%v), want v1 v3", rt.Content, err)
	}
	held.Close()
	held2.Close()
	m.commit()
	assertFile(t, m.inWS("a.txt"), "v1\nv3\n")
}

// TestSnapshotCapturesHeldWriter opens a file for writing before a
// snapshot opens and writes it after: the kernel passes such writes
// through without the daemon, so the snapshot takes the pre-image when it
// opens, and restoring it brings the file back.
func TestSnapshotCapturesHeldWriter(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"log.txt": "workspace\n", "staged.txt": "base\n"}))
	if passthroughAvailable() {
		requirePassthrough(t, m)
	}
	if err := os.WriteFile(m.in("staged.txt"), []byte("staged\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var held []*os.File
	for _, name := range []string{"log.txt", "staged.txt"} {
		f, err := os.OpenFile(m.in(name), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		held = append(held, f)
	}
	m.mustCLI("snapshot", "held")
	for _, f := range held {
		if _, err := f.WriteString("during\n"); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	m.mustCLI("close", "held")
	assertFile(t, m.in("log.txt"), "workspace\nduring\n")
	assertFile(t, m.in("staged.txt"), "staged\nduring\n")
	m.mustCLI("restore", "held")
	assertFile(t, m.in("log.txt"), "workspace\n")
	assertFile(t, m.in("staged.txt"), "staged\n")
	assertFile(t, m.inWS("log.txt"), "workspace\n")
	assertFile(t, m.inWS("staged.txt"), "base\n")
}

// TestWritableClosesFlushOnlyWhenServed checks which closes reach the
// daemon as FLUSH. A passthrough handle needs none (its writes and shared
// mmaps go to the upper file itself), so a shell redirect, which closes
// its file twice, costs no round trip at close. A writable handle the
// daemon serves keeps its FLUSH: the kernel writes back the pages a
// shared mmap dirtied before sending it. In both, what a shared mmap
// wrote is in the pending body once the file is closed and unmapped.
func TestWritableClosesFlushOnlyWhenServed(t *testing.T) {
	if !passthroughAvailable() {
		t.Skip("FUSE passthrough needs root and Linux 6.9+")
	}
	parallel(t)
	flush := regexp.MustCompile(`rx \d+: FLUSH `)
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"passthrough", []string{"--debug"}},
		{"no-passthrough", []string{"--debug", "--no-passthrough"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mountStagefs(t, withFiles(map[string]string{"keep.txt": "workspace\n"}), withMountFlags(tc.flags...))
			if tc.name == "passthrough" {
				requirePassthrough(t, m)
			}
			// go-fuse closes a file of its own at mount time.
			before := len(flush.FindAllString(m.daemonLog(), -1))
			sh(t, m.mnt, "echo one > a.txt && echo two >> a.txt && cp keep.txt b.txt")
			f, err := os.OpenFile(m.in("mapped.bin"), os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Truncate(8192); err != nil {
				t.Fatal(err)
			}
			mem, err := syscall.Mmap(int(f.Fd()), 0, 8192, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
			if err != nil {
				t.Fatal(err)
			}
			copy(mem[4096:], "written through a shared mapping")
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Munmap(mem); err != nil {
				t.Fatal(err)
			}
			flushes := len(flush.FindAllString(m.daemonLog(), -1)) - before
			if tc.name == "passthrough" && flushes != 0 {
				t.Errorf("closing passthrough files sent the daemon %d FLUSH requests; want none", flushes)
			}
			if tc.name == "no-passthrough" && flushes == 0 {
				t.Errorf("closing files the daemon serves sent it no FLUSH; the mmap'd pages may not be written back at close")
			}
			assertFile(t, m.in("a.txt"), "one\ntwo\n")
			assertFile(t, m.in("b.txt"), "workspace\n")
			m.mustCLI("commit")
			assertFile(t, m.inWS("a.txt"), "one\ntwo\n")
			assertFile(t, m.inWS("b.txt"), "workspace\n")
			b, err := os.ReadFile(m.inWS("mapped.bin"))
			if err != nil {
				t.Fatal(err)
			}
			if want := "written through a shared mapping"; len(b) != 8192 || string(b[4096:4096+len(want)]) != want {
				t.Errorf("the committed file has %d bytes and not the mmap'd text at 4096: %q", len(b), b[4096:4096+40])
			}
		})
	}
}
