package test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"stagefs/control"
)

func TestControlProtocol(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "one\n", "g.txt": "g\n"}))
	before := snapshot(t, m.ws)
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	c := m.dial()

	init, err := c.Initialize(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if init.Mode != control.ModeStaged || init.Workspace != m.ws || init.Mount != m.mnt || init.SessionID == "" {
		t.Errorf("initialize = %+v", init)
	}

	// ReadText returns the view and its sha256.
	rt, err := c.ReadText(ctx, "f.txt")
	if err != nil {
		t.Fatal(err)
	}
	if !rt.Exists || rt.Content != "one\n" || rt.SHA256 != contentHash([]byte("one\n")) || rt.Size != 4 {
		t.Errorf("read_text f.txt = %+v", rt)
	}
	if rt, err := c.ReadText(ctx, "nope.txt"); err != nil || rt.Exists {
		t.Errorf("read_text of a missing file = %+v, %v; want exists=false", rt, err)
	}
	// Absolute paths under the mount and under the workspace are accepted.
	for _, p := range []string{m.in("f.txt"), m.inWS("f.txt")} {
		if rt, err := c.ReadText(ctx, p); err != nil || rt.Path != "f.txt" || rt.Content != "one\n" {
			t.Errorf("read_text %s = %+v, %v", p, rt, err)
		}
	}
	readFile(t, m.in("f.txt")) // let the kernel cache the old content

	// SafeTextPatch: a wrong hash is stale_base and changes nothing.
	two := "two\n"
	res, err := c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "f.txt", ExpectedHash: contentHash([]byte("not it")), Content: &two})
	if err != nil {
		t.Fatal(err)
	}
	if res.Result != control.PatchStaleBase || res.SHA256 != rt.SHA256 {
		t.Errorf("patch with a wrong hash = %+v, want stale_base with the current hash", res)
	}
	assertFile(t, m.in("f.txt"), "one\n")
	// The right hash applies, and the mount shows it at once.
	res, err = c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "f.txt", ExpectedHash: rt.SHA256, Content: &two})
	if err != nil {
		t.Fatal(err)
	}
	if res.Result != control.PatchApplied || res.SHA256 != contentHash([]byte(two)) || res.Size != int64(len(two)) {
		t.Errorf("patch with the right hash = %+v", res)
	}
	assertFile(t, m.in("f.txt"), two)
	if got := sh(t, m.mnt, "cat f.txt"); got != two {
		t.Errorf("cat f.txt after patch = %q", got)
	}
	// Edits, against the new hash.
	res, err = c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "f.txt", ExpectedHash: contentHash([]byte(two)),
		Edits: []control.TextEdit{{OldText: "two", NewText: "three"}}})
	if err != nil || res.Result != control.PatchApplied {
		t.Errorf("patch with edits = %+v, %v", res, err)
	}
	assertFile(t, m.in("f.txt"), "three\n")
	// Creating a file: expected hash "".
	created := "created by patch\n"
	res, err = c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: "new.txt", Content: &created})
	if err != nil || res.Result != control.PatchApplied {
		t.Errorf("patch creating new.txt = %+v, %v", res, err)
	} else {
		assertFile(t, m.in("new.txt"), created)
	}

	// ReadText follows writes made through the mount.
	if err := os.WriteFile(m.in("g.txt"), []byte("written in the mount\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if rt, err := c.ReadText(ctx, "g.txt"); err != nil || rt.SHA256 != contentHash([]byte("written in the mount\n")) {
		t.Errorf("read_text g.txt after a write in the mount = %+v, %v", rt, err)
	}

	// Status through the client.
	st, err := c.Status(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	k := statusKinds(st)
	if k["f.txt"] != "write" || k["g.txt"] != "write" || k["new.txt"] != "create" || st.PendingCount != len(st.Entries) {
		t.Errorf("status = %+v", st)
	}
	if st, err := c.Status(ctx, []string{"g.txt"}); err != nil || len(st.Entries) != 1 || st.Entries[0].Path != "g.txt" {
		t.Errorf("status g.txt = %+v, %v", st, err)
	}
	assertSameTree(t, "workspace after control writes", before, snapshot(t, m.ws))

	// Paths outside the workspace: -32005.
	for _, p := range []string{"../etc/passwd", "sub/../../etc/passwd", "/etc/passwd", filepath.Dir(m.ws) + "/other"} {
		_, err := c.ReadText(ctx, p)
		if !control.IsCode(err, control.CodePathOutsideWorkspace) {
			t.Errorf("read_text %q: %v, want code %d", p, err, control.CodePathOutsideWorkspace)
		}
		evil := "x"
		_, err = c.SafeTextPatch(ctx, control.SafeTextPatchParams{Path: p, Content: &evil})
		if !control.IsCode(err, control.CodePathOutsideWorkspace) {
			t.Errorf("safe_text_patch %q: %v, want code %d", p, err, control.CodePathOutsideWorkspace)
		}
		if _, err := c.Commit(ctx, control.CommitParams{Paths: []string{p}}); !control.IsCode(err, control.CodePathOutsideWorkspace) {
			t.Errorf("commit %q: %v, want code %d", p, err, control.CodePathOutsideWorkspace)
		}
	}
	// A malformed line gets -32700 and the connection keeps serving.
	raw, err := net.Dial("unix", m.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(cmdTimeout))
	rd := bufio.NewReader(raw)
	roundTrip := func(line string) map[string]any {
		t.Helper()
		if _, err := raw.Write([]byte(line + "\n")); err != nil {
			t.Fatalf("write %q: %v", line, err)
		}
		resp, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the answer to %q: %v", line, err)
		}
		var msg map[string]any
		if err := json.Unmarshal([]byte(resp), &msg); err != nil {
			t.Fatalf("answer to %q is not JSON: %q", line, resp)
		}
		return msg
	}
	errCode := func(msg map[string]any) int {
		e, _ := msg["error"].(map[string]any)
		code, _ := e["code"].(float64)
		return int(code)
	}
	msg := roundTrip(`{"jsonrpc":"2.0","id":1,"method":`)
	if errCode(msg) != control.CodeParseError || msg["id"] != nil {
		t.Errorf("malformed line: answer %v, want error -32700 with id null", msg)
	}
	msg = roundTrip(`not json at all`)
	if errCode(msg) != control.CodeParseError {
		t.Errorf("garbage line: answer %v, want -32700", msg)
	}
	msg = roundTrip(`{"jsonrpc":"2.0","id":2,"method":"no/such_method"}`)
	if errCode(msg) != control.CodeMethodNotFound {
		t.Errorf("unknown method: %v, want -32601", msg)
	}
	msg = roundTrip(`{"jsonrpc":"2.0","id":3,"method":"fs/read_text","params":{"path":"../etc/passwd"}}`)
	if errCode(msg) != control.CodePathOutsideWorkspace || msg["id"] != float64(3) {
		t.Errorf("raw read_text ../etc/passwd: %v, want -32005 with id 3", msg)
	}
	if e, _ := msg["error"].(map[string]any); e != nil {
		if d, _ := e["data"].(map[string]any); d == nil || d["kind"] != "path_outside_workspace" {
			t.Errorf("-32005 error data = %v, want kind path_outside_workspace", e["data"])
		}
	}
	msg = roundTrip(`{"jsonrpc":"2.0","id":4,"method":"session/initialize"}`)
	if r, _ := msg["result"].(map[string]any); r == nil || r["mode"] != "staged" || msg["id"] != float64(4) {
		t.Errorf("initialize after the malformed lines: %v", msg)
	}
	// The typed client is fine too.
	if _, err := c.Initialize(ctx); err != nil {
		t.Errorf("client after malformed lines: %v", err)
	}

	// Discard through the client.
	dr, err := c.Discard(ctx, []string{"g.txt"})
	if err != nil || strings.Join(dr.Discarded, ",") != "g.txt" {
		t.Errorf("discard g.txt = %+v, %v", dr, err)
	}
	assertFile(t, m.in("g.txt"), "g\n")
	// Log has the operations.
	lr, err := c.Log(ctx, control.LogParams{Paths: []string{"f.txt"}})
	if err != nil || len(lr.Records) == 0 {
		t.Errorf("log f.txt = %+v, %v", lr, err)
	}
	// Diff through the client.
	if d, err := c.Diff(ctx, []string{"f.txt"}); err != nil || d.Files != 1 || !strings.Contains(d.Diff, "+three") {
		t.Errorf("diff f.txt = %+v, %v", d, err)
	}
	assertSameTree(t, "workspace after everything but commit", before, snapshot(t, m.ws))
}

func TestControlEvents(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "one\n"}))
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	c := m.dial()
	events, err := c.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitEvent := func(kind string, ok func(control.Event) bool) control.Event {
		t.Helper()
		timeout := time.After(10 * time.Second)
		var seen []string
		for {
			select {
			case ev, open := <-events:
				if !open {
					t.Fatalf("event channel closed while waiting for %s (seen %v)", kind, seen)
				}
				seen = append(seen, ev.Kind)
				if ev.Kind == kind && (ok == nil || ok(ev)) {
					return ev
				}
			case <-timeout:
				t.Fatalf("no %s event within 10s (seen %v)", kind, seen)
			}
		}
	}

	if err := os.WriteFile(m.in("f.txt"), []byte("two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.in("n.txt"), []byte("new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(control.EventStagedWritesPending, func(ev control.Event) bool { return ev.PendingCount == 2 })
	if ev.TotalBytes != 8 || ev.Seq == 0 || ev.Time == "" {
		t.Errorf("staged_writes_pending event = %+v, want pendingCount 2, totalBytes 8", ev)
	}

	cr, err := c.Commit(ctx, control.CommitParams{Paths: []string{"f.txt"}})
	if err != nil || strings.Join(cr.Committed, ",") != "f.txt" {
		t.Fatalf("commit f.txt = %+v, %v", cr, err)
	}
	ev = waitEvent("committed", nil)
	if strings.Join(ev.Paths, ",") != "f.txt" {
		t.Errorf("committed event paths = %v, want [f.txt]", ev.Paths)
	}
	assertFile(t, m.inWS("f.txt"), "two\n")

	if _, err := c.Discard(ctx, []string{"n.txt"}); err != nil {
		t.Fatal(err)
	}
	ev = waitEvent("discarded", nil)
	if strings.Join(ev.Paths, ",") != "n.txt" {
		t.Errorf("discarded event paths = %v", ev.Paths)
	}
	waitEvent(control.EventStagedWritesPending, func(ev control.Event) bool { return ev.PendingCount == 0 })

	// A conflict is announced too.
	if err := os.WriteFile(m.in("f.txt"), []byte("three\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.inWS("f.txt"), []byte("user\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cr, err = c.Commit(ctx, control.CommitParams{})
	if err != nil || len(cr.Conflicts) != 1 {
		t.Fatalf("commit with a conflict = %+v, %v", cr, err)
	}
	ev = waitEvent("conflict", nil)
	if strings.Join(ev.Paths, ",") != "f.txt" {
		t.Errorf("conflict event paths = %v", ev.Paths)
	}
}
