package test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"stagefs/control"
)

// Events and the journal through the real CLI (issues 3 and 4):
// `stagefs events --json`, `stagefs log --since SEQ` and `stagefs log PATH`,
// and the session/update that a restore sends.

// wireEvent is one event as it arrived: decoded, and as raw JSON fields.
type wireEvent struct {
	ev  control.Event
	raw map[string]any
	src string
}

// eventStream collects events from some source and lets a test wait for
// the one it wants.
type eventStream struct {
	t    *testing.T
	name string
	ch   chan wireEvent
	seen []string
}

func newEventStream(t *testing.T, name string) *eventStream {
	return &eventStream{t: t, name: name, ch: make(chan wireEvent, 1024)}
}

// push decodes one JSON object holding the event's fields.
func (s *eventStream) push(line []byte) {
	var we wireEvent
	we.src = string(line)
	if err := json.Unmarshal(line, &we.ev); err != nil {
		we.src = "undecodable: " + we.src
	}
	json.Unmarshal(line, &we.raw)
	select {
	case s.ch <- we:
	default: // the test is not reading; it fails on what it misses
	}
}

// wait returns the first event (from now on) for which ok holds.
func (s *eventStream) wait(what string, d time.Duration, ok func(wireEvent) bool) wireEvent {
	s.t.Helper()
	timeout := time.After(d)
	for {
		select {
		case we := <-s.ch:
			s.seen = append(s.seen, we.src)
			if ok(we) {
				return we
			}
		case <-timeout:
			last := s.seen
			if len(last) > 12 {
				last = last[len(last)-12:]
			}
			s.t.Fatalf("%s: no %s within %v; the last events seen:\n%s", s.name, what, d, strings.Join(last, "\n"))
		}
	}
}

// tryWait is wait without failing: false on timeout.
func (s *eventStream) tryWait(d time.Duration, ok func(wireEvent) bool) bool {
	timeout := time.After(d)
	for {
		select {
		case we := <-s.ch:
			s.seen = append(s.seen, we.src)
			if ok(we) {
				return true
			}
		case <-timeout:
			return false
		}
	}
}

// startCLIEvents runs `stagefs events --json` against m in the background.
func startCLIEvents(t *testing.T, m *stagefsMount) (*eventStream, *bgProc) {
	t.Helper()
	s := newEventStream(t, "stagefs events --json")
	cmd := exec.Command(stagefsBin, "events", "--json", "-m", m.mnt)
	p := startBG(t, "stagefs events", cmd, func(line string) { s.push([]byte(line)) })
	return s, p
}

// waitSubscribed makes changes in the mount until the stream shows an
// event, which proves the subscription is in place, then drops them again
// and waits until the stream reports nothing pending.
func waitSubscribed(t *testing.T, m *stagefsMount, s *eventStream) {
	t.Helper()
	for i := 0; ; i++ {
		if i == 40 {
			t.Fatalf("%s: no event after %d probe writes in the mount", s.name, i)
		}
		if err := os.WriteFile(m.in(fmt.Sprintf("probe-%d.tmp", i)), []byte("p"), 0o644); err != nil {
			t.Fatal(err)
		}
		if s.tryWait(500*time.Millisecond, func(wireEvent) bool { return true }) {
			break
		}
	}
	m.mustCLI("discard")
	s.wait("staged_writes_pending with nothing pending after discarding the probes", 10*time.Second, func(we wireEvent) bool {
		return we.ev.Kind == control.EventStagedWritesPending && we.ev.PendingCount == 0
	})
}

func pathsEqual(got []string, want ...string) bool {
	g := append([]string(nil), got...)
	sort.Strings(g)
	sort.Strings(want)
	return reflect.DeepEqual(g, want)
}

// `stagefs events --json` follows the pending set: staged_writes_pending
// with pendingCount and totalBytes, then committed and discarded with
// their paths.
func TestEventsCLI(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "one\n", "keep.txt": "k\n"}))
	s, _ := startCLIEvents(t, m)
	waitSubscribed(t, m, s)

	const fNew, nNew = "hello world, staged\n", "brand new\n"
	if err := os.WriteFile(m.in("f.txt"), []byte(fNew), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.in("n.txt"), []byte(nNew), 0o644); err != nil {
		t.Fatal(err)
	}
	// What the events must report is what status reports.
	st := m.status()
	wantBytes := int64(len(fNew) + len(nNew))
	if st.PendingCount != 2 || st.TotalBytes != wantBytes {
		t.Fatalf("status after two writes: pendingCount %d, totalBytes %d; want 2 and %d", st.PendingCount, st.TotalBytes, wantBytes)
	}
	we := s.wait(fmt.Sprintf("staged_writes_pending {pendingCount 2, totalBytes %d}", wantBytes), 10*time.Second, func(we wireEvent) bool {
		return we.ev.Kind == control.EventStagedWritesPending && we.ev.PendingCount == 2 && we.ev.TotalBytes == wantBytes
	})
	if we.raw["pendingCount"] != float64(2) || we.raw["totalBytes"] != float64(wantBytes) {
		t.Errorf("staged_writes_pending line does not carry pendingCount and totalBytes as JSON numbers: %s", we.src)
	}
	if we.ev.Seq == 0 || we.ev.Time == "" {
		t.Errorf("event without seq or time: %s", we.src)
	} else if _, err := time.Parse(time.RFC3339Nano, we.ev.Time); err != nil {
		t.Errorf("event time %q: %v", we.ev.Time, err)
	}
	lastSeq := we.ev.Seq

	m.mustCLI("commit", "f.txt")
	we = s.wait("committed", 10*time.Second, func(we wireEvent) bool { return we.ev.Kind == "committed" })
	if !pathsEqual(we.ev.Paths, "f.txt") {
		t.Errorf("committed event paths = %v, want [f.txt]: %s", we.ev.Paths, we.src)
	}
	if we.ev.Seq <= lastSeq {
		t.Errorf("committed event seq %d not after %d", we.ev.Seq, lastSeq)
	}
	lastSeq = we.ev.Seq
	we = s.wait(fmt.Sprintf("staged_writes_pending {pendingCount 1, totalBytes %d} after the commit", len(nNew)), 10*time.Second, func(we wireEvent) bool {
		return we.ev.Kind == control.EventStagedWritesPending && we.ev.PendingCount == 1 && we.ev.TotalBytes == int64(len(nNew))
	})
	assertFile(t, m.inWS("f.txt"), fNew)

	m.mustCLI("discard")
	we = s.wait("discarded", 10*time.Second, func(we wireEvent) bool { return we.ev.Kind == "discarded" })
	if !pathsEqual(we.ev.Paths, "n.txt") {
		t.Errorf("discarded event paths = %v, want [n.txt]: %s", we.ev.Paths, we.src)
	}
	if we.ev.Seq <= lastSeq {
		t.Errorf("discarded event seq %d not after %d", we.ev.Seq, lastSeq)
	}
	s.wait("staged_writes_pending {pendingCount 0} after the discard", 10*time.Second, func(we wireEvent) bool {
		return we.ev.Kind == control.EventStagedWritesPending && we.ev.PendingCount == 0 && we.ev.TotalBytes == 0
	})
	assertMissing(t, m.in("n.txt"))
}

// logCLI runs `stagefs log --json ARGS...` and decodes it.
func logCLI(t *testing.T, m *stagefsMount, args ...string) []control.LogEntry {
	t.Helper()
	out := m.mustCLI(append([]string{"log", "--json"}, args...)...)
	var lr control.LogResult
	if err := json.Unmarshal([]byte(out), &lr); err != nil {
		t.Fatalf("stagefs log --json %v: %v\n%.400s", args, err, out)
	}
	return lr.Records
}

// settledLog is logCLI once the journal has stopped growing: the close of
// a file is journaled when the kernel sends its release, after close(2)
// returned, so a log read right after a tool exits may still grow.
func settledLog(t *testing.T, m *stagefsMount) []control.LogEntry {
	t.Helper()
	recs := logCLI(t, m)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		again := logCLI(t, m)
		if len(again) == len(recs) {
			return again
		}
		recs = again
	}
	return recs
}

func seqsOf(recs []control.LogEntry) []uint64 {
	out := []uint64{}
	for _, r := range recs {
		out = append(out, r.Seq)
	}
	return out
}

func touchesPath(r control.LogEntry, p string) bool {
	return r.Path == p || r.Path2 == p || strings.HasPrefix(r.Path, p+"/") || strings.HasPrefix(r.Path2, p+"/")
}

// shellPid runs a script in the mount with sh; its first output line is
// the shell's pid ($$), which is returned.
func shellPid(t *testing.T, m *stagefsMount, script string) int {
	t.Helper()
	out := sh(t, m.mnt, "echo $$; "+script)
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(out, "\n", 2)[0]))
	if err != nil {
		t.Fatalf("no pid in %q", out)
	}
	return pid
}

// `stagefs log --since SEQ` and `stagefs log PATH` through the real CLI.
func TestLogCLISinceAndPath(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a\n", "b.txt": "b\n"}))
	pid1 := shellPid(t, m, "echo A > a.txt")
	all1 := settledLog(t, m)
	if len(all1) == 0 {
		t.Fatal("empty journal after a write in the mount")
	}
	since := all1[len(all1)-1].Seq
	var firstA *control.LogEntry
	for i := range all1 {
		if all1[i].Path == "a.txt" && all1[i].PID == pid1 {
			firstA = &all1[i]
		}
	}
	if firstA == nil {
		t.Fatalf("no journal record of a.txt by the shell %d: %+v", pid1, all1)
	}

	pid2 := shellPid(t, m, "echo B >> b.txt; echo C > c.txt; mkdir d; rm a.txt")
	all2 := settledLog(t, m)
	after := logCLI(t, m, "--since", fmt.Sprint(since))
	if len(after) == 0 {
		t.Fatalf("log --since %d: nothing, after four more operations", since)
	}
	// Exactly the records of the full log after SEQ, oldest first.
	var want []uint64
	for _, r := range all2 {
		if r.Seq > since {
			want = append(want, r.Seq)
		}
	}
	if got := seqsOf(after); !reflect.DeepEqual(got, want) {
		t.Errorf("log --since %d: seqs %v, want %v (the full log's records after it)", since, got, want)
	}
	for i := 1; i < len(after); i++ {
		if after[i].Seq <= after[i-1].Seq {
			t.Errorf("log --since: not oldest first: %d after %d", after[i].Seq, after[i-1].Seq)
		}
	}
	// Each operation is there, with who did it.
	find := func(recs []control.LogEntry, path string, ok func(control.LogEntry) bool) *control.LogEntry {
		for i := range recs {
			if touchesPath(recs[i], path) && ok(recs[i]) {
				return &recs[i]
			}
		}
		return nil
	}
	if r := find(after, "b.txt", func(r control.LogEntry) bool { return r.PID == pid2 }); r == nil || r.Comm != "sh" {
		t.Errorf("log --since: no record of b.txt by sh[%d]: %+v", pid2, r)
	}
	if r := find(after, "c.txt", func(r control.LogEntry) bool { return r.PID == pid2 }); r == nil {
		t.Errorf("log --since: no record of c.txt by sh[%d]", pid2)
	}
	if r := find(after, "d", func(r control.LogEntry) bool { return r.Comm == "mkdir" }); r == nil || r.PID == 0 || r.PID == pid2 {
		t.Errorf("log --since: no record of d by a mkdir process: %+v", r)
	}
	if r := find(after, "a.txt", func(r control.LogEntry) bool { return r.Comm == "rm" }); r == nil || r.PID == 0 {
		t.Errorf("log --since: no record of a.txt by rm: %+v", r)
	}
	for _, r := range after {
		if r.Seq == firstA.Seq {
			t.Errorf("log --since %d lists record %d", since, r.Seq)
		}
		if r.Time == "" || r.Op == "" {
			t.Errorf("record without time or op: %+v", r)
		}
	}
	// The Go client's session/log says the same.
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	lr, err := m.dial().Log(ctx, control.LogParams{Since: since})
	if err != nil || !reflect.DeepEqual(lr.Records, after) {
		t.Errorf("session/log {since %d} differs from stagefs log --since: %v\nclient: %+v\ncli: %+v", since, err, lr.Records, after)
	}
	// Nothing after the newest record.
	if recs := logCLI(t, m, "--since", fmt.Sprint(all2[len(all2)-1].Seq)); len(recs) != 0 {
		t.Errorf("log --since the newest seq: %+v, want nothing", recs)
	}

	// By path: the records of that path, and only those.
	byB := logCLI(t, m, "b.txt")
	var wantB []uint64
	for _, r := range all2 {
		if touchesPath(r, "b.txt") {
			wantB = append(wantB, r.Seq)
		}
	}
	if len(wantB) == 0 || !reflect.DeepEqual(seqsOf(byB), wantB) {
		t.Errorf("log b.txt: seqs %v, want %v (the full log's records of b.txt)", seqsOf(byB), wantB)
	}
	// Path and --since together: only the rm of a.txt, not the first write.
	byA := logCLI(t, m, "--since", fmt.Sprint(since), "a.txt")
	if len(byA) == 0 {
		t.Errorf("log --since %d a.txt: nothing, want the rm", since)
	}
	for _, r := range byA {
		if !touchesPath(r, "a.txt") || r.Seq <= since {
			t.Errorf("log --since %d a.txt lists %+v", since, r)
		}
	}
	// Two paths.
	byBC := logCLI(t, m, "b.txt", "c.txt")
	for _, r := range byBC {
		if !touchesPath(r, "b.txt") && !touchesPath(r, "c.txt") {
			t.Errorf("log b.txt c.txt lists %+v", r)
		}
	}
	if find(byBC, "c.txt", func(control.LogEntry) bool { return true }) == nil || find(byBC, "b.txt", func(control.LogEntry) bool { return true }) == nil {
		t.Errorf("log b.txt c.txt lacks one of them: %+v", byBC)
	}

	// Human output: one line per record, starting with its seq, naming the
	// path and who did it.
	human := strings.Split(strings.TrimSuffix(m.mustCLI("log", "--since", fmt.Sprint(since)), "\n"), "\n")
	if len(human) != len(after) {
		t.Fatalf("log --since %d: %d lines, want %d (one per record):\n%s", since, len(human), len(after), strings.Join(human, "\n"))
	}
	for i, line := range human {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != fmt.Sprint(after[i].Seq) {
			t.Errorf("log line %d = %q, want it to start with seq %d", i, line, after[i].Seq)
			continue
		}
		if after[i].Path != "" && !strings.Contains(line, after[i].Path) {
			t.Errorf("log line %q does not name %s", line, after[i].Path)
		}
		if after[i].PID != 0 && !strings.Contains(line, fmt.Sprintf("%s[%d]", after[i].Comm, after[i].PID)) {
			t.Errorf("log line %q does not show %s[%d]", line, after[i].Comm, after[i].PID)
		}
	}
	for _, line := range strings.Split(strings.TrimSuffix(m.mustCLI("log", "b.txt"), "\n"), "\n") {
		if !strings.Contains(line, "b.txt") {
			t.Errorf("stagefs log b.txt shows a line without b.txt: %q", line)
		}
	}
}

// subscribeRaw subscribes on a plain socket connection and hands every
// session/update notification (the whole message) to s.
func subscribeRaw(t *testing.T, m *stagefsMount, s *eventStream) {
	t.Helper()
	conn, err := net.Dial("unix", m.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.Write([]byte(`{"jsonrpc":"2.0","id":1,"method":"events/subscribe","params":{}}` + "\n")); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReaderSize(conn, 1<<20)
	conn.SetReadDeadline(time.Now().Add(cmdTimeout))
	line, err := rd.ReadBytes('\n')
	if err != nil {
		t.Fatalf("events/subscribe: %v", err)
	}
	var resp map[string]any
	if err := json.Unmarshal(line, &resp); err != nil || resp["id"] != float64(1) || resp["error"] != nil {
		t.Fatalf("events/subscribe answer: %s", line)
	}
	conn.SetReadDeadline(time.Time{})
	go func() {
		for {
			line, err := rd.ReadBytes('\n')
			if err != nil {
				return
			}
			s.push(line)
		}
	}()
}

// The restore of a tool call is announced as an ACP-shaped session/update:
// toolCallId, status "restored", _meta.stagefs.kind "tool_call_restored",
// and the restored paths; on the wire, through the Go client and through
// `stagefs events --json`.
func TestRestoreEventShape(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"a.txt": "a\n", "b.txt": "b\n", "c.txt": "untouched\n"}))
	raw := newEventStream(t, "raw socket")
	subscribeRaw(t, m, raw)
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	evs, err := m.dial().Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	viaClient := newEventStream(t, "Go client")
	go func() {
		for ev := range evs {
			b, _ := json.Marshal(ev)
			viaClient.push(b)
		}
	}()
	cli, _ := startCLIEvents(t, m)
	waitSubscribed(t, m, cli)

	const scope = "toolu_01-restore"
	m.mustExec(scope, "sh", "-ec", "echo changed > a.txt; echo new > new.txt; rm b.txt")
	res := m.restoreScope(scope)
	restored := pathSet(res.RestoredPaths)
	for _, p := range []string{"a.txt", "b.txt", "new.txt"} {
		if !contains(restored, p) {
			t.Errorf("restore result lacks %s: %v", p, restored)
		}
	}
	if contains(restored, "c.txt") {
		t.Errorf("restore result lists the untouched c.txt: %v", restored)
	}

	isRestore := func(we wireEvent) bool {
		p := we.raw
		if params, ok := we.raw["params"].(map[string]any); ok {
			p = params
		}
		return p["toolCallId"] == scope
	}
	checkParams := func(src string, p map[string]any) {
		t.Helper()
		if p["toolCallId"] != scope {
			t.Errorf("%s: toolCallId = %v, want %q", src, p["toolCallId"], scope)
		}
		if p["status"] != "restored" {
			t.Errorf("%s: status = %v, want \"restored\"", src, p["status"])
		}
		if p["kind"] != control.EventToolCallRestored {
			t.Errorf("%s: kind = %v, want %q", src, p["kind"], control.EventToolCallRestored)
		}
		meta, _ := p["_meta"].(map[string]any)
		sf, _ := meta["stagefs"].(map[string]any)
		if sf == nil || sf["kind"] != control.EventToolCallRestored {
			t.Errorf("%s: _meta = %v, want _meta.stagefs.kind %q", src, p["_meta"], control.EventToolCallRestored)
		}
		// The restored paths: in restoredPaths, and if _meta.stagefs
		// lists them too, the same.
		var lists [][]string
		for _, v := range []any{p["restoredPaths"], sf["restoredPaths"]} {
			if v == nil {
				continue
			}
			arr, ok := v.([]any)
			if !ok {
				t.Errorf("%s: restored paths are not a list: %v", src, v)
				continue
			}
			var ps []string
			for _, x := range arr {
				s, _ := x.(string)
				ps = append(ps, s)
			}
			lists = append(lists, pathSet(ps))
		}
		if len(lists) == 0 {
			t.Errorf("%s: no restored paths in %v", src, p)
		}
		for _, l := range lists {
			if !reflect.DeepEqual(l, restored) {
				t.Errorf("%s: restored paths %v, want the restore's %v", src, l, restored)
			}
		}
	}

	we := raw.wait("session/update for the restore", 10*time.Second, isRestore)
	if we.raw["jsonrpc"] != "2.0" || we.raw["method"] != control.MethodSessionUpdate {
		t.Errorf("raw notification: jsonrpc %v, method %v; want 2.0 and %s", we.raw["jsonrpc"], we.raw["method"], control.MethodSessionUpdate)
	}
	if _, hasID := we.raw["id"]; hasID {
		t.Errorf("raw notification has an id: %s", we.src)
	}
	params, _ := we.raw["params"].(map[string]any)
	checkParams("socket", params)

	we = viaClient.wait("tool_call_restored from the Go client", 10*time.Second, isRestore)
	if we.ev.Status != "restored" || we.ev.ToolCallID != scope {
		t.Errorf("Go client event = %+v", we.ev)
	}
	checkParams("Go client", we.raw)

	we = cli.wait("tool_call_restored from stagefs events --json", 10*time.Second, isRestore)
	checkParams("stagefs events --json", we.raw)

	// The restore did happen.
	assertFile(t, m.in("a.txt"), "a\n")
	assertFile(t, m.in("b.txt"), "b\n")
	assertMissing(t, m.in("new.txt"))
}
