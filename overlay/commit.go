package overlay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"stagefs/internal/contenthash"
)

// CommitResult reports what a commit did, path by path.
type CommitResult struct {
	Committed []string
	Conflicts []Conflict
	Failed    []Failure
}

// Conflict is a path whose workspace entry changed since it was staged.
type Conflict struct {
	Path     string
	Reason   string
	Expected string
	Actual   string
	// WorkspaceHash and StagedHash are the contents' hashes when the
	// path is a file on that side.
	WorkspaceHash, StagedHash contenthash.Hash
}

// Failure is a path that could not be committed for another reason.
type Failure struct {
	Path   string
	Reason string
}

// killedAt is what a commit or a discard panics with when a test stops it
// where a crash could (Engine.die, asked through killPoint). A panic ends
// the whole operation at once, as a SIGKILL would: no later step runs, and
// the deferred calls on the way out only unlock the engine and close
// descriptors, so the disk is left as a kill leaves it.
type killedAt string

// killPoint stops the running commit or discard here when a test asks for
// a crash at point.
func (e *Engine) killPoint(point string) {
	if e.died(point) {
		panic(killedAt(point))
	}
}

// errConflict marks a baseline mismatch inside the commit steps.
type conflictError struct{ expected, actual string }

func (c *conflictError) Error() string {
	return "the workspace changed since this path was staged"
}

// Commit applies the pending changes at or below paths (all when empty) to
// the workspace. Each path is checked against its baseline first: a path
// changed in the workspace meanwhile is a conflict and stays pending, unless
// force is set. Files are written to a temporary name in their directory,
// fsynced, and renamed into place; directories are fsynced once at the end.
// A commit interrupted by a crash is finished by Recover.
func (e *Engine) Commit(paths []string, force bool, c Caller) CommitResult {
	return e.commit(paths, force, c, false)
}

// commit is Commit; recovering is set when Recover finishes a commit that a
// crash interrupted, whose steps may be partly applied already.
func (e *Engine) commit(paths []string, force bool, c Caller, recovering bool) CommitResult {
	e.lockCommit()
	defer e.unlockCommit()
	e.AwaitReleases()
	stage := e.prepareCopies(paths)
	e.killPoint("commit-prepared")
	// The change gate is held from the selection to the end, the intent
	// record's fdatasync included: a change made in between would apply
	// to a selection that no longer describes the pending set. The engine
	// lock is let go of now and then for reads (commitRun.yield). The
	// files' contents were written before, and are taken if they are
	// still what the pending set holds (commitprep.go).
	e.lockGate()
	defer e.unlockGate()
	var sel []string
	var res CommitResult
	err := func() error {
		e.lockMu()
		defer e.unlockMu()
		e.finishForks()
		sel = e.selectLocked(paths, true, commitAncestor)
		if len(sel) == 0 {
			return nil
		}
		intent, _ := json.Marshal(sel)
		if err := e.record(Record{Op: "commit_begin", Pid: c.Pid, Detail: string(intent)}); err != nil {
			return err
		}
		res = e.commitLocked(sel, force, recovering, stage)
		return nil
	}()
	stage.close(e) // not deferred: a crash leaves it, as a kill would
	if err != nil {
		// Without a durable intent a crash in the middle could not be
		// finished at the next start: nothing was committed.
		for _, p := range sel {
			res.Failed = append(res.Failed, Failure{Path: p, Reason: err.Error()})
		}
		return res
	}
	if len(sel) == 0 {
		return CommitResult{}
	}
	e.emptyTrash()
	sum, _ := json.Marshal(map[string]int{"committed": len(res.Committed), "conflicts": len(res.Conflicts), "failed": len(res.Failed)})
	e.note(Record{Op: "commit_end", Pid: c.Pid, Detail: string(sum)})
	e.changed()
	return res
}

type commitRun struct {
	e       *Engine
	force   bool
	res     CommitResult
	syncDir map[string]bool // base dirs to fsync at the end
	// syncOnce: the prepared files are made durable together, by one
	// syncfs before their renames, instead of one fsync each.
	syncOnce bool
	linked   map[uint64]string // upper inode -> base path that already holds it (hard links)
	failed   map[string]bool   // paths that did not commit; their descendants wait

	// byBaseIno: the pending entries staged against each workspace
	// file, by inode (followLinkCtime); nil until needed.
	byBaseIno map[uint64][]string
	// shownLeft: the inode numbers that entries this commit leaves
	// pending show (stillShownBy); nil until needed.
	shownLeft map[uint64]bool

	movedAway map[string]bool         // workspace paths a directory rename of this commit emptied
	dirsMade  map[string]bool         // directories applyDir has made or updated in this commit
	pending   []preparedFile          // files written under temporary names
	prepared  map[uint64]preparedFile // upper inode -> its first prepared name (hard links)
	// heldDeleted: directories moved and then deleted whose deletion
	// waits for the renames (one of them takes a directory out of it).
	heldDeleted []string
	// movedDeletedSrcs: the sources of the directories moved and then
	// deleted (see movedDeletedFrom); nil until needed.
	movedDeletedSrcs map[string]bool

	progress *progress    // counts the steps, for a watching client
	stage    *commitStage // the copies written before the lock was taken
	held     time.Time    // when the commit last took Engine.mu (see yield)
	// dirOnRoot: workspace directories known to be, or not to be, on
	// the root's file system (onRootDev).
	dirOnRoot map[string]bool

	// recovering: Recover is finishing a commit a crash interrupted. A
	// few states that only this commit's own steps leave half way are
	// then accepted instead of reported as conflicts.
	recovering bool
}

func (e *Engine) commitLocked(sel []string, force, recovering bool, stage *commitStage) CommitResult {
	r := &commitRun{e: e, force: force, recovering: recovering, syncDir: map[string]bool{}, linked: map[uint64]string{}, failed: map[string]bool{}, prepared: map[uint64]preparedFile{}, movedAway: map[string]bool{}, dirsMade: map[string]bool{},
		progress: e.startProgress("commit", len(sel)), stage: stage, held: time.Now()}
	defer r.progress.finish()
	e.removeStrayTemps()
	if recovering {
		r.resumeMovesAside(sel)
	}
	// The root's times as the view shows them: the commit's changes in
	// it would otherwise leave the workspace's root, and the view's,
	// with the commit's time.
	root, rootErr := e.statLocked("")
	handled := r.applyRenames(sel)
	r.applyChanges(sel, handled)
	r.dropCommitted()
	touched := r.syncDir[""]
	for _, p := range r.res.Committed {
		touched = touched || !strings.Contains(p, "/")
	}
	if rootErr == nil && touched {
		ts := []unix.Timespec{unix.Timespec(root.Atim), unix.Timespec(root.Mtim)}
		unix.UtimesNanoAt(unix.AT_FDCWD, fdPath(e.base.fd), ts, 0)
		unix.UtimesNanoAt(unix.AT_FDCWD, fdPath(e.upper.fd), ts, 0)
	}
	return r.res
}

// applyRenames applies the directory renames of sel (step 1) and the
// deletions of directories moved and then deleted, and returns the paths
// it handled that way.
func (r *commitRun) applyRenames(sel []string) (handled map[string]bool) {
	e := r.e
	// 1. Directory renames, shallowest destination first.
	var redirects, movedDeleted []string
	for _, p := range sel {
		if m := e.index[p]; m != nil && m.Kind == KindDir && m.Redirect != "" {
			if m.Deleted {
				movedDeleted = append(movedDeleted, p)
			} else {
				redirects = append(redirects, p)
			}
		}
	}
	// A directory moved and then deleted is deleted where the workspace
	// has it, before any rename: its place may be another's destination,
	// and its destination's parent may not exist.
	handled = map[string]bool{}
	// Deepest source first: one moved into the other's source before
	// both were deleted (mv a/b c; mv a d; rm -r c d) empties its
	// workspace directory first.
	r.deletesFirst(movedDeleted)
	for _, p := range movedDeleted {
		if r.holdsRenameSource(p, redirects) {
			// Unless another rename still has to take a directory out
			// of it (mv a/b c; mv a c/a; rm -r c/a): the whiteout that
			// rename left below p stands for the directory that goes
			// to c, and deleting it now would leave that rename
			// nothing to move. These deletions then run with the
			// others, after the renames; until then the workspace
			// directory blocks renames into its place like a rename
			// source does (heldDeleted).
			r.heldDeleted = append(r.heldDeleted, p)
			continue
		}
		var below []string
		for _, q := range sel {
			if q == p || strings.HasPrefix(q, p+"/") {
				below = append(below, q)
			}
		}
		// Deepest in the workspace first: a directory moved into
		// another moved one is deeper in the view than where the
		// workspace has it.
		r.deletesFirst(below)
		for _, q := range below {
			if m := e.index[q]; m != nil && (m.Kind == KindWhiteout || m.Deleted) && !handled[q] {
				r.do(q, r.applyDelete)
				handled[q] = true
			}
		}
	}
	sort.SliceStable(redirects, func(i, j int) bool { return depth(redirects[i]) < depth(redirects[j]) })
	inSel := map[string]bool{}
	for _, p := range sel {
		inSel[p] = true
	}
	// A rename waits while its destination is, or is inside, the source of
	// another pending rename (mv a c; mv b a); a cycle (a swap) is broken
	// by moving one source aside under a temporary name first.
	for len(redirects) > 0 {
		var waiting []string
		movedOwn := false
		for _, p := range redirects {
			// A rename below one that waits waits too: its new parent
			// is not in place yet (redirects run shallowest first).
			if r.blockedBy(p, redirects) != "" || underAny(p, waiting) {
				waiting = append(waiting, p)
				continue
			}
			// A directory renamed to below its own old place (mkdir n;
			// mv d n/d; mv n d) cannot be moved into itself: it goes
			// aside first and waits a round, for its old place to be
			// made anew, or renamed into, before it moves in.
			if m := e.index[p]; p != m.Redirect && isUnder(p, m.Redirect) {
				if dir := r.failedAncestor(p); dir != "" {
					r.failParent(p, dir) // moved aside, it would stay there
					continue
				}
				if err := r.moveOwnSourceAside(p, m); err != nil {
					r.fileError(p, m, err)
					continue
				}
				movedOwn = true
				waiting = append(waiting, p)
				continue
			}
			r.applyRedirectStep(p, inSel)
		}
		if !movedOwn && len(waiting) == len(redirects) && r.checkSources(waiting) {
			// A rename whose source is gone or replaced failed instead:
			// it blocks nothing now, and nothing was moved aside for a
			// cycle that cannot complete.
			redirects = r.notFailed(waiting)
			continue
		}
		if !movedOwn && len(waiting) == len(redirects) {
			err := errors.New("the directory renames wait on each other")
			if src := r.blockedBy(waiting[0], waiting); src != "" {
				err = r.moveAside(src)
			}
			if err != nil {
				for _, p := range waiting {
					r.failed[p] = true
					r.res.Failed = append(r.res.Failed, Failure{Path: p, Reason: err.Error()})
				}
				break
			}
		}
		redirects = waiting
	}
	return handled
}

// applyChanges applies the rest of sel: deletions, directories, files,
// then the directories' times, and makes it durable (steps 2 to 5). From
// here on every step leaves the view whole, so the commit lets reads in
// between steps (yield).
func (r *commitRun) applyChanges(sel []string, handled map[string]bool) {
	e := r.e
	// 2. Deletions, deepest first.
	var deletes, dirs, files []string
	for _, p := range sel {
		m := e.index[p]
		switch {
		case m == nil:
		case handled[p]:
		case m.Kind == KindWhiteout || m.Deleted:
			deletes = append(deletes, p)
		case m.Kind == KindDir:
			dirs = append(dirs, p)
		default:
			files = append(files, p)
		}
	}
	// Every step from here on leaves the view whole: a workspace entry
	// replaced or removed is still described by its pending entry.
	r.deletesFirst(deletes)
	for _, p := range deletes {
		r.do(p, r.applyDelete)
		r.yield()
	}
	// 3. Directories, shallowest first; 4. files.
	sort.SliceStable(dirs, func(i, j int) bool { return depth(dirs[i]) < depth(dirs[j]) })
	for _, p := range dirs {
		r.do(p, r.applyDir)
		r.yield()
	}
	r.syncOnce = len(files)-len(r.stage.copies) >= syncOnceFiles
	for _, p := range files {
		r.do(p, r.applyFile)
		r.yield()
	}
	r.finishFiles()
	// 5. Directory times last: creating children changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		if !r.failed[dirs[i]] {
			r.applyDirTimes(dirs[i])
		}
	}
	// So did creating and removing entries in staged directories the
	// commit did not select (containers): they get the times the view
	// showed, not the commit's.
	for dir := range r.syncDir {
		if m := e.index[dir]; m != nil && m.Kind == KindDir && !m.Deleted && !r.failed[dir] {
			r.applyDirTimes(dir)
		}
	}
	for dir := range r.syncDir {
		if fd, err := e.base.openDirRead(dir); err == nil {
			unix.Fsync(fd)
			unix.Close(fd)
		}
		r.yield()
	}
}

// dropCommitted keeps the inode numbers the mount showed for what was
// committed, then drops it from the pending set (step 6).
func (r *commitRun) dropCommitted() {
	e := r.e
	// 6. Keep the inode numbers the mount showed for what was committed,
	// then drop it from the pending set, deepest first.
	var inos [][2]uint64
	committed := map[string]bool{}
	for _, p := range r.res.Committed {
		committed[p] = true
	}
	for _, p := range r.res.Committed {
		m := e.index[p]
		if m == nil || m.Kind == KindWhiteout || m.Deleted {
			continue
		}
		if r.stillShownBy(p, m, committed) {
			// One name of a staged hard link committed alone: the
			// names left pending keep the number, and the committed
			// file, another file now, shows its own.
			continue
		}
		// Recorded even when the numbers agree: the inode may be a
		// reused one that the map still gives another file's number.
		if st, err := e.base.lstat(p); err == nil && st.Dev == e.rootDev {
			inos = append(inos, [2]uint64{st.Ino, m.shownIno()})
		}
	}
	e.killPoint("commit-applied")
	if err := e.inos.add(inos); err != nil {
		e.logf("inode map: %v", err)
	}
	done := append([]string(nil), r.res.Committed...)
	sort.SliceStable(done, func(i, j int) bool { return depth(done[i]) > depth(done[j]) })
	// A committed directory that hid the workspace's (opaque, or a
	// rename's) shows it from now on: the workspace's holds what the
	// view showed. Before any entry in it is dropped, so that the view
	// stays whole at every yield below (an entry dropped from an opaque
	// directory would vanish from the view until the directory's turn).
	for _, p := range done {
		if m := e.index[p]; m != nil && m.Kind == KindDir && !m.Deleted && (m.Opaque || m.Redirect != "") {
			nm := *m
			nm.Opaque, nm.Redirect = false, ""
			if st, err := e.base.lstat(p); err == nil {
				nm.Base = baselineOf(st)
			}
			if e.writeMeta(p, &nm) == nil {
				*m = nm
			}
		}
	}
	for _, p := range done {
		e.dropCommitted(p)
		r.yield()
	}
	sort.Strings(r.res.Committed)
	r.res.Committed = uniq(r.res.Committed)
}

// blockedBy returns the source of another pending rename that p's
// destination is, or lies inside, ("" when none). The workspace directory
// of a held deletion blocks the same way: it is still there (mv a c; mv
// c/b a; rm -r c must move a aside before c/b can become a).
func (r *commitRun) blockedBy(p string, pending []string) string {
	for _, q := range append(pending[:len(pending):len(pending)], r.heldDeleted...) {
		if q == p || r.failed[q] {
			continue
		}
		if m := r.e.index[q]; m != nil && m.Redirect != "" && isUnder(p, m.Redirect) {
			return m.Redirect
		}
	}
	return ""
}

// holdsRenameSource reports whether the workspace directory of p, a
// directory moved and then deleted, holds the source of one of redirects.
func (r *commitRun) holdsRenameSource(p string, redirects []string) bool {
	src := r.e.index[p].Redirect
	for _, q := range redirects {
		if m := r.e.index[q]; m != nil && m.Redirect != src && isUnder(m.Redirect, src) {
			return true
		}
	}
	return false
}

// underAny reports whether p lies below one of dirs.
func underAny(p string, dirs []string) bool {
	for _, d := range dirs {
		if p != d && isUnder(p, d) {
			return true
		}
	}
	return false
}

// failedAncestor returns the nearest directory above p that failed in this
// commit ("" when none; the root never fails).
func (r *commitRun) failedAncestor(p string) string {
	for dir, _ := splitPath(p); dir != ""; dir, _ = splitPath(dir) {
		if r.failed[dir] {
			return dir
		}
	}
	return ""
}

// failParent files p as failed because its parent directory dir did.
func (r *commitRun) failParent(p, dir string) {
	r.failed[p] = true
	r.res.Failed = append(r.res.Failed, Failure{Path: p, Reason: "a parent directory was not committed: " + dir})
}

// checkSources checks, before a cycle of renames is broken by moving one
// source aside, that every rename in it still finds the directory it was
// staged with (checkSource): one that does not is filed as a conflict. It
// reports whether any failed.
func (r *commitRun) checkSources(renames []string) bool {
	failed := false
	for _, p := range renames {
		m := r.e.index[p]
		if r.failed[p] {
			continue
		}
		sst, _ := r.e.base.lstat(m.Redirect)
		if err := r.checkSource(m, sst); err != nil {
			r.fileError(p, m, err)
			r.keepSource(p, m.Redirect)
			failed = true
		}
	}
	return failed
}

// notFailed returns the paths of ps that have not failed.
func (r *commitRun) notFailed(ps []string) []string {
	var out []string
	for _, p := range ps {
		if !r.failed[p] {
			out = append(out, p)
		}
	}
	return out
}

// moveOwnSourceAside moves aside the workspace directory behind the rename
// m to p, whose destination lies below that directory's own place. It
// checks first that the directory there is the one the rename was staged
// with (p itself is checked when the rename is applied: what is at p now
// is inside the directory that moves).
func (r *commitRun) moveOwnSourceAside(p string, m *meta) error {
	sst, _ := r.e.base.lstat(m.Redirect)
	if err := r.checkSource(m, sst); err != nil {
		return err
	}
	return r.moveAside(m.Redirect)
}

// checkSource returns a conflict unless sst, the workspace entry at the
// source of the directory rename m, is the directory the rename was staged
// with (with force, any directory).
func (r *commitRun) checkSource(m *meta, sst *syscall.Stat_t) error {
	if sst == nil || sst.Mode&syscall.S_IFMT != syscall.S_IFDIR || (!r.e.isBaseIno(sst, m.Ino) && !r.force) {
		return &conflictError{expected: fmt.Sprintf("directory %s (ino %d)", m.Redirect, m.Ino), actual: "missing or replaced in the workspace"}
	}
	return nil
}

// forgetMovedBase drops the baseline of the entry the pending set made at
// src, the old place of the directory behind the rename m, once that
// directory has left it (by a move aside): the entry replaces nothing
// any more, and its commit must not look for the directory there.
//
// The entry is found by the workspace path it stands for, not by its view
// path: it may have moved since with a renamed parent (mv a/b c; mkdir
// a/b; mv a c/a: the new directory is c/a/b in the view, still a/b in the
// workspace until c/a's rename is applied), and its baseline would then
// expect, at its new place, the directory that went to c.
func (r *commitRun) forgetMovedBase(src string, m *meta) error {
	e := r.e
	for q, sm := range e.index {
		if sm == m || sm.Kind == KindWhiteout || !e.isBaseOf(sm.Base, m.Ino) || e.basePathOf(q) != src {
			continue
		}
		nm := *sm
		nm.Base = Baseline{}
		if err := e.writeMeta(q, &nm); err != nil {
			return err
		}
		*sm = nm
	}
	return nil
}

// applyRedirectStep commits the directory rename to p, after the new
// directories it goes into.
func (r *commitRun) applyRedirectStep(p string, inSel map[string]bool) {
	e := r.e
	var up []string
	for dir, _ := splitPath(p); dir != ""; dir, _ = splitPath(dir) {
		if m := e.index[dir]; inSel[dir] && m != nil && m.Kind == KindDir && !m.Deleted && m.Redirect == "" {
			up = append(up, dir)
		}
	}
	for i := len(up) - 1; i >= 0; i-- {
		r.do(up[i], r.applyDir)
	}
	src := e.index[p].Redirect
	r.do(p, r.applyRedirect)
	if r.failed[p] {
		r.keepSource(p, src)
	}
}

// keepSource keeps the whiteout at src, the source of the failed rename to
// p, from being committed: it is the other half of the rename, and
// deleting the source alone would lose the directory.
func (r *commitRun) keepSource(p, src string) {
	if w := r.e.index[src]; w != nil && w.Kind == KindWhiteout && !r.failed[src] {
		r.failed[src] = true
		r.res.Failed = append(r.res.Failed, Failure{Path: src, Reason: "the directory rename to " + p + " was not committed"})
	}
}

// moveAsidePrefix starts the temporary name moveAside gives a workspace
// directory, next to it: moveAsidePrefix + its own name, or, when that is
// taken (a directory of the user's, or one an earlier swap left),
// ".stagefs-move.N." + its name.
const (
	moveAsidePrefix   = ".stagefs-move-"
	moveAsideNumbered = ".stagefs-move." // + N + "." + name
)

// moveAsideTries bounds the temporary names tried for one directory.
const moveAsideTries = 10

// moveAsideName returns the n-th temporary name of the workspace directory
// src. It is derived from src alone, so that Recover finds a directory that
// a crash caught after its move and before the pending renames were
// pointed at it.
func moveAsideName(src string, n int) string {
	dir, name := splitPath(src)
	if n == 0 {
		return joinPath(dir, moveAsidePrefix+name)
	}
	return joinPath(dir, fmt.Sprintf("%s%d.%s", moveAsideNumbered, n, name))
}

// moveAside renames the workspace directory src to a temporary name next
// to it and points the pending renames from inside it there.
func (r *commitRun) moveAside(src string) error {
	e := r.e
	var tmp string
	var err error
	for n := 0; n < moveAsideTries; n++ {
		tmp = moveAsideName(src, n)
		err = e.base.withParent(src, func(sdir int, sname string) error {
			return e.base.withParent(tmp, func(tdir int, tname string) error {
				return renameAt(sdir, sname, tdir, tname, unix.RENAME_NOREPLACE)
			})
		})
		if !errors.Is(err, syscall.EEXIST) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("move %s aside in the workspace: %w", src, err)
	}
	r.movedAway[src] = true
	r.syncDir[parentOf(src)] = true
	e.killPoint("commit-move-aside")
	if err := r.rewriteSources(src, tmp, nil); err != nil {
		return err
	}
	e.killPoint("commit-moved-aside")
	// Whatever the pending set made at the old place since replaces
	// nothing from now on (as in finishRedirect): the workspace has
	// nothing there any more.
	for _, m := range e.index {
		if m.Kind == KindDir && m.Redirect == tmp {
			return r.forgetMovedBase(src, m)
		}
	}
	return nil
}

// resumeMovesAside, when recovering, finds the workspace directories that
// the interrupted commit had moved aside. A crash between the move and the
// rewrite of the pending renames' sources (moveAside) leaves renames of
// this commit whose source is missing in the workspace but present under a
// temporary name: each is pointed there if the directory found has the
// inode number the rename was staged with, so a directory of the user's
// that happens to have such a name is never taken. Every path a directory
// was moved aside from counts as emptied by this commit (movedAway), as it
// did before the crash: the renames into it expect it absent.
func (r *commitRun) resumeMovesAside(sel []string) {
	e := r.e
	var renames []*meta
	for _, p := range sel {
		if m := e.index[p]; m != nil && m.Kind == KindDir && m.Redirect != "" {
			renames = append(renames, m)
		}
	}
	sort.Slice(renames, func(i, j int) bool { return renames[i].Redirect < renames[j].Redirect })
	for _, m := range renames {
		src := m.Redirect
		if _, err := e.base.lstat(src); !errors.Is(err, syscall.ENOENT) {
			continue
		}
		// The shallowest missing directory on the way to src is the
		// one that may have been moved aside.
		parts := strings.Split(src, "/")
		for i := range parts {
			q := strings.Join(parts[:i+1], "/")
			if _, err := e.base.lstat(q); err == nil {
				continue
			}
			rest := strings.TrimPrefix(src, q)
			for n := 0; n < moveAsideTries; n++ {
				tmp := moveAsideName(q, n)
				if st, err := e.base.lstat(tmp + rest); err == nil && st.Mode&syscall.S_IFMT == syscall.S_IFDIR && e.isBaseIno(st, m.Ino) {
					if err := r.rewriteSources(q, tmp, nil); err != nil {
						e.logf("commit: point the renames from %s at %s: %v", q, tmp, err)
					}
					break
				}
			}
			break
		}
	}
	for _, m := range renames {
		dir, name := r.movedAsideFrom(m)
		if name != "" {
			from := joinPath(dir, name)
			r.movedAway[from] = true
			r.syncDir[dir] = true
			// A crash may have come before moveAside dropped the
			// baseline of what was made at the old place.
			if err := r.forgetMovedBase(from, m); err != nil {
				e.logf("commit: %s: %v", from, err)
			}
		}
	}
}

// movedAsideFrom returns where the workspace directory behind the rename m
// was before this commit moved it aside (dir and name; name "" when it was
// not): its source runs through a temporary name, and the directory there
// is the one the rename was staged with.
func (r *commitRun) movedAsideFrom(m *meta) (string, string) {
	st, err := r.e.base.lstat(m.Redirect)
	if err != nil || !r.e.isBaseIno(st, m.Ino) {
		return "", ""
	}
	parts := strings.Split(m.Redirect, "/")
	for i, part := range parts {
		dir := strings.Join(parts[:i], "/")
		if name, ok := strings.CutPrefix(part, moveAsidePrefix); ok {
			return dir, name
		}
		if rest, ok := strings.CutPrefix(part, moveAsideNumbered); ok {
			if _, name, ok := strings.Cut(rest, "."); ok {
				return dir, name
			}
		}
	}
	return "", ""
}

// rewriteSources points the pending renames whose source is at or below
// from to the same place below to (but skip).
func (r *commitRun) rewriteSources(from, to string, skip *meta) error {
	r.movedDeletedSrcs = nil
	for q, om := range r.e.index {
		if om != skip && om.Kind == KindDir && om.Redirect != "" && isUnder(om.Redirect, from) {
			nm := *om
			nm.Redirect = to + strings.TrimPrefix(om.Redirect, from)
			if err := r.e.writeMeta(q, &nm); err != nil {
				return err
			}
			*om = nm
		}
	}
	return nil
}

func depth(p string) int {
	if p == "" {
		return 0
	}
	return strings.Count(p, "/") + 1
}

// do runs one step for p unless an ancestor failed, and files the outcome.
func (r *commitRun) do(p string, step func(string, *meta) error) {
	defer r.progress.step(0)
	m := r.e.index[p]
	if m == nil || r.failed[p] {
		// Failed in an earlier step (a renamed directory is applied by
		// two): a later step must not report it committed, or it
		// would be dropped from the pending set.
		return
	}
	if dir := r.failedAncestor(p); dir != "" {
		r.failParent(p, dir)
		return
	}
	if err := step(p, m); err != nil {
		r.fileError(p, m, err)
		return
	}
	r.res.Committed = append(r.res.Committed, p)
}

// fileError files p as failed: a conflict, or a failure with err's reason.
func (r *commitRun) fileError(p string, m *meta, err error) {
	var ce *conflictError
	switch {
	case errors.As(err, &ce):
		r.failed[p] = true
		c := Conflict{Path: p, Reason: ce.Error(), Expected: ce.expected, Actual: ce.actual}
		c.WorkspaceHash = r.e.fileHash(r.e.base, p)
		if m.Kind == KindFile {
			c.StagedHash = r.e.fileHash(r.e.upper, p)
		}
		r.res.Conflicts = append(r.res.Conflicts, c)
	default:
		r.failed[p] = true
		r.res.Failed = append(r.res.Failed, Failure{Path: p, Reason: err.Error()})
	}
}

// check compares the base at p with the baseline, unless forced.
// alreadyDone reports whether the base already holds the staged result
// (a commit that a crash interrupted, or the same change made by hand).
func (r *commitRun) check(p string, b Baseline, alreadyDone func(*syscall.Stat_t) bool) (*syscall.Stat_t, bool, error) {
	st, err := r.e.base.lstat(p)
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		return nil, false, err
	}
	if err != nil {
		st = nil
	}
	if alreadyDone != nil && alreadyDone(st) {
		return st, true, nil
	}
	if st == nil && r.movedAway[p] {
		// What the baseline describes was renamed away by this commit.
		return nil, false, nil
	}
	if r.force || b.matches(st) {
		return st, false, nil
	}
	actual := "absent"
	if st != nil {
		actual = baselineOf(st).String()
	}
	return st, false, &conflictError{expected: b.String(), actual: actual}
}

// acceptReplacedAbsent reports whether Recover accepts the conflict err,
// check's answer for an absent workspace entry although the baseline has
// one: the staged entry replaces a workspace entry of the other type (a
// directory where a file was, or the reverse), which the commit removes
// (removeReplaced) before it makes the new one, so a crash between the
// two leaves the path absent. Where the types agree the commit replaces
// the entry by one rename and never leaves it absent, and a normal commit
// never accepts it: absent there means someone deleted the entry.
func (r *commitRun) acceptReplacedAbsent(err error, st *syscall.Stat_t, b Baseline, stagedDir bool) bool {
	var ce *conflictError
	if !r.recovering || !errors.As(err, &ce) || st != nil || !b.Exists {
		return false
	}
	return (b.Mode&syscall.S_IFMT == syscall.S_IFDIR) != stagedDir
}

func (r *commitRun) applyRedirect(p string, m *meta) error {
	e := r.e
	src := m.Redirect
	sst, _ := e.base.lstat(src)
	dst, _ := e.base.lstat(p)
	if sst == nil && dst != nil && dst.Mode&syscall.S_IFMT == syscall.S_IFDIR && e.isBaseIno(dst, m.Ino) {
		return r.finishRedirect(p, m, src) // renamed before a crash
	}
	if err := r.checkSource(m, sst); err != nil {
		return err
	}
	if _, _, err := r.check(p, m.Base, nil); err != nil {
		return err
	}
	e.killPoint("commit-redirect")
	err := e.base.withParent(src, func(sdir int, sname string) error {
		return e.base.withParent(p, func(ddir int, dname string) error {
			return renameAt(sdir, sname, ddir, dname, 0)
		})
	})
	if err != nil {
		return fmt.Errorf("rename %s to %s in the workspace: %w", src, p, err)
	}
	sd, _ := splitPath(src)
	dd, _ := splitPath(p)
	r.syncDir[sd], r.syncDir[dd] = true, true
	return r.finishRedirect(p, m, src)
}

// finishRedirect updates the pending set after the base directory moved:
// other redirects from inside it now come from its new place.
func (r *commitRun) finishRedirect(p string, m *meta, src string) error {
	e := r.e
	r.movedAway[src] = true
	// Something new made at the source (mv a b; mkdir a) replaced what
	// has moved: from now on it replaces nothing, even if it is not part
	// of this commit.
	if err := r.forgetMovedBase(src, m); err != nil {
		return err
	}
	if err := r.rewriteSources(src, p, m); err != nil {
		return err
	}
	nm := *m
	nm.Redirect = ""
	if st, err := e.base.lstat(p); err == nil {
		nm.Base = baselineOf(st)
	}
	if err := e.writeMeta(p, &nm); err != nil {
		return err
	}
	*m = nm
	return nil
}

// deleteDepth is the depth of the workspace path that the deletion at p
// removes.
func (r *commitRun) deleteDepth(p string) int {
	return depth(r.deletedRedirectBase(p))
}

// deletesFirst orders deletions deepest in the workspace first and, among
// those as deep, deepest in the view: a directory moved and deleted below
// another one (mv b a/b; mv a c; rm -r c) removes what the other's
// workspace directory holds.
func (r *commitRun) deletesFirst(ps []string) {
	sort.SliceStable(ps, func(i, j int) bool {
		di, dj := r.deleteDepth(ps[i]), r.deleteDepth(ps[j])
		if di != dj {
			return di > dj
		}
		return depth(ps[i]) > depth(ps[j])
	})
}

func (r *commitRun) applyDelete(p string, m *meta) error {
	e := r.e
	if m.Kind == KindDir && m.Redirect != "" {
		return r.deleteMovedDir(p, m)
	}
	bp := r.deletedRedirectBase(p)
	if m.Kind == KindWhiteout && bp != p && r.movedDeletedFrom(bp) {
		// The whiteout a move left at its source, inside a directory
		// moved and deleted too: the moved directory's own deletion
		// removes the workspace directory at bp, after its entries.
		return nil
	}
	if bp != p && m.Base.Exists {
		// Below a moved-then-deleted directory a whiteout hides either
		// an entry of the moved directory (at the source) or one of the
		// directory the move replaced (at p): its baseline tells which.
		if st, _ := e.base.lstat(bp); st == nil || st.Ino != m.Base.Ino {
			if st, _ := e.base.lstat(p); st != nil && st.Ino == m.Base.Ino {
				bp = p
			}
		}
	}
	st, done, err := r.check(bp, m.Base, func(st *syscall.Stat_t) bool { return st == nil })
	if err != nil || done || st == nil {
		return err
	}
	return r.removeBase(bp, st)
}

// movedDeletedFrom reports whether a pending directory moved and then
// deleted has the workspace path bp as its source. The sources are
// gathered once (rewriteSources starts over), so a commit of many
// deletions does not walk the pending set for each.
func (r *commitRun) movedDeletedFrom(bp string) bool {
	if r.movedDeletedSrcs == nil {
		r.movedDeletedSrcs = map[string]bool{}
		for _, m := range r.e.index {
			if m.Kind == KindDir && m.Deleted && m.Redirect != "" {
				r.movedDeletedSrcs[m.Redirect] = true
			}
		}
	}
	return r.movedDeletedSrcs[bp]
}

// deleteMovedDir applies a directory moved and then deleted: the
// workspace directory goes where the workspace has it (the move's source,
// known by its inode number), and so does a directory the move replaced at
// p. Their entries' deletions came first.
func (r *commitRun) deleteMovedDir(p string, m *meta) error {
	e := r.e
	src := r.deletedRedirectBase(p)
	if st, _ := e.base.lstat(src); st != nil {
		if st.Mode&syscall.S_IFMT != syscall.S_IFDIR || (!e.isBaseIno(st, m.Ino) && !r.force) {
			return &conflictError{expected: fmt.Sprintf("directory %s (ino %d)", src, m.Ino), actual: "replaced in the workspace"}
		}
		if err := r.removeBase(src, st); err != nil {
			return err
		}
	}
	// What the source's own baseline describes is gone, as if moved away.
	r.movedAway[src] = true
	// And what the pending set made there since (mv a b; mkdir a; rm -r
	// b) replaces nothing now, also when it is committed later.
	if err := r.forgetMovedBase(src, m); err != nil {
		return err
	}
	// The directory the move replaced is where the workspace has p now:
	// below a renamed parent not applied yet, at the parent's source.
	at := e.basePathOf(p)
	if st, _ := e.base.lstat(at); st != nil && m.Base.matches(st) && !e.isRenameSourceLocked(at) {
		return r.removeBase(at, st)
	}
	return nil
}

// stillShownBy reports whether another name of p's upper file (a staged
// hard link) stays pending after this commit, showing the number p
// showed.
func (r *commitRun) stillShownBy(p string, m *meta, committed map[string]bool) bool {
	if m.Kind == KindDir {
		return false
	}
	ust, err := r.e.upper.lstat(p)
	if err != nil || ust.Nlink <= 1 {
		return false
	}
	if r.shownLeft == nil {
		// Once per commit: the numbers the names left pending show.
		r.shownLeft = map[uint64]bool{}
		for q, mq := range r.e.index {
			if !committed[q] && mq.Kind != KindDir {
				r.shownLeft[mq.shownIno()] = true
			}
		}
	}
	return r.shownLeft[m.shownIno()]
}

// removeBase removes the workspace entry st at p; a directory must be
// empty by now.
func (r *commitRun) removeBase(p string, st *syscall.Stat_t) error {
	dir, _ := splitPath(p)
	r.syncDir[dir] = true
	err := r.e.base.withParent(p, func(dirfd int, name string) error {
		if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			err := rmdirAt(dirfd, name)
			if err == unix.ENOTEMPTY || err == unix.EEXIST {
				return &conflictError{expected: "an empty directory (its staged deletions applied)", actual: "the workspace directory holds entries that were not staged for deletion"}
			}
			return err
		}
		return unix.Unlinkat(dirfd, name, 0)
	})
	if err == nil {
		r.unlinkedName(p, st)
	}
	return err
}

// followLinkCtime keeps the other names of the workspace file st, which
// this commit just unlinked at p, committable: the unlink moved the file's
// ctime, which their staged changes' baselines record, and every later
// commit of them would find the file "changed since it was staged". A
// baseline that still matched the file before the unlink is moved to its
// new ctime; one that did not stays a conflict.
func (r *commitRun) followLinkCtime(p string, st *syscall.Stat_t) {
	e := r.e
	if r.byBaseIno == nil {
		r.byBaseIno = map[uint64][]string{}
		for q, m := range e.index {
			if m.Base.Exists && m.Base.Mode&syscall.S_IFMT != syscall.S_IFDIR {
				r.byBaseIno[m.Base.Ino] = append(r.byBaseIno[m.Base.Ino], q)
			}
		}
	}
	for _, q := range r.byBaseIno[st.Ino] {
		m := e.index[q]
		if q == p || m == nil || !m.Base.matches(st) {
			continue
		}
		now, err := e.base.lstat(q)
		if err != nil || now.Ino != st.Ino || now.Size != st.Size || now.Mtim != st.Mtim {
			continue
		}
		nm := *m
		nm.Base.Ctime = now.Ctim.Nano()
		if e.writeMeta(q, &nm) == nil {
			*m = nm
		}
	}
}

// deletedRedirectBase maps p to the workspace path it deletes: p itself,
// unless p is, or is inside, a directory that was moved and then deleted
// (its move is never applied), whose contents the workspace still has at
// the source. (Unlike basePathOf it ignores renames that are not
// deleted: those are applied before any deletion.)
func (r *commitRun) deletedRedirectBase(p string) string {
	for q := p; q != ""; q, _ = splitPath(q) {
		if m := r.e.index[q]; m != nil && m.Kind == KindDir && m.Deleted && m.Redirect != "" {
			return m.Redirect + strings.TrimPrefix(p, q)
		}
	}
	return p
}

// removeReplaced removes the base entry at p that a staged entry of
// another type replaces (a file where a directory was, or the reverse).
func (r *commitRun) removeReplaced(p string, st *syscall.Stat_t) error {
	err := r.e.base.withParent(p, func(dirfd int, name string) error {
		if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			err := rmdirAt(dirfd, name)
			if err == unix.ENOTEMPTY || err == unix.EEXIST {
				return &conflictError{expected: "an empty directory", actual: "the workspace directory is not empty"}
			}
			return err
		}
		return unix.Unlinkat(dirfd, name, 0)
	})
	if err == nil {
		r.unlinkedName(p, st)
	}
	return err
}

// unlinkedName keeps the other names committable after the commit took
// the workspace file st away from p (an unlink, or a rename over it).
func (r *commitRun) unlinkedName(p string, st *syscall.Stat_t) {
	if st != nil && st.Nlink > 1 && st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		r.followLinkCtime(p, st)
	}
}

func (r *commitRun) applyDir(p string, m *meta) error {
	e := r.e
	if r.dirsMade[p] {
		// Made already as the parent of a renamed directory: checked
		// again, the new directory is not the workspace's old one its
		// baseline describes.
		return nil
	}
	ust, err := e.upper.lstat(p)
	if err != nil {
		return err
	}
	// A directory where the baseline has a file: when recovering, the
	// directory already there is this commit's own (made before the
	// crash), and an absent entry is the file it removed first.
	replacesFile := m.Base.Exists && m.Base.Mode&syscall.S_IFMT != syscall.S_IFDIR
	st, done, err := r.check(p, m.Base, func(st *syscall.Stat_t) bool {
		isDir := st != nil && st.Mode&syscall.S_IFMT == syscall.S_IFDIR
		return isDir && (!m.Base.Exists || r.recovering && replacesFile)
	})
	if err != nil && !r.acceptReplacedAbsent(err, st, m.Base, true) {
		return err
	}
	if st != nil && st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		if err := r.removeReplaced(p, st); err != nil {
			return err
		}
		e.killPoint("commit-replaced")
		st = nil
	}
	return e.base.withParent(p, func(dirfd int, name string) error {
		if st == nil && !done {
			if err := unix.Mkdirat(dirfd, name, ust.Mode&0o7777); err != nil {
				return err
			}
			dir, _ := splitPath(p)
			r.syncDir[dir] = true
			e.killPoint("commit-dir-made")
		}
		if err := unix.Fchownat(dirfd, name, int(ust.Uid), int(ust.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil && err != unix.EPERM {
			return err
		}
		if err := unix.Fchmodat(dirfd, name, ust.Mode&0o7777, 0); err != nil {
			return err
		}
		if !m.Container {
			// Those the view shows are set; those removed through the
			// mount are removed (dirxattrs.go). Others the user set on
			// the workspace's directory meanwhile stay.
			eachXattr(e.upper, p, func(attr string, val []byte) {
				unix.Lsetxattr(procPath(dirfd, name), attr, val, 0)
			})
			for _, attr := range e.removedDirXattrs(p) {
				unix.Lremovexattr(procPath(dirfd, name), attr)
			}
		}
		r.dirsMade[p] = true
		return nil
	})
}

func (r *commitRun) applyDirTimes(p string) {
	e := r.e
	ust, err := e.upper.lstat(p)
	if err != nil {
		return
	}
	e.base.withParent(p, func(dirfd int, name string) error {
		ts := []unix.Timespec{unix.Timespec(ust.Atim), unix.Timespec(ust.Mtim)}
		return unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
	})
}

func (r *commitRun) applyFile(p string, m *meta) error {
	e := r.e
	if e.writers[m.uino] > 0 {
		return errors.New("busy: a process has the file open for writing; close it and commit again")
	}
	ust, err := e.upper.lstat(p)
	if err != nil {
		return err
	}
	st, done, err := r.check(p, m.Base, func(st *syscall.Stat_t) bool {
		if m.Kind == KindSpecial && !r.recovering {
			// A normal commit stays as strict as it always was for
			// special files: only what a crashed commit of this very
			// entry left counts as already committed.
			return false
		}
		return e.baseHolds(p, st, m, ust)
	})
	// A file (or symlink, or special) where the baseline has a directory:
	// when recovering, an absent entry is the directory this commit
	// removed before the crash.
	if err != nil && !r.acceptReplacedAbsent(err, st, m.Base, false) {
		return err
	}
	if done {
		r.linked[ust.Ino] = p
		return nil
	}
	if st != nil && st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		if err := r.removeReplaced(p, st); err != nil {
			return err
		}
		e.killPoint("commit-replaced")
		st = nil
	}
	before := st // what finishFiles checks again before its rename
	dir, _ := splitPath(p)
	r.syncDir[dir] = true
	if name, ok := r.stage.claim(p, ust); ok && r.onRootDev(dir) {
		// Written and made durable before the lock: finishFiles moves
		// it into place.
		r.pending = append(r.pending, preparedFile{path: p, tmp: name, staged: true, before: before})
		return nil
	}
	tmp := commitTempPrefix + e.tmpName()
	err = e.base.withParent(p, func(dirfd int, name string) error {
		if first, ok := r.prepared[ust.Ino]; ok && ust.Nlink > 1 {
			// Another name of a file being committed: keep them one
			// file in the workspace too.
			return e.base.withParent(first.path, func(fdir int, _ string) error {
				return unix.Linkat(fdir, first.tmp, dirfd, tmp, 0)
			})
		}
		if first, ok := r.linked[ust.Ino]; ok && ust.Nlink > 1 {
			return e.base.withParent(first, func(fdir int, fname string) error {
				return unix.Linkat(fdir, fname, dirfd, tmp, 0)
			})
		}
		if err := e.writeBaseEntry(p, m, ust, dirfd, tmp, !r.syncOnce); err != nil {
			unix.Unlinkat(dirfd, tmp, 0)
			return err
		}
		return nil
	})
	if err == nil {
		pf := preparedFile{path: p, tmp: tmp, before: before}
		r.pending = append(r.pending, pf)
		if _, ok := r.prepared[ust.Ino]; !ok {
			r.prepared[ust.Ino] = pf
		}
	}
	return err
}

// removeTemp removes a prepared file's temporary; nil also when it is
// gone already.
func removeTemp(base layer, pf preparedFile) error {
	err := base.withParent(pf.path, func(dirfd int, _ string) error { return unix.Unlinkat(dirfd, pf.tmp, 0) })
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// removeStrayTemps removes the temporaries earlier commits could not
// (see Engine.strayTemps), keeping those still out of reach.
func (e *Engine) removeStrayTemps() {
	kept := e.strayTemps[:0]
	for _, pf := range e.strayTemps {
		if removeTemp(e.base, pf) != nil {
			kept = append(kept, pf)
		}
	}
	e.strayTemps = kept
}

// commitTempPrefix starts the names of the temporary files commit writes in
// workspace directories; Recover removes any a crash left.
const commitTempPrefix = ".stagefs-commit-"

// preparedFile is a file written under a temporary name, waiting for its
// rename: tmp is in path's directory, or in the stage directory when
// staged (commitprep.go).
type preparedFile struct {
	path, tmp string
	staged    bool
	// before is what the workspace had at path when the commit checked
	// it against the baseline, after removing what the file replaces
	// (nil: nothing there).
	before *syscall.Stat_t
}

// finishFiles renames every prepared (written and fsynced) file into
// place. Writing them all first keeps the window in which the workspace
// holds part of the commit short. A file whose rename fails moves from
// committed to failed.
func (r *commitRun) finishFiles() {
	r.e.killPoint("commit-files-written")
	if r.syncOnce && len(r.pending) > 0 {
		if err := r.e.syncBase(); err != nil {
			synced := r.pending[:0]
			for _, pf := range r.pending {
				if pf.staged {
					synced = append(synced, pf)
				} else {
					r.unprepare(pf, fmt.Errorf("make the commit durable: %w", err))
				}
			}
			r.pending = synced
		}
	}
	for _, pf := range r.pending {
		if err := r.unchangedSinceCheck(pf); err != nil {
			// The host changed it after the check, while the commit
			// wrote the others: theirs stays, and it is a conflict.
			r.unprepare(pf, err)
			r.yield()
			continue
		}
		err := r.e.base.withParent(pf.path, func(dirfd int, name string) error {
			if pf.staged {
				return renameFileAt(r.stage.fd, pf.tmp, dirfd, name, 0)
			}
			return renameFileAt(dirfd, pf.tmp, dirfd, name, 0)
		})
		if err != nil {
			r.unprepare(pf, err)
		} else {
			r.unlinkedName(pf.path, pf.before)
		}
		r.yield()
	}
}

// onRootDev reports whether the workspace directory dir is on the file
// system of the workspace's root, where the stage directory is: a
// prepared copy cannot be renamed into another one.
func (r *commitRun) onRootDev(dir string) bool {
	on, ok := r.dirOnRoot[dir]
	if !ok {
		st, err := r.e.base.lstat(dir)
		on = err == nil && st.Dev == r.e.rootDev
		if r.dirOnRoot == nil {
			r.dirOnRoot = map[string]bool{}
		}
		r.dirOnRoot[dir] = on
	}
	return on
}

// commitHoldMax is the longest a commit holds Engine.mu before it lets
// the lookups and reads waiting for it in (yield). A variable for tests.
var commitHoldMax = 5 * time.Millisecond

// yield lets go of Engine.mu and takes it again once the commit has held
// it for commitHoldMax. Go's RWMutex lets every reader that waited for the
// lock in before the commit has it again. The change gate keeps every
// change out meanwhile, so the pending set is the same when the commit
// goes on; it is called only where the view is whole.
func (r *commitRun) yield() {
	if time.Since(r.held) < commitHoldMax {
		return
	}
	r.e.unlockMu()
	r.e.died("commit-yield") // a test's look at the engine meanwhile
	r.e.lockMu()
	r.held = time.Now()
}

// unprepare removes a prepared file's temporary and files it as failed.
func (r *commitRun) unprepare(pf preparedFile, err error) {
	if pf.staged {
		// The stage directory goes at the end of the commit, with it.
	} else if removeTemp(r.e.base, pf) != nil {
		r.e.strayTemps = append(r.e.strayTemps, pf)
	}
	for i, p := range r.res.Committed {
		if p == pf.path {
			r.res.Committed = append(r.res.Committed[:i], r.res.Committed[i+1:]...)
			break
		}
	}
	if m := r.e.index[pf.path]; m != nil {
		r.fileError(pf.path, m, err) // a conflict, or a failure
		return
	}
	r.failed[pf.path] = true
	r.res.Failed = append(r.res.Failed, Failure{Path: pf.path, Reason: err.Error()})
}

// unchangedSinceCheck checks the workspace entry at pf's path again right
// before the prepared file replaces it: a long commit writes every file
// before it moves any into place, and a host's edit in between was once
// overwritten without a word. (What changes between this check and the
// rename itself, microseconds later, is still lost: the workspace cannot
// be locked.)
func (r *commitRun) unchangedSinceCheck(pf preparedFile) error {
	if r.force || r.recovering {
		return nil
	}
	st, err := r.e.base.lstat(pf.path)
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		return err
	}
	if err != nil {
		st = nil
	}
	seen, now := baselineOrAbsent(pf.before), baselineOrAbsent(st)
	// Not the ctime: the commit's own unlink of another name of the same
	// file moves it.
	seen.Ctime, now.Ctime = 0, 0
	if seen != now {
		return &conflictError{expected: seen.String(), actual: now.String()}
	}
	return nil
}

// baselineOrAbsent is baselineOf, or the absent baseline for nil.
func baselineOrAbsent(st *syscall.Stat_t) Baseline {
	if st == nil {
		return Baseline{}
	}
	return baselineOf(st)
}

// releaseGrace is how long a commit waits for files still open for
// writing to be released. The kernel sends the release of a closed file
// after close(2) has returned, so a host that commits as soon as its tool
// exits would otherwise find files busy that nobody has open any more.
const releaseGrace = 200 * time.Millisecond

// AwaitReleases waits, up to releaseGrace, until no staged file is open
// for writing. Files held open longer are reported busy by the commit (or
// the merge of a branch).
func (e *Engine) AwaitReleases() {
	deadline := time.Now().Add(releaseGrace)
	for {
		e.rlock()
		open := len(e.writers)
		e.runlock()
		if open == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// syncOnceFiles is the number of files from which a commit makes them
// durable with one syncfs of the workspace's file system rather than one
// fsync per file: 1,000 small files took 1.05 s with an fsync each. Below
// it, fsyncs are cheaper than flushing whatever else the file system has
// dirty.
const syncOnceFiles = 32

// syncBase flushes the workspace's file system (syncfs): every file
// written to it so far is durable when it returns.
func (e *Engine) syncBase() error {
	fd, err := e.base.openDirRead("")
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// writeBaseEntry creates the staged entry p under a temporary name in the
// workspace directory dirfd, with the staged owner, mode and times, and
// durable unless the caller syncs it later (sync false).
func (e *Engine) writeBaseEntry(p string, m *meta, ust *syscall.Stat_t, dirfd int, tmp string, sync bool) error {
	switch m.Kind {
	case KindSymlink:
		target, err := e.readUpperSymlink(p)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(target, dirfd, tmp); err != nil {
			return err
		}
		unix.Fchownat(dirfd, tmp, int(ust.Uid), int(ust.Gid), unix.AT_SYMLINK_NOFOLLOW)
		return e.finishBaseEntry(p, ust, dirfd, tmp, 0)
	case KindSpecial:
		if err := unix.Mknodat(dirfd, tmp, m.Mode, int(m.Rdev)); err != nil {
			return err
		}
		unix.Fchownat(dirfd, tmp, int(ust.Uid), int(ust.Gid), unix.AT_SYMLINK_NOFOLLOW)
		return e.finishBaseEntry(p, ust, dirfd, tmp, m.Mode)
	}
	src, err := e.upper.open(p, unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(src)
	dst, err := openatRetry(dirfd, tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer unix.Close(dst)
	if err := copyFd(src, dst, ust.Size); err != nil {
		return err
	}
	copyXattrs(e.upper, p, dst)
	if err := unix.Fchown(dst, int(ust.Uid), int(ust.Gid)); err != nil && err != unix.EPERM {
		return err
	}
	if err := unix.Fchmod(dst, ust.Mode&0o7777); err != nil {
		return err
	}
	ts := []unix.Timespec{unix.Timespec(ust.Atim), unix.Timespec(ust.Mtim)}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, fdPath(dst), ts, 0); err != nil {
		return err
	}
	if !sync {
		return nil
	}
	return unix.Fsync(dst)
}

// finishBaseEntry gives a committed symlink or special (made as name in
// dirfd) the xattrs, mode (a special's, from its meta) and times its upper
// file p showed in the view. They are set by path without following the
// last name: neither can be opened for it.
func (e *Engine) finishBaseEntry(p string, ust *syscall.Stat_t, dirfd int, name string, mode uint32) error {
	eachXattr(e.upper, p, func(attr string, val []byte) {
		unix.Lsetxattr(procPath(dirfd, name), attr, val, 0)
	})
	if mode != 0 {
		// After the xattrs, as an access ACL sets the mode too. mknod
		// applied the umask; the view showed mode, and baseHolds
		// recognises the committed entry by it.
		if err := unix.Fchmodat(dirfd, name, mode&0o7777, 0); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{unix.Timespec(ust.Atim), unix.Timespec(ust.Mtim)}
	return unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

func (e *Engine) readUpperSymlink(p string) (string, error) {
	fd, err := e.upper.open(p, unix.O_RDONLY, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	buf := make([]byte, unix.PathMax+1)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// baseHolds reports whether the base entry st at p already is the staged
// entry (same type and content), so committing it again changes nothing.
func (e *Engine) baseHolds(p string, st *syscall.Stat_t, m *meta, ust *syscall.Stat_t) bool {
	if st == nil {
		return false
	}
	switch m.Kind {
	case KindSymlink:
		// As for a file: the very link the baseline recorded is not a
		// committed change, even with the same target (a chown -h or
		// touch -h changed only its owner or times).
		if st.Mode&syscall.S_IFMT != syscall.S_IFLNK || m.Base.matches(st) {
			return false
		}
		a, err1 := e.base.readlink(p)
		b, err2 := e.readUpperSymlink(p)
		return err1 == nil && err2 == nil && a == b
	case KindFile:
		if !isRegular(st) || st.Size != ust.Size || st.Mode&0o7777 != ust.Mode&0o7777 || m.Base.matches(st) {
			return false
		}
		return e.sameContent(p, p, st.Size)
	case KindSpecial:
		// A fifo, socket or device has no content: its type, device
		// number and mode are all it is. The same entry left where the
		// baseline still holds is not a change made since.
		return st.Mode == m.Mode && st.Rdev == m.Rdev && !m.Base.matches(st)
	}
	return false
}

// sameContent compares the base file at bp with the upper file at up.
func (e *Engine) sameContent(bp, up string, size int64) bool {
	a, err := e.base.open(bp, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer unix.Close(a)
	b, err := e.upper.open(up, unix.O_RDONLY, 0)
	if err != nil {
		return false
	}
	defer unix.Close(b)
	ba, bb := make([]byte, 64<<10), make([]byte, 64<<10)
	for off := int64(0); off < size; {
		n1, err1 := unix.Pread(a, ba, off)
		n2, err2 := unix.Pread(b, bb, off)
		if err1 != nil || err2 != nil || n1 != n2 || n1 <= 0 || !bytes.Equal(ba[:n1], bb[:n2]) {
			return false
		}
		off += int64(n1)
	}
	return true
}

// dropCommitted removes p's committed entry from the pending set. A
// directory that still holds pending entries (not selected, or failed)
// becomes a plain container whose baseline is the workspace's now.
func (e *Engine) dropCommitted(p string) {
	m := e.index[p]
	if m == nil {
		return
	}
	if m.Kind == KindDir && len(e.children[p]) > 0 {
		e.forgetDirXattrs(p) // the workspace's directory has them now
		nm := *m
		nm.Container, nm.Deleted, nm.Opaque, nm.Redirect = true, false, false, ""
		if st, err := e.base.lstat(p); err == nil {
			nm.Base = baselineOf(st)
			nm.Ino = e.baseInoAt(p, st)
		}
		if e.writeMeta(p, &nm) == nil {
			*m = nm
		}
		return
	}
	if e.upper.withParent(p, func(dirfd int, name string) error {
		if m.Kind != KindDir && e.toTrash(dirfd, name) {
			return nil
		}
		return removeAllAt(dirfd, name)
	}) != nil {
		return
	}
	e.dropEntry(p)
	e.pruneContainers(p)
}

// toTrash moves the committed upper file name (in dirfd) into work/, to
// be unlinked after the commit has answered (emptyTrash): freeing a file's
// blocks costs the file system about 0.3 ms here once they are allocated,
// 0.3 s of a 1,000-file commit, while a rename costs 20 us. work/ is
// emptied at start-up, so a crash leaves nothing behind.
func (e *Engine) toTrash(dirfd int, name string) bool {
	trash := "trash." + e.tmpName()
	if renameFileAt(dirfd, name, e.workFd, trash, 0) != nil {
		return false
	}
	e.trashMu.Lock()
	e.trash = append(e.trash, trash)
	e.trashMu.Unlock()
	return true
}

// emptyTrash unlinks, in the background, what commits moved to work/.
// Close waits for it.
func (e *Engine) emptyTrash() {
	e.trashMu.Lock()
	names := e.trash
	e.trash = nil
	e.trashMu.Unlock()
	if len(names) == 0 {
		return
	}
	e.trashWG.Add(1)
	go func() {
		defer e.trashWG.Done()
		for _, name := range names {
			unix.Unlinkat(e.workFd, name, 0)
		}
	}()
}

// Discard drops the pending changes at or below paths (all when empty) and
// returns the paths whose view changed.
func (e *Engine) Discard(paths []string, c Caller) []string {
	var done, renumbered []string
	e.locked(func() error {
		e.finishForks()
		done, renumbered = e.discardLocked(paths)
		return nil
	})
	if len(renumbered) > 0 && e.opts.OnRenumbered != nil {
		e.opts.OnRenumbered(renumbered)
	}
	sort.Strings(done)
	if len(done) > 0 {
		b, _ := json.Marshal(done)
		e.note(Record{Op: "discard", Pid: c.Pid, Detail: string(b)})
		e.changed()
	}
	return done
}

// discardLocked drops the selected pending changes and returns the paths
// whose view changed and the files that got a new inode number.
func (e *Engine) discardLocked(paths []string) (done, renumbered []string) {
	sel := e.selectLocked(paths, true, discardAncestor)
	// A discarded directory rename gives the directory back to its
	// source. What stands there now goes too if it cannot merge with
	// it (below): another directory renamed there (mv a b; mv c a), or
	// a file. And what is below the renamed directory goes with it,
	// so its partners come along: a whiteout there may be the source
	// of another rename (mv a/b c; mv a c/b), which must go too, or a/b
	// would show both in a and in c. The selection grows until it holds
	// every such entry.
	for {
		more := e.occupiedSources(sel)
		inSel := map[string]bool{}
		for _, p := range sel {
			inSel[p] = true
		}
		below := map[string]bool{}
		for _, p := range sel {
			if m := e.index[p]; m != nil && m.Kind == KindDir && m.Redirect != "" {
				e.collect(p, below)
			}
		}
		for q := range below {
			if !inSel[q] {
				more = append(more, q)
			}
		}
		if len(more) == 0 {
			break
		}
		sel = e.selectLocked(append(append([]string(nil), sel...), more...), true, discardAncestor)
	}
	// A deletion below a directory made anew (rm -r a; mkdir a) shows
	// nothing either way, but it is what will empty the workspace
	// directory when the new one is committed: it stays unless that
	// directory goes too.
	selected := map[string]bool{}
	for _, p := range sel {
		selected[p] = true
	}
	kept := sel[:0]
	for _, p := range sel {
		m := e.index[p]
		deletion := m != nil && (m.Kind == KindWhiteout || m.Deleted && m.Redirect == "")
		if !deletion || !e.underOpaqueKept(p, selected) {
			kept = append(kept, p)
		}
	}
	sel = kept
	// A crash can stop a discard between any two of its steps, and
	// nothing finishes a discard at the next start: every state in
	// between must be a view that loses nothing. Dropping an entry that
	// holds something (a moved file, a moved directory) before the
	// deletion that hides its workspace original would show neither,
	// and the next commit would delete the original. So the deletions
	// (whiteouts, always leaves) go first: a state in between then
	// shows the original again, next to the pending entry that is still
	// to be dropped. Then the rest, deepest first, so a directory goes
	// after its contents.
	sort.SliceStable(sel, func(i, j int) bool {
		wi, wj := e.isWhiteout(sel[i]), e.isWhiteout(sel[j])
		if wi != wj {
			return wi
		}
		return depth(sel[i]) > depth(sel[j])
	})
	inSel := map[string]bool{}
	for _, p := range sel {
		inSel[p] = true
	}
	// A discarded directory rename gives its directory back to the
	// source. When a new directory was made at the source meanwhile
	// (mv a b; mkdir a), the two merge, as they will in the workspace:
	// the new one must stop hiding the base directory. It stops before
	// the rename is dropped, for the same reason as above: the other
	// order would show the base directory nowhere in between.
	for _, p := range sel {
		m := e.index[p]
		if m == nil || m.Kind != KindDir || m.Redirect == "" {
			continue
		}
		src := e.madeAtSource(m)
		if src == "" {
			continue
		}
		sm := e.index[src]
		nm := *sm
		nm.Opaque = false
		// It is the workspace directory again, merged with what was
		// made in it, and shows its number: a rename of it later is
		// checked against the workspace by that number.
		nm.Ino = m.Ino
		if err := e.writeMeta(src, &nm); err != nil {
			e.logf("discard: give %s its directory back: %v", src, err)
			continue
		}
		if sm.Ino != nm.Ino {
			renumbered = append(renumbered, src)
		}
		*sm = nm
		if !inSel[src] {
			done = append(done, src)
		}
	}
	// A workspace file a discarded deletion shows again, whose number a
	// pending copy shows (mv a b; discard a), is shown with another
	// number (viewIno): the copy keeps its own, and what the kernel
	// cached under it.
	whiteoutKept := false
	pr := e.startProgress("discard", len(sel))
	defer pr.finish()
	for _, p := range sel {
		pr.step(0)
		m := e.index[p]
		if m == nil {
			done = append(done, p) // went with a discarded directory
			continue
		}
		if whiteoutKept && m.Kind != KindWhiteout {
			// A deletion that could not be dropped may hide the
			// original of an entry dropped now: keep the rest, as
			// the order above is there to.
			continue
		}
		if err := e.upper.withParent(p, func(dirfd int, name string) error { return removeAllAt(dirfd, name) }); err != nil {
			e.logf("discard %s: %v", p, err)
			whiteoutKept = whiteoutKept || m.Kind == KindWhiteout
			continue
		}
		e.dropEntry(p)
		e.pruneContainers(p)
		done = append(done, p)
		e.killPoint("discard-step")
	}
	return done, renumbered
}

// madeAtSource returns the view path of the directory made anew at the
// source of the directory rename m (mv a b; mkdir a), which hides the
// workspace directory there ("" when none). It is found by the workspace
// path it stands for: it may have moved with a renamed parent since (mv a/b
// c; mv a d; mkdir d/b).
func (e *Engine) madeAtSource(m *meta) string {
	for q, sm := range e.index {
		if sm.Kind == KindDir && sm.Opaque && !sm.Deleted && e.isBaseOf(sm.Base, m.Ino) && e.basePathOf(q) == m.Redirect {
			return q
		}
	}
	return ""
}

// occupiedSources returns the entries, not in sel, that stand at the
// source of a directory rename in sel and replace the directory it moved,
// unless they are directories made there anew (those merge with it).
func (e *Engine) occupiedSources(sel []string) []string {
	inSel := map[string]bool{}
	srcs := map[string]uint64{} // workspace path -> the moved directory's number
	for _, p := range sel {
		inSel[p] = true
		if m := e.index[p]; m != nil && m.Kind == KindDir && m.Redirect != "" {
			srcs[m.Redirect] = m.Ino
		}
	}
	if len(srcs) == 0 {
		return nil
	}
	var out []string
	for q, m := range e.index {
		if inSel[q] || m.Kind == KindWhiteout || m.Kind == KindDir && m.Redirect == "" || !m.isChange() {
			continue
		}
		if ino, ok := srcs[e.basePathOf(q)]; ok && e.isBaseOf(m.Base, ino) {
			out = append(out, q)
		}
	}
	return out
}

// underOpaqueKept reports whether p lies below an opaque directory that
// sel does not hold.
func (e *Engine) underOpaqueKept(p string, sel map[string]bool) bool {
	for dir, _ := splitPath(p); dir != ""; dir, _ = splitPath(dir) {
		if m := e.index[dir]; m != nil && m.Kind == KindDir && m.Opaque && !m.Deleted && !sel[dir] {
			return true
		}
	}
	return false
}

// isWhiteout reports whether the pending entry at p is a deletion.
func (e *Engine) isWhiteout(p string) bool {
	m := e.index[p]
	return m != nil && m.Kind == KindWhiteout
}

// Recover finishes a commit that a crash interrupted: it reads the journal
// tail given by the caller (the last commit_begin without a commit_end) and
// commits those paths again. Steps already applied are recognized and
// skipped, so this is idempotent.
func (e *Engine) Recover(unfinished []string) CommitResult {
	if len(unfinished) == 0 {
		return CommitResult{}
	}
	e.note(Record{Op: "commit_recover", Detail: fmt.Sprintf("%d path(s)", len(unfinished)), Time: time.Now().UnixNano()})
	e.removeCommitTemps(unfinished)
	return e.commit(unfinished, false, Caller{}, true)
}

// uniq drops adjacent duplicates from a sorted slice (a renamed directory
// is committed by two steps: the rename and its attributes).
func uniq(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// removeCommitTemps removes the temporary files an interrupted commit left
// in the workspace directories of its paths.
func (e *Engine) removeCommitTemps(paths []string) {
	dirs := map[string]bool{}
	for _, p := range paths {
		dirs[parentOf(p)] = true
	}
	for dir := range dirs {
		fd, err := e.base.openDirRead(dir)
		if err != nil {
			continue
		}
		ents, _ := readDirents(fd)
		for _, d := range ents {
			if strings.HasPrefix(d.Name, commitTempPrefix) {
				unix.Unlinkat(fd, d.Name, 0)
			}
		}
		unix.Close(fd)
	}
}

// fileHash returns the hash of the regular file rel in layer l, zero when
// it is not one.
func (e *Engine) fileHash(l layer, rel string) contenthash.Hash {
	st, err := l.lstat(rel)
	if err != nil || !isRegular(st) {
		return contenthash.Hash{}
	}
	fd, err := l.open(rel, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return contenthash.Hash{}
	}
	defer unix.Close(fd)
	return hashOf(fd)
}
