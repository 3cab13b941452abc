// Package backend answers the control protocol with the engine: it is the
// daemon's control.Backend (every method of the control socket) and
// control.HookBackend (the hook channel).
//
// Between a request and the engine it does what the protocol promises and
// the engine does not know of: it validates and normalizes the paths and
// ids a client sends (a path outside the workspace, a reserved scope id),
// applies the rules of fs/safe_text_patch, converts the engine's results
// and maps its and the snapshot store's errors to protocol errors, tells
// the kernel to drop what it caches for changed paths, and publishes
// events, pacing staged_writes_pending so that counting the pending set
// never costs the daemon more than a tenth of its time.
//
// The daemon (cmd/stagefs) builds the Backend before the engine, hands
// the engine its callbacks (PendingChanged, CaptureFailed, Progress,
// Renumbered), and calls Start once the mount is up, before the control
// socket and the hook channel serve.
//
// # Locking
//
// Backend.dirtyMu is a leaf, taken under Engine.mu (PendingChanged is the
// engine's OnChange). HookChannel.mu is taken before every engine lock: it
// is held across the engine calls that start and end a tool call, so that
// the two cannot cross (overlay's package doc has the whole table).
package backend
