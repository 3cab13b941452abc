package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"stagefs/control"
)

// MaxLine bounds one message. A longer line is answered with an error
// (from the client) or dropped with a log line (from the agent), and the
// relay goes on with the next line.
const MaxLine = 32 << 20

// pendingDebounce is how long the proxy waits after a change to the
// pending set before it tells the editor, so a build's thousand writes
// make one notification, not a thousand.
const pendingDebounce = 200 * time.Millisecond

// Proxy is one `stagefs acp` session: an editor on one side, an agent on
// the other, the daemon behind both.
type Proxy struct {
	ctl       *control.Client // the daemon's control socket
	workspace string          // the workspace's own path, as the agent sees it
	mount     string          // the mount point: the staged view, outside the sandbox
	logf      func(string, ...any)

	client *writer // to the editor
	agent  *writer // to the agent

	mu       sync.Mutex
	sessions map[string]bool
	// inFlight holds the client's requests to the agent not yet answered,
	// by id: their method, and for a prompt its turn.
	inFlight map[string]request
	// toolCalls maps a tool call id to the snapshots that restore it, in
	// the order they were opened (the gap before it, then its own).
	toolCalls map[string][]string
	open      map[string]string // tool calls running: id → scope
	// ClientGone, if set, is called when the editor's side has ended and
	// the agent's input has been closed.
	ClientGone func()
	gap        string // the open gap snapshot, if any
	serial     int    // numbers gap and tool-call scopes
	clientFS   bool   // the client offered fs read/write
}

type request struct {
	method string
	turn   string
}

// New makes a proxy over the daemon reached by ctl, for the workspace at
// path workspace, whose staged view is mounted at mount.
func New(ctl *control.Client, workspace, mount string, logf func(string, ...any)) *Proxy {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return &Proxy{
		ctl: ctl, workspace: workspace, mount: mount, logf: logf,
		sessions:  map[string]bool{},
		inFlight:  map[string]request{},
		toolCalls: map[string][]string{},
		open:      map[string]string{},
	}
}

// writer writes whole lines to one side; the proxy's goroutines share it.
type writer struct {
	mu sync.Mutex
	w  io.Writer
}

func (w *writer) line(b []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.w.Write(b); err != nil {
		return err
	}
	if len(b) == 0 || b[len(b)-1] != '\n' {
		_, err := w.w.Write([]byte{'\n'})
		return err
	}
	return nil
}

func (w *writer) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return w.line(b)
}

// Run relays until the agent's output ends (the agent exited), then
// closes what the session left open. clientIn ending closes agentIn, which
// tells the agent to exit.
func (p *Proxy) Run(clientIn io.Reader, clientOut io.Writer, agentOut io.Reader, agentIn io.WriteCloser) error {
	p.client = &writer{w: clientOut}
	p.agent = &writer{w: agentIn}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.pumpPending(ctx)
	go func() {
		readLines(clientIn, func(line []byte, tooLong bool) {
			if tooLong {
				p.client.send(errorResponse(nil, -32600, fmt.Sprintf("message longer than %d bytes; dropped", MaxLine)))
				return
			}
			p.fromClient(line)
		})
		agentIn.Close()
		if p.ClientGone != nil {
			p.ClientGone()
		}
	}()
	err := readLines(agentOut, func(line []byte, tooLong bool) {
		if tooLong {
			p.logf("acp: the agent sent a message longer than %d bytes; dropped", MaxLine)
			return
		}
		p.fromAgent(line)
	})
	p.agentGone(err)
	return err
}

// readLines calls fn with each line of r (without its newline) until r
// ends; a line over MaxLine is reported with tooLong and skipped.
func readLines(r io.Reader, fn func(line []byte, tooLong bool)) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	tooLong := false
	for {
		chunk, err := br.ReadSlice('\n')
		if len(buf)+len(chunk) > MaxLine {
			tooLong, buf = true, buf[:0]
		} else if !tooLong {
			buf = append(buf, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if len(buf) > 0 || tooLong {
			line := bytes.TrimRight(buf, "\r\n")
			if tooLong || len(bytes.TrimSpace(line)) > 0 {
				fn(line, tooLong)
			}
		}
		buf, tooLong = buf[:0], false
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// envelope is any JSON-RPC message.
type envelope struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  json.RawMessage `json:"error,omitempty"`
}

func (e envelope) isRequest() bool { return e.Method != "" && len(e.ID) > 0 && string(e.ID) != "null" }

func errorResponse(id json.RawMessage, code int, msg string) map[string]any {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	return map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": msg}}
}

func resultResponse(id json.RawMessage, result any) map[string]any {
	return map[string]any{"jsonrpc": "2.0", "id": id, "result": result}
}

// fromClient handles one message from the editor.
func (p *Proxy) fromClient(line []byte) {
	var e envelope
	if err := json.Unmarshal(line, &e); err != nil {
		p.client.send(errorResponse(nil, -32700, "parse error: "+err.Error()))
		return
	}
	if h, ok := sessionMethods[ownName(e.Method)]; ok {
		if !e.isRequest() {
			return // a notification expects no answer
		}
		result, err := h(p, e.Params)
		if err != nil {
			p.client.send(errorFor(e.ID, err))
			return
		}
		p.client.send(resultResponse(e.ID, result))
		return
	}
	switch e.Method {
	case "initialize":
		line = p.initializeRequest(line)
	case "session/prompt":
		turn := p.startTurn(e.Params)
		p.mu.Lock()
		p.inFlight[string(e.ID)] = request{method: e.Method, turn: turn}
		p.mu.Unlock()
		p.agent.line(line)
		return
	case "session/load", "session/resume":
		var ps struct{ SessionID string }
		json.Unmarshal(e.Params, &ps)
		p.addSession(ps.SessionID)
	}
	if e.isRequest() {
		p.mu.Lock()
		p.inFlight[string(e.ID)] = request{method: e.Method}
		p.mu.Unlock()
	}
	p.agent.line(line)
}

// ownName maps a method under the extension prefix _stagefs/ to its
// session/ name.
func ownName(method string) string {
	if rest, ok := strings.CutPrefix(method, "_stagefs/"); ok {
		return "session/" + rest
	}
	return method
}

// fromAgent handles one message from the agent.
func (p *Proxy) fromAgent(line []byte) {
	var e envelope
	if err := json.Unmarshal(line, &e); err != nil {
		p.client.line(line) // not ours to judge
		return
	}
	switch {
	case e.Method == "session/update":
		p.sessionUpdate(e.Params)
	case e.Method == "session/request_permission":
		// The one point where the agent waits: the tool call's snapshot
		// is open before the editor is asked.
		var ps struct {
			ToolCall toolCall `json:"toolCall"`
		}
		if json.Unmarshal(e.Params, &ps) == nil && ps.ToolCall.ToolCallID != "" {
			p.toolCallStarted(ps.ToolCall)
		}
	case e.isRequest() && (e.Method == "fs/read_text_file" || e.Method == "fs/write_text_file"):
		p.agent.send(p.serveFS(e))
		return
	case e.Method == "" && len(e.ID) > 0:
		line = p.response(e, line)
	}
	p.client.line(line)
}

// response handles the agent's answer to one of the client's requests.
func (p *Proxy) response(e envelope, line []byte) []byte {
	p.mu.Lock()
	req, ok := p.inFlight[string(e.ID)]
	delete(p.inFlight, string(e.ID))
	p.mu.Unlock()
	if !ok || len(e.Result) == 0 {
		if ok && req.method == "session/prompt" {
			p.promptEnded()
		}
		return line
	}
	switch req.method {
	case "initialize":
		return p.initializeResponse(e, line)
	case "session/new":
		var r struct{ SessionID string }
		json.Unmarshal(e.Result, &r)
		p.addSession(r.SessionID)
	case "session/prompt":
		p.promptEnded()
		return withMeta(e, line, map[string]any{"turnId": req.turn})
	}
	return line
}

func (p *Proxy) addSession(id string) {
	if id == "" {
		return
	}
	p.mu.Lock()
	p.sessions[id] = true
	p.mu.Unlock()
}

// withMeta adds fields under result._meta.stagefs of a response.
func withMeta(e envelope, line []byte, fields map[string]any) []byte {
	var result map[string]any
	if json.Unmarshal(e.Result, &result) != nil || result == nil {
		return line
	}
	meta, _ := result["_meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	sf, _ := meta["stagefs"].(map[string]any)
	if sf == nil {
		sf = map[string]any{}
	}
	for k, v := range fields {
		sf[k] = v
	}
	meta["stagefs"] = sf
	result["_meta"] = meta
	out, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": e.ID, "result": result})
	if err != nil {
		return line
	}
	return out
}

// initializeRequest hides the client's terminal from the agent: a
// terminal the editor runs would run in the real workspace, outside the
// staged view, so the agent runs its commands itself, inside it.
func (p *Proxy) initializeRequest(line []byte) []byte {
	var msg map[string]any
	if json.Unmarshal(line, &msg) != nil {
		return line
	}
	params, _ := msg["params"].(map[string]any)
	caps, _ := params["clientCapabilities"].(map[string]any)
	if caps == nil {
		return line
	}
	if fs, ok := caps["fs"].(map[string]any); ok {
		p.mu.Lock()
		p.clientFS = fs["readTextFile"] == true || fs["writeTextFile"] == true
		p.mu.Unlock()
	}
	if _, ok := caps["terminal"]; !ok {
		return line
	}
	caps["terminal"] = false
	out, err := json.Marshal(msg)
	if err != nil {
		return line
	}
	return out
}

// initializeResponse adds stagefs's session capabilities and the staging
// state to the agent's answer.
func (p *Proxy) initializeResponse(e envelope, line []byte) []byte {
	var result map[string]any
	if json.Unmarshal(e.Result, &result) != nil || result == nil {
		return line
	}
	caps, _ := result["agentCapabilities"].(map[string]any)
	if caps == nil {
		caps = map[string]any{}
	}
	sc, _ := caps["sessionCapabilities"].(map[string]any)
	if sc == nil {
		sc = map[string]any{}
	}
	for _, c := range []string{"restoreToolCall", "rollback", "redo"} {
		sc[c] = map[string]any{}
	}
	caps["sessionCapabilities"] = sc
	result["agentCapabilities"] = caps
	meta, _ := result["_meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["stagefs"] = p.stagingState()
	result["_meta"] = meta
	out, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": e.ID, "result": result})
	if err != nil {
		return line
	}
	return out
}

// stagingState is what _meta.stagefs says of the staged view: the mode,
// the pending set's size, and the methods the proxy answers.
func (p *Proxy) stagingState() map[string]any {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	state := map[string]any{"workspace": p.workspace, "methods": methodNames()}
	if init, err := p.ctl.Initialize(ctx); err == nil {
		state["mode"] = init.Mode
	}
	if st, err := p.ctl.Status(ctx, nil); err == nil {
		state["pendingCount"], state["totalBytes"] = st.PendingCount, st.TotalBytes
	}
	return state
}

// agentGone answers what the agent left unanswered and closes the
// session's snapshots; the turn stays.
func (p *Proxy) agentGone(err error) {
	why := "the agent exited"
	if err != nil {
		why += ": " + err.Error()
	}
	// The snapshots first: an editor told of the end may act on them.
	p.promptEnded()
	p.mu.Lock()
	ids := make([]string, 0, len(p.inFlight))
	for id := range p.inFlight {
		ids = append(ids, id)
	}
	p.inFlight = map[string]request{}
	p.mu.Unlock()
	for _, id := range ids {
		p.client.send(errorResponse(json.RawMessage(id), -32603, why+" before answering; what it staged stays pending (stagefs status)"))
	}
}

// pumpPending tells the editor, a little after each change, how big the
// pending set is.
func (p *Proxy) pumpPending(ctx context.Context) {
	events, err := p.ctl.Subscribe(ctx)
	if err != nil {
		p.logf("acp: no events from the daemon: %v", err)
		return
	}
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			if ev.Kind == control.EventStagedWritesPending && timer == nil {
				timer = time.After(pendingDebounce)
			}
		case <-timer:
			timer = nil
			p.notifyPending(ctx)
		}
	}
}

func (p *Proxy) notifyPending(ctx context.Context) {
	st, err := p.ctl.Status(ctx, nil)
	if err != nil {
		return
	}
	for _, s := range p.sessionIDs() {
		p.client.send(map[string]any{"jsonrpc": "2.0", "method": "session/update", "params": map[string]any{
			"sessionId": s,
			"update": map[string]any{
				"sessionUpdate": "session_info_update",
				"_meta": map[string]any{"stagefs": map[string]any{
					"kind": "staged_writes_pending", "pendingCount": st.PendingCount, "totalBytes": st.TotalBytes,
				}},
			},
		}})
	}
}

func (p *Proxy) sessionIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for s := range p.sessions {
		out = append(out, s)
	}
	return out
}

// relPath maps an absolute path the agent names to a workspace-relative
// one; a path outside the workspace is refused.
func (p *Proxy) relPath(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("path %q is not absolute", path)
	}
	rel, err := filepath.Rel(p.workspace, filepath.Clean(path))
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("path %s is outside the workspace %s", path, p.workspace)
	}
	return rel, nil
}

// maxSymlinks bounds the links followed for one path, as the kernel's
// ELOOP limit does.
const maxSymlinks = 40

// resolve follows the symlinks of the workspace-relative path rel in the
// staged view, as an open there would, and returns the workspace-relative
// path it leads to. A link may name its target relative to itself or by
// an absolute path under the workspace (or the mount); one that leads out
// of the workspace is refused. A missing last part is kept (a file to be
// created).
func (p *Proxy) resolve(rel string) (string, error) {
	todo := strings.Split(filepath.ToSlash(rel), "/")
	var done []string
	for hops := 0; len(todo) > 0; {
		name := todo[0]
		todo = todo[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			if len(done) == 0 {
				return "", fmt.Errorf("%s leads out of the workspace", rel)
			}
			done = done[:len(done)-1]
			continue
		}
		cur := append(append([]string{}, done...), name)
		st, err := os.Lstat(filepath.Join(append([]string{p.mount}, cur...)...))
		if err != nil || st.Mode()&os.ModeSymlink == 0 {
			done = cur // missing parts are the caller's to report
			continue
		}
		if hops++; hops > maxSymlinks {
			return "", fmt.Errorf("%s: too many levels of symbolic links", rel)
		}
		target, err := os.Readlink(filepath.Join(append([]string{p.mount}, cur...)...))
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			t := filepath.Clean(target)
			var inside string
			switch {
			case t == p.workspace || strings.HasPrefix(t, p.workspace+"/"):
				inside = strings.TrimPrefix(strings.TrimPrefix(t, p.workspace), "/")
			case t == p.mount || strings.HasPrefix(t, p.mount+"/"):
				inside = strings.TrimPrefix(strings.TrimPrefix(t, p.mount), "/")
			default:
				return "", fmt.Errorf("%s leads out of the workspace (to %s)", rel, target)
			}
			done = nil
			todo = append(strings.Split(inside, "/"), todo...)
		} else {
			todo = append(strings.Split(target, "/"), todo...)
		}
	}
	return strings.Join(done, "/"), nil
}
