package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"stagefs/control"
)

// Issue 3: the conflict's hashes, fs/read_text and fs/safe_text_patch,
// against a real mount, through the CLI and the Go client.

// A path whose workspace copy changed behind its staged copy is a
// conflict that carries both contents' hashes, stays pending, and is
// committed by --force.
func TestConflictReportsBothHashes(t *testing.T) {
	parallel(t)
	const base, staged, user = "base\n", "staged in the mount\n", "edited in the workspace\n"
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": base, "ok.txt": "ok\n"}))
	if err := os.WriteFile(m.in("f.txt"), []byte(staged), 0o644); err != nil {
		t.Fatal(err)
	}
	// Someone edits the real workspace behind the staged path.
	if err := os.WriteFile(m.inWS("f.txt"), []byte(user), 0o644); err != nil {
		t.Fatal(err)
	}
	wantWS, wantStaged := contentHash([]byte(user)), contentHash([]byte(staged))

	check := func(what string, cr control.CommitResult) {
		t.Helper()
		if len(cr.Conflicts) != 1 || cr.Conflicts[0].Path != "f.txt" {
			t.Fatalf("%s: conflicts = %+v, want one on f.txt", what, cr.Conflicts)
		}
		c := cr.Conflicts[0]
		if c.WorkspaceHash != wantWS {
			t.Errorf("%s: workspaceHash = %q, want sha256 of the workspace's content %q", what, c.WorkspaceHash, wantWS)
		}
		if c.StagedHash != wantStaged {
			t.Errorf("%s: stagedHash = %q, want sha256 of the staged content %q", what, c.StagedHash, wantStaged)
		}
		if c.Reason == "" {
			t.Errorf("%s: conflict without a reason: %+v", what, c)
		}
		if contains(cr.Committed, "f.txt") {
			t.Errorf("%s: f.txt listed as committed too: %v", what, cr.Committed)
		}
		assertFile(t, m.inWS("f.txt"), user)
		assertFile(t, m.in("f.txt"), staged)
		if k := statusKinds(m.status()); k["f.txt"] != "write" {
			t.Errorf("%s: f.txt not pending after the conflict: %v", what, k)
		}
	}

	// CLI, --json: exit 3 and the result on stdout.
	r := m.cli("commit", "--json", "f.txt")
	if r.code != 3 {
		t.Errorf("commit --json with a conflict: exit %d, want 3\n%s", r.code, r)
	}
	var cr control.CommitResult
	if err := json.Unmarshal([]byte(r.stdout), &cr); err != nil {
		t.Fatalf("commit --json: %v\n%s", err, r)
	}
	check("stagefs commit --json", cr)
	// The raw JSON names the fields as the protocol documents them.
	var raw struct {
		Conflicts []map[string]any `json:"conflicts"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil || len(raw.Conflicts) != 1 ||
		raw.Conflicts[0]["workspaceHash"] != wantWS || raw.Conflicts[0]["stagedHash"] != wantStaged {
		t.Errorf("commit --json conflict object = %v, %v; want workspaceHash and stagedHash", raw.Conflicts, err)
	}

	// Human output shows both hashes.
	r = m.cli("commit", "f.txt")
	if r.code != 3 || !strings.Contains(r.stdout, wantWS) || !strings.Contains(r.stdout, wantStaged) {
		t.Errorf("stagefs commit (human) does not show both hashes (exit %d, want 3):\n%s", r.code, r)
	}

	// Go client, committing everything: ok.txt is not involved, and the
	// conflict on f.txt does not stop other paths.
	if err := os.WriteFile(m.in("ok.txt"), []byte("ok2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	c := m.dial()
	cr, err := c.Commit(ctx, control.CommitParams{})
	if err != nil {
		t.Fatalf("client commit: %v", err)
	}
	check("client commit", cr)
	if !contains(cr.Committed, "ok.txt") {
		t.Errorf("client commit: committed = %v, want ok.txt", cr.Committed)
	}
	assertFile(t, m.inWS("ok.txt"), "ok2\n")

	// The hashes follow the workspace: a second edit there changes
	// workspaceHash, not stagedHash.
	const user2 = "edited again\n"
	if err := os.WriteFile(m.inWS("f.txt"), []byte(user2), 0o644); err != nil {
		t.Fatal(err)
	}
	wantWS = contentHash([]byte(user2))
	user2Check := func() {
		cr, err := c.Commit(ctx, control.CommitParams{Paths: []string{"f.txt"}})
		if err != nil {
			t.Fatalf("client commit f.txt: %v", err)
		}
		if len(cr.Conflicts) != 1 || cr.Conflicts[0].WorkspaceHash != wantWS || cr.Conflicts[0].StagedHash != wantStaged {
			t.Errorf("after a second workspace edit: conflicts = %+v, want workspaceHash %s, stagedHash %s", cr.Conflicts, wantWS, wantStaged)
		}
	}
	user2Check()
	assertFile(t, m.inWS("f.txt"), user2)

	// --force commits the staged content.
	r = m.cli("commit", "--json", "--force", "f.txt")
	if r.code != 0 {
		t.Fatalf("commit --force: %s", r)
	}
	if err := json.Unmarshal([]byte(r.stdout), &cr); err != nil {
		t.Fatalf("commit --force --json: %v\n%s", err, r)
	}
	if !contains(cr.Committed, "f.txt") || len(cr.Conflicts) != 0 {
		t.Errorf("commit --force = %+v, want f.txt committed, no conflicts", cr)
	}
	assertFile(t, m.inWS("f.txt"), staged)
	assertFile(t, m.in("f.txt"), staged)
	assertNothingPending(t, m, "after commit --force")
}

// fs/read_text: non-UTF-8 content is a clear error (CLI and client), a
// missing path is exists=false.
func TestReadTextNonUTF8AndMissing(t *testing.T) {
	parallel(t)
	bin := []byte("text\xff\xfe then \xc3\x28 bad\n") // invalid UTF-8 sequences
	m := mountStagefs(t, withFiles(map[string]string{"bin.dat": string(bin), "ok.txt": "héllo\n"}))
	// One in the workspace, one staged through the mount.
	staged := []byte{0x80, 0x81, 'x', '\n'}
	if err := os.WriteFile(m.in("staged.dat"), staged, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	c := m.dial()

	for _, p := range []string{"bin.dat", "staged.dat"} {
		_, err := c.ReadText(ctx, p)
		if err == nil {
			t.Errorf("client read_text %s: no error for non-UTF-8 content", p)
		} else {
			msg := err.Error()
			if !strings.Contains(msg, "UTF-8") || !strings.Contains(msg, p) {
				t.Errorf("client read_text %s: error %q does not say the file is not UTF-8 text", p, msg)
			}
			var ce *control.Error
			if !errors.As(err, &ce) {
				t.Errorf("client read_text %s: %T %v, want a JSON-RPC error", p, err, err)
			}
		}
		for _, args := range [][]string{{"read", p}, {"read", "--json", p}} {
			r := m.cli(args...)
			if r.code != 1 || !strings.Contains(r.stderr, "UTF-8") || !strings.Contains(r.stderr, p) {
				t.Errorf("stagefs %s: want exit 1 and an error naming the path and UTF-8:\n%s", strings.Join(args, " "), r)
			}
			if r.stdout != "" {
				t.Errorf("stagefs %s printed content for non-UTF-8 data: %q", strings.Join(args, " "), r.stdout)
			}
		}
	}
	// The bytes themselves are intact in the mount.
	assertFile(t, m.in("bin.dat"), string(bin))
	assertFile(t, m.in("staged.dat"), string(staged))

	// Valid UTF-8 beyond ASCII is text.
	rt, err := c.ReadText(ctx, "ok.txt")
	if err != nil || rt.Content != "héllo\n" || rt.SHA256 != contentHash([]byte("héllo\n")) || rt.Size != int64(len("héllo\n")) {
		t.Errorf("read_text ok.txt = %+v, %v", rt, err)
	}

	// Missing: exists=false, no error, no content.
	for _, p := range []string{"missing.txt", "no/such/dir.txt"} {
		rt, err := c.ReadText(ctx, p)
		if err != nil || rt.Exists || rt.Content != "" || rt.SHA256 != "" {
			t.Errorf("client read_text %s = %+v, %v; want exists=false", p, rt, err)
		}
		r := m.cli("read", "--json", p)
		var res map[string]any
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil {
			t.Errorf("stagefs read --json %s: want exit 0 with JSON: %s", p, r)
		} else if ex, ok := res["exists"]; !ok || ex != false {
			t.Errorf("stagefs read --json %s: exists = %v (present %v), want false", p, ex, ok)
		}
	}
	// A file deleted in the mount is missing too, though the workspace has it.
	if err := os.Remove(m.in("ok.txt")); err != nil {
		t.Fatal(err)
	}
	if rt, err := c.ReadText(ctx, "ok.txt"); err != nil || rt.Exists {
		t.Errorf("read_text of a file deleted in the mount = %+v, %v; want exists=false", rt, err)
	}
}

// fs/safe_text_patch: applied, stale_base, no_op, through the client and
// the CLI (content on stdin).
func TestSafeTextPatchResults(t *testing.T) {
	parallel(t)
	const v1 = "line one\nline two\n"
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": v1, "g.txt": "g\n"}))
	wsBefore := snapshot(t, m.ws)
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	c := m.dial()
	readFile(t, m.in("f.txt")) // have the kernel cache the old content

	// no_op on an untouched file: same content, right hash; nothing staged.
	same := v1
	res, err := c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "f.txt", ExpectedHash: contentHash([]byte(v1)), Content: &same})
	if err != nil || res.Result != control.PatchNoOp || res.SHA256 != contentHash([]byte(v1)) || res.Size != int64(len(v1)) {
		t.Errorf("patch with unchanged content = %+v, %v; want no_op with the current hash", res, err)
	}
	if k := statusKinds(m.status()); len(k) != 0 {
		t.Errorf("a no_op patch staged something: %v", k)
	}
	// An edit that changes nothing is a no_op too.
	res, err = c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "f.txt", ExpectedHash: contentHash([]byte(v1)),
		Edits: []control.TextEdit{{OldText: "two", NewText: "two"}}})
	if err != nil || res.Result != control.PatchNoOp {
		t.Errorf("patch with an identity edit = %+v, %v; want no_op", res, err)
	}

	// stale_base: a wrong expected hash, the file unchanged.
	v2 := "line one\nline 2\n"
	res, err = c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "f.txt", ExpectedHash: contentHash([]byte("line one\n")), Content: &v2})
	if err != nil || res.Result != control.PatchStaleBase || res.SHA256 != contentHash([]byte(v1)) {
		t.Errorf("patch with a wrong hash = %+v, %v; want stale_base reporting the current hash", res, err)
	}
	assertFile(t, m.in("f.txt"), v1)
	if rt, err := c.ReadText(ctx, "f.txt"); err != nil || rt.Content != v1 {
		t.Errorf("read_text after stale_base = %+v, %v", rt, err)
	}
	if k := statusKinds(m.status()); len(k) != 0 {
		t.Errorf("a stale_base patch staged something: %v", k)
	}
	// Expecting a new file where one exists is stale too.
	res, err = c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "f.txt", ExpectedHash: "", Content: &v2})
	if err != nil || res.Result != control.PatchStaleBase {
		t.Errorf("patch expecting no file over f.txt = %+v, %v; want stale_base", res, err)
	}
	assertFile(t, m.in("f.txt"), v1)

	// applied: the right hash.
	res, err = c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "f.txt", ExpectedHash: contentHash([]byte(v1)), Content: &v2})
	if err != nil || res.Result != control.PatchApplied || res.SHA256 != contentHash([]byte(v2)) || res.Size != int64(len(v2)) {
		t.Errorf("patch with the right hash = %+v, %v; want applied with the new hash", res, err)
	}
	assertFile(t, m.in("f.txt"), v2)
	if k := statusKinds(m.status()); k["f.txt"] != "write" {
		t.Errorf("after an applied patch: pending %v, want f.txt write", k)
	}
	// The old hash is stale now, and changes nothing.
	v3 := "line one\nline three\n"
	res, err = c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "f.txt", ExpectedHash: contentHash([]byte(v1)), Content: &v3})
	if err != nil || res.Result != control.PatchStaleBase || res.SHA256 != contentHash([]byte(v2)) {
		t.Errorf("patch against the replaced content = %+v, %v; want stale_base", res, err)
	}
	assertFile(t, m.in("f.txt"), v2)
	// no_op on a staged file.
	res, err = c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "f.txt", ExpectedHash: contentHash([]byte(v2)), Content: &v2})
	if err != nil || res.Result != control.PatchNoOp || res.SHA256 != contentHash([]byte(v2)) {
		t.Errorf("patch of a staged file with its own content = %+v, %v; want no_op", res, err)
	}

	// The CLI: new content on stdin, exit 0 for applied and no_op, 3 for
	// stale_base.
	cliPatch := func(path, expect, content string) (control.SafeTextPatchResult, result) {
		t.Helper()
		if expect == "" {
			expect = "none"
		}
		r := runIn(t, cmdSpec{stdin: content}, stagefsBin, "patch", "--json", path, "--expect", expect, "-m", m.mnt)
		var pr control.SafeTextPatchResult
		if err := json.Unmarshal([]byte(r.stdout), &pr); err != nil {
			t.Fatalf("stagefs patch --json %s: %v\n%s", path, err, r)
		}
		return pr, r
	}
	if pr, r := cliPatch("f.txt", contentHash([]byte(v1)), v3); r.code != 3 || pr.Result != control.PatchStaleBase || pr.SHA256 != contentHash([]byte(v2)) {
		t.Errorf("stagefs patch with a stale hash: %+v\n%s", pr, r)
	}
	assertFile(t, m.in("f.txt"), v2)
	if pr, r := cliPatch("f.txt", contentHash([]byte(v2)), v3); r.code != 0 || pr.Result != control.PatchApplied || pr.SHA256 != contentHash([]byte(v3)) {
		t.Errorf("stagefs patch with the right hash: %+v\n%s", pr, r)
	}
	assertFile(t, m.in("f.txt"), v3)
	if pr, r := cliPatch("f.txt", contentHash([]byte(v3)), v3); r.code != 0 || pr.Result != control.PatchNoOp {
		t.Errorf("stagefs patch with the same content: %+v\n%s", pr, r)
	}
	// The bare hex form of the hash is accepted as well.
	if pr, r := cliPatch("g.txt", sha256Hex([]byte("g\n")), "g2\n"); r.code != 0 || pr.Result != control.PatchApplied {
		t.Errorf("stagefs patch --expect with a bare hex hash: %+v\n%s", pr, r)
	}
	assertFile(t, m.in("g.txt"), "g2\n")
	// A process in the mount sees the patched content at once.
	if got := sh(t, m.mnt, "cat f.txt g.txt"); got != v3+"g2\n" {
		t.Errorf("cat in the mount after patches = %q", got)
	}
	assertSameTree(t, "workspace after patches (nothing committed)", wsBefore, snapshot(t, m.ws))
}

// fs/safe_text_patch is atomic against a writer in the mount and other
// socket clients. A shell in the mount appends numbered lines to a file
// (each `>>` opens, writes and closes; a short pause every few lines
// leaves the file closed now and then), while two clients loop: read the
// file, then patch it to what they read plus a line of their own, with the
// hash of what they read. Every change keeps what was there, so if each
// patch's check and write are atomic the file's history is append-only:
//   - every line the shell appended is in the final file, once, in order
//     (a patch that read an older version and wrote over a newer one would
//     drop an append);
//   - every applied patch's line is there once, and no other patch's;
//   - every content a patch produced, and every hash a patch reported, is
//     that of a prefix of the final file.
func TestSafeTextPatchAtomicAgainstMountWriters(t *testing.T) {
	parallel(t)
	const base = "base\n"
	const appends = 400
	m := mountStagefs(t, withFiles(map[string]string{"log.txt": base}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*cmdTimeout)
	defer cancel()

	type patchRec struct {
		id      string
		read    string // content read before the patch
		result  string // applied, stale_base, no_op, or "busy"/"error: ..."
		gotHash string // sha256 the patch reported
	}
	var (
		mu      sync.Mutex
		patches []patchRec
		// Hashes the patches reported. Those of the reads are not
		// checked here: read_text does not hold the engine lock, see
		// TestReadTextNotTornByConcurrentPatch.
		seen = map[string]bool{}
	)

	cmd := exec.CommandContext(ctx, "sh", "-ec", fmt.Sprintf(
		`i=0; while [ $i -lt %d ]; do i=$((i+1)); echo "A$i" >> log.txt; [ $((i %% 4)) -ne 0 ] || sleep 0.002; done; echo "done $i"`, appends))
	cmd.Dir = m.mnt
	cmd.Env = baseEnv()
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	writerDone := make(chan error, 1)
	go func() { writerDone <- cmd.Wait() }()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		c := m.dial()
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				rt, err := c.ReadText(ctx, "log.txt")
				if err != nil {
					mu.Lock()
					patches = append(patches, patchRec{id: "read", result: "error: " + err.Error()})
					mu.Unlock()
					return
				}
				id := fmt.Sprintf("P%d.%d", w, k)
				next := rt.Content + id + "\n"
				res, err := c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "log.txt", ExpectedHash: rt.SHA256, Content: &next})
				rec := patchRec{id: id, read: rt.Content, result: res.Result, gotHash: res.SHA256}
				if control.IsCode(err, control.CodeBusy) {
					rec.result = "busy"
				} else if err != nil {
					rec.result = "error: " + err.Error()
				}
				mu.Lock()
				patches = append(patches, rec)
				if res.SHA256 != "" {
					seen[res.SHA256] = true
				}
				mu.Unlock()
				if rec.result != control.PatchApplied {
					time.Sleep(time.Millisecond) // let the writer on
				}
			}
		}(w)
	}
	var werr error
	select {
	case werr = <-writerDone:
	case <-time.After(2 * cmdTimeout):
		t.Fatal("the appending shell did not finish")
	}
	close(stop)
	wg.Wait()
	if werr != nil || !strings.Contains(out.String(), fmt.Sprintf("done %d", appends)) {
		t.Fatalf("the appending shell failed: %v\n%s", werr, out.String())
	}

	final := readFile(t, m.in("log.txt"))
	c := m.dial()
	rt, err := c.ReadText(ctx, "log.txt")
	if err != nil || rt.Content != final || rt.SHA256 != contentHash([]byte(final)) {
		t.Fatalf("read_text disagrees with the mount at the end: %v\nmount:\n%q\nread_text:\n%q", err, final, rt.Content)
	}

	counts := map[string]int{}
	for _, r := range patches {
		key := r.result
		if strings.HasPrefix(key, "error: ") {
			t.Errorf("patch %s: %s", r.id, r.result)
			key = "error"
		}
		counts[key]++
	}
	t.Logf("%d appends; patches: %v", appends, counts)

	// The final file: base, then A1..An in order, with the applied
	// patches' lines in between, each once.
	if !strings.HasPrefix(final, base) || !strings.HasSuffix(final, "\n") {
		t.Fatalf("final file does not start with the base line or end with a newline:\n%q", final)
	}
	lines := strings.Split(strings.TrimSuffix(strings.TrimPrefix(final, base), "\n"), "\n")
	applied := map[string]bool{}
	for _, r := range patches {
		if r.result == control.PatchApplied {
			applied[r.id] = true
		}
	}
	nextA := 1
	seenP := map[string]int{}
	interleaved := 0
	prevKind := byte('A')
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "A"):
			if l != fmt.Sprintf("A%d", nextA) {
				t.Fatalf("line %d of the final file is %q, want A%d: an append was lost, repeated or reordered\n%s", i+2, l, nextA, final)
			}
			nextA++
		case strings.HasPrefix(l, "P"):
			seenP[l]++
			if !applied[l] {
				t.Errorf("line %q is in the file, but that patch was not reported applied", l)
			}
		default:
			t.Fatalf("line %d of the final file is %q: not an append, not a patch\n%q", i+2, l, final)
		}
		if l[0] != prevKind {
			interleaved++
			prevKind = l[0]
		}
	}
	if nextA != appends+1 {
		t.Errorf("the final file holds appends A1..A%d, want A1..A%d", nextA-1, appends)
	}
	for id := range applied {
		if seenP[id] != 1 {
			t.Errorf("applied patch %s is in the final file %d times, want once", id, seenP[id])
		}
	}

	// Every applied patch produced a prefix of the final file, and
	// reported that content's hash; every hash seen is a prefix's.
	prefixHashes := map[string]bool{}
	for i := 0; i <= len(final); i++ {
		if i == 0 || final[i-1] == '\n' {
			prefixHashes[contentHash([]byte(final[:i]))] = true
		}
	}
	for _, r := range patches {
		if r.result != control.PatchApplied {
			continue
		}
		wrote := r.read + r.id + "\n"
		if !strings.HasPrefix(final, wrote) {
			t.Errorf("applied patch %s wrote a content that is not a prefix of the final file: something it replaced was not what it read, or a later write was lost\nwrote:\n%q", r.id, wrote)
		}
		if r.gotHash != contentHash([]byte(wrote)) {
			t.Errorf("applied patch %s reported %s, want the hash of what it wrote", r.id, r.gotHash)
		}
	}
	for h := range seen {
		if !prefixHashes[h] {
			t.Errorf("hash %s was reported by a patch but is no state of the file's append-only history", h)
		}
	}
	for _, r := range patches {
		if r.result == control.PatchStaleBase && r.gotHash == contentHash([]byte(r.read)) {
			t.Errorf("patch %s was stale_base but reported the very hash it expected", r.id)
		}
	}

	// The test proves something only if patches and appends did mix.
	if len(applied) < 3 || interleaved < 4 {
		t.Fatalf("too little interleaving to test atomicity: %d patches applied, %d switches between appends and patches", len(applied), interleaved)
	}
}

// fs/read_text of a file that another socket client is patching returns
// one of the file's contents, before or after the patch, never a mix:
// the patch is atomic against other socket clients. One client swaps a
// 64 KiB file between two contents with safe_text_patch while another
// reads it with read_text; every read must be one of the two.
func TestReadTextNotTornByConcurrentPatch(t *testing.T) {
	parallel(t)
	x := strings.Repeat("x-line of the first version\n", 64<<10/28)
	y := strings.Repeat("y-line of the other version\n", 64<<10/28)
	m := mountStagefs(t, withFiles(map[string]string{"big.txt": x}))
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	patcher, reader := m.dial(), m.dial()
	valid := map[string]string{contentHash([]byte(x)): "x", contentHash([]byte(y)): "y"}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var patchErr error
	swaps := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		cur, next := x, y
		for {
			select {
			case <-stop:
				return
			default:
			}
			n := next
			res, err := patcher.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "big.txt", ExpectedHash: contentHash([]byte(cur)), Content: &n})
			if err != nil || res.Result != control.PatchApplied {
				patchErr = fmt.Errorf("swap %d: %+v, %v", swaps, res, err)
				return
			}
			swaps++
			cur, next = next, cur
		}
	}()
	reads, torn := 0, 0
	var example string
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		rt, err := reader.ReadText(ctx, "big.txt")
		if err != nil {
			t.Errorf("read_text: %v", err)
			break
		}
		reads++
		if rt.SHA256 != contentHash([]byte(rt.Content)) {
			t.Errorf("read_text reported %s for a content whose hash is %s", rt.SHA256, contentHash([]byte(rt.Content)))
		}
		if valid[rt.SHA256] == "" {
			torn++
			if example == "" {
				example = fmt.Sprintf("%d bytes (both versions have %d) holding %d x-lines and %d y-lines",
					len(rt.Content), len(x), strings.Count(rt.Content, "x-line"), strings.Count(rt.Content, "y-line"))
			}
		}
	}
	close(stop)
	wg.Wait()
	if patchErr != nil {
		t.Fatalf("patcher: %v", patchErr)
	}
	t.Logf("%d swaps, %d reads, %d torn", swaps, reads, torn)
	if swaps < 10 || reads < 10 {
		t.Fatalf("too few swaps (%d) or reads (%d) to test anything", swaps, reads)
	}
	if torn > 0 {
		t.Errorf("%d of %d read_text calls returned a content that the file never had, e.g. %s", torn, reads, example)
	}
}

// The text methods never follow a symlink (its target may be outside the
// workspace): reading or patching one is a clear invalid-params error,
// not an internal one.
func TestTextMethodsRefuseASymlinkClearly(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"real.txt": "hi\n"}), withSymlink("link.txt", "real.txt"))
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	c := m.dial()
	_, err := c.ReadText(ctx, "link.txt")
	var ce *control.Error
	if !errors.As(err, &ce) || ce.Code != control.CodeInvalidParams || !strings.Contains(ce.Message, "symbolic link") {
		t.Fatalf("read_text of a symlink: %v, want -32602 saying it is a symbolic link", err)
	}
	content := "changed\n"
	_, err = c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "link.txt", ExpectedHash: contentHash([]byte("hi\n")), Content: &content})
	if !errors.As(err, &ce) || ce.Code != control.CodeInvalidParams || !strings.Contains(ce.Message, "link.txt") {
		t.Fatalf("safe_text_patch of a symlink: %v, want -32602 naming it", err)
	}
	assertFile(t, m.in("real.txt"), "hi\n")
	assertFile(t, m.inWS("real.txt"), "hi\n")
}
