package test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stagefs/control"
)

var (
	raceBinOnce sync.Once
	raceBin     string
	raceBinErr  error
)

// stressBinary is the stagefs binary for the stress test: built with the
// race detector when the tests run under it, so a race in the daemon
// shows in its log.
func stressBinary(t *testing.T) string {
	if !raceEnabled {
		return stagefsBin
	}
	raceBinOnce.Do(func() {
		raceBin = filepath.Join(filepath.Dir(stagefsBin), "stagefs-race")
		out, err := exec.Command(goBin, "build", "-race", "-o", raceBin, "../cmd/stagefs").CombinedOutput()
		if err != nil {
			raceBinErr = fmt.Errorf("go build -race: %v\n%s", err, out)
		}
	})
	if raceBinErr != nil {
		t.Fatal(raceBinErr)
	}
	return raceBin
}

// slowLimit is how long any one request may take before the watchdog
// calls the run hung.
const slowLimit = 5 * time.Second

// TestConcurrentControl runs processes that write, rename and delete in
// the mount while control clients commit, discard, snapshot, restore and
// read status and diffs. Every request must answer within slowLimit; at
// the end the merged view, the pending set and the journal agree, a
// restart changes nothing, and a final commit makes the workspace the
// view.
func TestConcurrentControl(t *testing.T) {
	parallel(t)
	files := map[string]string{}
	for d := 0; d < 4; d++ {
		for f := 0; f < 6; f++ {
			files[fmt.Sprintf("d%d/f-%d", d, f)] = fmt.Sprintf("base %d %d\n", d, f)
		}
		files[fmt.Sprintf("d%d/s-0/x", d)] = "in a subdir\n"
	}
	m := mountStagefs(t, withFiles(files), withBinary(stressBinary(t)))
	ctx := context.Background()

	var mu sync.Mutex
	unexpected := map[string]int{}
	outcomes := map[string]int{}
	fail := func(what string) {
		mu.Lock()
		unexpected[what]++
		mu.Unlock()
	}
	count := func(what string) {
		mu.Lock()
		outcomes[what]++
		mu.Unlock()
	}
	// timed runs one request under the watchdog.
	timed := func(what string, f func()) {
		start := time.Now()
		done := make(chan struct{})
		go func() {
			select {
			case <-done:
			case <-time.After(slowLimit):
				fail(fmt.Sprintf("%s: no answer after %v", what, slowLimit))
			}
		}()
		f()
		close(done)
		if d := time.Since(start); d > slowLimit {
			fail(fmt.Sprintf("%s took %v", what, d.Round(time.Millisecond)))
		}
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var fsOps atomic.Int64
	// Processes in the mount: each worker is a shell loop, so the
	// writes come from real processes with their own pids.
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for {
				select {
				case <-stop:
					return
				default:
				}
				d := fmt.Sprintf("d%d", rng.IntN(4))
				a, b := rng.IntN(8), rng.IntN(8)
				var script string
				switch rng.IntN(6) {
				case 0:
					script = fmt.Sprintf("echo w%d >> %s/f-%d", w, d, a)
				case 1:
					script = fmt.Sprintf("printf 'x%%.0s' $(seq %d) > %s/f-%d.tmp && mv %s/f-%d.tmp %s/f-%d", 1+rng.IntN(300), d, a, d, a, d, a)
				case 2:
					script = fmt.Sprintf("mv %s/f-%d %s/f-%d", d, a, d, b)
				case 3:
					script = fmt.Sprintf("rm -f %s/f-%d", d, a)
				case 4:
					script = fmt.Sprintf("mkdir -p %s/s-%d && echo y > %s/s-%d/y && mv %s/s-%d %s/s-%d", d, a, d, a, d, a, d, b)
				case 5:
					script = fmt.Sprintf("rm -rf %s/s-%d", d, a)
				}
				timed("sh: "+script, func() {
					r := runIn(t, cmdSpec{dir: m.mnt}, "sh", "-c", script)
					fsOps.Add(1)
					// Races between workers (a file renamed away
					// under another) are expected; a hang or a crash
					// of the mount is not.
					if r.code != 0 && (strings.Contains(r.stderr, "not connected") || strings.Contains(r.stderr, "Input/output")) {
						fail(fmt.Sprintf("sh %q: %s", script, strings.TrimSpace(r.stderr)))
					}
				})
			}
		}(w)
	}

	// Control clients, each on its own connection.
	client := func(name string, body func(c *control.Client, rng *rand.Rand, i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := m.dial()
			rng := rand.New(rand.NewPCG(uint64(len(name)), uint64(time.Now().UnixNano())))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(time.Duration(20+rng.IntN(80)) * time.Millisecond):
				}
				body(c, rng, i)
			}
		}()
	}
	randomPath := func(rng *rand.Rand) string {
		d := fmt.Sprintf("d%d", rng.IntN(4))
		if rng.IntN(2) == 0 {
			return d
		}
		return fmt.Sprintf("%s/f-%d", d, rng.IntN(8))
	}
	client("commit", func(c *control.Client, rng *rand.Rand, i int) {
		p := randomPath(rng)
		timed("commit "+p, func() {
			res, err := c.Commit(ctx, control.CommitParams{Paths: []string{p}})
			if err != nil {
				fail("commit: " + err.Error())
				return
			}
			count("commit")
			for _, f := range res.Failed {
				if strings.HasPrefix(f.Reason, "busy") || strings.HasPrefix(f.Reason, "a parent directory was not committed") {
					count("commit busy")
					continue
				}
				if nestedRenameFailure(f.Reason) {
					// The README's known limit (rotations of nested
					// directory renames): the paths stay pending, and
					// the final commit must still land.
					count("commit failed: nested rename")
					t.Logf("commit %s: %s: %s", p, f.Path, f.Reason)
					continue
				}
				fail(fmt.Sprintf("commit %s: %s: %s", p, f.Path, f.Reason))
			}
			// Nothing edits the workspace, so a conflict is stagefs
			// misjudging its own earlier partial commits: safe (the
			// path stays pending and the final commit must still
			// succeed) but counted and shown. Known to happen rarely
			// with directories renamed into each other.
			for _, cf := range res.Conflicts {
				count("commit conflict")
				t.Logf("commit %s: conflict at %s: %s", p, cf.Path, cf.Reason)
			}
		})
	})
	client("discard", func(c *control.Client, rng *rand.Rand, i int) {
		if rng.IntN(3) != 0 {
			return
		}
		p := randomPath(rng)
		timed("discard "+p, func() {
			if _, err := c.Discard(ctx, []string{p}); err != nil {
				fail("discard: " + err.Error())
			}
			count("discard")
		})
	})
	client("status", func(c *control.Client, rng *rand.Rand, i int) {
		timed("status+diff", func() {
			if _, err := c.Status(ctx, nil); err != nil {
				fail("status: " + err.Error())
			}
			if _, err := c.Diff(ctx, nil); err != nil {
				fail("diff: " + err.Error())
			}
			count("status+diff")
		})
	})
	// Snapshots through the CLI: open with a path, close, restore.
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			scope := fmt.Sprintf("call-%d", i)
			p := randomPath(rng)
			steps := [][]string{{"snapshot", scope, p}, {"close", scope}, {"restore", scope}}
			for _, args := range steps {
				timed(strings.Join(args, " "), func() {
					r := m.cli(args...)
					switch {
					case r.code == 0:
						count(args[0])
					case r.code == exitConflictCode && args[0] == "restore":
						count("restore with conflicts")
					default:
						fail(fmt.Sprintf("stagefs %s: exit %d: %s", strings.Join(args, " "), r.code, strings.TrimSpace(r.stderr)))
					}
				})
			}
		}
	}()

	time.Sleep(6 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d shell commands in the mount; requests: %v", fsOps.Load(), outcomes)
	for what, n := range unexpected {
		t.Errorf("%d× %s", n, what)
	}
	if outcomes["commit"] == 0 || outcomes["restore"]+outcomes["restore with conflicts"] == 0 || outcomes["discard"] == 0 {
		t.Errorf("the clients did not get through: %v", outcomes)
	}

	checkAgreement(t, m)
	if log := m.daemonLog(); strings.Contains(log, "DATA RACE") || strings.Contains(log, "panic") {
		t.Errorf("the daemon log reports a race or a panic:\n%s", log)
	}
}

// nestedRenameFailure reports a commit failure of the known family in the
// README's limits: after rotations of nested directory renames, a partial
// commit can ask the workspace to move a directory onto a sibling that an
// earlier partial commit has not emptied yet (seen once in CI, 2026-11-26:
// "rename d0/s-5 to d0/s-7 in the workspace: directory not empty"), with
// the follow-on "the directory rename to d0/s-7 was not committed" for its
// source. (A directory renamed into its own former child, which failed with
// EINVAL, is committed since 2026-11-26 and fails this test again.)
func nestedRenameFailure(reason string) bool {
	if strings.HasPrefix(reason, "the directory rename to ") && strings.HasSuffix(reason, " was not committed") {
		return true
	}
	old, rest, ok := strings.Cut(strings.TrimPrefix(reason, "rename "), " to ")
	if !ok || !strings.HasPrefix(reason, "rename ") {
		return false
	}
	newp, _, ok := strings.Cut(rest, " in the workspace: directory not empty")
	return ok && filepath.Dir(newp) == filepath.Dir(old)
}

// exitConflictCode is the CLI's exit status for conflicts (see README).
const exitConflictCode = 3

// checkAgreement checks that the merged view, the pending set and the
// journal tell the same story, before and after a restart, and that a
// commit of everything makes the workspace equal the view.
func checkAgreement(t *testing.T, m *stagefsMount) {
	t.Helper()
	view := snapshot(t, m.mnt)
	ws := snapshot(t, m.ws)
	st := m.status()
	pending := map[string]string{}
	for _, e := range st.Entries {
		pending[e.Path] = e.Kind
		if e.From != "" {
			pending[e.From] = "rename source"
		}
	}
	covered := func(p string) bool {
		for q := p; ; q = filepath.Dir(q) {
			if _, ok := pending[q]; ok {
				return true
			}
			if q == "." || q == "/" {
				return false
			}
		}
	}
	// Every difference between the view and the workspace is pending.
	var diffs []string
	for p, v := range view {
		if ws[p] != v {
			diffs = append(diffs, p)
		}
	}
	for p := range ws {
		if _, ok := view[p]; !ok {
			diffs = append(diffs, p)
		}
	}
	sort.Strings(diffs)
	for _, p := range diffs {
		if p != "." && !covered(p) {
			t.Errorf("the view and the workspace differ at %s (view %q, workspace %q) but status lists nothing there", p, view[p], ws[p])
		}
	}
	// Every pending path shows its kind in the view.
	for p, kind := range pending {
		_, inView := view[p]
		switch kind {
		case "delete", "rmdir", "rename source":
			if inView && kind != "rename source" {
				t.Errorf("status says %s is a %s, but the view shows %s", p, kind, view[p])
			}
		case "write", "create", "mkdir", "symlink":
			if !inView {
				t.Errorf("status says %s is a %s, but the view does not show it", p, kind)
			}
		}
	}
	// The journal is readable, in order, and names every pending path.
	r := m.cli("log", "--json")
	if r.code != 0 {
		t.Fatalf("stagefs log: %s", r)
	}
	var lr control.LogResult
	if err := json.Unmarshal([]byte(r.stdout), &lr); err != nil {
		t.Fatalf("log --json: %v", err)
	}
	journaled := map[string]bool{}
	var last uint64
	for _, rec := range lr.Records {
		if rec.Seq <= last {
			t.Errorf("journal sequence goes from %d to %d", last, rec.Seq)
		}
		last = rec.Seq
		journaled[rec.Path], journaled[rec.Path2] = true, true
	}
	for p := range pending {
		if !journaledAt(journaled, p) {
			t.Errorf("pending %s (%s) has no journal record", p, pending[p])
		}
	}

	// A restart: the pending set on disk is the one in memory.
	m.unmount()
	m.mount()
	assertSameTree(t, "the view after a restart", view, snapshot(t, m.mnt))
	if again := m.status(); again.PendingCount != st.PendingCount {
		t.Errorf("pending after a restart: %d, before: %d", again.PendingCount, st.PendingCount)
	}
	cr := m.commit()
	if len(cr.Conflicts)+len(cr.Failed) > 0 {
		t.Errorf("final commit: %+v", cr)
	}
	assertSameTree(t, "the workspace after the final commit vs the view", view, snapshot(t, m.ws))
	if t.Failed() {
		t.Logf("status before the restart: %+v", st.Entries)
		t.Logf("final commit: %+v", cr)
		t.Logf("journal:\n%s", m.cli("log").stdout)
	}
	if n := m.status().PendingCount; n != 0 {
		t.Errorf("%d pending after the final commit", n)
	}
}

// journaledAt reports whether a record names p, a directory above it (a
// renamed directory carries its entries to the new name) or a path below
// it (a directory's entry is implied by its children's records).
func journaledAt(journaled map[string]bool, p string) bool {
	for q := p; q != "." && q != "/"; q = filepath.Dir(q) {
		if journaled[q] {
			return true
		}
	}
	for q := range journaled {
		if strings.HasPrefix(q, p+"/") {
			return true
		}
	}
	return false
}
