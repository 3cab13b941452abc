package overlay

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"stagefs/internal/atomicfile"
	"stagefs/internal/fdio"
	"stagefs/snapshot"
)

// Restore: putting a snapshot's pre-images back into the merged view, for
// one tool call (Restore, RestoreTool) and for rollback and redo
// (restoreFiltered). The captures themselves are in capture.go.

// RestoreResult reports a restore.
type RestoreResult struct {
	Restored []string // paths whose pre-image is back in the view
	// Overwritten were changed after the snapshot closed (by a later tool
	// call or another process) and restored anyway; Kept were left alone
	// for that reason (keepLater).
	Overwritten []string
	Kept        []string
	// Uncaptured changed while the snapshot was open, but their pre-image
	// could not be stored: restore cannot bring them back.
	Uncaptured []string
	Failed     []Failure
}

// Restore writes scope's pre-images back into the merged view, newest
// capture first: files get their content, mode and times back, paths that
// were absent are removed, moved directories move back. In staged mode a
// pre-image equal to the workspace drops the pending entry instead. The
// operations are the daemon's own, so open snapshots do not capture them.
func (e *Engine) Restore(scope string) (RestoreResult, error) {
	return e.RestoreTool(scope, false)
}

// RestoreTool is Restore for a tool call's snapshot: paths changed since
// the snapshot closed are reported as overwritten, or, with keepLater, left
// as they are and reported as kept. Restoring twice is the same as once.
func (e *Engine) RestoreTool(scope string, keepLater bool) (RestoreResult, error) {
	if e.snaps == nil {
		return RestoreResult{}, errors.New("snapshots are not enabled")
	}
	post := e.loadPost(scope)
	ents, err := e.snaps.Entries(scope)
	if err != nil {
		return RestoreResult{}, err
	}
	pre := map[string]snapshot.Entry{}
	for _, ent := range ents {
		if ent.Kind != snapshot.KindMoved {
			if _, ok := pre[ent.Path]; !ok {
				pre[ent.Path] = ent
			}
		}
	}
	later := map[string]bool{} // changed or made after the tool call
	holds := map[string]bool{} // pre-images whose restore would remove a later path below
	e.rlocked(func() error {
		for p, after := range post {
			cur, err := e.viewState(p)
			if err != nil || sameState(cur, after) {
				continue
			}
			if ent, ok := pre[p]; ok && sameState(cur, &ent) {
				continue // restored already
			}
			later[p] = true
		}
		e.findLaterBelow(ents, e.Uncaptured(scope), func(top, p string) {
			later[p], holds[top] = true, true
		})
		return nil
	})
	var kept, overwritten []string
	for p := range later {
		if keepLater {
			kept = append(kept, p)
		} else {
			overwritten = append(overwritten, p)
		}
	}
	if keepLater {
		for p := range holds {
			if !later[p] {
				kept = append(kept, p)
			}
		}
	}
	sort.Strings(kept)
	sort.Strings(overwritten)
	res, err := e.restoreFiltered(scope, func(p string) bool { return !keepLater || !later[p] && !holds[p] })
	res.Overwritten, res.Kept = overwritten, kept
	res.Uncaptured = e.Uncaptured(scope)
	return res, err
}

// findLaterBelow finds the paths that a restore of ents would remove
// although the snapshot's processes did not make them: entries below a
// directory that was not one before (restore removes that tree) that were
// never captured (nor named in uncaptured), so another process, a later
// tool call or an edit outside the mount made them. It calls found with
// the captured path and the later one. Trees moved into place and paths
// that are never captured (--no-capture) are left out. Called with the
// engine's lock held.
func (e *Engine) findLaterBelow(ents []snapshot.Entry, uncaptured []string, found func(top, p string)) {
	captured := map[string]bool{}
	movedIn := map[string]bool{} // destinations of directory moves
	for _, ent := range ents {
		captured[ent.Path] = true
		if ent.Kind == snapshot.KindMoved {
			movedIn[ent.Path] = true
		}
	}
	for _, p := range uncaptured {
		captured[p] = true
	}
	var walk func(top, dir string)
	walk = func(top, dir string) {
		list, err := e.readDirLocked(dir)
		if err != nil {
			return
		}
		for _, d := range list {
			p := joinPath(dir, d.Name)
			switch {
			case e.noCapture(p) || movedIn[p]:
			case !captured[p]:
				found(top, p)
			case d.Mode&syscall.S_IFMT == syscall.S_IFDIR:
				walk(top, p)
			}
		}
	}
	seen := map[string]bool{}
	for _, ent := range ents {
		if ent.Kind == snapshot.KindDir || ent.Kind == snapshot.KindMoved || movedIn[ent.Path] || seen[ent.Path] {
			continue
		}
		seen[ent.Path] = true
		l, err := e.locate(ent.Path)
		if err != nil {
			continue
		}
		if st, err := e.statLoc(ent.Path, l); err == nil && st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			walk(ent.Path, ent.Path)
		}
	}
}

// restoreFiltered restores the entries of scope whose path keep accepts.
func (e *Engine) restoreFiltered(scope string, keep func(string) bool) (RestoreResult, error) {
	if e.snaps == nil {
		return RestoreResult{}, errors.New("snapshots are not enabled")
	}
	ents, err := e.snaps.Entries(scope)
	if err != nil {
		return RestoreResult{}, err
	}
	snapID := scope
	if info, ok := e.snaps.Lookup(scope); ok {
		snapID = info.ID
	}
	var res RestoreResult
	seen := map[string]bool{}
	pr := e.startProgress("restore", len(ents))
	defer pr.finish()
	for i := len(ents) - 1; i >= 0; i-- {
		ent := ents[i]
		pr.step(ent.Size)
		if !keep(ent.Path) {
			continue
		}
		if err := e.restoreEntry(ent, snapID); err != nil {
			if errors.Is(err, errDied) {
				// A test stopped the daemon here: a killed daemon
				// restores nothing more.
				return res, err
			}
			res.Failed = append(res.Failed, Failure{Path: ent.Path, Reason: err.Error()})
			continue
		}
		e.normalize(ent.Path)
		if ent.From != "" {
			e.normalize(ent.From)
		}
		for _, p := range []string{ent.Path, ent.From} {
			if p != "" && !seen[p] {
				seen[p] = true
				res.Restored = append(res.Restored, p)
			}
		}
	}
	// A second pass, parents first: a directory restored after its
	// children (explicit captures list parents first) may only now let the
	// workspace show through, which makes those children no change.
	if e.Mode() == Staged {
		byDepth := append([]string(nil), res.Restored...)
		sort.SliceStable(byDepth, func(i, j int) bool { return depth(byDepth[i]) < depth(byDepth[j]) })
		for _, p := range byDepth {
			e.normalize(p)
		}
	}
	e.note(Record{Op: "restore", Detail: fmt.Sprintf("%s: %d restored, %d failed", scope, len(res.Restored), len(res.Failed))})
	e.changed()
	return res, nil
}

var daemon = Caller{}

// restoreEntry puts ent back; snapID is the id of the snapshot it is
// from.
func (e *Engine) restoreEntry(ent snapshot.Entry, snapID string) error {
	st, statErr := e.Stat(ent.Path)
	exists := statErr == nil
	isDir := exists && st.Mode&syscall.S_IFMT == syscall.S_IFDIR
	switch ent.Kind {
	case snapshot.KindMoved:
		return e.moveBack(ent, exists, snapID)
	case snapshot.KindAbsent:
		if !exists {
			return nil
		}
		return e.removeTree(ent.Path)
	case snapshot.KindDir:
		if isDir {
			if st.Mode&0o7777 != ent.Mode&0o7777 {
				if _, err := e.Setattr(ent.Path, -1, SetAttr{Mode: ptr(ent.Mode & 0o7777)}, daemon); err != nil {
					return err
				}
			}
			return e.restoreXattrs(ent.Path, ent.Xattrs)
		}
		if !exists && e.undelete(ent.Path) {
			return e.restoreXattrs(ent.Path, ent.Xattrs)
		}
		if exists {
			if err := e.removeTree(ent.Path); err != nil {
				return err
			}
		}
		if err := e.mkdirAll(parentOf(ent.Path)); err != nil {
			return err
		}
		if _, err := e.Mkdir(ent.Path, ent.Mode&0o7777, Caller{Uid: ent.Uid, Gid: ent.Gid}); err != nil {
			return err
		}
		return e.restoreXattrs(ent.Path, ent.Xattrs)
	case snapshot.KindSymlink:
		if exists {
			if err := e.removeTree(ent.Path); err != nil {
				return err
			}
		}
		if err := e.mkdirAll(parentOf(ent.Path)); err != nil {
			return err
		}
		_, err := e.Symlink(ent.Target, ent.Path, Caller{Uid: ent.Uid, Gid: ent.Gid})
		return err
	case snapshot.KindFile:
		if isDir || (exists && st.Mode&syscall.S_IFMT != syscall.S_IFREG) {
			if err := e.removeTree(ent.Path); err != nil {
				return err
			}
		}
		if e.Mode() == Staged && e.baseHasBody(ent) {
			// The pre-image is what the workspace has: drop the
			// pending entry rather than stage a copy of the workspace.
			e.Discard([]string{ent.Path}, daemon)
			if st, err := e.Stat(ent.Path); err == nil && st.Mode&syscall.S_IFMT == syscall.S_IFREG {
				return e.restoreXattrs(ent.Path, ent.Xattrs)
			}
		}
		return e.restoreFile(ent)
	}
	return fmt.Errorf("unknown pre-image kind %q", ent.Kind)
}

func ptr[T any](v T) *T { return &v }

// moveBack moves the directory ent.Path back to ent.From (exists: whether
// ent.Path is in the view). When a rename cannot do it (EXDEV: ent.From
// still holds staged deletions that a rename would drop) it copies the
// tree and removes the original, as mv does. That takes many steps, and
// "ent.From exists" cannot tell a finished copy from one a crash cut
// short: a restore tried again took a partial copy for the move done,
// and left the original tree where it was. So a state file, named by the
// snapshot and the move, says which half is under way: "copy" (what
// ent.From holds may be part of a copy: start the copy over) or "remove"
// (the copy is whole: finish removing the original).
func (e *Engine) moveBack(ent snapshot.Entry, exists bool, snapID string) error {
	state := e.moveStateFile(snapID, ent)
	b, err := os.ReadFile(state)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	switch string(b) {
	case moveCopying:
		// What ent.From holds must be part of the copy (all of it is
		// in ent.Path): anything else was made there after the crash,
		// and is not the restore's to remove.
		if !e.treeWithin(ent.From, ent.Path) {
			return fmt.Errorf("%s changed after an interrupted restore copied %s there; left as it is", ent.From, ent.Path)
		}
		if err := e.removeTree(ent.From); err != nil {
			return err
		}
		if !exists {
			// The original went meanwhile: nothing to copy.
			return os.Remove(state)
		}
		return e.copyBack(ent, state)
	case moveRemoving:
		// The copy was whole: ent.Path may go only while everything
		// in it is in the copy too.
		if !e.treeWithin(ent.Path, ent.From) {
			return fmt.Errorf("%s changed after an interrupted restore copied it to %s; left as it is", ent.Path, ent.From)
		}
		return e.removeMoved(ent, state)
	}
	if _, err := e.Stat(ent.From); err == nil || !exists {
		return nil // moved back already, or gone
	}
	err = e.Rename(ent.Path, ent.From, unix.RENAME_NOREPLACE, daemon)
	if errors.Is(err, syscall.EXDEV) {
		return e.copyBack(ent, state)
	}
	return err
}

// The halves of a move back by copying (see moveBack).
const (
	moveCopying  = "copy"
	moveRemoving = "remove"
)

// copyBack copies the tree ent.Path to ent.From and removes the original,
// noting in state which half is under way.
func (e *Engine) copyBack(ent snapshot.Entry, state string) error {
	if err := writeMoveState(state, moveCopying); err != nil {
		return err
	}
	if err := e.copyTree(ent.Path, ent.From); err != nil {
		return err
	}
	if err := writeMoveState(state, moveRemoving); err != nil {
		return err
	}
	return e.removeMoved(ent, state)
}

// removeMoved removes the original of a tree copied back, then the state
// file: the move back is done.
func (e *Engine) removeMoved(ent snapshot.Entry, state string) error {
	if err := e.removeTree(ent.Path); err != nil {
		return err
	}
	if err := os.Remove(state); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// moveStateFile names the state file of the move back of ent in the
// snapshot snapID: a snapshot id is never used again, so an old file left
// by a restore nobody tried again never applies to another one, and it
// goes when the snapshot is dropped (dropMoveStates).
func (e *Engine) moveStateFile(snapID string, ent snapshot.Entry) string {
	sum := sha256.Sum256([]byte(ent.From + "\x00" + ent.Path))
	return filepath.Join(e.opts.StateDir, "moves", snapID+"."+hex.EncodeToString(sum[:12]))
}

// dropMoveStates removes the move-back state files of a dropped snapshot.
func (e *Engine) dropMoveStates(snapID string) {
	names, _ := filepath.Glob(filepath.Join(e.opts.StateDir, "moves", snapID+".*"))
	for _, name := range names {
		os.Remove(name)
	}
}

// writeMoveState replaces the state file with phase. It is written whole,
// made durable and renamed into place, so a crash, or a power loss, leaves
// the old phase or the new.
func writeMoveState(state, phase string) error {
	if err := os.MkdirAll(filepath.Dir(state), 0o700); err != nil {
		return err
	}
	// A restore is rare: it may wait for the disk.
	return atomicfile.Write(state, []byte(phase), 0o600)
}

// undelete brings back a workspace directory that the pending set deletes,
// as it was just before its rmdir: the whiteouts of the children deleted
// before stay (restore brings back, one by one, those the snapshot
// captured), so later or earlier deletions by other tool calls are kept.
func (e *Engine) undelete(p string) bool {
	e.lockChange()
	defer e.unlockChange()
	e.pushForks(p)
	if e.mode != Staged {
		return false
	}
	m := e.index[p]
	if m == nil {
		return false
	}
	switch {
	case m.Kind == KindDir && m.Deleted && !m.Opaque:
		nm := *m
		nm.Deleted = false
		nm.Container = m.Redirect == "" && m.Base.Exists
		if e.writeMeta(p, &nm) != nil {
			return false
		}
		*m = nm
	case m.Kind == KindWhiteout && m.Base.Exists && m.Base.Mode&syscall.S_IFMT == syscall.S_IFDIR:
		if e.isRenameSourceLocked(e.basePathOf(p)) {
			// The workspace directory was renamed away (mv d e), and the
			// rename stays: showing it here again would show it twice,
			// and commit moves it. The caller makes a new directory.
			return false
		}
		l, err := e.locate(p)
		if err != nil {
			return false
		}
		if st := e.baseStat(l); st == nil || st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			return false
		}
		if e.upper.withParent(p, func(dirfd int, name string) error { return unix.Unlinkat(dirfd, name, 0) }) != nil {
			return false
		}
		e.dropEntry(p)
		e.pruneContainers(p)
	default:
		return false
	}
	return true
}

// restoreFile writes a stored body back to ent.Path with its mode, owner
// and mtime. The body takes the path's place whole, with the mode and
// owner that sameState compares (replaceLocked): a crash leaves the path
// either restored or as it was, which a restore tried again then restores
// instead of keeping it as a later change.
func (e *Engine) restoreFile(ent snapshot.Entry) error {
	body, err := e.snaps.OpenBody(ent.Hash)
	if err != nil {
		return err
	}
	defer body.Close()
	if err := e.mkdirAll(parentOf(ent.Path)); err != nil {
		return err
	}
	want := &ownerMode{mode: ent.Mode & 0o7777, uid: ent.Uid, gid: ent.Gid}
	fill := func(fd int) error {
		_, err := copyBuffer(fdio.Writer(fd), body)
		return err
	}
	var created bool
	err = e.locked(func() (err error) {
		e.pushForks(ent.Path)
		created, err = e.replaceLocked(ent.Path, daemon, want, fill)
		return err
	})
	if err == errInPlace {
		err = e.restoreBodyInPlace(ent, body)
	} else if err == nil {
		err = e.recordReplaced(daemon, ent.Path, created, ent.Size)
	}
	if err != nil {
		return err
	}
	// Also after a whole replacement, which set the mode and owner
	// already: the mtime and the xattrs are set here in every case.
	if err := e.restoreXattrs(ent.Path, ent.Xattrs); err != nil {
		return err
	}
	mt := unix.NsecToTimespec(ent.Mtime)
	_, err = e.Setattr(ent.Path, -1, SetAttr{Mode: ptr(ent.Mode & 0o7777), Uid: ptr(ent.Uid), Gid: ptr(ent.Gid), Mtime: &mt}, daemon)
	return err
}

// restoreBodyInPlace is restoreFile's write of a body replaceLocked leaves
// in place (immediate mode, hard links, a file open for writing): a crash
// between the truncate and the end of the write leaves it empty or
// partial.
func (e *Engine) restoreBodyInPlace(ent snapshot.Entry, body io.Reader) error {
	f, _, err := e.Create(ent.Path, unix.O_WRONLY|unix.O_TRUNC, ent.Mode&0o7777, daemon)
	if err != nil {
		return err
	}
	if e.died("replace-body") {
		return errDied
	}
	_, err = copyBuffer(fdio.Writer(f.Fd), body)
	e.Release(ent.Path, f, daemon)
	return err
}

// baseHasBody reports whether the workspace file behind ent.Path (through
// renamed directories) is the pre-image: same size, mode and content hash.
func (e *Engine) baseHasBody(ent snapshot.Entry) bool {
	e.rlock()
	l, err := e.locate(ent.Path)
	e.runlock()
	if err != nil || !l.hasBase {
		return false
	}
	st, err := e.base.lstat(l.basePath)
	if err != nil || !isRegular(st) || st.Size != ent.Size || st.Mode&0o7777 != ent.Mode&0o7777 {
		return false
	}
	fd, err := e.base.open(l.basePath, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return hashOf(fd) == ent.Hash
}

// mkdirAll makes p and its missing parents in the view.
func (e *Engine) mkdirAll(p string) error {
	if p == "" {
		return nil
	}
	if st, err := e.Stat(p); err == nil {
		if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			return syscall.ENOTDIR
		}
		return nil
	}
	if err := e.mkdirAll(parentOf(p)); err != nil {
		return err
	}
	_, err := e.Mkdir(p, 0o755, daemon)
	if errors.Is(err, syscall.EEXIST) {
		return nil
	}
	return err
}

// xattrsLocked reads p's extended attributes as the view shows them.
func (e *Engine) xattrsLocked(p string) map[string][]byte {
	lyr, rel, err := e.xattrTarget(p)
	if err != nil {
		return nil
	}
	out := map[string][]byte{}
	eachXattr(lyr, rel, func(name string, val []byte) {
		if strings.HasPrefix(name, "user.") {
			out[name] = append([]byte(nil), val...)
		}
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

// restoreXattrs makes p's user xattrs exactly want.
func (e *Engine) restoreXattrs(p string, want map[string][]byte) error {
	e.rlock()
	have := e.xattrsLocked(p)
	e.runlock()
	for name := range have {
		if _, ok := want[name]; !ok {
			if err := e.Removexattr(p, name, daemon); err != nil {
				return err
			}
		}
	}
	for name, v := range want {
		if old, ok := have[name]; ok && string(old) == string(v) {
			continue
		}
		if err := e.Setxattr(p, name, v, 0, daemon); err != nil {
			return err
		}
	}
	return nil
}

func (e *Engine) baseXattrs(rel string) map[string][]byte {
	buf := make([]byte, 64<<10)
	n, err := e.base.listxattr(rel, buf)
	if err != nil || n <= 0 {
		return nil
	}
	out := map[string][]byte{}
	val := make([]byte, 64<<10)
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if strings.HasPrefix(name, "user.") && !strings.HasPrefix(name, xattrPrefix) {
			if vn, err := e.base.getxattr(rel, name, val); err == nil {
				out[name] = append([]byte(nil), val[:vn]...)
			}
		}
	}
	return out
}

func sameXattrs(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || string(w) != string(v) {
			return false
		}
	}
	return true
}

// normalize drops p's pending entry when it shows just what the workspace
// has (a restore made it so): staged mode keeps only real changes.
func (e *Engine) normalize(p string) {
	e.lockChange()
	defer e.unlockChange()
	e.pushForks(p)
	if e.mode != Staged {
		return
	}
	m := e.index[p]
	if m == nil || e.writers[m.uino] > 0 {
		return
	}
	l, err := e.locate(p)
	if err != nil {
		return
	}
	bst := e.baseStat(l)
	drop := false
	switch m.Kind {
	case KindWhiteout:
		drop = bst == nil
	case KindFile, KindSymlink:
		ust, err := e.upper.lstat(p)
		if err != nil || bst == nil || ust.Nlink > 1 || ust.Uid != bst.Uid || ust.Gid != bst.Gid {
			return
		}
		if m.Kind == KindSymlink {
			a, err1 := e.base.readlink(l.basePath)
			b, err2 := e.readUpperSymlink(p)
			drop = bst.Mode&syscall.S_IFMT == syscall.S_IFLNK && err1 == nil && err2 == nil && a == b
		} else {
			drop = isRegular(bst) && bst.Size == ust.Size && bst.Mode&0o7777 == ust.Mode&0o7777 && e.sameContent(l.basePath, p, bst.Size) &&
				sameXattrs(e.xattrsLocked(p), e.baseXattrs(l.basePath))
		}
	case KindDir:
		if m.Deleted || bst == nil || bst.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			return
		}
		if e.isRenameSourceLocked(l.basePath) {
			// The workspace directory here is renamed elsewhere: this
			// one stays new, or it would show it twice.
			return
		}
		ust, err := e.upper.lstat(p)
		if err != nil {
			return
		}
		// A directory recreated where the workspace has one: let the
		// workspace's entries show through again (those deleted keep
		// their whiteouts), and it is no change when its attributes
		// match.
		nm := *m
		nm.Opaque = false
		nm.Container = m.Redirect == "" && ust.Mode&0o7777 == bst.Mode&0o7777 && ust.Uid == bst.Uid && ust.Gid == bst.Gid
		if nm.Container {
			nm.Base, nm.Ino = baselineOf(bst), e.baseInoAt(p, bst)
		}
		if nm != *m {
			if e.writeMeta(p, &nm) != nil {
				return
			}
			*m = nm
		}
		drop = nm.Container && len(e.children[p]) == 0
	}
	if !drop {
		return
	}
	if e.upper.withParent(p, func(dirfd int, name string) error { return removeAllAt(dirfd, name) }) != nil {
		return
	}
	e.dropEntry(p)
	e.pruneContainers(p)
}

// copyTree copies the view's tree at from to to (which must not exist),
// keeping modes and file times.
func (e *Engine) copyTree(from, to string) error {
	st, err := e.Stat(from)
	if err != nil {
		return err
	}
	owner := Caller{Uid: st.Uid, Gid: st.Gid}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		if _, err := e.Mkdir(to, st.Mode&0o7777, owner); err != nil {
			return err
		}
		ents, err := e.ReadDir(from)
		if err != nil {
			return err
		}
		for _, d := range ents {
			if err := e.copyTree(joinPath(from, d.Name), joinPath(to, d.Name)); err != nil {
				return err
			}
		}
		return nil
	case syscall.S_IFLNK:
		t, err := e.Readlink(from)
		if err != nil {
			return err
		}
		_, err = e.Symlink(t, to, owner)
		return err
	case syscall.S_IFREG:
		src, err := e.Open(from, unix.O_RDONLY, daemon)
		if err != nil {
			return err
		}
		defer unix.Close(src.Fd)
		dst, _, err := e.Create(to, unix.O_WRONLY|unix.O_EXCL, st.Mode&0o7777, owner)
		if err != nil {
			return err
		}
		_, err = copyBuffer(fdio.Writer(dst.Fd), fdio.Reader(src.Fd))
		e.Release(to, dst, daemon)
		if err != nil {
			return err
		}
		mt := unix.Timespec(st.Mtim)
		if _, err = e.Setattr(to, -1, SetAttr{Mtime: &mt}, daemon); err != nil {
			return err
		}
		if e.died("copy-tree") {
			return errDied
		}
		return nil
	}
	return nil // special files are not copied
}

// removeTree removes p and everything below it from the view.
// treeWithin reports whether every entry of the tree a is in the tree b
// too, with the same type (and, for a file, size): a is part of a copy of
// b. An absent a is within anything.
func (e *Engine) treeWithin(a, b string) bool {
	sa, err := e.Stat(a)
	if err != nil {
		return errors.Is(err, syscall.ENOENT)
	}
	sb, err := e.Stat(b)
	if err != nil || sa.Mode&syscall.S_IFMT != sb.Mode&syscall.S_IFMT {
		return false
	}
	switch sa.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		// A file a copy cut short is shorter.
		return sa.Size <= sb.Size
	case syscall.S_IFDIR:
		ents, err := e.ReadDir(a)
		if err != nil {
			return false
		}
		for _, d := range ents {
			if !e.treeWithin(joinPath(a, d.Name), joinPath(b, d.Name)) {
				return false
			}
		}
	}
	return true
}

func (e *Engine) removeTree(p string) error {
	st, err := e.Stat(p)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil
		}
		return err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return e.Unlink(p, daemon)
	}
	ents, err := e.ReadDir(p)
	if err != nil {
		return err
	}
	for _, d := range ents {
		if err := e.removeTree(joinPath(p, d.Name)); err != nil {
			return err
		}
	}
	return e.Rmdir(p, daemon)
}
