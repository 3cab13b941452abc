package agents

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"stagefs/control"
)

// fakeChannel is a hook channel that records what the hooks asked.
type fakeChannel struct {
	mu    sync.Mutex
	calls []string // method and params, one per call
	path  string
}

func startFake(t testing.TB) *fakeChannel {
	t.Helper()
	f := &fakeChannel{path: filepath.Join(t.TempDir(), "hooks.sock")}
	s := control.NewServer(nil, control.ServerOptions{})
	record := func(method string) control.HandlerFunc {
		return func(ctx context.Context, params json.RawMessage) (any, error) {
			f.mu.Lock()
			f.calls = append(f.calls, method+" "+string(params))
			f.mu.Unlock()
			var p struct{ ScopeID string }
			json.Unmarshal(params, &p)
			if p.ScopeID == "" {
				p.ScopeID = "numbered-1"
			}
			return map[string]any{"scopeId": p.ScopeID, "turnId": "t1"}, nil
		}
	}
	for _, m := range control.HookMethods {
		s.Handle(m, record(m))
	}
	l, err := control.Listen(f.path)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	return f
}

func (f *fakeChannel) dial() (*control.Client, error) { return control.Dial(f.path) }

func (f *fakeChannel) taken() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.calls
	f.calls = nil
	return out
}

func TestClaudeEvents(t *testing.T) {
	f := startFake(t)
	for _, tc := range []struct {
		payload string
		calls   []string
		stdout  string
	}{
		{`{"hook_event_name":"UserPromptSubmit","session_id":"s1","prompt_id":"p-1","prompt":"fix the bug\nand more"}`,
			[]string{`hook/turn {"sessionId":"s1","turnId":"p-1","label":"fix the bug"}`}, ""},
		{`{"hook_event_name":"PreToolUse","session_id":"s1","tool_name":"Write","tool_input":{"file_path":"/w/a.txt","content":"x"},"tool_use_id":"toolu_1"}`,
			[]string{`hook/tool_call_start {"sessionId":"s1","scopeId":"toolu_1","label":"Write: /w/a.txt"}`}, ""},
		{`{"hook_event_name":"PreToolUse","session_id":"s1","tool_name":"Bash","tool_input":{"command":"rm -rf d","description":"rm"},"tool_use_id":"toolu_2"}`,
			[]string{`hook/tool_call_start {"sessionId":"s1","scopeId":"toolu_2","label":"Bash: rm -rf d","bind":true}`},
			`{"hookSpecificOutput":{"hookEventName":"PreToolUse","updatedInput":{"command":"'/bin/stage fs' hook bind 'toolu_2' || exit 97\nrm -rf d","description":"rm"}}}`},
		{`{"hook_event_name":"PostToolUse","session_id":"s1","tool_use_id":"toolu_2"}`,
			[]string{`hook/tool_call_end {"sessionId":"s1","scopeId":"toolu_2"}`}, ""},
		{`{"hook_event_name":"PostToolUseFailure","session_id":"s1","tool_use_id":"bad id with spaces"}`,
			[]string{`hook/tool_call_end {"sessionId":"s1"}`}, ""},
		{`{"hook_event_name":"SessionEnd","session_id":"s1"}`,
			[]string{`hook/session_end {"sessionId":"s1"}`}, ""},
		{`{"hook_event_name":"Stop","session_id":"s1"}`, nil, ""},
	} {
		ans := Hook(&Claude, []byte(tc.payload), f.dial, "/bin/stage fs", "/w")
		if ans.Exit != 0 || ans.Stderr != "" || string(ans.Stdout) != tc.stdout {
			t.Errorf("%s: answer %+v (stdout %s), want exit 0 and stdout %s", tc.payload, ans, ans.Stdout, tc.stdout)
		}
		if got := f.taken(); strings.Join(got, "|") != strings.Join(tc.calls, "|") {
			t.Errorf("%s:\n calls %q\n want  %q", tc.payload, got, tc.calls)
		}
	}
}

func TestClaudeSettingsWireEveryEvent(t *testing.T) {
	args, env, err := Claude.Wire("'/x/stagefs' hook claude", t.TempDir())
	if err != nil || len(args) != 2 || args[0] != "--settings" || len(env) != 0 {
		t.Fatalf("Wire: %q %q %v", args, env, err)
	}
	var s struct {
		Hooks map[string][]struct {
			Matcher string
			Hooks   []struct {
				Type, Command string
				Timeout       int
			}
		}
	}
	if err := json.Unmarshal([]byte(args[1]), &s); err != nil {
		t.Fatal(err)
	}
	for event := range claudeEvents {
		h := s.Hooks[event]
		if len(h) != 1 || len(h[0].Hooks) != 1 || h[0].Hooks[0].Command != "'/x/stagefs' hook claude" || h[0].Hooks[0].Timeout != hookTimeoutSeconds {
			t.Errorf("%s: %+v", event, h)
		}
	}
	if len(s.Hooks) != len(claudeEvents) {
		t.Errorf("settings wire %d events, want %d", len(s.Hooks), len(claudeEvents))
	}
}

// FuzzHook: no payload makes a hook panic, and one that does not parse as
// a JSON object is refused.
func FuzzHook(f *testing.F) {
	for _, s := range []string{
		`{"hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":{"command":"x"},"tool_use_id":"t"}`,
		`{"hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":"nope"}`,
		`{"hook_event_name":"UserPromptSubmit","prompt":5,"prompt_id":[]}`,
		`{"hook_event_name":7}`, `null`, `[]`, `"x"`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	fake := startFake(f)
	f.Fuzz(func(t *testing.T, payload []byte) {
		ans := Hook(&Claude, payload, fake.dial, "/bin/stagefs", "/w")
		var obj map[string]any
		if json.Unmarshal(payload, &obj) != nil || obj == nil {
			if ans.Exit != ExitRefused {
				t.Errorf("%q: exit %d, want %d", payload, ans.Exit, ExitRefused)
			}
		}
		fake.taken()
	})
}

func TestStripJSONComments(t *testing.T) {
	in := `{
  // the theme
  "theme": "dark", /* inline */ "url": "http://x//y", "q": "a\"//b",
  "n": 1 /* multi
  line */
}`
	var v map[string]any
	if err := json.Unmarshal(stripJSONComments([]byte(in)), &v); err != nil {
		t.Fatalf("%v\n%s", err, stripJSONComments([]byte(in)))
	}
	if v["theme"] != "dark" || v["url"] != "http://x//y" || v["q"] != `a"//b` || v["n"] != float64(1) {
		t.Errorf("parsed %v", v)
	}
}
