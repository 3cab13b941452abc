package test

// The crash battery: the daemon is killed with SIGKILL at random moments
// while real tools write in the mount, while a commit runs and while a
// restore runs. After each kill the dead mount is cleared and the same state
// dir mounted again (`stagefs mount` does both), and the guarantees are
// checked: the daemon starts (the journal verifies), every write a tool had
// fsynced is there, the workspace holds a commit whole or not at all, an
// interrupted restore run again gives exactly the pre-image, the snapshots
// are listed and the content store has no orphan or missing bodies.
//
// CI runs a bounded version: STAGEFS_CRASH_KILLS (default 8) kills per
// scenario. scripts/crash runs the full one (50 kills per scenario by
// default); STAGEFS_CRASH_SEED replays a run's random choices.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"stagefs/control"
)

// crashHelperEnv makes the test binary run as a helper process (the fsync
// writer) instead of the tests; see init.
const crashHelperEnv = "STAGEFS_CRASH_HELPER"

func init() {
	if os.Getenv(crashHelperEnv) == "writer" {
		os.Exit(crashWriterMain(os.Getenv("STAGEFS_CRASH_DIR")))
	}
}

func crashKills(t *testing.T) int {
	if s := os.Getenv("STAGEFS_CRASH_KILLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("STAGEFS_CRASH_KILLS=%q: want a positive number", s)
		}
		return n
	}
	return 8
}

func crashSeed(t *testing.T) uint64 {
	if s := os.Getenv("STAGEFS_CRASH_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("STAGEFS_CRASH_SEED=%q: %v", s, err)
		}
		return n
	}
	return uint64(time.Now().UnixNano())
}

func TestCrash(t *testing.T) {
	parallel(t)
	requireFUSE(t)
	kills := crashKills(t)
	seed := crashSeed(t)
	t.Logf("%d kills per scenario, seed %d (STAGEFS_CRASH_SEED=%d replays it)", kills, seed, seed)
	scenarios := []struct {
		name string
		run  func(*crashRun)
	}{
		{"writers", crashWriters},
		{"tools", crashTools},
		{"commit", crashCommit},
		{"restore", crashRestore},
		{"branch", crashBranch},
	}
	for i, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			c := &crashRun{t: t, kills: kills, rng: rand.New(rand.NewPCG(seed, uint64(i))), stats: map[string]int{}}
			start := time.Now()
			sc.run(c)
			t.Logf("%s: %d kills in %v; %s", sc.name, c.killed, time.Since(start).Round(time.Millisecond), c.statsString())
		})
	}
}

// crashRun is one scenario's state.
type crashRun struct {
	t      *testing.T
	m      *stagefsMount
	rng    *rand.Rand
	kills  int
	killed int
	stats  map[string]int
}

func (c *crashRun) statsString() string {
	var keys []string
	for k := range c.stats {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, c.stats[k]))
	}
	return strings.Join(parts, " ")
}

// randDur is a uniformly random duration in [lo, hi].
func (c *crashRun) randDur(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(c.rng.Int64N(int64(hi-lo)+1))
}

// kill SIGKILLs the daemon and waits until it is gone.
func (c *crashRun) kill() {
	c.t.Helper()
	pid := c.m.daemonPid()
	if pid <= 0 {
		c.t.Fatal("no daemon pid to kill")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		c.t.Fatalf("kill %d: %v", pid, err)
	}
	if !waitProcessGone(pid, 10*time.Second) {
		c.t.Fatalf("daemon %d survived SIGKILL for 10s", pid)
	}
	c.killed++
}

// restart mounts the same state dir again: the dead mount is cleared, the
// journal verified, an interrupted commit finished. It checks that exactly
// one mount is left at the mount point and that the daemon answers.
func (c *crashRun) restart() {
	c.t.Helper()
	c.m.mount()
	if n := countMounts(c.m.mnt); n != 1 {
		c.t.Errorf("%d mounts at %s after the restart, want 1 (the dead one cleared)", n, c.m.mnt)
	}
	if r := c.m.cli("status", "--json"); r.code != 0 {
		c.t.Fatalf("status after the restart: %s", r)
	}
	if log := c.m.daemonLog(); strings.Contains(log, "journal: cut a torn tail") {
		c.stats["tornTails"] = strings.Count(log, "journal: cut a torn tail")
	}
}

// ---------------------------------------------------------------------------
// Background processes.

// bgProc is a process started in its own process group whose stdout lines
// are handed to a callback.
type bgProc struct {
	name   string
	cmd    *exec.Cmd
	done   chan struct{}
	err    error
	stderr bytes.Buffer
	start  time.Time
	took   time.Duration
}

func startBG(t *testing.T, name string, cmd *exec.Cmd, onLine func(string)) *bgProc {
	t.Helper()
	p := &bgProc{name: name, cmd: cmd, done: make(chan struct{})}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if cmd.Env == nil {
		cmd.Env = baseEnv()
	}
	if cmd.Dir == "" {
		cmd.Dir = "/"
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &p.stderr
	p.start = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if onLine != nil {
				onLine(sc.Text())
			}
		}
		p.err = cmd.Wait()
		p.took = time.Since(p.start)
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(time.Second) })
	return p
}

// stop waits up to d for the process to exit, then kills its group.
func (p *bgProc) stop(d time.Duration) {
	select {
	case <-p.done:
		return
	case <-time.After(d):
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
	}
}

// shellBG runs a bash script in dir with args ($1...).
func shellBG(t *testing.T, name, dir, script string, onLine func(string), args ...string) *bgProc {
	cmd := exec.Command("bash", append([]string{"-ec", script, name}, args...)...)
	cmd.Dir = dir
	return startBG(t, name, cmd, onLine)
}

// stopAll waits for every process to end after a kill (each sees its mount
// die) and kills the stragglers: nothing may still run when the new mount
// appears, or a late absolute-path write would land in it.
func stopAll(ps ...*bgProc) {
	for _, p := range ps {
		p.stop(10 * time.Second)
	}
}

// ---------------------------------------------------------------------------
// The fsync writer: a helper process that appends numbered records to
// log.txt with an fsync after each, creates files (fsync file and
// directory) and saves save.txt atomically (temp, fsync, rename, fsync
// directory), and reports on stdout, after each fsync returned, what it
// made durable: "A k" (records 0..k), "C k" (new-k), "S k" (save.txt holds
// save k). It resumes an existing log.txt after its last whole record.

func writerRecord(k int) string {
	return fmt.Sprintf("rec %06d %s\n", k, strings.Repeat(string(rune('a'+k%26)), 10+(k*37)%1500))
}

func writerNew(k int) string {
	return fmt.Sprintf("new %06d %s\n", k, strings.Repeat("n", (k*53)%3000))
}

func writerSave(k int) string {
	return fmt.Sprintf("save %06d %s\n", k, strings.Repeat("s", 100+(k*71)%5000))
}

// writerPrefix checks that data is a prefix of the record stream and
// returns how many whole records it holds.
func writerPrefix(data []byte) (int, error) {
	off := 0
	for k := 0; ; k++ {
		rest := data[off:]
		if len(rest) == 0 {
			return k, nil
		}
		rec := writerRecord(k)
		if len(rest) < len(rec) {
			if !bytes.HasPrefix([]byte(rec), rest) {
				return k, fmt.Errorf("torn record %d at offset %d is not a prefix of the record", k, off)
			}
			return k, nil
		}
		if string(rest[:len(rec)]) != rec {
			return k, fmt.Errorf("record %d at offset %d differs: %.40q", k, off, rest[:min(len(rest), 40)])
		}
		off += len(rec)
	}
}

func crashWriterMain(dir string) int {
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "writer %s: %s: %v\n", dir, what, err)
		return 1
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail("mkdir", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fail("open dir", err)
	}
	logPath := filepath.Join(dir, "log.txt")
	old, err := os.ReadFile(logPath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail("read log", err)
	}
	next, err := writerPrefix(old)
	if err != nil {
		fmt.Fprintf(os.Stderr, "writer %s: log.txt is damaged: %v\n", dir, err)
		return 3
	}
	keep := 0
	for k := 0; k < next; k++ {
		keep += len(writerRecord(k))
	}
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fail("open log", err)
	}
	if keep < len(old) {
		if err := lf.Truncate(int64(keep)); err != nil {
			return fail("truncate log", err)
		}
	}
	syncFile := func(name, content string) error {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		if _, err := f.WriteString(content); err != nil {
			f.Close()
			return err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	// fsync of a directory in the mount: a failure with EOPNOTSUPP is
	// reported once ("X dirsync") and then ignored, so the battery still
	// runs; TestReliabilityDirFsync is the test for it.
	dirSync := func() error {
		err := d.Sync()
		if errors.Is(err, syscall.EOPNOTSUPP) {
			fmt.Printf("X dirsync\n")
			return nil
		}
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for k := next; time.Now().Before(deadline); k++ {
		if _, err := lf.WriteAt([]byte(writerRecord(k)), int64(keep)); err != nil {
			return fail("write", err)
		}
		keep += len(writerRecord(k))
		if err := lf.Sync(); err != nil {
			return fail("fsync", err)
		}
		fmt.Printf("A %d\n", k)
		switch k % 8 {
		case 3:
			if err := syncFile("save.tmp", writerSave(k)); err != nil {
				return fail("save.tmp", err)
			}
			if err := os.Rename(filepath.Join(dir, "save.tmp"), filepath.Join(dir, "save.txt")); err != nil {
				return fail("rename", err)
			}
			if err := dirSync(); err != nil {
				return fail("fsync dir", err)
			}
			fmt.Printf("S %d\n", k)
		case 7:
			if err := syncFile(fmt.Sprintf("new-%06d", k), writerNew(k)); err != nil {
				return fail("new", err)
			}
			if err := dirSync(); err != nil {
				return fail("fsync dir", err)
			}
			fmt.Printf("C %d\n", k)
		}
	}
	return 0
}

// writerAcks is what one writer slot has reported durable, over all its runs.
type writerAcks struct {
	rel       string // its directory, relative to the mount
	mu        sync.Mutex
	lastA     int
	lastS     int
	created   []int
	noDirSync bool
	proc      *bgProc
}

func newWriterAcks(rel string) *writerAcks { return &writerAcks{rel: rel, lastA: -1, lastS: -1} }

func (w *writerAcks) onLine(line string) {
	var op string
	var k int
	w.mu.Lock()
	defer w.mu.Unlock()
	if line == "X dirsync" {
		w.noDirSync = true
		return
	}
	if _, err := fmt.Sscanf(line, "%s %d", &op, &k); err != nil {
		return
	}
	switch op {
	case "A":
		w.lastA = max(w.lastA, k)
	case "S":
		w.lastS = max(w.lastS, k)
	case "C":
		w.created = append(w.created, k)
	}
}

func (w *writerAcks) start(t *testing.T, m *stagefsMount) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(baseEnv(), crashHelperEnv+"=writer", "STAGEFS_CRASH_DIR="+m.in(w.rel))
	w.proc = startBG(t, "writer "+w.rel, cmd, w.onLine)
}

// verify checks, in the remounted mount, everything the writer reported.
func (w *writerAcks) verify(t *testing.T, m *stagefsMount, what string) {
	t.Helper()
	if w.proc != nil {
		<-w.proc.done
		if ee, ok := w.proc.err.(*exec.ExitError); ok && ee.ExitCode() == 3 {
			t.Errorf("%s: writer %s found its log damaged at start: %s", what, w.rel, w.proc.stderr.String())
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	data, err := os.ReadFile(m.in(w.rel + "/log.txt"))
	if err != nil {
		if w.lastA >= 0 || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %s/log.txt: %v (records 0..%d were fsynced)", what, w.rel, err, w.lastA)
		}
	} else {
		n, err := writerPrefix(data)
		if err != nil {
			t.Errorf("%s: %s/log.txt is not the written record stream: %v", what, w.rel, err)
		} else if n < w.lastA+1 {
			t.Errorf("%s: %s/log.txt holds %d whole records, but records 0..%d were fsynced", what, w.rel, n, w.lastA)
		}
	}
	for _, k := range w.created {
		p := m.in(fmt.Sprintf("%s/new-%06d", w.rel, k))
		if b, err := os.ReadFile(p); err != nil || string(b) != writerNew(k) {
			t.Errorf("%s: %s (fsynced with its directory) = %d bytes, %v; want %d bytes", what, p, len(b), err, len(writerNew(k)))
		}
	}
	if w.lastS >= 0 {
		b, err := os.ReadFile(m.in(w.rel + "/save.txt"))
		var j int
		if err == nil {
			_, err = fmt.Sscanf(string(b), "save %d", &j)
		}
		if err != nil || string(b) != writerSave(j) || j < w.lastS {
			t.Errorf("%s: %s/save.txt = %.30q (%v); want save %d or later, whole", what, w.rel, b, err, w.lastS)
		}
	}
}

// ---------------------------------------------------------------------------
// Content store checks.

var reservedScopePrefixes = []string{"turn:", "post:", "redo:"}

func isReservedScope(s string) bool {
	for _, p := range reservedScopePrefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// checkSnapshotStore parses every manifest in STATE/snapshots/snaps and
// checks that every blob is referenced by one (no orphans after the
// start-up cleanup), that every referenced blob is there with the content
// its name says, that no temp files are left, and that `stagefs snapshots`
// lists every snapshot whose manifest is on disk plus those in want.
func checkSnapshotStore(t *testing.T, m *stagefsMount, what string, want []string) {
	t.Helper()
	dir := filepath.Join(m.state, "snapshots")
	refs := map[string]string{} // hash -> a manifest referring to it
	scopes := map[string]bool{}
	ents, err := os.ReadDir(filepath.Join(dir, "snaps"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s: %v", what, err)
	}
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".jsonl") || strings.HasPrefix(name, ".") {
			t.Errorf("%s: leftover %s in snapshots/snaps after start-up", what, name)
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, "snaps", name))
		if err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		if !bytes.HasSuffix(data, []byte("\n")) {
			t.Errorf("%s: manifest %s ends in a torn line after start-up", what, name)
		}
		for i, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
			var l struct {
				ScopeID string `json:"scopeId"`
				Hash    string `json:"hash"`
				Path    string `json:"path"`
			}
			if err := json.Unmarshal([]byte(line), &l); err != nil {
				t.Errorf("%s: manifest %s line %d: %v: %.80q", what, name, i+1, err, line)
				continue
			}
			if i == 0 {
				scopes[l.ScopeID] = true
			}
			if l.Hash != "" {
				refs[l.Hash] = name
			}
		}
	}
	found := map[string]bool{}
	filepath.WalkDir(filepath.Join(dir, "blobs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s: walking blobs: %v", what, err)
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		name := d.Name()
		if strings.HasPrefix(name, ".") {
			t.Errorf("%s: leftover temp file %s in the content store after start-up", what, p)
			return nil
		}
		found[name] = true
		if _, ok := refs[name]; !ok {
			t.Errorf("%s: orphan blob %s: no manifest refers to it", what, name)
		}
		if filepath.Base(filepath.Dir(p)) != name[:min(2, len(name))] {
			t.Errorf("%s: blob %s in the wrong fan-out dir", what, p)
		}
		if b, err := os.ReadFile(p); err != nil || sha256Hex(b) != name {
			t.Errorf("%s: blob %s does not hash to its name (%v)", what, p, err)
		}
		return nil
	})
	for h, man := range refs {
		if !found[h] {
			t.Errorf("%s: manifest %s refers to blob %s, which is missing", what, man, h)
		}
	}
	listed := m.snapshotsByScope()
	for s := range scopes {
		if _, ok := listed[s]; !ok && !isReservedScope(s) {
			t.Errorf("%s: snapshot %s has a manifest but `stagefs snapshots` does not list it", what, s)
		}
	}
	for _, s := range want {
		if _, ok := listed[s]; !ok {
			t.Errorf("%s: snapshot %s is missing from `stagefs snapshots`", what, s)
		}
	}
}

// ---------------------------------------------------------------------------
// Scenario: fsync writers.

func crashWriters(c *crashRun) {
	t := c.t
	c.m = mountStagefs(t, withFiles(map[string]string{"w/": ""}))
	ws := []*writerAcks{newWriterAcks("w/0"), newWriterAcks("w/1"), newWriterAcks("w/2")}
	for k := 0; k < c.kills; k++ {
		for _, w := range ws {
			w.start(t, c.m)
		}
		time.Sleep(c.randDur(50*time.Millisecond, 900*time.Millisecond))
		c.kill()
		for _, w := range ws {
			stopAll(w.proc)
		}
		c.restart()
		for _, w := range ws {
			w.verify(t, c.m, fmt.Sprintf("kill %d", k+1))
		}
		if t.Failed() {
			t.FailNow()
		}
		if k%4 == 3 {
			// Commit now and then, so later records go to files that
			// are committed in the workspace, not only to new ones.
			if cr := c.m.commit(); len(cr.Conflicts)+len(cr.Failed) > 0 {
				t.Errorf("commit: %+v", cr)
			}
		}
	}
	for _, w := range ws {
		c.stats["records"] += w.lastA + 1
		c.stats["creates"] += len(w.created)
		if w.noDirSync {
			c.stats["dirFsyncUnsupported"] = 1
		}
	}
	checkSnapshotStore(t, c.m, "writers", nil)
}

// ---------------------------------------------------------------------------
// Scenario: real tools (tar, git, sqlite3, rm -rf) under an open snapshot.

// crashTarTree writes the tree the tarball holds (x/ with 10 dirs of 20
// files).
func crashTarTree(t *testing.T, root string) {
	for d := 0; d < 10; d++ {
		for f := 0; f < 20; f++ {
			p := filepath.Join(root, "x", fmt.Sprintf("d%02d", d), fmt.Sprintf("f%02d.txt", f))
			os.MkdirAll(filepath.Dir(p), 0o755)
			content := fmt.Sprintf("tar %d/%d\n", d, f) + strings.Repeat(string(rune('A'+(d+f)%26)), (d*131+f*17)%9000)
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// toolsState tracks what the tools have left in the mount across kills.
type toolsState struct {
	dirs map[string]string // tar dir (relative to the mount) -> "complete" or "partial"
}

func (s toolsState) clone() toolsState {
	c := toolsState{dirs: map[string]string{}}
	for k, v := range s.dirs {
		c.dirs[k] = v
	}
	return c
}

// checkTarDir compares a tar target dir with the extracted tree: whole
// when exact, else every file present must be whole (rm only removes) or,
// when partial, a prefix of the file (tar writes sequentially).
func checkTarDir(t *testing.T, mnt, rel string, want tree, bodies map[string]string, exact, partial bool, what string) {
	t.Helper()
	dir := filepath.Join(mnt, rel)
	if _, err := os.Lstat(dir); err != nil {
		if exact {
			t.Errorf("%s: %s: %v", what, rel, err)
		}
		return
	}
	got := snapshot(t, dir)
	if exact {
		assertSameTree(t, what+": "+rel, want, got)
		return
	}
	n := 0
	for p, desc := range got {
		w, ok := want[p]
		switch {
		case p == ".":
		case !ok:
			t.Errorf("%s: %s/%s is not in the tarball", what, rel, p)
		case strings.HasPrefix(w, "dir ") || desc == w:
		case partial && strings.HasPrefix(desc, "file "):
			b, err := os.ReadFile(filepath.Join(dir, p))
			if err != nil || !strings.HasPrefix(bodies[p], string(b)) {
				t.Errorf("%s: %s/%s (half extracted) is not a prefix of its content: %d bytes, %v", what, rel, p, len(b), err)
			}
		default:
			t.Errorf("%s: %s/%s = %s, want %s", what, rel, p, desc, w)
		}
		if n++; n > 2000 {
			break
		}
	}
}

func crashTools(c *crashRun) {
	t := c.t
	for _, tool := range []string{"tar", "git", "sqlite3"} {
		requireTool(t, tool)
	}
	c.m = mountStagefs(t, withFiles(map[string]string{"t/": "", "db/": "", "repo/README": "repo\n"}))
	m := c.m
	// The tarball, and what it extracts to.
	src := filepath.Join(m.base, "tarsrc")
	crashTarTree(t, src)
	tarball := filepath.Join(m.base, "tools.tar")
	mustRun(t, cmdSpec{dir: src}, "tar", "-cf", tarball, "x")
	want := snapshot(t, src)
	bodies := map[string]string{}
	for p, d := range want {
		if strings.HasPrefix(d, "file ") {
			bodies[p] = readFile(t, filepath.Join(src, p))
		}
	}
	// git and sqlite set up in the workspace itself; the tools then work
	// in the mount.
	sh(t, m.ws, `git init -q repo && git -C repo add -A && git -C repo commit -q -m init
sqlite3 db/q.db "CREATE TABLE t(k INTEGER PRIMARY KEY, v BLOB);"
sqlite3 db/w.db "PRAGMA journal_mode=WAL; CREATE TABLE t(k INTEGER PRIMARY KEY, v BLOB);" >/dev/null`)

	st := toolsState{dirs: map[string]string{}}
	var live []string // snapshot scopes not dropped
	for k := 0; k < c.kills; k++ {
		what := fmt.Sprintf("kill %d", k+1)
		restore := k%2 == 1
		var pre tree
		if restore {
			pre = snapshot(t, m.mnt)
		}
		startState := st.clone()
		scope := fmt.Sprintf("tools-%d", k)
		m.mustCLI("snapshot", scope)
		live = append(live, scope)

		var mu sync.Mutex
		var tarDone, rmDone, gitDone []string
		qLast, wLast := -1, -1
		onLine := func(line string) {
			mu.Lock()
			defer mu.Unlock()
			f := strings.Fields(line)
			if len(f) != 2 {
				return
			}
			switch f[0] {
			case "T":
				tarDone = append(tarDone, f[1])
			case "R":
				rmDone = append(rmDone, f[1])
			case "G":
				gitDone = append(gitDone, f[1])
			case "Q":
				n, _ := strconv.Atoi(f[1])
				qLast = n
			case "W":
				n, _ := strconv.Atoi(f[1])
				wLast = n
			}
		}
		var rmList []string
		for d := range st.dirs {
			rmList = append(rmList, d)
		}
		sort.Strings(rmList)
		K := strconv.Itoa(k)
		procs := []*bgProc{
			shellBG(t, "tar", m.mnt, `i=0; while :; do d=t/x-$1-$i; mkdir $d; tar -C $d -xf "$2"; echo "T $d"; i=$((i+1)); done`, onLine, K, tarball),
			shellBG(t, "git", m.mnt, `cd repo; i=0
while :; do echo "$1 $i" > f-$((i % 10)).txt; git add -A; git commit -q -m "k$1 i$i"; h=$(git rev-parse HEAD); echo "G $h"; i=$((i+1)); done`, onLine, K),
			shellBG(t, "sqlite-rollback", m.mnt, `i=0; while :; do n=$(($1*100000+i)); sqlite3 -bail db/q.db "BEGIN; INSERT INTO t VALUES($n, randomblob(1500)); COMMIT;"; echo "Q $n"; i=$((i+1)); done`, onLine, K),
			shellBG(t, "sqlite-wal", m.mnt, `i=0; while :; do n=$(($1*100000+i)); sqlite3 -bail db/w.db "BEGIN; INSERT INTO t VALUES($n, randomblob(1500)); COMMIT;"; echo "W $n"; i=$((i+1)); done`, onLine, K),
		}
		if len(rmList) > 0 {
			procs = append(procs, shellBG(t, "rm", m.mnt, `for d in "$@"; do rm -rf "$d"; echo "R $d"; done`, onLine, rmList...))
		}
		time.Sleep(c.randDur(200*time.Millisecond, 3000*time.Millisecond))
		c.kill()
		stopAll(procs...)
		c.restart()
		checkSnapshotStore(t, m, what+": after restart", live)

		mu.Lock()
		// rm -rf: removed dirs are gone; the one in progress holds only
		// whole files; the others are as they were.
		removed := map[string]bool{}
		for _, d := range rmDone {
			removed[d] = true
			if _, err := os.Lstat(m.in(d)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s: %s was removed by rm -rf (reported) but is there: %v", what, d, err)
			}
			delete(st.dirs, d)
		}
		inRm := ""
		for _, d := range rmList {
			if !removed[d] {
				inRm = d
				break
			}
		}
		for _, d := range rmList {
			if removed[d] {
				continue
			}
			partial := st.dirs[d] == "partial"
			exact := !partial && d != inRm
			checkTarDir(t, m.mnt, d, want, bodies, exact, partial, what+": rm -rf")
			if d == inRm {
				st.dirs[d] = "partial"
			}
		}
		// tar: reported extractions are whole; the one in progress has
		// prefixes only.
		for _, d := range tarDone {
			checkTarDir(t, m.mnt, d, want, bodies, true, false, what+": tar")
			st.dirs[d] = "complete"
		}
		next := fmt.Sprintf("t/x-%d-%d", k, len(tarDone))
		if _, err := os.Lstat(m.in(next)); err == nil {
			checkTarDir(t, m.mnt, next, want, bodies, false, true, what+": tar (interrupted)")
			st.dirs[next] = "partial"
		}
		// git: every reported commit is there and HEAD descends from the
		// last one; the repository checks out.
		repo := m.in("repo")
		for _, h := range gitDone {
			if r := runIn(t, cmdSpec{dir: repo}, "git", "cat-file", "-e", h+"^{commit}"); r.code != 0 {
				t.Errorf("%s: git commit %s (reported) is missing: %s", what, h, r)
			}
		}
		if len(gitDone) > 0 {
			last := gitDone[len(gitDone)-1]
			if r := runIn(t, cmdSpec{dir: repo}, "git", "merge-base", "--is-ancestor", last, "HEAD"); r.code != 0 {
				t.Errorf("%s: HEAD does not descend from the last reported commit %s: %s", what, last, r)
			}
		}
		if r := runIn(t, cmdSpec{dir: repo}, "git", "fsck", "--no-progress", "--no-dangling"); r.code != 0 {
			t.Errorf("%s: git fsck after the kill: %s", what, r)
		}
		// sqlite3: the database checks out and holds every reported
		// transaction.
		for _, db := range []struct {
			file string
			last int
		}{{"db/q.db", qLast}, {"db/w.db", wLast}} {
			lo := k * 100000
			r := runIn(t, cmdSpec{dir: m.mnt}, "sqlite3", "-bail", db.file, fmt.Sprintf("PRAGMA integrity_check; SELECT count(*) FROM t WHERE k BETWEEN %d AND %d;", lo, db.last))
			wantOut := fmt.Sprintf("ok\n%d\n", max(0, db.last-lo+1))
			if r.code != 0 || r.stdout != wantOut {
				t.Errorf("%s: %s after the kill: got %q, want %q (transactions %d..%d reported committed)\n%s", what, db.file, r.stdout, wantOut, lo, db.last, r)
			}
		}
		c.stats["tarDone"] += len(tarDone)
		c.stats["rmDone"] += len(rmDone)
		c.stats["gitCommits"] += len(gitDone)
		c.stats["sqliteTx"] += max(0, qLast-k*100000+1) + max(0, wLast-k*100000+1)
		mu.Unlock()
		if t.Failed() {
			t.FailNow()
		}

		// The tool call's snapshot, interrupted by the kill, closes and
		// restores to exactly the state before it.
		m.mustCLI("close", scope)
		if restore {
			m.restoreScope(scope)
			assertSameTree(t, what+": the mount after restoring "+scope, pre, snapshot(t, m.mnt))
			st = startState
			c.stats["restored"]++
		}
		// Locks a killed git left behind.
		sh(t, m.in("repo"), `find .git -name '*.lock' -delete`)
		if k >= 3 {
			m.mustCLI("drop", live[0])
			live = live[1:]
		}
		if t.Failed() {
			t.FailNow()
		}
	}
}

// ---------------------------------------------------------------------------
// Scenario: a commit killed at a random moment.

func commitContent(g, i int) string {
	return fmt.Sprintf("gen %d file %d\n%s", g, i, strings.Repeat(string(rune('a'+(g+i)%26)), 50+((g*7+i)*113)%6000))
}

// walkCommitTemps lists the commit temp files left in the workspace.
func walkCommitTemps(root string) []string {
	var out []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".stagefs-commit-") {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// stageGeneration stages generation g of c/: every file rewritten, a new
// directory of files, the previous one removed, a file renamed, a mode
// changed. Writes run on 8 goroutines, so their journal syncs are shared.
func stageGeneration(t *testing.T, in func(string) string, g, files int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, files+16)
	work := make(chan int)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := os.WriteFile(in(fmt.Sprintf("c/f%03d", i)), []byte(commitContent(g, i)), 0o644); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := 0; i < files; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("staging generation %d: %v", g, err)
	}
	dir := in(fmt.Sprintf("c/d-%d", g))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for j := 0; j < 10; j++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("x%02d", j)), []byte(commitContent(g, 1000+j)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(in(fmt.Sprintf("c/d-%d", g-1))); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(in(fmt.Sprintf("c/r-%d", g-1)), in(fmt.Sprintf("c/r-%d", g))); err != nil {
		t.Fatal(err)
	}
	mode := os.FileMode(0o644)
	if g%2 == 1 {
		mode = 0o600
	}
	if err := os.Chmod(in("c/f000"), mode); err != nil {
		t.Fatal(err)
	}
}

// commitTree is the workspace the commit and branch scenarios start
// from: files under c/, a renamed file and a directory of ten.
func commitTree(files int) map[string]string {
	tree := map[string]string{"c/r-0": "renamed file\n"}
	for i := 0; i < files; i++ {
		tree[fmt.Sprintf("c/f%03d", i)] = commitContent(0, i)
	}
	for j := 0; j < 10; j++ {
		tree[fmt.Sprintf("c/d-0/x%02d", j)] = commitContent(0, 1000+j)
	}
	return tree
}

func crashCommit(c *crashRun) {
	t := c.t
	const files = 200
	files0 := commitTree(files)
	files0["w/"] = ""
	c.m = mountStagefs(t, withFiles(files0))
	m := c.m
	est := 400 * time.Millisecond // how long a commit takes; updated below
	for g := 1; g <= c.kills; g++ {
		what := fmt.Sprintf("generation %d", g)
		old := snapshot(t, m.inWS("c"))
		stageGeneration(t, m.in, g, files)
		want := snapshot(t, m.in("c"))
		if d := diffTrees(old, want); d == "" {
			t.Fatalf("%s: staging changed nothing", what)
		}
		recoveredBefore := strings.Count(m.daemonLog(), "finished an interrupted commit")

		w := newWriterAcks(fmt.Sprintf("w/%d", g))
		w.start(t, m)
		ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
		commit := startBG(t, "commit", exec.CommandContext(ctx, stagefsBin, "commit", "c", "--json", "-m", m.mnt), nil)
		if c.rng.IntN(5) == 0 {
			time.Sleep(c.randDur(0, 30*time.Millisecond)) // around the start
		} else {
			time.Sleep(c.randDur(0, est*5/4))
		}
		c.kill()
		stopAll(commit, w.proc)
		cancel()
		c.restart()

		if temps := walkCommitTemps(m.ws); len(temps) > 0 {
			t.Errorf("%s: commit temp files left in the workspace after the restart: %v", what, temps)
		}
		got := snapshot(t, m.inWS("c"))
		dNew, dOld := diffTrees(want, got), diffTrees(old, got)
		recovered := strings.Count(m.daemonLog(), "finished an interrupted commit") > recoveredBefore
		switch {
		case dNew == "" && recovered:
			c.stats["finishedAtRestart"]++
			est = est * 6 / 5 // aim later next time
		case dNew == "":
			c.stats["doneBeforeKill"]++
			est = est * 4 / 5
		case dOld == "":
			c.stats["notBegun"]++
			if recovered {
				t.Errorf("%s: the restart finished an interrupted commit, but the workspace is unchanged", what)
			}
		default:
			t.Fatalf("%s: the workspace holds part of the commit after the restart (recovery ran: %v)\nvs the staged view:\n%s\nvs before:\n%s\n%s",
				what, recovered, dNew, dOld, m.daemonLog())
		}
		assertSameTree(t, what+": the mount after the restart", want, snapshot(t, m.in("c")))
		// Inode numbers are unique: two files showing one number are
		// one file to the kernel, which then serves one's pages for the
		// other (a stale inode map did this after commits).
		assertUniqueInos(t, what+": the mount after the restart", m.in("c"))
		pending := 0
		for _, e := range m.status().Entries {
			if e.Path == "c" || strings.HasPrefix(e.Path, "c/") {
				pending++
			}
		}
		if dNew == "" && pending > 0 {
			t.Errorf("%s: the commit is in the workspace but %d entries under c/ are still pending", what, pending)
		}
		if dNew != "" {
			if pending == 0 {
				t.Errorf("%s: nothing pending under c/ and the workspace does not hold the commit", what)
			}
			start := time.Now()
			cr := m.commit("c")
			est = (est + time.Since(start)) / 2
			if len(cr.Conflicts)+len(cr.Failed) > 0 {
				t.Errorf("%s: commit after the restart: %+v", what, cr)
			}
			assertSameTree(t, what+": the workspace after committing again", want, snapshot(t, m.inWS("c")))
		}
		w.verify(t, m, what)
		if t.Failed() {
			t.FailNow()
		}
	}
}

// ---------------------------------------------------------------------------
// Scenario: a tool call's snapshot, killed while it captures and while it
// is restored.

// mutateRestoreArea is one tool call's worth of changes under r/. It stops
// at the first error (the daemon died) and returns it.
func mutateRestoreArea(mnt string, k int) error {
	r := func(p string) string { return filepath.Join(mnt, "r", p) }
	for i := 0; i < 80; i++ {
		if i%3 == 0 {
			continue
		}
		p := r(fmt.Sprintf("f%03d", i))
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := os.WriteFile(p, []byte(commitContent(k+100, i)), 0o644); err != nil {
			return err
		}
	}
	for i := 0; i < 80; i++ {
		if (i+k)%8 == 0 {
			if err := os.Remove(r(fmt.Sprintf("f%03d", i))); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
	}
	for j := 0; j < 10; j++ {
		if err := os.WriteFile(r(fmt.Sprintf("n-%d-%d", k, j)), []byte(commitContent(k, 500+j)), 0o644); err != nil {
			return err
		}
	}
	if err := os.Mkdir(r(fmt.Sprintf("dir-%d", k)), 0o755); err != nil {
		return err
	}
	for j := 0; j < 5; j++ {
		if err := os.WriteFile(r(fmt.Sprintf("dir-%d/x%d", k, j)), []byte(commitContent(k, 600+j)), 0o644); err != nil {
			return err
		}
	}
	if err := os.Rename(r(fmt.Sprintf("f%03d", (k*7+1)%80)), r(fmt.Sprintf("mv-%d", k))); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, i := range []int{5, 17, 29} {
		if err := os.Chmod(r(fmt.Sprintf("f%03d", i)), 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := os.Symlink(fmt.Sprintf("f%03d", k%80), r(fmt.Sprintf("ln-%d", k))); err != nil {
		return err
	}
	return os.RemoveAll(r("sub"))
}

func crashRestore(c *crashRun) {
	t := c.t
	files0 := map[string]string{}
	for i := 0; i < 80; i++ {
		files0[fmt.Sprintf("r/f%03d", i)] = commitContent(0, i)
	}
	for j := 0; j < 10; j++ {
		files0[fmt.Sprintf("r/sub/s%02d", j)] = commitContent(0, 700+j)
	}
	c.m = mountStagefs(t, withFiles(files0))
	m := c.m
	restoreEst, mutateEst := 300*time.Millisecond, 300*time.Millisecond
	var live []string
	for k := 0; k < c.kills; k++ {
		what := fmt.Sprintf("kill %d", k+1)
		pre := snapshot(t, m.in("r"))
		scope := fmt.Sprintf("rs-%d", k)
		m.mustCLI("snapshot", scope)
		live = append(live, scope)
		if k%2 == 0 {
			// Killed while the restore runs.
			start := time.Now()
			if err := mutateRestoreArea(m.mnt, k); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			mutateEst = (mutateEst + time.Since(start)) / 2
			m.mustCLI("close", scope)
			ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
			p := startBG(t, "restore", exec.CommandContext(ctx, stagefsBin, "restore", scope, "--json", "-m", m.mnt), nil)
			time.Sleep(c.randDur(0, restoreEst*5/4))
			c.kill()
			stopAll(p)
			cancel()
			if p.err == nil {
				c.stats["restoreDoneBeforeKill"]++
			} else {
				c.stats["restoreInterrupted"]++
			}
			c.restart()
		} else {
			// Killed while the tool call changes files (captures).
			done := make(chan error, 1)
			go func() { done <- mutateRestoreArea(m.mnt, k) }()
			time.Sleep(c.randDur(0, mutateEst*5/4))
			c.kill()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: the writes did not end after the daemon was killed", what)
			}
			if err == nil {
				c.stats["mutateDoneBeforeKill"]++
			} else {
				c.stats["mutateInterrupted"]++
			}
			c.restart()
			m.mustCLI("close", scope)
		}
		checkSnapshotStore(t, m, what+": after restart", live)
		start := time.Now()
		m.restoreScope(scope)
		restoreEst = (restoreEst + time.Since(start)) / 2
		assertSameTree(t, what+": the mount after restoring "+scope+" again", pre, snapshot(t, m.in("r")))
		if t.Failed() {
			t.Logf("daemon log:\n%s", m.daemonLog())
			t.FailNow()
		}
		// Move on: a change outside any snapshot, sometimes committed,
		// and the oldest snapshots dropped.
		if err := os.WriteFile(m.in(fmt.Sprintf("r/f%03d", (k*11+3)%80)), []byte(commitContent(k+200, 0)), 0o644); err != nil {
			t.Fatal(err)
		}
		if k%3 == 2 {
			if cr := m.commit("r"); len(cr.Conflicts)+len(cr.Failed) > 0 {
				t.Errorf("%s: commit: %+v", what, cr)
			}
		}
		if len(live) > 2 {
			m.mustCLI("drop", live[0])
			live = live[1:]
		}
	}
	checkSnapshotStore(t, m, "restore: at the end", live)
}

// ---------------------------------------------------------------------------
// Scenario: a branch forked and merged back, killed at a random moment of
// the fork or of the merge. A fork is there whole or not at all; a merge
// is in the parent whole or not at all (the restart finishes one begun).

func crashBranch(c *crashRun) {
	t := c.t
	const files = 200
	files0 := commitTree(files)
	c.m = mountStagefs(t, withFiles(files0))
	m := c.m
	forkEst, mergeEst := 100*time.Millisecond, 300*time.Millisecond
	branches := func() map[string]control.BranchInfo {
		var res control.ListBranchesResult
		if err := json.Unmarshal([]byte(m.mustCLI("branches", "--json")), &res); err != nil {
			t.Fatal(err)
		}
		out := map[string]control.BranchInfo{}
		for _, b := range res.Branches {
			out[b.Name] = b
		}
		return out
	}
	for g := 1; g <= c.kills; g++ {
		name := fmt.Sprintf("g%d", g)
		what := fmt.Sprintf("generation %d", g)
		main := snapshot(t, m.in("c"))
		// Killed while it forks. (This found a daemon killed while it
		// mounted the new branch left hung by go-fuse's check of a new
		// mount; the daemon now mounts without it, fusefs/mount.go.)
		if g%2 == 1 {
			ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
			fork := startBG(t, "fork", exec.CommandContext(ctx, stagefsBin, "branch", name, "-m", m.mnt), nil)
			time.Sleep(c.randDur(0, forkEst*5/4))
			c.kill()
			stopAll(fork)
			cancel()
			c.restart()
			if b, ok := branches()[name]; ok {
				c.stats["forkDone"]++
				assertSameTree(t, what+": a fork killed and kept", main, snapshot(t, filepath.Join(b.Mount, "c")))
			} else {
				c.stats["forkNotDone"]++
				if _, err := os.Stat(filepath.Join(m.state, "branches", name)); err == nil {
					t.Fatalf("%s: a fork killed before it was registered left its directory after the restart", what)
				}
			}
		}
		b, ok := branches()[name]
		if !ok {
			start := time.Now()
			m.mustCLI("branch", name)
			forkEst = (forkEst + time.Since(start)) / 2
			b = branches()[name]
		}
		stageGeneration(t, func(p string) string { return filepath.Join(b.Mount, p) }, g, files)
		want := snapshot(t, filepath.Join(b.Mount, "c"))
		recoveredBefore := strings.Count(m.daemonLog(), "finished an interrupted merge")

		ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
		merge := startBG(t, "merge", exec.CommandContext(ctx, stagefsBin, "merge", name, "--json", "-m", m.mnt), nil)
		time.Sleep(c.randDur(0, mergeEst*5/4))
		c.kill()
		stopAll(merge)
		cancel()
		c.restart()

		got := snapshot(t, m.in("c"))
		dNew, dOld := diffTrees(want, got), diffTrees(main, got)
		recovered := strings.Count(m.daemonLog(), "finished an interrupted merge") > recoveredBefore
		switch {
		case dNew == "" && recovered:
			c.stats["mergeFinishedAtRestart"]++
			mergeEst = mergeEst * 6 / 5
		case dNew == "":
			c.stats["mergeDoneBeforeKill"]++
			mergeEst = mergeEst * 4 / 5
		case dOld == "":
			c.stats["mergeNotBegun"]++
			start := time.Now()
			res, r := m.merge(name)
			mergeEst = (mergeEst + time.Since(start)) / 2
			if r.code != 0 || len(res.Conflicts)+len(res.Failed) > 0 {
				t.Fatalf("%s: merge after the restart: %s", what, r)
			}
			assertSameTree(t, what+": the main view after merging again", want, snapshot(t, m.in("c")))
		default:
			t.Fatalf("%s: the main view holds part of the merge after the restart (recovery ran: %v)\nvs the branch:\n%s\nvs before:\n%s\n%s",
				what, recovered, dNew, dOld, m.daemonLog())
		}
		assertSameTree(t, what+": the branch after the restart", want, snapshot(t, filepath.Join(b.Mount, "c")))
		m.mustCLI("branch", "--drop", name)
		if t.Failed() {
			t.FailNow()
		}
	}
}
