package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Client talks to a stagefs daemon. It is safe for concurrent use: each
// Call gets its own id and a reader goroutine hands responses back by id.
type Client struct {
	path string
	conn *net.UnixConn

	wmu sync.Mutex // serializes request writes

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan callResult
	err     error // why the connection ended; set before done is closed

	done    chan struct{} // closed when the reader goroutine exits
	closing chan struct{} // closed by Close
	once    sync.Once

	// events is non-nil only for a subscription connection; the reader
	// delivers session/update notifications there and closes it on exit.
	events chan Event
}

type callResult struct {
	result json.RawMessage
	err    error
}

// incoming is any message from the server: a response or a notification.
type incoming struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *Error          `json:"error"`
}

// outgoing is a request.
type outgoing struct {
	JSONRPC string `json:"jsonrpc"`
	ID      uint64 `json:"id"`
	Method  string `json:"method"`
	Params  any    `json:"params,omitempty"`
}

// ErrClientClosed is returned by calls on a closed client.
var ErrClientClosed = errors.New("stagefs control client closed")

// Dial connects to the daemon's control socket.
func Dial(socketPath string) (*Client, error) {
	return dial(socketPath, false)
}

func dial(socketPath string, subscription bool) (*Client, error) {
	nc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socketPath, Net: "unix"})
	if err != nil {
		// The two common cases, named for the user: no socket file, or a
		// socket file whose daemon has gone.
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("no stagefs daemon at %s: %w", socketPath, err)
		}
		return nil, fmt.Errorf("cannot connect to stagefs daemon at %s: %w", socketPath, err)
	}
	c := &Client{
		path:    socketPath,
		conn:    nc,
		pending: map[uint64]chan callResult{},
		done:    make(chan struct{}),
		closing: make(chan struct{}),
	}
	if subscription {
		c.events = make(chan Event, 64)
	}
	go c.read()
	return c, nil
}

// Close closes the connection. Calls in flight fail with ErrClientClosed.
func (c *Client) Close() error {
	var err error
	c.once.Do(func() {
		close(c.closing)
		err = c.conn.Close()
	})
	<-c.done
	return err
}

// Call sends one request and waits for its response. result, if not nil,
// receives the decoded result. A JSON-RPC error comes back as *Error.
func (c *Client) Call(ctx context.Context, method string, params, result any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.nextID++
	id := c.nextID
	ch := make(chan callResult, 1)
	c.pending[id] = ch
	c.mu.Unlock()

	line, err := json.Marshal(outgoing{JSONRPC: "2.0", ID: id, Method: method, Params: params})
	if err != nil {
		c.forget(id)
		return fmt.Errorf("encode %s params: %w", method, err)
	}
	if n, err := c.send(ctx, append(line, '\n')); err != nil {
		c.forget(id)
		if n == 0 && ctx.Err() != nil {
			// The deadline passed before a byte went out: the stream is
			// intact and the client stays usable.
			return ctx.Err()
		}
		// The server has gone, or a partial line broke the framing. Only
		// shut our sending side: the reader still collects what the server
		// wrote before closing (say, "peer uid not allowed"), then fails
		// all pending calls. That reason beats "broken pipe".
		c.conn.CloseWrite()
		select {
		case <-c.done:
		case <-ctx.Done():
		}
		if e := c.connErr(); errors.As(e, new(*Error)) {
			return e
		}
		return fmt.Errorf("send %s: %w", method, err)
	}

	select {
	case r := <-ch:
		if r.err != nil {
			return r.err
		}
		if result != nil {
			if err := json.Unmarshal(r.result, result); err != nil {
				return fmt.Errorf("decode %s result: %w", method, err)
			}
		}
		return nil
	case <-ctx.Done():
		c.forget(id)
		return ctx.Err()
	}
}

// send writes one line, honouring the context's deadline, and returns how
// many bytes went out.
func (c *Client) send(ctx context.Context, line []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if deadline, ok := ctx.Deadline(); ok {
		c.conn.SetWriteDeadline(deadline)
		defer c.conn.SetWriteDeadline(time.Time{})
	}
	return c.conn.Write(line)
}

func (c *Client) forget(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

func (c *Client) connErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// read is the reader goroutine: it routes responses to their callers and
// notifications to the event channel (or drops them on a plain client).
func (c *Client) read() {
	r := bufio.NewReaderSize(c.conn, 64<<10)
	var readErr error
	for {
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			if !c.dispatch(line) {
				readErr = ErrClientClosed
				break
			}
		}
		if err != nil {
			readErr = err
			break
		}
	}
	c.finish(readErr)
}

// dispatch handles one line from the server. It returns false when the
// client is closing and the reader should stop.
func (c *Client) dispatch(line []byte) bool {
	var msg incoming
	if err := json.Unmarshal(line, &msg); err != nil {
		return true // not ours to fix; the caller will time out or get the next line
	}
	if msg.Method != "" {
		if c.events == nil || msg.Method != MethodSessionUpdate {
			return true
		}
		var ev Event
		if err := json.Unmarshal(msg.Params, &ev); err != nil {
			return true
		}
		// Blocking on purpose: a consumer that does not keep up stops us
		// reading, and the server's bounded queue then reports "missed".
		select {
		case c.events <- ev:
			return true
		case <-c.closing:
			return false
		}
	}

	id, err := strconv.ParseUint(string(msg.ID), 10, 64)
	if err != nil {
		// No usable id: the server could not tie its answer to a request
		// (refused peer, over-long line). It closes the connection next,
		// so this error is the reason every pending call fails.
		if msg.Error != nil {
			c.mu.Lock()
			if c.err == nil {
				c.err = msg.Error
			}
			c.mu.Unlock()
		}
		return true
	}
	c.mu.Lock()
	ch := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if ch == nil {
		return true // the caller gave up (context done)
	}
	if msg.Error != nil {
		ch <- callResult{err: msg.Error}
	} else {
		ch <- callResult{result: msg.Result}
	}
	return true
}

// finish records why the connection ended and fails every pending call.
func (c *Client) finish(readErr error) {
	c.mu.Lock()
	if c.err == nil {
		select {
		case <-c.closing:
			c.err = ErrClientClosed
		default:
			if readErr == nil || errors.Is(readErr, io.EOF) {
				c.err = fmt.Errorf("stagefs daemon at %s closed the connection", c.path)
			} else {
				c.err = fmt.Errorf("connection to stagefs daemon at %s: %w", c.path, readErr)
			}
		}
	}
	err := c.err
	pending := c.pending
	c.pending = map[uint64]chan callResult{}
	c.mu.Unlock()

	for _, ch := range pending {
		ch <- callResult{err: err}
	}
	c.conn.Close()
	if c.events != nil {
		close(c.events)
	}
	close(c.done)
}

// Subscribe opens a separate connection, subscribes to events and returns
// them on a channel. The channel is closed when ctx ends, the client is
// closed, or the connection drops. A consumer that falls behind receives an
// Event{Kind: "missed"} once it catches up.
func (c *Client) Subscribe(ctx context.Context) (<-chan Event, error) {
	sc, err := dial(c.path, true)
	if err != nil {
		return nil, err
	}
	var res SubscribeResult
	if err := sc.Call(ctx, MethodSubscribe, SubscribeParams{}, &res); err != nil {
		sc.Close()
		return nil, err
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-c.done:
		case <-sc.done:
		}
		sc.Close()
	}()
	return sc.events, nil
}

// Initialize calls session/initialize.
func (c *Client) Initialize(ctx context.Context) (InitializeResult, error) {
	var r InitializeResult
	err := c.Call(ctx, MethodInitialize, InitializeParams{}, &r)
	return r, err
}

// SetMode calls fs/set_mode.
func (c *Client) SetMode(ctx context.Context, mode string) (SetModeResult, error) {
	var r SetModeResult
	err := c.Call(ctx, MethodSetMode, SetModeParams{Mode: mode}, &r)
	return r, err
}

// Status calls fs/staged_status.
func (c *Client) Status(ctx context.Context, paths []string) (StatusResult, error) {
	var r StatusResult
	err := c.Call(ctx, MethodStagedStatus, PathsParams{Paths: paths}, &r)
	return r, err
}

// Commit calls fs/commit_staged.
func (c *Client) Commit(ctx context.Context, p CommitParams) (CommitResult, error) {
	var r CommitResult
	err := c.Call(ctx, MethodCommitStaged, p, &r)
	return r, err
}

// Discard calls fs/discard_staged.
func (c *Client) Discard(ctx context.Context, paths []string) (DiscardResult, error) {
	var r DiscardResult
	err := c.Call(ctx, MethodDiscardStaged, PathsParams{Paths: paths}, &r)
	return r, err
}

// Diff calls fs/diff.
func (c *Client) Diff(ctx context.Context, paths []string) (DiffResult, error) {
	var r DiffResult
	err := c.Call(ctx, MethodDiff, PathsParams{Paths: paths}, &r)
	return r, err
}

// ReadText calls fs/read_text.
func (c *Client) ReadText(ctx context.Context, path string) (ReadTextResult, error) {
	var r ReadTextResult
	err := c.Call(ctx, MethodReadText, PathParams{Path: path}, &r)
	return r, err
}

// SafeTextPatch calls fs/safe_text_patch.
func (c *Client) SafeTextPatch(ctx context.Context, p SafeTextPatchParams) (SafeTextPatchResult, error) {
	var r SafeTextPatchResult
	err := c.Call(ctx, MethodSafeTextPatch, p, &r)
	return r, err
}

// Log calls session/log.
func (c *Client) Log(ctx context.Context, p LogParams) (LogResult, error) {
	var r LogResult
	err := c.Call(ctx, MethodLog, p, &r)
	return r, err
}

// A Client is also a Backend, which lets a host put a remote daemon where a
// local backend is expected (for example to proxy it).
var _ Backend = (*Client)(nil)
