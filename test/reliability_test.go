package test

// Reliability batteries: a full state dir, 10,000 open files, the
// workspace changing underneath the mount, hostile input on the control
// socket and symlinks pointing out of the workspace, and many processes
// mutating overlapping directories at once. (The crash battery is in
// crash_test.go.)

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"stagefs/control"
)

// ---------------------------------------------------------------------------
// fsync of a directory.

// TestReliabilityDirFsync: tools make a rename or a create durable by
// fsyncing the directory (atomic saves, databases, git with core.fsync).
// In the mount that must succeed (and make the journal durable).
func TestReliabilityDirFsync(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{"sub/a.txt": "a\n"}))
	if err := os.WriteFile(m.in("sub/new.txt"), []byte("new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{m.mnt, m.in("sub")} {
		f, err := os.Open(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Errorf("fsync of the directory %s in the mount: %v (want success)", d, err)
		}
		f.Close()
	}
}

// ---------------------------------------------------------------------------
// Full disk.

// journalRecords returns the journal's records (`stagefs log --json`).
func journalRecords(t *testing.T, m *stagefsMount) []control.LogEntry {
	t.Helper()
	out := m.mustCLI("log", "--json")
	var lr control.LogResult
	if err := json.Unmarshal([]byte(out), &lr); err != nil {
		t.Fatalf("log --json: %v\n%.300s", err, out)
	}
	return lr.Records
}

func hasRecord(recs []control.LogEntry, op, path string) bool {
	for _, r := range recs {
		if r.Op == op && (path == "" || r.Path == path || strings.Contains(r.Detail, strconv.Quote(path))) {
			return true
		}
	}
	return false
}

// TestFullDisk puts the state dir on an 8 MiB tmpfs and fills it from the
// mount: writes get ENOSPC, snapshot captures and commit fail cleanly or
// work, nothing staged is damaged, the daemon keeps serving, and once space
// is freed everything works again, journaled.
func TestFullDisk(t *testing.T) {
	parallel(t)
	capBody := strings.Repeat("capture me\n", 6000) // 66 KB: its body does not fit
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a\n", "cap.txt": capBody}))
	m.unmount()
	tdir := filepath.Join(m.base, "tst")
	if err := os.Mkdir(tdir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", tdir, "tmpfs", 0, "size=8m"); err != nil {
		if os.Geteuid() != 0 {
			t.Skipf("mounting a tmpfs needs root: %v", err)
		}
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		// The daemon holds files on the tmpfs: it goes first.
		if t.Failed() {
			t.Logf("daemon log (last lines):\n%s", lastLines(m.daemonLog(), 12))
		}
		if isMounted(m.mnt) {
			if r := runStagefs(t, "unmount", m.mnt); r.code != 0 {
				forceUnmount(m.mnt)
			}
		}
		if pid := m.daemonPid(); pid > 0 && !waitProcessGone(pid, 15*time.Second) {
			syscall.Kill(pid, syscall.SIGKILL)
			waitProcessGone(pid, 5*time.Second)
		}
		if err := syscall.Unmount(tdir, 0); err != nil {
			t.Errorf("unmount the tmpfs %s: %v", tdir, err)
			syscall.Unmount(tdir, syscall.MNT_DETACH)
		}
	})
	m.state = filepath.Join(tdir, "st")
	m.sock = filepath.Join(m.state, "control.sock")
	m.mount()

	// Staged before the disk fills.
	staged := map[string]string{}
	for i := 1; i <= 5; i++ {
		p := fmt.Sprintf("s%d.txt", i)
		staged[p] = fmt.Sprintf("staged %d\n", i) + strings.Repeat(strconv.Itoa(i), 40000)
		if err := os.WriteFile(m.in(p), []byte(staged[p]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	checkStaged := func(what string) {
		t.Helper()
		for p, want := range staged {
			if b, err := os.ReadFile(m.in(p)); err != nil || string(b) != want {
				t.Errorf("%s: staged %s reads back %d bytes (%v), want %d", what, p, len(b), err, len(want))
			}
		}
		if r := m.cli("status", "--json"); r.code != 0 {
			t.Errorf("%s: the daemon does not answer status: %s", what, r)
		}
	}
	m.mustCLI("snapshot", "sc-open") // open, captures on write

	// Fill it.
	r := runIn(t, cmdSpec{dir: m.mnt}, "dd", "if=/dev/zero", "of=big", "bs=1M", "count=16")
	if r.code == 0 || !strings.Contains(r.stderr, "No space left on device") {
		t.Errorf("dd of 16 MiB into the mount with 8 MiB of state: want a failure with ENOSPC, got %s", r)
	}
	r = runIn(t, cmdSpec{dir: m.mnt}, "sh", "-c", "head -c 16M /dev/zero > big2")
	if r.code == 0 || !strings.Contains(r.stderr, "No space left on device") {
		t.Errorf("head -c 16M into the full mount: want ENOSPC, got %s", r)
	}
	checkStaged("disk full")

	// A capture that needs a body fails, and so the write fails and
	// changes nothing.
	r = runIn(t, cmdSpec{dir: m.mnt}, "sh", "-c", "echo changed > cap.txt")
	if r.code == 0 {
		t.Errorf("overwriting cap.txt under an open snapshot with the state dir full succeeded: its pre-image (66 KB) cannot have been stored")
	}
	assertFile(t, m.in("cap.txt"), capBody)
	// An explicit capture fails with a message.
	r = m.cli("snapshot", "sc-paths", "cap.txt")
	if r.code == 0 {
		t.Errorf("snapshot sc-paths cap.txt with the state dir full succeeded: %s", r)
	} else if !strings.Contains(strings.ToLower(r.stderr), "no space left") {
		t.Errorf("snapshot with the state dir full: exit %d, but the message does not say why: %q", r.code, r.stderr)
	}

	// Metadata operations while full: each either fails or is journaled.
	// (A journal append that fails must not be answered as a success.)
	var madeDirs []string
	var mkdirErr error
	for i := 0; i < 60; i++ {
		d := fmt.Sprintf("md%02d", i)
		if err := os.Mkdir(m.in(d), 0o755); err != nil {
			mkdirErr = err
			continue
		}
		madeDirs = append(madeDirs, d)
	}
	t.Logf("disk full: %d of 60 mkdirs succeeded (last error: %v)", len(madeDirs), mkdirErr)
	recs := journalRecords(t, m)
	var unjournaled []string
	for _, d := range madeDirs {
		if !hasRecord(recs, "mkdir", d) {
			unjournaled = append(unjournaled, d)
		}
	}
	if len(unjournaled) > 0 {
		t.Errorf("disk full: %d mkdirs were answered with success but have no journal record (e.g. %v); the daemon log says: %s",
			len(unjournaled), unjournaled[:min(3, len(unjournaled))], firstLineWith(m.daemonLog(), "journal"))
	}
	checkStaged("after metadata operations on a full disk")

	// Commit while full: a clean failure, or a whole commit with its
	// intent in the journal.
	r = m.cli("commit", "s1.txt", "--json")
	switch {
	case r.code == 0:
		assertFile(t, m.inWS("s1.txt"), staged["s1.txt"])
		if !hasRecord(journalRecords(t, m), "commit_begin", "s1.txt") {
			t.Errorf("disk full: commit of s1.txt succeeded without a commit_begin record in the journal: a crash in the middle could not have been finished at the next start")
		}
		delete(staged, "s1.txt")
	case strings.TrimSpace(r.stderr+r.stdout) == "":
		t.Errorf("disk full: commit failed without a message: %s", r)
	default:
		t.Logf("disk full: commit s1.txt failed: %s", strings.TrimSpace(r.stderr))
	}
	checkStaged("after a commit on a full disk")

	// Free the space.
	for _, p := range []string{"big", "big2"} {
		if _, err := os.Lstat(m.in(p)); err != nil {
			continue
		}
		if err := os.Remove(m.in(p)); err != nil {
			t.Errorf("rm %s to free space: %v; trying discard", p, err)
			m.mustCLI("discard", p)
		}
	}
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(tdir, &sfs); err == nil && sfs.Bfree*uint64(sfs.Bsize) < 4<<20 {
		t.Errorf("only %d bytes free on the state tmpfs after removing the big files", sfs.Bfree*uint64(sfs.Bsize))
	}
	// Work resumes: writes, captures, metadata, all journaled again.
	after := strings.Repeat("after\n", 20000)
	if err := os.WriteFile(m.in("new.txt"), []byte(after), 0o644); err != nil {
		t.Errorf("write after freeing space: %v", err)
	}
	if err := os.WriteFile(m.in("cap.txt"), []byte("changed\n"), 0o644); err != nil {
		t.Errorf("write (with capture) after freeing space: %v", err)
	}
	if err := os.Mkdir(m.in("after-free"), 0o755); err != nil {
		t.Errorf("mkdir after freeing space: %v", err)
	} else if !hasRecord(journalRecords(t, m), "mkdir", "after-free") {
		t.Errorf("after freeing space: mkdir after-free succeeded but is not journaled: the journal stays failed until the daemon restarts (log: %s)",
			firstLineWith(m.daemonLog(), "journal"))
	}
	checkStaged("after freeing space")
	info := m.mustCLI("close", "sc-open", "--json")
	if !strings.Contains(info, "cap.txt") {
		t.Errorf("sc-open did not capture cap.txt once space was free: %s", info)
	}
	cr := m.commit()
	if len(cr.Conflicts)+len(cr.Failed) > 0 {
		t.Errorf("commit after freeing space: %+v", cr)
	}
	for p, want := range staged {
		assertFile(t, m.inWS(p), want)
	}
	assertFile(t, m.inWS("new.txt"), after)
	assertFile(t, m.inWS("cap.txt"), "changed\n")
	assertMissing(t, m.inWS("big"))
	if st := m.status(); st.PendingCount != 0 {
		t.Errorf("pending after the final commit: %+v", st.Entries)
	}

	// The state dir that was full starts again, intact.
	m.unmount()
	m.mount()
	checkSnapshotStore(t, m, "full disk: after a restart", []string{"sc-open"})
	m.restoreScope("sc-open")
	assertFile(t, m.in("cap.txt"), capBody)
}

func firstLineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return "(nothing)"
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ---------------------------------------------------------------------------
// 10,000 open files.

// procLimit reads a "Max open files" style line of /proc/PID/limits.
func procNofile(pid int) (soft, hard uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Max open files") {
			f := strings.Fields(strings.TrimPrefix(line, "Max open files"))
			if len(f) >= 2 {
				soft, _ = strconv.ParseUint(f[0], 10, 64)
				hard, _ = strconv.ParseUint(f[1], 10, 64)
				return soft, hard, nil
			}
		}
	}
	return 0, 0, errors.New("no Max open files line")
}

func TestOpenFiles(t *testing.T) {
	parallel(t)
	const n = 10000
	need := uint64(n + 2000)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < need {
		nl := lim
		nl.Cur = need
		if nl.Max < need {
			nl.Max = need // root only
		}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &nl); err != nil {
			t.Skipf("cannot raise RLIMIT_NOFILE to %d (soft %d, hard %d): %v", need, lim.Cur, lim.Max, err)
		}
	}

	m := mountStagefs(t)
	// The files exist in the workspace; the mount opens them.
	dir := m.inWS("many")
	os.Mkdir(dir, 0o755)
	start0 := time.Now()
	var mk sync.WaitGroup
	var mkErr atomic.Value
	for w := 0; w < 8; w++ {
		mk.Add(1)
		go func(w int) {
			defer mk.Done()
			for i := w; i < n; i += 8 {
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), []byte(fmt.Sprintf("file %d\n", i)), 0o644); err != nil {
					mkErr.CompareAndSwap(nil, err)
				}
			}
		}(w)
	}
	mk.Wait()
	if err := mkErr.Load(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d files made in the workspace in %v", n, time.Since(start0).Round(time.Millisecond))
	pid := m.daemonPid()
	soft, hard, err := procNofile(pid)
	t.Logf("daemon %d RLIMIT_NOFILE: soft %d, hard %d (%v)", pid, soft, hard, err)
	if err == nil && soft < need {
		t.Errorf("the daemon's RLIMIT_NOFILE soft limit is %d (hard %d): it cannot hold %d open files in the mount", soft, hard, n)
	}

	files := make([]*os.File, n)
	var openErrs atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				flag := os.O_RDONLY
				if i%5 == 1 {
					flag = os.O_RDWR
				}
				f, err := os.OpenFile(m.in(fmt.Sprintf("many/f%05d", i)), flag, 0)
				if err != nil {
					openErrs.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				files[i] = f
			}
		}(w)
	}
	wg.Wait()
	t.Logf("opened %d files (a fifth for writing) in %v", n, time.Since(start).Round(time.Millisecond))
	if openErrs.Load() > 0 {
		t.Errorf("%d of %d opens in the mount failed; first: %v", openErrs.Load(), n, firstErr.Load())
	}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		t.Logf("the daemon holds %d descriptors with %d files open in the mount", len(ents), n)
	}
	// All open at once: read each, write the writable ones.
	var ioErrs []string
	buf := make([]byte, 64)
	for i, f := range files {
		if f == nil {
			continue
		}
		k, err := f.ReadAt(buf, 0)
		if want := fmt.Sprintf("file %d\n", i); (err != nil && k != len(want)) || string(buf[:k]) != want {
			ioErrs = append(ioErrs, fmt.Sprintf("read f%05d: %q, %v", i, buf[:k], err))
		}
		if i%5 == 1 {
			if _, err := f.WriteAt([]byte(fmt.Sprintf("written %d\n", i)), 0); err != nil {
				ioErrs = append(ioErrs, fmt.Sprintf("write f%05d: %v", i, err))
			}
		}
	}
	for i, f := range files {
		if f == nil {
			continue
		}
		if err := f.Close(); err != nil {
			ioErrs = append(ioErrs, fmt.Sprintf("close f%05d: %v", i, err))
		}
	}
	t.Logf("read, wrote and closed them in %v", time.Since(start).Round(time.Millisecond))
	if len(ioErrs) > 0 {
		t.Errorf("%d read/write/close errors with %d files open, e.g.:\n%s", len(ioErrs), n, strings.Join(ioErrs[:min(5, len(ioErrs))], "\n"))
	}
	// What was written is there; the rest is unchanged (every written
	// file and every seventh of the others).
	bad := 0
	for i := 0; i < n; i++ {
		if i%5 != 1 && i%7 != 0 {
			continue
		}
		want := fmt.Sprintf("file %d\n", i)
		if i%5 == 1 {
			want = fmt.Sprintf("written %d\n", i)
		}
		if b, err := os.ReadFile(m.in(fmt.Sprintf("many/f%05d", i))); err != nil || string(b) != want {
			if bad++; bad <= 3 {
				t.Errorf("many/f%05d after closing = %q, %v; want %q", i, b, err, want)
			}
		}
	}
	if st := m.status(); st.PendingCount != n/5 {
		t.Errorf("%d pending after writing %d files, want %d", st.PendingCount, n/5, n/5)
	}
	// The kernel sends the releases after close returns: give them time.
	held := 0
	if !waitFor(5*time.Second, func() bool {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		held = len(ents)
		return err != nil || held < 200
	}) {
		t.Errorf("the daemon still holds %d descriptors 5s after every file in the mount was closed", held)
	}
}

// ---------------------------------------------------------------------------
// The workspace changes underneath.

// TestUnderneathEdits: an edit made directly in the workspace to a path
// without pending changes shows in the mount within the cache timeout. (A
// staged path edited in the workspace is a conflict at commit:
// TestConflict.)
func TestUnderneathEdits(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{"same.txt": "aaaa\n", "grow.txt": "x\n", "gone.txt": "g\n", "dir/in.txt": "in\n"}),
		withMountFlags("--cache-timeout", "200ms"))
	for _, p := range []string{"same.txt", "grow.txt", "gone.txt", "dir/in.txt"} {
		readFile(t, m.in(p)) // cached by the kernel
	}
	os.ReadDir(m.in("dir"))
	start := time.Now()
	writeTree(t, m.ws, map[string]string{"same.txt": "bbbb\n", "grow.txt": "longer now\n", "added.txt": "added\n", "dir/new.txt": "new\n"})
	os.Remove(m.inWS("gone.txt"))
	check := func() string {
		var bad []string
		for p, want := range map[string]string{"same.txt": "bbbb\n", "grow.txt": "longer now\n", "added.txt": "added\n", "dir/new.txt": "new\n"} {
			if b, err := os.ReadFile(m.in(p)); err != nil || string(b) != want {
				bad = append(bad, fmt.Sprintf("%s=%q (%v)", p, b, err))
			}
		}
		if _, err := os.Lstat(m.in("gone.txt")); !errors.Is(err, fs.ErrNotExist) {
			bad = append(bad, fmt.Sprintf("gone.txt: %v", err))
		}
		return strings.Join(bad, ", ")
	}
	var last string
	ok := waitFor(time.Second, func() bool { last = check(); return last == "" })
	if !ok {
		t.Errorf("edits made in the workspace not visible in the mount 1s after (--cache-timeout 200ms): %s", last)
	} else {
		t.Logf("workspace edits visible in the mount after %v", time.Since(start).Round(time.Millisecond))
	}
	if st := m.status(); st.PendingCount != 0 {
		t.Errorf("workspace edits show as pending: %+v", st.Entries)
	}
}

// ---------------------------------------------------------------------------
// Hostile input on the control socket.

// rawConn is a line-oriented raw connection to the control socket.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	rd *bufio.Reader
}

func dialRaw(t *testing.T, sock string) *rawConn {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(cmdTimeout))
	return &rawConn{t: t, c: c, rd: bufio.NewReaderSize(c, 1<<20)}
}

// call writes one line and reads one reply line. The write runs in the
// background: the server may answer (and close) before it has read all of
// a huge line.
func (r *rawConn) call(line []byte) (map[string]any, error) {
	werr := make(chan error, 1)
	go func() {
		_, err := r.c.Write(append(line, '\n'))
		werr <- err
	}()
	resp, err := r.rd.ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("no reply (%v; write: %v)", err, <-werr)
	}
	var msg map[string]any
	if err := json.Unmarshal(resp, &msg); err != nil {
		return nil, fmt.Errorf("reply is not JSON: %.200q", resp)
	}
	return msg, nil
}

func rpcErr(msg map[string]any) (int, string) {
	e, _ := msg["error"].(map[string]any)
	if e == nil {
		return 0, ""
	}
	code, _ := e["code"].(float64)
	s, _ := e["message"].(string)
	return int(code), s
}

func TestHostileControlInput(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a\n", "sub/b.txt": "b\n"}))
	other := filepath.Join(m.base, "other")
	writeTree(t, other, map[string]string{"secret.txt": "secret\n"})
	wsBefore, otherBefore := snapshot(t, m.ws), snapshot(t, other)
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	alive := func(what string) {
		t.Helper()
		c, err := control.Dial(m.sock)
		if err != nil {
			t.Fatalf("%s: the daemon does not accept connections: %v", what, err)
		}
		defer c.Close()
		if _, err := c.Initialize(ctx); err != nil {
			t.Fatalf("%s: the daemon does not answer: %v", what, err)
		}
	}

	// An oversized line: an error, the connection ends, the daemon serves.
	for _, big := range [][]byte{
		[]byte(`{"jsonrpc":"2.0","id":1,"method":"fs/read_text","params":{"path":"` + strings.Repeat("a", 9<<20) + `"}}`),
		[]byte(strings.Repeat(" ", 9<<20)), // no JSON at all, no newline for 9 MiB
	} {
		rc := dialRaw(t, m.sock)
		msg, err := rc.call(big)
		if err != nil {
			t.Errorf("oversized request: %v", err)
		} else if code, text := rpcErr(msg); code != control.CodeInvalidRequest && code != control.CodeParseError {
			t.Errorf("oversized request: answer %v, want -32600", msg)
		} else if !strings.Contains(text, "exceeds") {
			t.Logf("oversized request: %d %s", code, text)
		}
		rc.c.Close()
		alive("after an oversized request")
	}

	// Deep nesting: refused without a stack overflow; the connection
	// keeps serving.
	rc := dialRaw(t, m.sock)
	deep := []string{
		`{"jsonrpc":"2.0","id":1,"method":"fs/staged_status","params":{"paths":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}}`,
		`{"jsonrpc":"2.0","id":1,"method":"fs/staged_status","params":` + strings.Repeat(`{"a":`, 10000) + `1` + strings.Repeat("}", 10000) + `}`,
		strings.Repeat("[", 10000),
		strings.Repeat(`{"a":`, 10000),
	}
	for i, line := range deep {
		msg, err := rc.call([]byte(line))
		if err != nil {
			t.Fatalf("nesting %d: %v", i, err)
		}
		if code, _ := rpcErr(msg); code != control.CodeInvalidRequest && code != control.CodeParseError {
			t.Errorf("10,000 levels of nesting (%d): answer %.200v, want -32600", i, msg)
		}
	}
	if msg, err := rc.call([]byte(`{"jsonrpc":"2.0","id":7,"method":"session/initialize"}`)); err != nil || msg["result"] == nil {
		t.Errorf("the connection after deep nesting: %v, %v", msg, err)
	}

	// Paths that escape the workspace, for every method that takes one.
	// Sent raw, so NUL and invalid UTF-8 reach the server as they are.
	rc.call([]byte(`{"jsonrpc":"2.0","id":1,"method":"session/turn","params":{"turnId":"h1"}}`))
	hostile := []string{
		`"../x"`, `"a/../../x"`, `".."`, `"./../x"`, `"sub/b.txt/../../../x"`, `"sub/../.."`,
		`"/etc/passwd"`, `"/"`, `"//etc/passwd"`,
		strconv.Quote(other + "/secret.txt"), strconv.Quote(m.ws + "/../other/secret.txt"),
		strconv.Quote(m.mnt + "/../other/secret.txt"), strconv.Quote(m.state), strconv.Quote(m.state + "/journal.log"),
		`"a\u0000b"`, `"\u0000"`, `"a.txt\u0000/../../x"`,
		"\"a\xff\xfe.txt\"", "\"sub/\xc0\xaf..\"", `"\ud800"`, `"a\udfff.txt"`,
	}
	methods := []struct{ method, params string }{
		{"fs/staged_status", `{"paths":[P]}`},
		{"fs/commit_staged", `{"paths":[P]}`},
		{"fs/discard_staged", `{"paths":[P]}`},
		{"fs/diff", `{"paths":[P]}`},
		{"fs/read_text", `{"path":P}`},
		{"fs/safe_text_patch", `{"path":P,"expectedHash":"","content":"pwned\n"}`},
		{"fs/snapshot", `{"scopeId":"hostile-N","paths":[P]}`},
		{"session/rollback", `{"paths":[P]}`},
		{"session/log", `{"paths":[P]}`},
	}
	id := 100
	accepted := map[string][]string{} // hostile path -> methods that accepted it
	var order []string
	for _, meth := range methods {
		for _, p := range hostile {
			id++
			params := strings.ReplaceAll(strings.ReplaceAll(meth.params, "P", p), "hostile-N", fmt.Sprintf("hostile-%d", id))
			line := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, meth.method, params)
			msg, err := rc.call([]byte(line))
			if err != nil {
				t.Fatalf("%s %q: %v", meth.method, p, err)
			}
			code, text := rpcErr(msg)
			if code != control.CodePathOutsideWorkspace && code != control.CodeInvalidParams {
				if accepted[p] == nil {
					order = append(order, p)
				}
				res, _ := json.Marshal(msg["result"])
				accepted[p] = append(accepted[p], fmt.Sprintf("%s (code %d, result %.120s)", meth.method, code, res))
			} else if text == "" {
				t.Errorf("%s with path %q: error %d without a message", meth.method, p, code)
			}
		}
		alive("after hostile paths for " + meth.method)
	}
	for _, p := range order {
		t.Errorf("path %q (raw in the request line) was not refused (want -32005 or -32602) by %d of %d methods:\n  %s",
			p, len(accepted[p]), len(methods), strings.Join(accepted[p], "\n  "))
	}
	// Scope and turn ids are names in the state dir: refused as params.
	for _, s := range []string{`"../x"`, `"../../snaps/x"`, `"a/b"`, `"a\u0000"`, `"."`, `".."`, strconv.Quote(strings.Repeat("x", 300)), "\"a\xff\""} {
		for _, meth := range []string{"fs/snapshot", "fs/close_snapshot", "fs/restore", "fs/drop_snapshot"} {
			id++
			msg, err := rc.call([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":{"scopeId":%s}}`, id, meth, s)))
			if err != nil {
				t.Fatal(err)
			}
			if code, _ := rpcErr(msg); code != control.CodeInvalidParams {
				t.Errorf("%s with scopeId %s: answer %.300v; want -32602", meth, s, msg)
			}
		}
		if s == `"."` || s == `".."` {
			continue // turn ids are never path components ("turn:.." is a scope)
		}
		for _, meth := range []string{"session/turn", "session/rollback"} {
			id++
			msg, err := rc.call([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":{"turnId":%s}}`, id, meth, s)))
			if err != nil {
				t.Fatal(err)
			}
			if code, _ := rpcErr(msg); code != control.CodeInvalidParams && code != control.CodeNotFound {
				t.Errorf("%s with turnId %s: answer %.300v; want -32602 (or -32003)", meth, s, msg)
			}
		}
	}
	alive("after hostile ids")
	assertSameTree(t, "workspace after hostile requests", wsBefore, snapshot(t, m.ws))
	assertSameTree(t, "the directory beside the workspace after hostile requests", otherBefore, snapshot(t, other))
	if st := m.status(); st.PendingCount != 0 {
		t.Errorf("hostile requests staged something: %+v", st.Entries)
	}
	// The Go client gets the same answers.
	c := m.dial()
	if _, err := c.ReadText(ctx, "../other/secret.txt"); !control.IsCode(err, control.CodePathOutsideWorkspace) {
		t.Errorf("client read_text ../other/secret.txt: %v, want -32005", err)
	}
	if _, err := c.Snapshot(ctx, control.SnapshotParams{ScopeID: "ok-scope", Paths: []string{"/etc"}}); !control.IsCode(err, control.CodePathOutsideWorkspace) {
		t.Errorf("client snapshot of /etc: %v, want -32005", err)
	}
}

// ---------------------------------------------------------------------------
// Symlinks pointing out of the workspace.

func TestHostileSymlinks(t *testing.T) {
	parallel(t)
	outside, err := os.MkdirTemp("/tmp", "sfs-outside-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(outside) })
	readable, err := os.MkdirTemp("/tmp", "sfs-outside-read-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(readable) })
	secret := "the secret outside the workspace\n"
	writeTree(t, readable, map[string]string{"secret": secret})
	files := map[string]string{"top.txt": "top\n", "d2/f.txt": "d2\n"}
	for i := 0; i < 20; i++ {
		files[fmt.Sprintf("d/f%02d", i)] = fmt.Sprintf("base %d\n", i)
	}
	m := mountStagefs(t, withFiles(files), withSymlink("out", outside), withSymlink("outr", readable), withSymlink("dlink", outside))
	ctx, cancel := context.WithTimeout(context.Background(), 2*cmdTimeout)
	defer cancel()
	c := m.dial()
	outsideEmpty := func(what string) {
		t.Helper()
		ents, err := os.ReadDir(outside)
		if err != nil || len(ents) > 0 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Fatalf("%s: %s (outside the workspace) now holds %v (%v)", what, outside, names, err)
		}
		assertSameTree(t, what+": the readable dir outside", tree{".": "dir 0700", "secret": "file 0644 " + sha256Hex([]byte(secret))}, snapshot(t, readable))
	}
	outsideEmpty("at the start")

	// Daemon-side operations through the symlinks.
	content := "pwned\n"
	if res, err := c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "out/x", Content: &content}); err == nil {
		t.Errorf("safe_text_patch out/x (out -> %s) = %+v, want an error", outside, res)
	}
	outsideEmpty("safe_text_patch out/x")
	if res, err := c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "outr/secret", ExpectedHash: sha256Hex([]byte(secret)), Content: &content}); err == nil {
		t.Errorf("safe_text_patch outr/secret = %+v, want an error", res)
	}
	outsideEmpty("safe_text_patch outr/secret")
	if rt, err := c.ReadText(ctx, "outr/secret"); err == nil && strings.Contains(rt.Content, "secret") {
		t.Errorf("read_text outr/secret read the file outside the workspace: %+v", rt)
	}
	if d, err := c.Diff(ctx, []string{"outr/secret", "out/x"}); err == nil && strings.Contains(d.Diff, "secret") {
		t.Errorf("diff through outr showed the file outside: %s", d.Diff)
	}
	if _, err := c.Snapshot(ctx, control.SnapshotParams{ScopeID: "through-link", Paths: []string{"outr/secret", "outr", "out"}}); err == nil {
		c.CloseSnapshot(ctx, "through-link")
	}
	if b, err := os.ReadFile(filepath.Join(m.state, "snapshots", "blobs", sha256Hex([]byte(secret))[:2], sha256Hex([]byte(secret)))); err == nil {
		t.Errorf("the snapshot through outr stored the file outside the workspace: %q", b)
	}
	c.Commit(ctx, control.CommitParams{Paths: []string{"out/x"}})
	c.Commit(ctx, control.CommitParams{Paths: []string{"out/x"}, Force: true})
	c.Discard(ctx, []string{"out/x"})
	c.Status(ctx, []string{"out/x"})
	outsideEmpty("snapshot, commit, discard and status through out")

	// A staged directory replaced in the workspace by a symlink to the
	// outside: a conflict, and with --force never a write outside.
	if err := os.Mkdir(m.in("nd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.in("nd/x"), []byte("staged\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.in("d2/f.txt"), []byte("staged d2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, m.inWS("nd")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.inWS("d2"), m.inWS("d2.real")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, m.inWS("d2")); err != nil {
		t.Fatal(err)
	}
	r := m.cli("commit", "nd", "d2", "--json")
	if r.code != 3 {
		t.Errorf("commit of nd/x and d2/f.txt with nd and d2 now symlinks to the outside in the workspace: want exit 3 (conflicts/failures), got %s", r)
	}
	outsideEmpty("commit with staged dirs replaced by symlinks")
	m.cli("commit", "nd", "d2", "--force", "--json")
	outsideEmpty("commit --force with staged dirs replaced by symlinks")

	// The race: ws/d and ws/dlink (a symlink to the outside) swapped
	// atomically in a loop while commits of staged files under d/ run.
	stage := func(round int) {
		for i := 0; i < 20; i++ {
			if err := os.WriteFile(m.in(fmt.Sprintf("d/f%02d", i)), []byte(fmt.Sprintf("round %d file %d\n", round, i)), 0o644); err != nil {
				t.Fatalf("stage round %d: %v", round, err)
			}
			if err := os.WriteFile(m.in(fmt.Sprintf("d/n%02d", i)), []byte(fmt.Sprintf("round %d new %d\n", round, i)), 0o644); err != nil {
				t.Fatalf("stage round %d: %v", round, err)
			}
		}
	}
	swapped := func() bool {
		st, err := os.Lstat(m.inWS("d"))
		return err == nil && st.Mode()&fs.ModeSymlink != 0
	}
	exchange := func() error {
		return unix.Renameat2(unix.AT_FDCWD, m.inWS("d"), unix.AT_FDCWD, m.inWS("dlink"), unix.RENAME_EXCHANGE)
	}
	var swaps, committed, refused int
	deadline := time.Now().Add(4 * time.Second)
	for round := 0; round < 40 && time.Now().Before(deadline); round++ {
		stage(round)
		stop := make(chan struct{})
		done := make(chan int)
		go func() {
			n := 0
			for {
				select {
				case <-stop:
					done <- n
					return
				default:
				}
				if exchange() == nil {
					n++
				}
				if round%2 == 0 {
					time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
				}
			}
		}()
		cr, err := c.Commit(ctx, control.CommitParams{Paths: []string{"d"}})
		close(stop)
		swaps += <-done
		if swapped() {
			if err := exchange(); err != nil {
				t.Fatal(err)
			}
		}
		if err != nil {
			t.Fatalf("round %d: commit: %v", round, err)
		}
		committed += len(cr.Committed)
		refused += len(cr.Conflicts) + len(cr.Failed)
		outsideEmpty(fmt.Sprintf("round %d of commits raced with swapping d and a symlink to the outside", round))
	}
	t.Logf("symlink swap race: %d swaps, %d paths committed, %d refused (conflicts or failures)", swaps, committed, refused)
	// Quiet again: everything commits, into the real d.
	m.commit("d", "--force")
	outsideEmpty("the final commit")
	assertSameTree(t, "d in the workspace and the mount after the final commit", snapshot(t, m.in("d")), snapshot(t, m.inWS("d")))
}

// ---------------------------------------------------------------------------
// Concurrency.

// Two commits that TestConcurrentMutations ran into, reduced. Nothing
// changes in the workspace, so neither may end in a conflict or a failure.

// TestReliabilityCommitDirMovedThenRecreated: a workspace directory moved
// away and a new one made at its old name.
func TestReliabilityCommitDirMovedThenRecreated(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{"a/s/x": "old x\n", "b/": ""}))
	sh(t, m.mnt, "mv a/s b/t && mkdir a/s && echo new > a/s/x")
	view := snapshot(t, m.mnt)
	if r := m.cli("commit", "--json"); r.code != 0 {
		t.Errorf("commit of `mv a/s b/t; mkdir a/s; echo new > a/s/x`: %s", r)
	}
	assertSameTree(t, "the workspace after commit vs the mount before", view, snapshot(t, m.ws))
}

// TestReliabilityCommitDirRotation: directories moved along a chain
// (a -> c, b -> a) and swapped (a <-> b through a temporary name).
func TestReliabilityCommitDirRotation(t *testing.T) {
	for name, script := range map[string]string{
		"chain": "mv d/a d/c && mv d/b d/a",
		"swap":  "mv d/a d/tmp && mv d/b d/a && mv d/tmp d/b",
	} {
		t.Run(name, func(t *testing.T) {
			m := mountStagefs(t, withFiles(map[string]string{"d/a/x": "from a\n", "d/b/x": "from b\n"}))
			sh(t, m.mnt, script)
			view := snapshot(t, m.mnt)
			if r := m.cli("commit", "--json"); r.code != 0 {
				t.Errorf("commit of `%s`: %s", script, r)
			}
			assertSameTree(t, "the workspace after commit vs the mount before", view, snapshot(t, m.ws))
		})
	}
}

func TestConcurrentMutations(t *testing.T) {
	parallel(t)
	files := map[string]string{}
	for d := 0; d < 4; d++ {
		for f := 0; f < 8; f++ {
			files[fmt.Sprintf("d%d/f-%d", d, f)] = fmt.Sprintf("base %d %d\n", d, f)
		}
		files[fmt.Sprintf("d%d/s-0/x", d)] = "in a subdir\n"
	}
	m := mountStagefs(t, withFiles(files))
	allowed := func(err error) bool {
		for _, e := range []error{syscall.ENOENT, syscall.EEXIST, syscall.ENOTEMPTY, syscall.EXDEV} {
			if errors.Is(err, e) {
				return true
			}
		}
		return false
	}
	var mu sync.Mutex
	unexpected := map[string]int{}
	var ops, expected atomic.Int64
	note := func(op string, err error) {
		ops.Add(1)
		if err == nil {
			return
		}
		if allowed(err) {
			expected.Add(1)
			return
		}
		mu.Lock()
		unexpected[fmt.Sprintf("%s: %v", op, err)]++
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			dir := func() string { return m.in(fmt.Sprintf("d%d", rng.IntN(4))) }
			name := func(kind string) string { return fmt.Sprintf("%s/%s-%d", dir(), kind, rng.IntN(10)) }
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				switch rng.IntN(10) {
				case 0, 1:
					note("write", os.WriteFile(name("f"), []byte(fmt.Sprintf("w%d i%d %s\n", w, i, strings.Repeat("x", rng.IntN(5000)))), 0o644))
				case 2:
					f, err := os.OpenFile(name("f"), os.O_WRONLY|os.O_APPEND, 0)
					if err == nil {
						_, err = f.WriteString("appended\n")
						if cerr := f.Close(); err == nil {
							err = cerr
						}
					}
					note("append", err)
				case 3:
					note("rename file", os.Rename(name("f"), name("f")))
				case 4:
					note("unlink", os.Remove(name("f")))
				case 5:
					d := name("s")
					err := os.Mkdir(d, 0o755)
					if err == nil {
						err = os.WriteFile(d+"/x", []byte("x\n"), 0o644)
					}
					note("mkdir", err)
				case 6:
					note("rename dir", os.Rename(name("s"), name("s")))
				case 7:
					d := name("s")
					os.Remove(d + "/x")
					note("rmdir", os.Remove(d))
				case 8:
					note("truncate", os.Truncate(name("f"), int64(rng.IntN(100))))
				case 9:
					note("symlink", os.Symlink("f-1", name("l")))
					note("unlink symlink", os.Remove(name("l")))
				}
			}
		}(w)
	}
	// Meanwhile status and diff, again and again.
	var clis, cliFails int
	var cliErr string
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, args := range [][]string{{"status", "--json"}, {"diff"}} {
			r := m.cli(args...)
			clis++
			if r.code != 0 {
				cliFails++
				cliErr = r.String()
			}
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d operations, %d expected races (ENOENT/EEXIST/ENOTEMPTY/EXDEV), %d status/diff runs", ops.Load(), expected.Load(), clis)
	for e, n := range unexpected {
		t.Errorf("%d× unexpected error: %s", n, e)
	}
	if cliFails > 0 {
		t.Errorf("%d of %d status/diff runs failed, e.g. %s", cliFails, clis, cliErr)
	}
	view := snapshot(t, m.mnt)
	r := m.cli("commit", "--json")
	var cr control.CommitResult
	if err := json.Unmarshal([]byte(r.stdout), &cr); err != nil || r.code != 0 {
		t.Errorf("commit after the concurrent run: exit %d, %d committed, conflicts %+v, failed %+v (%v)\n%s",
			r.code, len(cr.Committed), cr.Conflicts, cr.Failed, err, r.stderr)
	}
	assertSameTree(t, "the workspace after commit vs the mount before it", view, snapshot(t, m.ws))
	assertSameTree(t, "the mount after commit vs before", view, snapshot(t, m.mnt))
	if st := m.status(); st.PendingCount != 0 {
		t.Errorf("pending after commit: %+v", st.Entries)
	}
}
