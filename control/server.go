package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"runtime/debug"
	"sort"
	"sync"
	"time"
	"unicode/utf8"
)

// Defaults for ServerOptions.
const (
	DefaultMaxLineBytes = 8 << 20
	DefaultEventQueue   = 256
)

// ServerOptions tunes a Server. The zero value is usable.
type ServerOptions struct {
	// MaxLineBytes bounds one request line (newline excluded). A longer
	// line gets a -32600 reply and the connection is closed, because the
	// rest of the stream can no longer be framed reliably.
	MaxLineBytes int
	// AllowUID decides which peer uids (from SO_PEERCRED) may talk to the
	// server. Default: the daemon's own uid and root.
	AllowUID func(uid uint32) bool
	// EventQueue is the length of each subscriber's event queue.
	EventQueue int
	// Logf, if set, receives diagnostics (refused peers, panics, accept
	// errors).
	Logf func(format string, args ...any)
}

// HandlerFunc answers one method. params is the raw params value, nil when
// the request had none (or null). The result is marshalled as the response
// result; an error is sent as described for Backend.
type HandlerFunc func(ctx context.Context, params json.RawMessage) (any, error)

// Server answers JSON-RPC requests on Unix sockets and fans events out to
// subscribers.
type Server struct {
	opts ServerOptions

	// ctx is the parent of every connection's context; Close cancels it so
	// that handlers waiting on the backend give up.
	ctx    context.Context
	cancel context.CancelFunc

	hmu      sync.RWMutex
	handlers map[string]HandlerFunc

	mu        sync.Mutex
	closed    bool
	listeners map[*net.UnixListener]struct{}
	conns     map[*conn]struct{}
	// wg counts connection goroutines and subscriber writers, so that Close
	// can wait for every handler to return.
	wg sync.WaitGroup

	// subMu guards seq and subs. Publish holds it only while appending to
	// in-memory queues, never during I/O.
	subMu sync.Mutex
	seq   uint64
	subs  map[*subscriber]struct{}
}

// NewServer returns a server answering the methods in Methods with b.
// b may be nil for a server whose methods are all added with Handle (as
// NewHookServer's are).
func NewServer(b Backend, opts ServerOptions) *Server {
	if opts.MaxLineBytes <= 0 {
		opts.MaxLineBytes = DefaultMaxLineBytes
	}
	if opts.AllowUID == nil {
		self := uint32(os.Getuid())
		opts.AllowUID = func(uid uint32) bool { return uid == self || uid == 0 }
	}
	if opts.EventQueue <= 0 {
		opts.EventQueue = DefaultEventQueue
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		opts:      opts,
		ctx:       ctx,
		cancel:    cancel,
		handlers:  map[string]HandlerFunc{},
		listeners: map[*net.UnixListener]struct{}{},
		conns:     map[*conn]struct{}{},
		subs:      map[*subscriber]struct{}{},
	}
	if b != nil {
		s.registerBackend(b)
	}
	s.Handle(MethodSubscribe, Typed(s.subscribe))
	return s
}

// registerBackend fills the method table with the Backend's methods. Each
// entry only adapts params to the Backend call; nil slices in results are
// replaced by empty ones so that clients always see arrays, never null.
func (s *Server) registerBackend(b Backend) {
	s.Handle(MethodInitialize, Typed(func(ctx context.Context, _ InitializeParams) (InitializeResult, error) {
		r, err := b.Initialize(ctx)
		if r.Capabilities == nil {
			r.Capabilities = map[string]bool{}
		}
		return r, err
	}))
	s.Handle(MethodSetMode, Typed(func(ctx context.Context, p SetModeParams) (SetModeResult, error) {
		return b.SetMode(ctx, p.Mode)
	}))
	s.Handle(MethodStagedStatus, Typed(func(ctx context.Context, p PathsParams) (StatusResult, error) {
		r, err := b.Status(ctx, p.Paths)
		r.Entries = nonNil(r.Entries)
		return r, err
	}))
	s.Handle(MethodCommitStaged, Typed(func(ctx context.Context, p CommitParams) (CommitResult, error) {
		r, err := b.Commit(ctx, p)
		r.Committed = nonNil(r.Committed)
		r.Conflicts = nonNil(r.Conflicts)
		r.Failed = nonNil(r.Failed)
		return r, err
	}))
	s.Handle(MethodDiscardStaged, Typed(func(ctx context.Context, p PathsParams) (DiscardResult, error) {
		r, err := b.Discard(ctx, p.Paths)
		r.Discarded = nonNil(r.Discarded)
		return r, err
	}))
	s.Handle(MethodDiff, Typed(func(ctx context.Context, p PathsParams) (DiffResult, error) {
		return b.Diff(ctx, p.Paths)
	}))
	s.Handle(MethodReadText, Typed(func(ctx context.Context, p PathParams) (ReadTextResult, error) {
		return b.ReadText(ctx, p.Path)
	}))
	s.Handle(MethodSafeTextPatch, Typed(func(ctx context.Context, p SafeTextPatchParams) (SafeTextPatchResult, error) {
		return b.SafeTextPatch(ctx, p)
	}))
	s.Handle(MethodLog, Typed(func(ctx context.Context, p LogParams) (LogResult, error) {
		r, err := b.Log(ctx, p)
		r.Records = nonNil(r.Records)
		return r, err
	}))

	s.Handle(MethodSnapshot, Typed(func(ctx context.Context, p SnapshotParams) (SnapshotInfo, error) {
		r, err := b.Snapshot(ctx, p)
		r.Paths = nonNil(r.Paths)
		return r, err
	}))
	s.Handle(MethodCloseSnapshot, Typed(func(ctx context.Context, p ScopeParams) (SnapshotInfo, error) {
		r, err := b.CloseSnapshot(ctx, p.ScopeID)
		r.Paths = nonNil(r.Paths)
		return r, err
	}))
	s.Handle(MethodRestore, Typed(func(ctx context.Context, p RestoreParams) (RestoreResult, error) {
		r, err := b.RestoreWith(ctx, p)
		r.RestoredPaths = nonNil(r.RestoredPaths)
		r.Overwritten = nonNil(r.Overwritten)
		r.Kept = nonNil(r.Kept)
		r.Uncaptured = nonNil(r.Uncaptured)
		r.Conflicts = nonNil(r.Conflicts)
		r.Failed = nonNil(r.Failed)
		return r, err
	}))
	s.Handle(MethodListSnapshots, Typed(func(ctx context.Context, _ struct{}) (ListSnapshotsResult, error) {
		r, err := b.ListSnapshots(ctx)
		r.Snapshots = nonNil(r.Snapshots)
		return r, err
	}))
	s.Handle(MethodDropSnapshot, Typed(func(ctx context.Context, p ScopeParams) (DropSnapshotResult, error) {
		return b.DropSnapshot(ctx, p.ScopeID)
	}))

	s.Handle(MethodTurn, Typed(func(ctx context.Context, p TurnParams) (TurnInfo, error) {
		return b.Turn(ctx, p)
	}))
	s.Handle(MethodCheckpoints, Typed(func(ctx context.Context, _ struct{}) (CheckpointsResult, error) {
		r, err := b.Checkpoints(ctx)
		r.Turns = nonNil(r.Turns)
		return r, err
	}))
	s.Handle(MethodRollback, Typed(func(ctx context.Context, p RollbackParams) (RollbackResult, error) {
		r, err := b.Rollback(ctx, p)
		return rollbackResult(r), err
	}))
	s.Handle(MethodRedo, Typed(func(ctx context.Context, p RedoParams) (RollbackResult, error) {
		r, err := b.Redo(ctx, p)
		return rollbackResult(r), err
	}))
	s.Handle(MethodMarkUser, Typed(func(ctx context.Context, p MarkUserParams) (MarkUserResult, error) {
		return b.MarkUser(ctx, p)
	}))
}

// rollbackResult gives a rollback's or a redo's lists as arrays.
func rollbackResult(r RollbackResult) RollbackResult {
	r.RestoredPaths = nonNil(r.RestoredPaths)
	r.Conflicts = nonNil(r.Conflicts)
	r.Failed = nonNil(r.Failed)
	return r
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// Handle adds or replaces the handler of a method. It is safe to call at
// any time, also while serving.
func (s *Server) Handle(method string, h HandlerFunc) {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	if h == nil {
		delete(s.handlers, method)
		return
	}
	s.handlers[method] = h
}

// Methods returns the names of all methods with a handler, sorted.
func (s *Server) Methods() []string {
	s.hmu.RLock()
	defer s.hmu.RUnlock()
	names := make([]string, 0, len(s.handlers))
	for name := range s.handlers {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

func (s *Server) handler(method string) HandlerFunc {
	s.hmu.RLock()
	defer s.hmu.RUnlock()
	return s.handlers[method]
}

// Typed adapts a function taking decoded params to a HandlerFunc. Absent or
// null params decode as the zero P; params that do not decode into P (wrong
// types; unknown fields are fine) are -32602 naming the field. If *P has a
// Validate method (see Validator) it runs before fn.
func Typed[P any, R any](fn func(context.Context, P) (R, error)) HandlerFunc {
	return func(ctx context.Context, params json.RawMessage) (any, error) {
		var p P
		if len(params) > 0 && !bytes.Equal(params, jsonNull) {
			if err := validText(params); err != nil {
				return nil, err
			}
			if err := json.Unmarshal(params, &p); err != nil {
				return nil, paramsError(err)
			}
		}
		if v, ok := any(&p).(Validator); ok {
			if err := v.Validate(); err != nil {
				var e *Error
				if errors.As(err, &e) {
					return nil, err
				}
				return nil, Errorf(CodeInvalidParams, "invalid params: %v", err)
			}
		}
		r, err := fn(ctx, p)
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}

// paramsError describes a params decoding failure as -32602, naming the
// field (its dotted path) both in the message and in data.field.
func paramsError(err error) *Error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return Errorf(CodeInvalidParams, "invalid params: params must be %s, got %s", jsonTypeName(te.Type), te.Value)
		}
		return invalidParams(te.Field, "field %q must be %s, got %s", te.Field, jsonTypeName(te.Type), te.Value)
	}
	return Errorf(CodeInvalidParams, "invalid params: %v", err)
}

// jsonTypeName names a Go type the way a JSON client thinks of it.
func jsonTypeName(t reflect.Type) string {
	if t == nil {
		return "a different type"
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Pointer:
		return jsonTypeName(t.Elem())
	}
	return t.String()
}

// Serve accepts connections on l until Close is called, then returns nil.
// It may be called for several listeners at once. l is closed on return.
func (s *Server) Serve(l *net.UnixListener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return nil
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
		l.Close()
	}()

	var backoff time.Duration
	for {
		nc, err := l.AcceptUnix()
		if err != nil {
			if s.isClosed() {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Typically EMFILE: the daemon must not die, so wait and retry.
			if backoff == 0 {
				backoff = 5 * time.Millisecond
			} else if backoff < time.Second {
				backoff *= 2
			}
			s.logf("control: accept: %v; retrying in %v", err, backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0

		c := s.newConn(nc)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close stops accepting, closes every connection and waits until all
// handlers and subscriber writers have returned. It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	listeners := make([]*net.UnixListener, 0, len(s.listeners))
	for l := range s.listeners {
		listeners = append(listeners, l)
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()

	s.cancel()
	for _, l := range listeners {
		l.Close()
	}
	for _, c := range conns {
		c.close()
	}
	s.wg.Wait()
	return nil
}

// Publish sends ev to every subscriber. It assigns ev.Seq (and ev.Time
// when empty) and never blocks on I/O: each subscriber has a bounded queue,
// see subscriber.push. It is safe from any goroutine. The slices in ev are
// shared with the queues and must not be changed afterwards.
func (s *Server) Publish(ev Event) {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	s.seq++
	ev.Seq = s.seq
	if ev.Time == "" {
		ev.Time = now()
	}
	for sub := range s.subs {
		sub.push(ev)
	}
}

func now() string {
	return time.Now().UTC().Format(time.RFC3339Nano)
}

func (s *Server) logf(format string, args ...any) {
	if s.opts.Logf != nil {
		s.opts.Logf(format, args...)
	}
}

// conn is one client connection. Requests are read and answered in order
// by one goroutine; a subscriber writer goroutine may write events in
// between, so every write goes through write, which serializes them.
type conn struct {
	s      *Server
	nc     *net.UnixConn
	ctx    context.Context
	cancel context.CancelFunc

	wmu       sync.Mutex
	closeOnce sync.Once

	// peer is the client process, read once when the connection is
	// accepted; handlers get it through PeerFrom.
	peer Peer

	// sub is set by events/subscribe. It is only touched by the
	// connection's own goroutine, which is also the one running handlers.
	sub        *subscriber
	subStarted bool
}

type connKey struct{}

// Peer is the process at the other end of a connection, from SO_PEERCRED.
type Peer struct {
	Pid int
	Uid uint32
	Gid uint32
}

// PeerFrom returns the client process of the request whose context ctx
// is, so that a Backend can say who asked for an operation (the journal
// records a commit's or a discard's pid and command). ok is false for a
// context that did not come from the server.
func PeerFrom(ctx context.Context) (peer Peer, ok bool) {
	c, ok := ctx.Value(connKey{}).(*conn)
	if !ok {
		return Peer{}, false
	}
	return c.peer, true
}

func (s *Server) newConn(nc *net.UnixConn) *conn {
	ctx, cancel := context.WithCancel(s.ctx)
	return &conn{s: s, nc: nc, ctx: ctx, cancel: cancel}
}

// write sends one complete line. A failed write closes the connection:
// after a partial line the stream cannot be framed any more.
func (c *conn) write(line []byte) error {
	c.wmu.Lock()
	_, err := c.nc.Write(line)
	c.wmu.Unlock()
	if err != nil {
		c.close()
	}
	return err
}

func (c *conn) close() {
	c.closeOnce.Do(func() {
		c.cancel()
		c.nc.Close()
	})
}

func (s *Server) serveConn(c *conn) {
	defer s.wg.Done()
	defer func() {
		c.close()
		if c.sub != nil {
			s.removeSubscriber(c.sub)
		}
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()

	peer, err := peerCred(c.nc)
	if err != nil {
		s.logf("control: refusing connection: %v", err)
		s.refuse(c, "cannot read peer credentials: %v", err)
		return
	}
	if !s.opts.AllowUID(peer.Uid) {
		s.logf("control: refusing connection from uid %d", peer.Uid)
		s.refuse(c, "peer uid %d not allowed", peer.Uid)
		return
	}
	c.peer = peer

	r := bufio.NewReaderSize(c.nc, 64<<10)
	for {
		line, err := readLine(r, s.opts.MaxLineBytes)
		if errors.Is(err, errLineTooLong) {
			c.write(encodeResponse(errorResponse(nil, CodeInvalidRequest,
				"request line exceeds %d bytes", s.opts.MaxLineBytes)))
			return
		}
		if len(line) > 0 {
			if werr := s.handleLine(c, line); werr != nil {
				return
			}
		}
		if err != nil {
			// io.EOF or a closed connection: nothing more to answer.
			return
		}
	}
}

// refuse sends one error line to a peer that may not talk to us. The
// deadline keeps a peer that never reads from holding the goroutine.
func (s *Server) refuse(c *conn, format string, args ...any) {
	c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	c.write(encodeResponse(errorResponse(nil, CodeInvalidRequest, format, args...)))
}

// handleLine answers one request line. It returns an error only when the
// connection is broken.
func (s *Server) handleLine(c *conn, line []byte) error {
	req, reply := decodeRequest(line)
	if reply != nil {
		return c.write(encodeResponse(reply))
	}
	if req == nil {
		return nil // blank line
	}

	result, err := s.call(c, req)
	if req.ID != nil {
		resp := &response{JSONRPC: "2.0", ID: req.ID}
		if err != nil {
			resp.Error = wireError(err)
		} else if b, merr := json.Marshal(result); merr != nil {
			resp.Error = &Error{Code: CodeInternal, Message: fmt.Sprintf("cannot encode result: %v", merr)}
		} else {
			resp.Result = b
		}
		if werr := c.write(encodeResponse(resp)); werr != nil {
			return werr
		}
	}

	// The subscriber's writer starts only once the subscribe reply is on
	// the wire, so a client always sees the reply before any event. Events
	// published in between wait in the queue.
	if c.sub != nil && !c.subStarted {
		c.subStarted = true
		s.wg.Add(1)
		go s.writeEvents(c, c.sub)
	}
	return nil
}

// call runs the method's handler, turning a panic into an internal error
// so that one bad request never takes the daemon down.
func (s *Server) call(c *conn, req *request) (result any, err error) {
	h := s.handler(req.Method)
	if h == nil {
		return nil, &Error{Code: CodeMethodNotFound, Message: fmt.Sprintf("method not found: %q", req.Method)}
	}
	defer func() {
		if p := recover(); p != nil {
			s.logf("control: panic in %s: %v\n%s", req.Method, p, debug.Stack())
			result = nil
			err = &Error{Code: CodeInternal, Message: fmt.Sprintf("internal error: panic in %s: %v", req.Method, p)}
		}
	}()
	ctx := context.WithValue(c.ctx, connKey{}, c)
	return h(ctx, req.Params)
}

// subscribe is the events/subscribe handler. Subscribing twice on one
// connection is harmless.
func (s *Server) subscribe(ctx context.Context, _ SubscribeParams) (SubscribeResult, error) {
	c, ok := ctx.Value(connKey{}).(*conn)
	if !ok {
		return SubscribeResult{}, Errorf(CodeInternal, "events/subscribe needs a connection")
	}
	if c.sub == nil {
		c.sub = newSubscriber(s.opts.EventQueue)
		s.subMu.Lock()
		s.subs[c.sub] = struct{}{}
		s.subMu.Unlock()
	}
	return SubscribeResult{Subscribed: true}, nil
}

// Subscribers is the number of clients following events, so a publisher
// can skip computing events nobody would receive.
func (s *Server) Subscribers() int {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	return len(s.subs)
}

func (s *Server) removeSubscriber(sub *subscriber) {
	s.subMu.Lock()
	delete(s.subs, sub)
	s.subMu.Unlock()
	close(sub.done)
}

// writeEvents drains one subscriber's queue onto its connection. It may
// block in Write for as long as the client does not read; meanwhile
// Publish keeps filling (and, when full, counting drops in) the queue.
func (s *Server) writeEvents(c *conn, sub *subscriber) {
	defer s.wg.Done()
	for {
		select {
		case <-sub.wake:
		case <-sub.done:
			return
		}
		for {
			ev, ok := sub.pop()
			if !ok {
				break
			}
			b, err := json.Marshal(notification{JSONRPC: "2.0", Method: MethodSessionUpdate, Params: ev})
			if err != nil {
				s.logf("control: cannot encode event: %v", err)
				continue
			}
			if err := c.write(append(b, '\n')); err != nil {
				return
			}
		}
	}
}

// subscriber is one subscribed connection's event queue.
//
// Policy: the queue holds at most limit events. When it is full, new
// events are dropped and counted. The first event accepted after drops is
// preceded by an Event{Kind: "missed", Missed: n} marker, which carries the
// seq of the last dropped event; if no further event comes, the writer
// emits the marker once it has emptied the queue. So a client always
// learns about gaps, in order. A "staged_writes_pending" event replaces a
// "staged_writes_pending" event at the tail of the queue (only the newest
// counts matter), which keeps a chatty filesystem from filling the queue.
type subscriber struct {
	limit int
	wake  chan struct{} // capacity 1: "the queue may have something"
	done  chan struct{} // closed when the connection goes away

	mu          sync.Mutex
	queue       []Event
	missed      int
	lastDropped uint64
}

func newSubscriber(limit int) *subscriber {
	return &subscriber{
		limit: limit,
		wake:  make(chan struct{}, 1),
		done:  make(chan struct{}),
	}
}

// push queues ev without blocking.
func (q *subscriber) push(ev Event) {
	q.mu.Lock()
	n := len(q.queue)
	switch {
	case q.missed == 0 && ev.Kind == EventStagedWritesPending && n > 0 && q.queue[n-1].Kind == EventStagedWritesPending:
		// Coalesce. Not done while drops are pending, since the marker
		// must stay between older and newer events.
		q.queue[n-1] = ev
	case n >= q.limit:
		q.missed++
		q.lastDropped = ev.Seq
		q.mu.Unlock()
		return // nothing new to write, no need to wake the writer
	default:
		if q.missed > 0 {
			// The marker does not take a slot, so the queue briefly holds
			// limit+1 events; it is still bounded.
			q.queue = append(q.queue, q.takeMissed())
		}
		q.queue = append(q.queue, ev)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// pop returns the next event to write: the head of the queue, or the
// missed marker once the queue is empty.
func (q *subscriber) pop() (Event, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.queue) > 0 {
		ev := q.queue[0]
		q.queue[0] = Event{} // let the slices be collected
		q.queue = q.queue[1:]
		if len(q.queue) == 0 {
			q.queue = q.queue[:0:0]
		}
		return ev, true
	}
	if q.missed > 0 {
		return q.takeMissed(), true
	}
	return Event{}, false
}

// takeMissed builds the marker for the drops so far and resets the count.
// Called with q.mu held.
func (q *subscriber) takeMissed() Event {
	ev := Event{Kind: EventMissed, Seq: q.lastDropped, Time: now(), Missed: q.missed}
	q.missed = 0
	return ev
}

// validText refuses params whose strings are not Unicode text: bytes that
// are not UTF-8, or an escaped surrogate (\ud800-\udfff) that is not half
// of a pair. JSON decoding turns both into U+FFFD without a word, so a
// path would name another file and a text patch write other bytes than
// the client sent.
func validText(raw []byte) error {
	if !utf8.Valid(raw) {
		return Errorf(CodeInvalidParams, "invalid params: a string is not valid UTF-8")
	}
	inString := false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case c == '"':
			inString = !inString
		case c == '\\' && inString && i+1 < len(raw):
			i++
			if raw[i] != 'u' {
				continue
			}
			r, ok := hex4(raw, i+1)
			if !ok {
				continue // json.Unmarshal reports it
			}
			i += 4
			switch {
			case r >= 0xd800 && r <= 0xdbff:
				if i+6 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
					if lo, ok := hex4(raw, i+3); ok && lo >= 0xdc00 && lo <= 0xdfff {
						i += 6
						continue
					}
				}
				return Errorf(CodeInvalidParams, "invalid params: a string holds a lone surrogate (\\u%04x)", r)
			case r >= 0xdc00 && r <= 0xdfff:
				return Errorf(CodeInvalidParams, "invalid params: a string holds a lone surrogate (\\u%04x)", r)
			}
		}
	}
	return nil
}

// hex4 reads the four hex digits at raw[i:].
func hex4(raw []byte, i int) (rune, bool) {
	if i+4 > len(raw) {
		return 0, false
	}
	var r rune
	for _, c := range raw[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
