package agentsim

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// The API names a Request records.
const (
	APIAnthropic = "anthropic" // Claude Code: /v1/messages
	APIOpenAI    = "openai"    // Codex CLI: /v1/responses
	APIGemini    = "gemini"    // Gemini CLI: /v1beta/models/...
)

// ToolResult is one tool result an agent sent back.
type ToolResult struct {
	// ID is the tool-use id: Anthropic's tool_use_id and Codex's call_id
	// echo the id the Server sent; Gemini CLI makes up its own
	// ("run_shell_command_1795760408138_0") for calls without one.
	ID string
	// Name is the function name; only Gemini sends it.
	Name string
	// Output is the result as text: the string the agent sent, the texts
	// of its content blocks joined by newlines, or else the raw JSON.
	Output string
	// IsError is Anthropic's is_error flag.
	IsError bool
}

// Request is one request the Server answered, as the tests see it.
type Request struct {
	API    string // APIAnthropic, APIOpenAI, APIGemini, or "" for a path none serves
	Method string
	Path   string // URL path without the query
	Query  string // raw query, for example "beta=true" or "alt=sse"
	Header http.Header
	Body   map[string]any
	Stream bool // the request asked for a streamed reply

	// Tools are the names of the tools the request offered the model.
	Tools []string
	// Prompt is the text of the latest user prompt in the conversation.
	Prompt string
	// Results are the tool results the conversation carries since Prompt.
	Results []ToolResult
	// Reply is what the Server answered, with tool-use ids filled in.
	Reply Step
}

// Server is a scripted stand-in for the Anthropic, OpenAI Responses and
// Gemini APIs, listening on 127.0.0.1 until the test ends.
type Server struct {
	// URL is the server's base URL, "http://127.0.0.1:PORT", with no path.
	URL string

	t       testing.TB
	scripts Scripts
	ts      *httptest.Server

	mu       sync.Mutex
	requests []Request
	ids      []string
	calls    int // tool calls given ids so far, numbering them
	serial   int // numbers message and response ids
}

// Start starts a Server answering from scripts on a free port of 127.0.0.1
// and stops it when the test ends. Scripts may be nil, in which case every
// request gets SideText.
func Start(t testing.TB, scripts Scripts) *Server {
	t.Helper()
	s := &Server{t: t, scripts: scripts}
	// httptest picks 127.0.0.1 too, but falls back to [::1]; the agents
	// must never be pointed anywhere but IPv4 loopback, so bind explicitly.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("agentsim: listen: %v", err)
	}
	s.ts = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.ts.Listener.Close()
	s.ts.Listener = l
	s.ts.Start()
	s.URL = s.ts.URL
	// Close waits for requests in flight, so no handler logs to t after
	// the test has finished.
	t.Cleanup(s.ts.Close)
	return s
}

// Requests returns a copy of every request answered so far, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.requests))
	copy(out, s.requests)
	return out
}

// ToolUseIDs returns every tool-use id the Server has sent, in order.
func (s *Server) ToolUseIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ids...)
}

// ToolResults returns the tool results the agents sent back, each once
// (agents resend the whole conversation, so a result arrives again with
// every later request), in the order first seen.
func (s *Server) ToolResults() []ToolResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []ToolResult
	seen := map[ToolResult]bool{}
	for _, r := range s.requests {
		for _, res := range r.Results {
			if !seen[res] {
				seen[res] = true
				out = append(out, res)
			}
		}
	}
	return out
}

// serve routes a request to the API its path belongs to.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p := r.URL.Path
	switch {
	case r.Method == http.MethodPost && p == "/v1/messages":
		s.anthropicMessages(w, r, body)
	case r.Method == http.MethodPost && p == "/v1/messages/count_tokens":
		s.anthropicCountTokens(w, r, body)
	case r.Method == http.MethodPost && p == "/v1/responses":
		s.openaiResponses(w, r, body)
	case r.Method == http.MethodPost && strings.HasPrefix(p, "/v1beta/models/"):
		s.gemini(w, r, body)
	default:
		s.notFound(w, r, body)
	}
}

// notFound answers a path no API here serves, in the JSON error shape the
// three APIs share closely enough, and logs it: an agent that starts
// calling a new endpoint is something the test author wants to hear about.
func (s *Server) notFound(w http.ResponseWriter, r *http.Request, body []byte) {
	s.t.Logf("agentsim: unexpected request %s %s", r.Method, r.URL)
	s.record(newRequest("", r, body))
	writeJSON(w, http.StatusNotFound, anthropicError("not_found_error",
		fmt.Sprintf("agentsim: no handler for %s %s", r.Method, r.URL.Path)))
}

// badBody logs and records a request whose body does not decode; the
// caller answers it with the API's 400 error. An agent sending a shape the
// Server cannot read is news to the test author, like an unknown path.
func (s *Server) badBody(api string, r *http.Request, body []byte, err error) {
	s.t.Logf("agentsim: %s %s: cannot decode the body: %v", r.Method, r.URL, err)
	s.record(newRequest(api, r, body))
}

// choose picks the reply to a request. Requests offering no tools are side
// requests (titles, summaries); they and prompts no Script covers get
// SideText. Tool calls get fresh ids made from idPrefix, unless idPrefix is
// empty (Gemini has no ids) or the Script set its own.
func (s *Server) choose(tools []string, prompt string, results int, idPrefix string) Step {
	if len(tools) == 0 {
		return Text(SideText)
	}
	script, ok := s.scripts.match(prompt)
	if !ok {
		return Text(SideText)
	}
	step := script.stepFor(results)
	// Copy the calls: the Script is shared and must not see the ids.
	calls := make([]ToolCall, len(step.Calls))
	copy(calls, step.Calls)
	step.Calls = calls
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range step.Calls {
		if step.Calls[i].ID == "" && idPrefix != "" {
			s.calls++
			step.Calls[i].ID = fmt.Sprintf("%ssim%04d", idPrefix, s.calls)
		}
		if step.Calls[i].ID != "" {
			s.ids = append(s.ids, step.Calls[i].ID)
		}
	}
	return step
}

// nextSerial returns a fresh number for message and response ids.
func (s *Server) nextSerial() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.serial++
	return s.serial
}

// newRequest starts the record of a request with what every API shares.
func newRequest(api string, r *http.Request, body []byte) Request {
	return Request{
		API: api, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
		Header: r.Header.Clone(), Body: decodeBody(body),
	}
}

func (s *Server) record(req Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, req)
}

// decodeBody decodes a JSON object body for the record; anything else
// (empty, not JSON) records as nil.
func decodeBody(body []byte) map[string]any {
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return nil
	}
	return m
}

// mustJSON marshals v, which the package builds itself or a Script holds.
// A Script input that cannot be marshalled is a bug in the test, and the
// agent would only fail obscurely on it, so say so loudly.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("agentsim: cannot marshal %T: %v", v, err))
	}
	return b
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(mustJSON(v))
}

// startSSE sends the headers of a server-sent event stream.
func startSSE(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
}

// writeEvent sends one server-sent event: an "event:" line when event is
// not empty (Gemini's stream has none), then the JSON data, and flushes it
// so the agent sees it at once, as it would from a real stream.
func writeEvent(w http.ResponseWriter, event string, data any) {
	if event != "" {
		fmt.Fprintf(w, "event: %s\n", event)
	}
	fmt.Fprintf(w, "data: %s\n\n", mustJSON(data))
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// inputJSON is a call's input as JSON text, "{}" for none: the APIs want an
// object there, never null.
func inputJSON(input any) []byte {
	if input == nil {
		return []byte("{}")
	}
	return mustJSON(input)
}

// tokens is a rough token count for usage fields. The agents show usage and
// some refuse a reply without it, but none checks the number.
func tokens(body []byte) int {
	return len(body)/4 + 1
}

// resultText turns a tool result's content, a JSON string or an array of
// {"type":"text","text":...} blocks, into text; anything else stays raw JSON.
func resultText(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var str string
	if json.Unmarshal(raw, &str) == nil {
		return str
	}
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &blocks) == nil {
		var texts []string
		for _, b := range blocks {
			if b.Text != "" {
				texts = append(texts, b.Text)
			}
		}
		return strings.Join(texts, "\n")
	}
	return string(raw)
}
