// Package acp is the Agent Client Protocol proxy behind `stagefs acp`: it
// sits between an editor (the ACP client, on one side) and an agent (on
// the other), relays every message both ways, and adds what stagefs
// gives: each tool call a snapshot, each prompt a turn, and the session
// methods an editor calls to restore one tool call, roll a prompt back and
// redo it, and review, commit or discard the staged writes.
//
// The proxy is a relay first: a message it does not own passes through
// byte for byte and in order. It changes only
//
//   - the initialize request (the client's terminal capability is hidden,
//     so the agent runs commands itself, inside the staged view) and its
//     response (restoreToolCall, rollback and redo are added to
//     agentCapabilities.sessionCapabilities, the staging state under
//     _meta.stagefs);
//   - a session/prompt response, which gains _meta.stagefs.turnId.
//
// It answers itself, never forwarding them, the stagefs session methods
// (also under the extension prefix _stagefs/) and the agent's
// fs/read_text_file and fs/write_text_file requests, which it serves from
// the staged view, so a write is staged and a read sees staged writes.
//
// Attribution. tool_call notifications arrive after the agent has decided
// to run a tool, possibly while it already runs. The proxy therefore keeps
// a snapshot open from the end of one tool call to the start of the next
// (the gap): what is written in the gap belongs to the next tool call,
// and restoring that tool call restores the gap too. A permission request
// is the one point where the proxy can hold the agent: the tool call's
// snapshot is open before the request reaches the editor. Tool calls that
// run at the same time cannot be told apart: a write goes to the one that
// started last.
//
// The package talks to the daemon through the control client only.
package acp
