// Package overlay is stagefs's engine: the merged view of a workspace (the
// base) and a pending set (the upper tree in the state dir), with copy-up,
// whiteouts, directory renames recorded as redirects, commit, discard and
// status. It knows nothing of FUSE: its API is os-like, path based
// (workspace-relative, slash separated, "" is the root) and returns
// syscall.Errno values that the FUSE layer passes to the kernel.
//
// # The upper tree
//
// STATE/upper mirrors the paths of the workspace that have pending changes.
// It holds only regular files and directories, so every entry can carry the
// user.stagefs.meta extended attribute (user xattrs are not allowed on
// symlinks or device nodes):
//
//   - a regular file is a staged body; for kind symlink its content is the
//     link target, for kind special (fifo, socket, device) it is empty and the
//     meta holds the mode and rdev;
//   - a whiteout is an empty regular file whose meta says kind whiteout: the
//     path is deleted in the merged view;
//   - a directory is either a container (it exists only to hold staged
//     children; not a change itself), a new or changed directory, a deleted
//     directory (kept so the whiteouts of its children survive until commit),
//     an opaque directory (recreated after a delete: base contents hidden) or
//     a redirected directory (renamed: its base contents come from another
//     base path).
//
// Every change to the upper tree is made atomically: new entries are built
// in STATE/work and renamed into place, so a crash leaves either the old or
// the new entry, never half of one. The meta of each entry is also kept in
// memory (the index), rebuilt at start-up by walking the upper tree, which
// costs what is pending, never the size of the workspace.
//
// # Symlink safety
//
// The base and the upper tree are reached only through directory file
// descriptors opened before the mount, with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS) for directories and *at calls with AT_SYMLINK_NOFOLLOW
// or O_NOFOLLOW on the last name, so no symlink in the workspace can lead a
// commit, a copy-up or a read out of it.
//
// # Locking
//
// Engine.mu guards the index and serializes namespace changes (create,
// unlink, rename, copy-up, commit, discard). Reads of the namespace (lookup,
// getattr, readdir) take it shared. Data I/O on open files takes no engine
// lock. Staging records are appended after the lock is released, but before
// the operation returns; a commit's intent record is written under it.
// Every change passes Engine.changeGate, shared, before it takes mu; a
// commit holds the gate alone, so it can let go of mu now and then and let
// the reads in while the pending set stays as it selected it: a stat waits
// for a few milliseconds of a commit, not for the whole of it.
//
// Lock order: a lock may be taken while holding those above it in this
// table, never the reverse. Locks on one line are not held together.
//
//	the daemon's hook channel (backend HookChannel.mu)
//	fusefs: a file handle's mu (re-pointing an open file)
//	Engine.turnMu        turn start and end, rollback, redo
//	Engine.commitMu      a whole commit, its copies made before Engine.mu
//	a branch's Engine.changeGate, held by a merge from it (HoldChanges),
//	                     before its parent's locks (branch.Manager.mu above all)
//	Engine.textMu        a whole ReadFile or PatchFile
//	Engine.changeGate    shared by every change, alone by a running commit
//	Engine.mu            the index, namespace changes, commit, discard,
//	                     a fork's copy (shared) and what a change pushes into it
//	turnState.mu, Engine.failMu, Engine.trashMu, Engine.userMu,
//	inoMap.mu, dirCache.mu, procCache.mu, progress.mu
//	snapshot.Store.mu    (capture under Engine.mu; it fsyncs under it)
//	journal.Journal.mu   (a commit's intent under Engine.mu)
//
// fusefs's anonNode.mu (the names an O_TMPFILE file was given) is held
// alone.
//
// The engine's callbacks (OnChange, OnCaptureFailed, OnProgress) are
// called with Engine.mu held and must take no lock above it and never
// block; the daemon's only publish to in-memory event queues.
//
// # Durability of the journal
//
// The record of a staging operation (create, mkdir, unlink, rename, link,
// symlink, setattr, xattrs, the first write-open of a path) is durable
// before the operation is answered; concurrent operations share the
// fdatasync (group commit). Records that change nothing in the pending
// set's structure (a close, a write-open of a file already staged, a
// refused attempt) are written without waiting and become durable with the
// next durable record or fsync. Options.JournalSync, when set, treats
// staging records the same way and syncs on a ticker. Commit's intent,
// discard, snapshot and restore records are always durable first.
package overlay
