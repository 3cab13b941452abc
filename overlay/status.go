package overlay

import (
	"sort"
	"strings"
	"syscall"
	"time"
)

// Change is one pending change as status reports it.
type Change struct {
	Path  string
	Kind  string // created, modified, deleted, renamed, mkdir, symlink, special, metadata
	Dir   bool   // the entry is (or, deleted, was) a directory
	From  string // renamed: the base path it came from
	Bytes int64
	Time  time.Time
	Pid   int
	Comm  string
}

func (m *meta) changeKind() (kind, from string) {
	if m.AttrOnly && m.Base.Exists && m.Kind != KindDir && m.Kind != KindWhiteout {
		return "metadata", ""
	}
	switch m.Kind {
	case KindFile:
		if m.Base.Exists {
			return "modified", ""
		}
		return "created", ""
	case KindSymlink:
		return "symlink", ""
	case KindSpecial:
		return "special", ""
	case KindWhiteout:
		return "deleted", ""
	}
	switch {
	case m.Deleted:
		return "deleted", ""
	case m.Redirect != "":
		return "renamed", m.Redirect
	case !m.Base.Exists || m.Opaque:
		return "mkdir", ""
	}
	return "metadata", ""
}

// Pending lists the pending changes at or below the given paths (all when
// none), sorted by path. Its cost grows with the pending set only.
func (e *Engine) Pending(paths []string) []Change {
	e.rlock()
	defer e.runlock()
	var out []Change
	for _, p := range e.selectLocked(paths, false, nil) {
		m := e.index[p]
		kind, from := m.changeKind()
		ch := Change{Path: p, Kind: kind, From: from, Time: time.Unix(0, m.Time), Pid: m.Pid, Comm: m.Comm}
		ch.Dir = m.Kind == KindDir || (m.Kind == KindWhiteout && m.Base.Mode&syscall.S_IFMT == syscall.S_IFDIR)
		if m.Kind == KindFile || m.Kind == KindSymlink {
			if st, err := e.upper.lstat(p); err == nil {
				ch.Bytes = st.Size
			}
		}
		out = append(out, ch)
	}
	return out
}

// named returns c with its command name, read from /proc (cached) unless
// the caller gave it. Entry points call it before taking the engine's lock,
// so a /proc read never holds up other operations; the name is then the
// one of the process as it made the change, which a lookup at status time
// could not give (the process is gone or runs another program by then).
func (e *Engine) named(c Caller) Caller {
	if c.Comm == "" && c.Pid > 0 {
		c.Comm = e.procs.comm(c.Pid)
	}
	return c
}

// changedBy notes that c just changed the staged entry m at p, so status
// names c as the last process to change it. body says whether the change
// may touch the entry's content (a write-open, a truncate): a copy that had
// only its attributes changed (AttrOnly) stops being one, and that is
// written to its meta at once, since status must keep telling a write from
// a metadata change after a restart. Otherwise the new changer is kept in
// memory only (unsaved), so a write-open of a staged file costs no xattr
// write; the next meta write or Close stores it.
func (e *Engine) changedBy(p string, m *meta, c Caller, body bool) error {
	c = e.named(c)
	if body && m.AttrOnly {
		nm := *m
		nm.AttrOnly = false
		nm.Pid, nm.Comm = c.Pid, c.Comm
		if err := e.writeMeta(p, &nm); err != nil {
			return err
		}
		*m = nm
		return nil
	}
	if m.Pid != c.Pid || m.Comm != c.Comm {
		m.Pid, m.Comm = c.Pid, c.Comm
		m.unsaved = true
	}
	return nil
}

// saveChangers writes the meta of every entry whose last changer is known
// only in memory (see changedBy), so a clean restart shows the same pid and
// command. After a crash the meta's older values are shown; the journal
// still names every change's process.
func (e *Engine) saveChangers() {
	e.lockChange()
	defer e.unlockChange()
	for p, m := range e.index {
		if m.unsaved {
			if err := e.writeMeta(p, m); err != nil {
				e.logf("overlay: save the last changer of %s: %v", p, err)
			}
		}
	}
}

// Untouched reports whether the directory listing of p comes from the
// workspace alone: no pending entry at p, so none below it either. Such a
// listing changes only with the workspace directory's own mtime, which is
// what lets the kernel cache it.
func (e *Engine) Untouched(p string) bool {
	e.rlock()
	defer e.runlock()
	return e.index[p] == nil
}

// PendingCount is the number of pending changes.
func (e *Engine) PendingCount() int {
	e.rlock()
	defer e.runlock()
	return e.pendingCountLocked()
}

// selectLocked returns the changed entries at or below paths (all when
// paths is empty), sorted. With partners, a renamed directory brings the
// whiteout at its source and the reverse, since one without the other would
// lose or duplicate the directory. Ancestors of a selected entry for which
// ancestor returns true come along too (nil: none).
func (e *Engine) selectLocked(paths []string, partners bool, ancestor func(*meta) bool) []string {
	set := map[string]bool{}
	if len(paths) == 0 {
		for p, m := range e.index {
			if m.isChange() {
				set[p] = true
			}
		}
	} else {
		for _, q := range paths {
			e.collect(q, set)
		}
	}
	// Ancestors before the partners, so an ancestor's partner comes
	// along, and after, for the ancestors of a partner, until neither
	// adds anything: a partner's ancestor may be a rename with a partner
	// of its own (mv a/b c; mv a c/a: c brings the whiteout at a/b, now
	// at c/a/b, which brings the rename c/a, which brings a's whiteout).
	for n := -1; n != len(set); {
		n = len(set)
		e.addAncestors(set, ancestor)
		if !partners {
			break
		}
		e.addPartners(set)
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// addPartners adds to set the other halves of the directory renames it
// touches: a renamed directory brings the whiteout at its source and the
// reverse, since one without the other would lose or duplicate the
// directory.
func (e *Engine) addPartners(set map[string]bool) {
	// A rename's source is a workspace path; its whiteout sits at
	// the view path, which differs when a parent was renamed too.
	whiteoutAt := map[string]string{} // workspace path -> view path
	// What was made at a rename's source since (mv a b; mkdir a)
	// stands where the whiteout stood, and hides the directory
	// there until the rename moves it: committed without the
	// rename, it would stop hiding it and the directory would show
	// in two places.
	madeAt := map[string]string{} // workspace path -> view path
	for q, m := range e.index {
		if m.Kind == KindWhiteout {
			whiteoutAt[e.basePathOf(q)] = q
		} else if m.Base.Exists {
			madeAt[e.basePathOf(q)] = q
		}
	}
	for p := range set {
		m := e.index[p]
		if m.Kind == KindDir && m.Redirect != "" {
			if q, ok := whiteoutAt[m.Redirect]; ok && e.isBaseOf(e.index[q].Base, m.Ino) {
				set[q] = true
			}
		}
	}
	for p, m := range e.index {
		if m.Kind == KindDir && m.Redirect != "" && !set[p] {
			q, ok := whiteoutAt[m.Redirect]
			n, made := madeAt[m.Redirect]
			if set[m.Redirect] || (ok && set[q]) || (made && set[n] && e.isBaseOf(e.index[n].Base, m.Ino)) {
				set[p] = true
				if m.Deleted {
					// Moved, then deleted: its deletions below
					// empty the workspace directory.
					e.collect(p, set)
				}
			}
		}
	}
}

// addAncestors adds to set the ancestors of its entries that are changes
// and for which want returns true.
func (e *Engine) addAncestors(set map[string]bool, want func(*meta) bool) {
	if want == nil {
		return
	}
	for p := range set {
		for dir, _ := splitPath(p); dir != ""; dir, _ = splitPath(dir) {
			if m := e.index[dir]; m != nil && m.isChange() && want(m) {
				set[dir] = true
			}
		}
	}
}

// commitAncestor: a new, renamed or recreated directory must be committed
// with what is below it. A deleted one need not, and must not: its
// deletion needs every deletion below it (the workspace directory must be
// empty), and a deletion below it applies alone, the directory staying
// deleted in the view (mv a/b c; rm -r a; commit c takes a/b's whiteout,
// not a's deletion).
func commitAncestor(m *meta) bool { return !m.Deleted }

// discardAncestor: what is discarded below a deleted directory can only
// show again if the directory does; other changed directories stay.
func discardAncestor(m *meta) bool { return m.Deleted }

// collect adds the changes at or below q to set.
func (e *Engine) collect(q string, set map[string]bool) {
	m := e.index[q]
	if m == nil {
		return
	}
	if m.isChange() {
		set[q] = true
	}
	if m.Kind == KindDir {
		for name := range e.children[q] {
			e.collect(joinPath(q, name), set)
		}
	}
}

// isRegular reports whether st is a regular file.
func isRegular(st *syscall.Stat_t) bool {
	return st != nil && st.Mode&syscall.S_IFMT == syscall.S_IFREG
}

// basePathOf returns the workspace path that view path p stands for: p,
// unless an ancestor is a renamed directory.
func (e *Engine) basePathOf(p string) string {
	dir, name := splitPath(p)
	for q := dir; q != ""; q, _ = splitPath(q) {
		if m := e.index[q]; m != nil && m.Kind == KindDir && m.Redirect != "" && !m.Opaque {
			return joinPath(m.Redirect+strings.TrimPrefix(dir, q), name)
		}
	}
	return p
}

// isRenameSourceLocked reports whether a pending directory rename has the
// workspace path base as its source (it moves that directory, or, moved
// and then deleted, deletes it).
func (e *Engine) isRenameSourceLocked(base string) bool {
	for _, m := range e.index {
		if m.Kind == KindDir && m.Redirect == base {
			return true
		}
	}
	return false
}

// DirSource says where the entries of a merged directory come from.
type DirSource int

const (
	// FromElsewhere: a renamed directory (its workspace original is at
	// another path), or p is not a directory of the view.
	FromElsewhere DirSource = iota
	// FromBaseInPlace: the workspace directory at the same path, merged
	// with pending entries if any.
	FromBaseInPlace
	// FromUpperOnly: only the pending set; the workspace has nothing at p.
	// The view changes without the mount only if the workspace gets a
	// directory at p.
	FromUpperOnly
	// FromOpaque: only the pending set, whatever the workspace has at p.
	FromOpaque
)

// DirSourceOf reports where the entries of the merged directory p come
// from, and for FromBaseInPlace opens (O_PATH) the workspace directory
// (dirfd; -1 otherwise). fusefs uses it to know which workspace changes
// can change what the kernel has cached.
func (e *Engine) DirSourceOf(p string) (src DirSource, dirfd int) {
	e.rlock()
	defer e.runlock()
	l, err := e.locate(p)
	if err != nil {
		return FromElsewhere, -1
	}
	m := l.m
	if m != nil && (m.Kind != KindDir || m.Deleted) {
		return FromElsewhere, -1
	}
	switch {
	case m != nil && m.Redirect != "" && !m.Opaque:
		return FromElsewhere, -1
	case m != nil && m.Opaque, !l.hasBase:
		return FromOpaque, -1
	case l.basePath != p:
		return FromElsewhere, -1
	}
	fd, err := e.base.openDir(p)
	if err == syscall.ENOENT && m != nil {
		return FromUpperOnly, -1
	}
	if err != nil {
		return FromElsewhere, -1
	}
	return FromBaseInPlace, fd
}
