package agentsim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// These tests check the Server's side of the wire without any agent, so
// they run everywhere; agentsim_test.go checks that real agents agree.

// post sends body as JSON to the server and returns the response body.
func post(t *testing.T, s *Server, path string, body any) (int, string) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(s.URL+path, "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(out)
}

// sseData returns the "data:" payloads of a server-sent event stream.
func sseData(t *testing.T, stream string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(stream))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("event data %q: %v", data, err)
		}
		out = append(out, m)
	}
	return out
}

func TestListensOnLoopback(t *testing.T) {
	s := Start(t, nil)
	u, err := url.Parse(s.URL)
	if err != nil || u.Hostname() != "127.0.0.1" {
		t.Fatalf("URL %q (%v), want http://127.0.0.1:PORT", s.URL, err)
	}
}

func TestStepFor(t *testing.T) {
	script := Script{
		{Calls: []ToolCall{{Name: "a"}, {Name: "b"}}}, // two parallel calls
		Call("c", nil),
		Text("end"),
	}
	// One result of the two parallel calls is enough to move on.
	for results, want := range []string{"a", "c", "c", ""} {
		step := script.stepFor(results)
		got := ""
		if len(step.Calls) > 0 {
			got = step.Calls[0].Name
		}
		if got != want {
			t.Errorf("stepFor(%d) = %+v, want first call %q", results, step, want)
		}
	}
	if got := script.stepFor(3).Text; got != "end" {
		t.Errorf("stepFor(3) text %q, want end", got)
	}
	if got := script.stepFor(4).Text; got != DoneText {
		t.Errorf("past the end: %q, want %q", got, DoneText)
	}
}

func TestScriptsMatchLongestFirst(t *testing.T) {
	ss := Scripts{"fix": {Text("short")}, "fix the bug": {Text("long")}}
	if s, ok := ss.match("please fix the bug now"); !ok || s[0].Text != "long" {
		t.Errorf("got %v %v, want the longer key's script", s, ok)
	}
	if s, ok := ss.match("fix it"); !ok || s[0].Text != "short" {
		t.Errorf("got %v %v, want the shorter key's script", s, ok)
	}
	if _, ok := ss.match("nothing"); ok {
		t.Error("matched a prompt with no key in it")
	}
}

func TestAnthropic(t *testing.T) {
	s := Start(t, Scripts{"go": {
		Call("Bash", map[string]any{"command": "true"}),
		Text("finished"),
	}})
	tools := []any{map[string]any{"name": "Bash"}}
	prompt := map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "text", "text": "<system-reminder>context</system-reminder>"},
		map[string]any{"type": "text", "text": "go now"},
	}}

	// First turn, streamed: the events in the order Claude Code expects.
	_, body := post(t, s, "/v1/messages?beta=true", map[string]any{
		"model": "m", "stream": true, "tools": tools, "messages": []any{prompt},
	})
	var types []string
	var id string
	for _, ev := range sseData(t, body) {
		types = append(types, ev["type"].(string))
		if cb, ok := ev["content_block"].(map[string]any); ok && cb["type"] == "tool_use" {
			id = cb["id"].(string)
		}
		if d, ok := ev["delta"].(map[string]any); ok && d["type"] == "input_json_delta" && d["partial_json"] != `{"command":"true"}` {
			t.Errorf("input delta %v", d)
		}
	}
	want := "message_start content_block_start content_block_delta content_block_stop message_delta message_stop"
	if strings.Join(types, " ") != want {
		t.Errorf("events %v, want %s", types, want)
	}
	if id != "toolu_sim0001" || strings.Join(s.ToolUseIDs(), ",") != id {
		t.Errorf("tool id %q, ids %v", id, s.ToolUseIDs())
	}

	// Second turn, not streamed, carrying the result: the final text.
	_, body = post(t, s, "/v1/messages", map[string]any{
		"model": "m", "tools": tools, "messages": []any{
			prompt,
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": id, "name": "Bash", "input": map[string]any{}}}},
			map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "tool_result", "tool_use_id": id, "content": []any{map[string]any{"type": "text", "text": "out"}}},
				map[string]any{"type": "text", "text": "<system-reminder>beside a result</system-reminder>"},
			}},
		},
	})
	var msg struct {
		Content []struct {
			Type, Text string
		}
		StopReason string `json:"stop_reason"`
	}
	if err := json.Unmarshal([]byte(body), &msg); err != nil || len(msg.Content) != 1 || msg.Content[0].Text != "finished" || msg.StopReason != "end_turn" {
		t.Errorf("reply %s (%v)", body, err)
	}
	res := s.ToolResults()
	if len(res) != 1 || res[0] != (ToolResult{ID: id, Output: "out"}) {
		t.Errorf("results %+v", res)
	}
	reqs := s.Requests()
	if len(reqs) != 2 || !strings.Contains(reqs[1].Prompt, "go now") || reqs[1].Stream {
		t.Errorf("requests %+v", reqs)
	}

	// A side request without tools gets SideText; count_tokens a count;
	// an unknown path a 404.
	_, body = post(t, s, "/v1/messages", map[string]any{"model": "m", "messages": []any{prompt}})
	if !strings.Contains(body, `"text":"`+SideText+`"`) {
		t.Errorf("side reply %s", body)
	}
	if _, body = post(t, s, "/v1/messages/count_tokens", map[string]any{"messages": []any{prompt}}); !strings.Contains(body, `"input_tokens"`) {
		t.Errorf("count_tokens %s", body)
	}
	if code, _ := post(t, s, "/v1/other", map[string]any{}); code != http.StatusNotFound {
		t.Errorf("unknown path: status %d", code)
	}
}

func TestOpenAI(t *testing.T) {
	s := Start(t, Scripts{"patch": {
		Call("apply_patch", "*** Begin Patch\n*** End Patch\n"),
		Call("exec_command", map[string]any{"cmd": "ls"}),
	}})
	input := []any{
		map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "<environment_context/>"}}},
		map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "patch it"}}},
	}
	tools := []any{map[string]any{"type": "function", "name": "exec_command"}, map[string]any{"type": "custom", "name": "apply_patch"}}
	_, body := post(t, s, "/v1/responses", map[string]any{"model": "m", "stream": true, "tools": tools, "input": input})
	evs := sseData(t, body)
	if len(evs) != 3 || evs[1]["type"] != "response.output_item.done" || evs[2]["type"] != "response.completed" {
		t.Fatalf("events %v", evs)
	}
	item := evs[1]["item"].(map[string]any)
	if item["type"] != "custom_tool_call" || item["input"] != "*** Begin Patch\n*** End Patch\n" || item["call_id"] != "call_sim0001" {
		t.Errorf("item %v", item)
	}

	input = append(input,
		item,
		map[string]any{"type": "custom_tool_call_output", "call_id": "call_sim0001", "output": "Success."},
	)
	_, body = post(t, s, "/v1/responses", map[string]any{"model": "m", "stream": true, "tools": tools, "input": input})
	item = sseData(t, body)[1]["item"].(map[string]any)
	if item["type"] != "function_call" || item["arguments"] != `{"cmd":"ls"}` || item["call_id"] != "call_sim0002" {
		t.Errorf("item %v", item)
	}
	if r := s.Requests()[1]; r.Prompt != "patch it" || len(r.Results) != 1 || r.Results[0].Output != "Success." {
		t.Errorf("request %+v", r)
	}
}

func TestGemini(t *testing.T) {
	s := Start(t, Scripts{"shell": {Call("run_shell_command", map[string]any{"command": "ls"})}})
	req := map[string]any{
		"contents": []any{
			map[string]any{"role": "user", "parts": []any{map[string]any{"text": "<session_context/>"}, map[string]any{"text": "shell please"}}},
		},
		"tools": []any{map[string]any{"functionDeclarations": []any{map[string]any{"name": "run_shell_command"}}}},
	}
	_, body := post(t, s, "/v1beta/models/m:streamGenerateContent?alt=sse", req)
	evs := sseData(t, body)
	if len(evs) != 1 || !strings.Contains(body, `"functionCall":{"args":{"command":"ls"},"name":"run_shell_command"}`) {
		t.Errorf("stream %s", body)
	}
	// Once the function response is back, the script is over: DoneText,
	// here through the non-streaming method.
	req["contents"] = append(req["contents"].([]any),
		map[string]any{"role": "model", "parts": []any{map[string]any{"functionCall": map[string]any{"name": "run_shell_command", "args": map[string]any{"command": "ls"}}}}},
		map[string]any{"role": "user", "parts": []any{map[string]any{"functionResponse": map[string]any{
			"id": "x1", "name": "run_shell_command", "response": map[string]any{"output": "a.txt"},
		}}}},
	)
	_, body = post(t, s, "/v1beta/models/m:generateContent", req)
	if !strings.Contains(body, `"text":"`+DoneText+`"`) {
		t.Errorf("reply %s", body)
	}
	if res := s.ToolResults(); len(res) != 1 || res[0] != (ToolResult{ID: "x1", Name: "run_shell_command", Output: "a.txt"}) {
		t.Errorf("results %+v", res)
	}
}

func TestRunKillsProcessGroup(t *testing.T) {
	// The shell starts a child that would outlive it, prints the child's
	// pid and then hangs; Run must end both at the timeout.
	start := time.Now()
	stdout, _, err := Run(t, time.Second, t.TempDir(), nil, "sh", "-c", "sleep 60 & echo $!; sleep 60")
	if err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Errorf("err = %v, want a timeout", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Run took %v", d)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(stdout))
	if err != nil {
		t.Fatalf("child pid %q: %v", stdout, err)
	}
	// Dead means gone, or a zombie its new parent has not reaped yet.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(stat), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d still runs: %s", pid, stat)
		}
	}
}
