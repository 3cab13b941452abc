package test

// The hook channel is reachable from inside the sandbox, by the model's
// own commands too: what such a command can do with it is bounded.

import (
	"fmt"
	"strings"
	"testing"
)

// hookCalls runs rawrpc inside stagefs run against the hook channel.
func hookCalls(t *testing.T, m *stagefsMount, calls ...string) string {
	t.Helper()
	r := m.run(m.ws, append([]string{"--", rawrpc(t), hookSocketOf(t, m)}, calls...)...)
	if r.code != 0 {
		t.Fatalf("rawrpc inside stagefs run: %s", r)
	}
	return r.stdout
}

// A tool call cannot end a turn's snapshot, or any snapshot the hook
// channel did not start, nor close a host's unbound one by starting its
// own.
func TestHookChannelActsOnlyOnItsOwn(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "0\n"}), withTestBinaries())
	m.mustCLI("turn", "t1")
	m.mustCLI("snapshot", "host-call") // a host's own, unbound
	out := hookCalls(t, m,
		"hook/tool_call_end", `{"scopeId":"turn:t1"}`,
		"hook/tool_call_end", `{"scopeId":"host-call"}`,
		"hook/tool_call_bind", `{"scopeId":"host-call"}`,
		"hook/session_end", `{"sessionId":"nobody"}`,
		"hook/tool_call_start", `{"sessionId":"s","scopeId":"mine"}`,
		"hook/tool_call_end", `{"scopeId":"mine"}`,
	)
	if n := strings.Count(out, `"code":-32003`); n != 3 {
		t.Errorf("want the two ends and the bind of scopes the channel did not start refused (-32003):\n%s", out)
	}
	if s := m.snapshotInfo("host-call"); !s.Open {
		t.Errorf("the host's snapshot was closed through the hook channel: %+v", s)
	}
	sh(t, m.mnt, "echo 1 > f.txt")
	m.mustCLI("rollback", "t1")
	assertFile(t, m.in("f.txt"), "0\n")
}

// A flood of tool calls gets errors once the channel holds its maximum,
// and the daemon stays up.
func TestHookChannelBounded(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withTestBinaries())
	var calls []string
	for i := 0; i < 530; i++ {
		calls = append(calls, "hook/tool_call_start", fmt.Sprintf(`{"sessionId":"flood","scopeId":"f%d","bind":true}`, i))
	}
	out := hookCalls(t, m, calls...)
	if n := strings.Count(out, `"code":-32004`); n != 530-512 {
		t.Errorf("%d of 530 starts refused as busy, want %d", n, 530-512)
	}
	if st := m.status(); st.PendingCount != 0 {
		t.Errorf("status after the flood: %+v", st)
	}
}

// Turns started in a burst that capture nothing do not push out the turns
// that hold work.
func TestEmptyTurnsDoNotPushOutRealOnes(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "0\n"}), withMountFlags("--max-turns", "5"), withTestBinaries())
	m.mustCLI("turn", "real")
	sh(t, m.mnt, "echo 1 > f.txt")
	var calls []string
	for i := 0; i < 20; i++ {
		calls = append(calls, "hook/turn", "{}")
	}
	hookCalls(t, m, calls...)
	m.mustCLI("rollback", "real")
	assertFile(t, m.in("f.txt"), "0\n")
	if n := len(m.checkpoints()); n > 10 {
		t.Errorf("%d turns kept after 20 empty ones, want at most 8 empty and the real one", n)
	}
}
