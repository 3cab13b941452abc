package overlay

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"stagefs/internal/atomicfile"
	"stagefs/snapshot"
)

// Snapshots: while a snapshot is open, the first mutation of each path by
// a process it covers captures that path's pre-image into the content store
// before the mutation happens. Mutating operations call capture under e.mu,
// so the pre-image is the state the mutation starts from.

// capture records the pre-images of paths for every open snapshot that
// covers c and has not captured them yet. Operations by the daemon itself
// (pid 0: commit, discard, restore) are not tool mutations and are never
// captured; the host's own edits (c.Host) are. A failure fails the mutation:
// nothing may change without its pre-image.
func (e *Engine) capture(c Caller, paths ...string) error {
	if err := e.checkDeny(c, paths...); err != nil {
		return err
	}
	if (c.Pid != 0 || c.Host) && e.redoValid.Load() {
		// A new change after a rollback: redo would overwrite it.
		e.redoValid.Store(false)
	}
	if e.snaps == nil || (c.Pid == 0 && !c.Host) || e.openSnaps.Load() == 0 {
		return nil
	}
	open := e.snaps.OpenSnapshots()
	user := e.isUserProcess(c.Pid)
	if user {
		e.noteUserChange(paths)
	}
	for _, p := range paths {
		if e.noCapture(p) {
			e.markForkPoints(open, p)
			continue
		}
		var pre *snapshot.Entry
		for _, s := range open {
			if !e.covers(s, open, c.Pid) {
				continue
			}
			if user && strings.HasPrefix(s.ScopeID, turnPrefix) {
				continue // the user's own change is not the turn's
			}
			if e.snaps.Has(s.ScopeID, p) {
				continue
			}
			if e.snaps.IsUncaptured(s.ScopeID, p) && !e.unchangedSinceFailure(s.ScopeID, p) {
				// Changed since its capture failed (the mutation went
				// on): what it is now is not its pre-image.
				continue
			}
			var err error
			if pre == nil {
				if pre, err = e.preImage(p); err == nil {
					pre.Pid, pre.Comm = c.Pid, e.procs.comm(c.Pid)
				}
			}
			if err == nil {
				err = e.snaps.Add(s.ScopeID, *pre)
			}
			if err != nil && !errors.Is(err, snapshot.ErrClosed) {
				if err := e.captureFailed(s.ScopeID, p, err); err != nil {
					return err
				}
				pre = nil
			}
		}
	}
	return nil
}

// markForkPoints notes, in each open branch fork point (every process of
// the branch is the branch's), that the path p, which --no-capture keeps
// out of snapshots, changed: without a note a merge would never carry the
// change back; with one it is a path whose pre-image is unknown, a
// conflict unless the merge is forced.
func (e *Engine) markForkPoints(open []snapshot.Info, p string) {
	for _, s := range open {
		if !IsForkScope(s.ScopeID) {
			continue
		}
		// A no-op for a path captured or marked already.
		if err := e.snaps.MarkUncaptured(s.ScopeID, p); err != nil {
			e.logf("mark %s changed in %s: %v", p, s.ScopeID, err)
		}
	}
}

// covers reports whether the open snapshot s captures the mutations of
// process pid: a snapshot bound to pid or one of its ancestors does, and
// so does an unbound one, except that an unbound tool call's snapshot
// leaves a process that a bound tool call's snapshot covers to that tool
// call (a command a host bound to its own tool call, still writing in the
// background while the next tool call runs, belongs to its own). Turns
// capture every process. open is the list s comes from.
func (e *Engine) covers(s snapshot.Info, open []snapshot.Info, pid int) bool {
	if s.Pid != 0 {
		return e.procs.descends(pid, s.Pid)
	}
	if internalScope(s.ScopeID) {
		return true
	}
	for _, b := range open {
		if b.Pid != 0 && !internalScope(b.ScopeID) && e.procs.descends(pid, b.Pid) {
			return false
		}
	}
	return true
}

// Capturing reports cheaply whether any snapshot is open, so the FUSE
// layer computes a path for BeforeWrite only then.
// While redo is available it is true as well, so that a write through a
// file opened before a rollback reaches BeforeWrite and clears redo.
func (e *Engine) Capturing() bool {
	return e.snaps != nil && (e.openSnaps.Load() > 0 || e.redoValid.Load())
}

// BeforeWrite captures p's pre-image, if an open snapshot covering c has
// not yet, before a write through a file that was opened earlier (an
// editor or a log writer that opened it before the snapshot began), and
// clears redo: a new change after a rollback. It is cheap when no snapshot
// is open.
func (e *Engine) BeforeWrite(p string, c Caller) error {
	if e.snaps == nil || c.Pid == 0 {
		return nil
	}
	if e.redoValid.Load() {
		e.redoValid.Store(false)
	}
	if e.openSnaps.Load() == 0 {
		return nil
	}
	need := false
	open := e.snaps.OpenSnapshots()
	for _, s := range open {
		if e.covers(s, open, c.Pid) && !e.snaps.Has(s.ScopeID, p) {
			need = true
			break
		}
	}
	if !need {
		return nil
	}
	e.lockChange()
	defer e.unlockChange()
	return e.capture(c, p)
}

// captureMove records that the directory oldp is about to move to newp, so
// restore moves it back instead of copying its tree.
func (e *Engine) captureMove(c Caller, oldp, newp string) error {
	if e.snaps == nil || c.Pid == 0 || e.openSnaps.Load() == 0 {
		return nil
	}
	open := e.snaps.OpenSnapshots()
	for _, s := range open {
		if !e.covers(s, open, c.Pid) {
			continue
		}
		err := e.snaps.Add(s.ScopeID, snapshot.Entry{Path: newp, From: oldp, Kind: snapshot.KindMoved, Pid: c.Pid, Comm: e.procs.comm(c.Pid)})
		if err != nil && !errors.Is(err, snapshot.ErrClosed) {
			if err := e.captureFailed(s.ScopeID, oldp, fmt.Errorf("capture the move of %s: %w", oldp, err)); err != nil {
				return err
			}
		}
	}
	return nil
}

// captureFailed handles a pre-image that could not be stored (a full
// disk, the byte cap): by default the mutation goes on and the snapshot is
// marked incomplete (the path is named in restore's result and an event
// tells the host); with CaptureFailure "deny" the mutation fails with
// ENOSPC instead.
func (e *Engine) captureFailed(scope, p string, err error) error {
	err = stateDirError(e.opts.StateDir, err)
	e.logf("capture of %s for %s failed: %v", p, scope, err)
	if e.opts.CaptureFailure == "deny" {
		return syscall.ENOSPC
	}
	e.markIncomplete(scope, p, err)
	if st, ok := e.stampLocked(p); ok {
		e.failMu.Lock()
		if e.failStamps == nil {
			e.failStamps = map[string]pathStamp{}
		}
		e.failStamps[scope+"\x00"+p] = st
		e.failMu.Unlock()
	}
	return nil
}

// pathStamp is what a stat says of a path: enough to tell that it has not
// changed (a write moves mtime and ctime; a replacement, the inode).
type pathStamp struct {
	mode         uint32
	ino          uint64
	size         int64
	mtime, ctime int64
}

// stampLocked stats p in the view (a zero stamp for an absent path).
// Called with the engine's lock held.
func (e *Engine) stampLocked(p string) (pathStamp, bool) {
	l, err := e.locate(p)
	var st *syscall.Stat_t
	if err == nil {
		st, err = e.statLoc(p, l)
	}
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
		return pathStamp{}, true
	}
	if err != nil {
		return pathStamp{}, false
	}
	return pathStamp{st.Mode, st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano()}, true
}

// unchangedSinceFailure reports whether p is as it was when its capture
// for scope failed: then the mutation did not happen either (it failed
// too, e.g. on the same full disk), and a capture now stores its true
// pre-image. Without a stamp (the daemon restarted since) it is false.
func (e *Engine) unchangedSinceFailure(scope, p string) bool {
	e.failMu.Lock()
	was, ok := e.failStamps[scope+"\x00"+p]
	e.failMu.Unlock()
	if !ok {
		return false
	}
	now, ok := e.stampLocked(p)
	return ok && now == was
}

// markIncomplete names p as a path scope could not capture, in its
// manifest (the snapshot is incomplete), and tells the host.
func (e *Engine) markIncomplete(scope, p string, err error) {
	if merr := e.snaps.MarkUncaptured(scope, p); merr != nil {
		e.logf("mark %s uncaptured in %s: %v", p, scope, merr)
	}
	// In the journal too, so that stagefs log shows it (best effort: the
	// disk that refused the pre-image may refuse the record).
	e.recordLazy(Record{Op: "capture_failed", Path: p, Detail: strings.TrimPrefix(scope, turnPrefix) + ": " + err.Error()})
	if e.opts.OnCaptureFailed != nil {
		e.opts.OnCaptureFailed(scope, p, err)
	}
}

// Uncaptured lists the paths whose pre-image a snapshot could not store.
func (e *Engine) Uncaptured(scope string) []string {
	info, _ := e.snaps.Lookup(scope)
	return info.Uncaptured
}

// captureRename captures what a rename changes: a file's pre-image at both
// names, or, for a directory, the destination's pre-image and the move.
func (e *Engine) captureRename(c Caller, oldp, newp string) error {
	if err := e.checkDenyTree(c, oldp); err != nil {
		return err
	}
	if err := e.checkDeny(c, newp); err != nil {
		return err
	}
	if e.snaps == nil || c.Pid == 0 || e.openSnaps.Load() == 0 {
		return nil
	}
	l, err := e.locate(oldp)
	if err != nil {
		return nil // the rename fails on its own
	}
	st, err := e.statLoc(oldp, l)
	if err != nil {
		return nil
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return e.capture(c, oldp, newp)
	}
	if err := e.capture(c, newp); err != nil {
		return err
	}
	return e.captureMove(c, oldp, newp)
}

// preImage reads p's state in the merged view; a file's body goes to the
// content store.
func (e *Engine) preImage(p string) (*snapshot.Entry, error) { return e.readState(p, true) }

// viewState reads p's state like preImage, but only hashes a file's body.
func (e *Engine) viewState(p string) (*snapshot.Entry, error) { return e.readState(p, false) }

func (e *Engine) readState(p string, keepBody bool) (*snapshot.Entry, error) {
	ent := &snapshot.Entry{Path: p, Time: time.Now().UnixNano()}
	l, err := e.locate(p)
	var st *syscall.Stat_t
	if err == nil {
		st, err = e.statLoc(p, l)
	}
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
		ent.Kind = snapshot.KindAbsent
		return ent, nil
	}
	if err != nil {
		return nil, err
	}
	ent.Mode, ent.Uid, ent.Gid, ent.Mtime = st.Mode, st.Uid, st.Gid, st.Mtim.Nano()
	if t := st.Mode & syscall.S_IFMT; t == syscall.S_IFREG || t == syscall.S_IFDIR {
		ent.Xattrs = e.xattrsLocked(p)
	}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		ent.Kind = snapshot.KindDir
	case syscall.S_IFLNK:
		ent.Kind = snapshot.KindSymlink
		if l.m != nil {
			ent.Target, err = e.readUpperSymlink(p)
		} else {
			ent.Target, err = e.base.readlink(l.basePath)
		}
	case syscall.S_IFREG:
		ent.Kind = snapshot.KindFile
		var fd int
		if l.m != nil {
			fd, err = e.upper.open(p, unix.O_RDONLY, 0)
		} else {
			fd, err = e.base.open(l.basePath, unix.O_RDONLY|unix.O_NONBLOCK, 0)
		}
		if err != nil {
			return nil, err
		}
		if keepBody && !e.snaps.Fits(st.Size) {
			err = fmt.Errorf("%w: %s is %d bytes", snapshot.ErrOverCap, p, st.Size)
		} else if keepBody {
			ent.Hash, ent.Size, err = e.snaps.PutFile(fd)
		} else {
			ent.Hash, ent.Size = hashOf(fd), st.Size
		}
		unix.Close(fd)
	default:
		// FIFOs, sockets and devices carry no content; restore
		// removes what replaced them. Recorded as absent.
		ent.Kind = snapshot.KindAbsent
		ent.Mode = 0
	}
	return ent, err
}

// OpenSnapshot opens a snapshot for scope. With paths, their pre-images
// (directories with everything below them) are captured at once and the
// snapshot is closed; without, it stays open and captures each path at its
// first mutation by a process it covers: pid and its descendants, or any
// process when pid is 0. Opening an unbound snapshot closes the previous
// unbound one.
func (e *Engine) OpenSnapshot(scope, turn string, pid int, paths []string) (snapshot.Info, error) {
	return e.OpenLabeledSnapshot(scope, turn, "", pid, paths)
}

// OpenLabeledSnapshot is OpenSnapshot with a label for people: the tool
// and its command or file.
func (e *Engine) OpenLabeledSnapshot(scope, turn, label string, pid int, paths []string) (snapshot.Info, error) {
	return e.openSnapshot(scope, turn, label, pid, paths, true)
}

// OpenSnapshotWith opens the unbound internal snapshot scope already
// holding entries and marking uncaptured paths, before it captures
// anything itself (the files held open for writing are captured as it
// opens): a branch's next fork point keeps the fork's versions of what a
// merge left in the branch. The caller keeps the engine from changing
// meanwhile (HoldChanges).
func (e *Engine) OpenSnapshotWith(scope string, entries []snapshot.Entry, uncaptured []string) (snapshot.Info, error) {
	if e.snaps == nil {
		return snapshot.Info{}, errors.New("snapshots are not enabled")
	}
	if !internalScope(scope) {
		return snapshot.Info{}, fmt.Errorf("%s is not one of the engine's own scopes", scope)
	}
	info, err := e.snaps.CreateLabeled(scope, "", "", 0)
	if err != nil {
		return info, err
	}
	for _, en := range entries {
		if err := e.snaps.Add(scope, en); err != nil {
			e.snaps.Drop(scope)
			return info, err
		}
	}
	for _, p := range uncaptured {
		if err := e.snaps.MarkUncaptured(scope, p); err != nil {
			e.snaps.Drop(scope)
			return info, err
		}
	}
	e.openSnaps.Add(1)
	e.noteSnapshot(scope, Record{Op: "snapshot_open", Detail: scope})
	e.captureHeld(info)
	return info, nil
}

// OpenSnapshotBeside opens an unbound snapshot like OpenLabeledSnapshot,
// but leaves the other unbound snapshots open: for a caller that closes
// its own (the agents' hook channel), so that it can close nobody else's.
func (e *Engine) OpenSnapshotBeside(scope, turn, label string) (snapshot.Info, error) {
	return e.openSnapshot(scope, turn, label, 0, nil, false)
}

func (e *Engine) openSnapshot(scope, turn, label string, pid int, paths []string, closeOthers bool) (snapshot.Info, error) {
	if e.snaps == nil {
		return snapshot.Info{}, errors.New("snapshots are not enabled")
	}
	if closeOthers && pid == 0 && len(paths) == 0 && !internalScope(scope) {
		for _, s := range e.snaps.OpenSnapshots() {
			if s.Pid == 0 && s.ScopeID != scope && !internalScope(s.ScopeID) {
				e.CloseSnapshot(s.ScopeID)
			}
		}
	}
	info, err := e.snaps.CreateLabeled(scope, turn, label, pid)
	if err != nil {
		return info, err
	}
	e.openSnaps.Add(1)
	e.noteSnapshot(scope, Record{Op: "snapshot_open", Detail: scope, Pid: pid})
	if len(paths) == 0 {
		e.captureHeld(info)
		return info, nil
	}
	err = e.rlocked(func() error {
		for _, p := range paths {
			if err := e.captureTree(scope, p); err != nil {
				return err
			}
		}
		return nil
	})
	closed, cerr := e.CloseSnapshot(scope)
	if err != nil {
		return closed, err
	}
	return closed, cerr
}

// captureTree captures p and, for a directory, everything below it.
func (e *Engine) captureTree(scope, p string) error {
	pre, err := e.preImage(p)
	if err != nil {
		return fmt.Errorf("capture %s: %w", p, err)
	}
	if err := e.snaps.Add(scope, *pre); err != nil {
		return err
	}
	if pre.Kind != snapshot.KindDir {
		return nil
	}
	ents, err := e.readDirLocked(p)
	if err != nil {
		return err
	}
	for _, d := range ents {
		if err := e.captureTree(scope, joinPath(p, d.Name)); err != nil {
			return err
		}
	}
	return nil
}

// CloseSnapshot stops capturing for scope and returns what it captured.
func (e *Engine) CloseSnapshot(scope string) (snapshot.Info, error) {
	if e.snaps == nil {
		return snapshot.Info{}, errors.New("snapshots are not enabled")
	}
	wasOpen := false
	if info, ok := e.snaps.Lookup(scope); ok && !info.Closed {
		wasOpen = true
	}
	info, err := e.snaps.CloseSnapshot(scope)
	if errors.Is(err, snapshot.ErrClosed) {
		// Closed already (a snapshot of explicit paths closes at once, a
		// host may retry): closing is idempotent and returns it as is.
		if cur, ok := e.snaps.Lookup(scope); ok {
			return cur, nil
		}
	}
	if wasOpen && (err == nil || info.Closed) {
		e.openSnaps.Add(-1)
		e.noteSnapshot(scope, Record{Op: "snapshot_close", Detail: fmt.Sprintf("%s: %d path(s)", scope, len(info.Paths))})
		if !internalScope(scope) {
			e.savePost(info)
		}
	}
	return info, err
}

// noteSnapshot journals the opening or closing of a snapshot. For a tool
// call the record need not wait for the disk: the manifest, not the
// journal, says what a snapshot holds, and a tool call's snapshot opens and
// closes without a disk flush (snapshot.Options.Lazy).
func (e *Engine) noteSnapshot(scope string, r Record) {
	if ToolCallScope(scope) {
		e.recordLazy(r)
		return
	}
	e.note(r)
}

// postFile holds, for a closed tool-call snapshot, what its paths looked
// like when it closed (kind, content hash, mode, owner), so a restore can
// tell the paths changed afterwards by a later tool call or another
// process. It is named by the snapshot's id, so a scope id used again
// never finds an old one, and it goes when the store drops the snapshot.
func (e *Engine) postFile(snapshotID string) string {
	return filepath.Join(e.opts.StateDir, "posts", snapshotID+".json")
}

func (e *Engine) savePost(info snapshot.Info) {
	post := map[string]*snapshot.Entry{}
	e.rlocked(func() error {
		for _, p := range uniqStrings(info.Paths) {
			if st, err := e.viewState(p); err == nil {
				st.Time, st.Xattrs = 0, nil
				post[p] = st
			}
		}
		return nil
	})
	b, _ := json.Marshal(post)
	final := e.postFile(info.ID)
	err := os.MkdirAll(filepath.Dir(final), 0o700)
	if err == nil {
		err = atomicfile.Write(final, b, 0o600)
	}
	if err != nil {
		e.logf("save the state after %s: %v", info.ScopeID, err)
	}
}

// removeStalePosts removes post files and move-back state files of
// snapshots that are gone (a crash between a drop and the removal).
func (e *Engine) removeStalePosts() {
	ents, _ := os.ReadDir(filepath.Join(e.opts.StateDir, "posts"))
	live := map[string]bool{}
	for _, s := range e.snaps.List() {
		live[s.ID] = true
	}
	for _, de := range ents {
		// Only post files: turns keep other files here.
		id, ok := strings.CutSuffix(de.Name(), ".json")
		if ok && snapshot.ValidID(id) == nil && !live[id] {
			os.Remove(filepath.Join(e.opts.StateDir, "posts", de.Name()))
		}
	}
	// Move-back state files of snapshots dropped while no daemon ran,
	// or by a crash between the drop and OnDrop.
	moves, _ := os.ReadDir(filepath.Join(e.opts.StateDir, "moves"))
	for _, de := range moves {
		id, _, _ := strings.Cut(de.Name(), ".")
		if !live[id] {
			os.Remove(filepath.Join(e.opts.StateDir, "moves", de.Name()))
		}
	}
}

// saveMissingPosts writes the post file of every closed tool-call snapshot
// that lacks a readable one: closed at the start after a reboot, or a
// crash before its file reached the disk. What the view shows now stands
// in for its state at close, so a restore can still tell the changes made
// from now on. Called once the engine has loaded the pending set.
func (e *Engine) saveMissingPosts() {
	for _, s := range e.snaps.List() {
		if s.Closed && ToolCallScope(s.ScopeID) && e.loadPost(s.ScopeID) == nil {
			e.savePost(s)
		}
	}
}

func (e *Engine) loadPost(scope string) map[string]*snapshot.Entry {
	info, ok := e.snaps.Lookup(scope)
	if !ok {
		return nil
	}
	b, err := os.ReadFile(e.postFile(info.ID))
	if err != nil {
		return nil
	}
	var post map[string]*snapshot.Entry
	if json.Unmarshal(b, &post) != nil {
		return nil
	}
	return post
}

// DropSnapshot deletes a tool call's snapshot (closing it first).
func (e *Engine) DropSnapshot(scope string) error {
	if info, ok := e.snaps.Lookup(scope); ok && !info.Closed {
		if _, err := e.CloseSnapshot(scope); err != nil {
			return err
		}
	}
	return e.snaps.Drop(scope)
}

// HeldWriter is a file a process holds open for writing through FUSE
// passthrough: the kernel writes it without asking the daemon, so no write
// of it can be captured when it happens.
type HeldWriter struct {
	Path string
	Pid  int // the process that opened it
}

// SetHeldWriters gives the engine the FUSE layer's list of held writers,
// whose pre-images a snapshot captures when it opens.
func (e *Engine) SetHeldWriters(list func() []HeldWriter) {
	e.heldWriters.Store(&list)
}

// captureHeld captures, for the snapshot s that has just opened, the
// pre-images of the files held open for writing through passthrough by
// processes it covers (the process that opened the file, as the daemon
// never sees who writes): their next write would reach the pending body
// without the daemon seeing it, so the pre-image is taken now, whether or
// not they write again. A file opened for writing after this point is
// captured at its open: the FUSE layer registers a write-open before the
// engine opens the file, and the snapshot is counted open (openSnaps)
// before this list is read, so every write-open is seen by one or the
// other.
func (e *Engine) captureHeld(s snapshot.Info) {
	list := e.heldWriters.Load()
	if list == nil {
		return
	}
	held := (*list)()
	if len(held) == 0 {
		return
	}
	open := e.snaps.OpenSnapshots()
	e.rlock()
	defer e.runlock()
	for _, w := range held {
		if w.Pid == 0 || !e.covers(s, open, w.Pid) || e.noCapture(w.Path) {
			continue
		}
		if strings.HasPrefix(s.ScopeID, turnPrefix) && e.isUserProcess(w.Pid) {
			continue // the user's own change is not the turn's
		}
		if e.snaps.Has(s.ScopeID, w.Path) {
			continue
		}
		pre, err := e.preImage(w.Path)
		if err == nil {
			pre.Pid, pre.Comm = w.Pid, e.procs.comm(w.Pid)
			err = e.snaps.Add(s.ScopeID, *pre)
		}
		if err != nil && !errors.Is(err, snapshot.ErrClosed) && !errors.Is(err, syscall.ENOENT) {
			err = stateDirError(e.opts.StateDir, err)
			e.logf("capture of %s (held open for writing) for %s failed: %v", w.Path, s.ScopeID, err)
			e.markIncomplete(s.ScopeID, w.Path, err)
		}
	}
}

// stateDirError says, for an error of the state dir's disk being full,
// that the state dir is what is full: the user's workspace may have room.
func stateDirError(state string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("the state dir %s is full (%w): free space there, or mount with --state on a larger disk", state, err)
	}
	return err
}
