// Package snapshot stores the pre-images that let stagefs undo one tool call.
//
// A host opens a snapshot per tool call (its scope id is the tool call id).
// While the snapshot is open, the first mutation of each path captures what
// the path was before: a file's body and metadata, a symlink's target, a
// directory's mode, the fact that the path did not exist, or that a
// directory was renamed. Later mutations of the same path in that snapshot
// capture nothing: the first capture wins, because it is the state before
// the tool call. Undo itself is not here; this package only keeps the
// pre-images durably and hands them back.
//
// # On disk
//
//	DIR/blobs/ab/abcdef…    file bodies, named by the lowercase hex sha256 of
//	                        their content, fanned out by its first two digits;
//	                        mode 0600, never modified once written
//	DIR/snaps/<id>.jsonl    one manifest per snapshot
//	DIR/boot                the boot id of the machine run that last opened it
//
// A manifest is JSON lines, each ending with "\n":
//
//	line 1       header: {"id":…,"scopeId":…,"turn":…,"pid":…,"created":…}
//	             (Info without Paths, Bytes and Closed)
//	lines 2..n   one Entry per captured path, in capture order
//	last line    {"closed":true} once the snapshot is closed
//
// Snapshot ids are "%016x-%s" of the creation time in unix ns and 8 random
// hex digits, so they sort by creation; Created strictly increases within a
// store, so the order survives a reopen even for snapshots made within one
// clock tick.
//
// # Durability
//
// A blob is written to a temp file (DIR/blobs/.tmp-*) while it is hashed
// (PutBody), or copied there in the kernel and hashed from the copy
// (PutFile), fsynced, renamed to its hash name, and its directory fsynced before
// PutBody returns; a new fan-out directory is fsynced into DIR/blobs first.
// A body already stored is not written again (dedupe), so every size count
// below counts each distinct body once.
//
// A manifest is created under a temp name with its header and renamed into
// place, so it never exists without a whole header. After that it is only
// appended to: Add and CloseSnapshot write one line and fsync the file
// before they return.
//
// Lazy scopes (Options.Lazy: the daemon's tool calls) skip the fsyncs of the
// header and of the close marker, so that opening and closing a snapshot
// needs no disk flush. The first Add fsyncs the file and DIR/snaps, which
// makes the header durable with the entry. A power loss can then leave a
// manifest without a whole header line (it captured nothing: Open removes
// it) or without its close marker. DIR/boot records the boot id of the last
// Open; when it differs, Open closes (durably) every lazy snapshot still
// open, because its close marker may have been lost and its processes are
// gone. Where the boot id cannot be read, nothing is lazy. A line is thus acknowledged only once it is whole and
// on disk, and a crash can leave at most one torn line, at the end. Open
// ignores such a last line (one without a trailing "\n", or that is not
// valid JSON) and truncates it away, so the next append does not follow it.
// Anything else that is wrong with a manifest (invalid JSON on an earlier
// line, an unknown kind, a malformed hash, a line after the close marker) is
// an error naming the file and line, and Open fails with it: acknowledged
// lines are never dropped silently. A failed append is cut back; if that or
// an fsync fails, the snapshot refuses further lines, because after a failed
// fsync the page cache may no longer match the disk.
//
// Dropping a snapshot removes its manifest and fsyncs DIR/snaps before any
// blob goes, so a crash can never leave a manifest whose bodies are gone.
// Open removes temp files and blobs that no manifest refers to: the
// leftovers of a crash between writing a body and recording it, or between
// dropping a manifest and collecting its blobs.
//
// # Byte cap and garbage collection
//
// Options.ByteCap bounds the bytes of distinct bodies referenced by
// snapshots (default 1 GiB). After CloseSnapshot, while the total is over the
// cap, whole closed snapshots are dropped oldest first; open snapshots are
// never evicted, so the total can stay above the cap while they are open.
// Then blobs no snapshot refers to are removed.
//
// A body returned by PutBody is pinned until a file entry with its hash is
// passed to Add, so that a GC running between the two (another snapshot
// being closed or dropped) does not remove it.
//
// # Concurrency
//
// A Store is safe for concurrent use. One mutex guards its in-memory state;
// PutBody copies and hashes without it and takes it only to rename the blob
// into place. Add holds it across its write and fsync so that lines are
// appended in capture order. One directory must be used by one Store at a
// time: a second Store would remove the other's unreferenced new bodies.
package snapshot
