// Package control is the host-facing side of stagefs: a JSON-RPC 2.0
// server on a Unix socket through which a host inspects, commits and
// discards the pending set of a staged mount, and the Go client for it.
//
// # Framing
//
// Each message is one JSON object on one line, terminated by "\n", over a
// Unix stream socket. A request line may be at most ServerOptions.
// MaxLineBytes long (8 MiB by default, newline excluded); a longer line is
// answered with -32600 and the connection is closed, because the rest of
// the stream can no longer be framed. Blank lines are ignored. Batches
// (JSON arrays) are refused with -32600 "batches are not supported".
// Nesting deeper than MaxDepth (64) levels is refused with -32600 before
// the line reaches the JSON parser.
//
// Requests look like
//
//	{"jsonrpc":"2.0","id":1,"method":"fs/staged_status","params":{"paths":["a.txt"]}}
//
// The id must be a number or a string. A request without id is a
// notification: it runs, but gets no reply. Params may be omitted or null
// for methods whose params are all optional. Unknown params fields are
// ignored (so newer clients work with older daemons); fields of the wrong
// type are -32602, with the field named in the message and in data.field.
//
// Each connection is served by one goroutine: requests on one connection
// are answered in the order they were sent. Clients wanting parallelism
// open more connections; the Client type multiplexes calls on one
// connection and matches responses by id.
//
// # Methods
//
// Every request method but events/subscribe is answered by a Backend,
// which has one method for each (see Methods): the session and the pending
// set (session/initialize, fs/set_mode, fs/staged_status,
// fs/commit_staged, fs/discard_staged, fs/diff, fs/read_text,
// fs/safe_text_patch, session/log), tool calls' snapshots (fs/snapshot,
// fs/close_snapshot, fs/restore, fs/list_snapshots, fs/drop_snapshot) and
// turns (session/turn, session/checkpoints, session/rollback,
// session/redo, session/mark_user). events/subscribe is answered by the
// server itself. The hook channel (hooks.go) is a server of its own,
// answering the hook methods with a HookBackend (NewHookServer).
//
// The dispatch is a table: NewServer fills it from the Backend, and
// Server.Handle adds a method to it; Typed turns a func(ctx, Params)
// (Result, error) into a handler.
//
// # Errors
//
// Standard JSON-RPC codes: -32700 parse error (id null), -32600 invalid
// request (not an object, jsonrpc not "2.0", missing method, id of the
// wrong type, line too long, too deep, peer not allowed), -32601 method
// not found, -32602 invalid params, -32603 internal error. A panic in a
// handler is recovered and reported as -32603; the daemon keeps serving.
//
// stagefs codes use the server-error range and carry their name in
// error.data.kind, plus any details the backend adds:
//
//	-32001 stale_base              -32004 busy
//	-32002 conflict                -32005 path_outside_workspace
//	-32003 not_found               -32006 invalid_state
//
// for example
//
//	{"jsonrpc":"2.0","id":7,"error":{"code":-32002,"message":"a.txt changed on disk","data":{"kind":"conflict","path":"a.txt"}}}
//
// A Backend returns an *Error (see Errorf and Error.With) to pick the code;
// any other error becomes -32603 with the error's text.
//
// # Events
//
// After events/subscribe the server writes notifications on that same
// connection, interleaved with responses (writes are serialized, never
// mixed within a line):
//
//	{"jsonrpc":"2.0","method":"session/update","params":{"kind":"staged_writes_pending","seq":12,"time":"...","pendingCount":3,"totalBytes":4096}}
//
// The subscribe response is always written before the first event. Seq is
// assigned by Server.Publish and increases across the server; a
// subscriber sees increasing seqs, with gaps where events were coalesced
// or dropped.
//
// Subscriber queue policy: Publish is called from filesystem code and must
// never wait for a client, so each subscriber has its own bounded queue
// (ServerOptions.EventQueue, 256 by default) drained by its own writer
// goroutine. When the queue is full, new events are dropped and counted;
// when it has room again, the next event is preceded by
// {"kind":"missed","missed":N,"seq":<seq of the last dropped event>} (or
// the marker alone is sent once the queue has drained and nothing newer
// came). A client that sees "missed" can catch up with session/log. A
// "staged_writes_pending" event that arrives while another one is waiting
// at the tail of the queue replaces it, since only the newest counts
// matter.
//
// # Access
//
// Listen creates the socket with mode 0600 (under a restrictive umask, so
// it is never briefly wider) and removes a stale socket file left by a
// dead daemon. On every accepted connection the server reads the peer's
// uid with SO_PEERCRED and, unless ServerOptions.AllowUID accepts it (by
// default: the daemon's uid and root), writes one -32600 "peer uid N not
// allowed" line and closes the connection.
package control
