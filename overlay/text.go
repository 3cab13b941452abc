package overlay

import (
	"bytes"
	"errors"
	"io"
	"sort"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"stagefs/internal/fdio"
	"stagefs/internal/unidiff"
)

// MaxReadBytes bounds what ReadFile and the diff load into memory for one
// file.
const MaxReadBytes = 64 << 20

// ReadFile returns p's content in the merged view; exists is false (and
// err nil) when p does not exist.
func (e *Engine) ReadFile(p string) (data []byte, exists bool, err error) {
	e.rlockText()
	defer e.runlockText()
	f, err := e.Open(p, unix.O_RDONLY, Caller{})
	if err == syscall.ENOENT {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer unix.Close(f.Fd)
	var st unix.Stat_t
	if err := unix.Fstat(f.Fd, &st); err != nil {
		return nil, true, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, true, syscall.EISDIR
	}
	if st.Size > MaxReadBytes {
		return nil, true, syscall.EFBIG
	}
	data, err = io.ReadAll(io.LimitReader(fdio.Reader(f.Fd), MaxReadBytes+1))
	return data, true, err
}

// WriteFile replaces p's content in the merged view (creating it with mode
// 0644 when absent), as a process in the mount would. The new body takes
// p's place whole (replaceLocked), so a crash leaves the old one or the new
// one, never a mix.
func (e *Engine) WriteFile(p string, data []byte, c Caller) error {
	c = e.named(c)
	var created bool
	err := e.locked(func() (err error) {
		e.pushForks(p)
		created, err = e.replaceLocked(p, c, nil, func(fd int) error { return writeAllSync(fd, data) })
		return err
	})
	if err == errInPlace {
		return e.writeFileInPlace(p, data, c)
	}
	if err != nil {
		return err
	}
	return e.recordReplaced(c, p, created, int64(len(data)))
}

// writeFileInPlace is WriteFile for a body replaceLocked leaves in place:
// a crash between the truncate and the end of the write leaves it empty or
// partial.
func (e *Engine) writeFileInPlace(p string, data []byte, c Caller) error {
	f, _, err := e.Create(p, unix.O_WRONLY|unix.O_TRUNC, 0o644, c)
	if err != nil {
		return err
	}
	if e.died("replace-body") {
		return errDied
	}
	err = writeAllSync(f.Fd, data)
	e.Release(p, f, c)
	return err
}

// writeAllSync writes data at fd's offset and makes it durable.
func writeAllSync(fd int, data []byte) error {
	if _, err := io.Copy(fdio.Writer(fd), bytes.NewReader(data)); err != nil {
		return err
	}
	return unix.Fsync(fd)
}

// recordReplaced journals a body replaceLocked swapped in, with the
// records an open with O_TRUNC, the write and the close would have left
// (Create, then Release), so the journal reads the same either way.
func (e *Engine) recordReplaced(c Caller, p string, created bool, size int64) error {
	op := "open_write"
	if created {
		op = "create"
	}
	err := e.recordOp(c, op, p, "", 0)
	e.recordLazy(Record{Op: "close_write", Path: p, Pid: c.Pid, Size: size})
	e.changed()
	return err
}

// errInPlace is replaceLocked's answer when p's body cannot be swapped by a
// rename: the caller rewrites it in place, as every body was before.
var errInPlace = errors.New("overlay: the body is rewritten in place")

// ownerMode is the owner and permission bits a new body gets.
type ownerMode struct{ mode, uid, gid uint32 }

// replaceLocked makes p a regular file of the merged view holding what
// fill writes, in one step: the new body is built in work/ with its owner,
// mode, xattrs and meta, and then renamed to p's place in the upper tree.
// Rewriting a pending body in place (truncate, then write) left it empty
// or partial when a crash came between the two, and start-up kept that as
// the staged content: an edit was lost, and a restore tried again took the
// torn file for a later change and kept it. Now p holds its whole old body
// or its whole new one at every moment.
//
// want is the owner and mode to give the body; nil keeps those of the
// file it replaces (a new file gets 0644 and c's owner, as Create gives
// it). created says p did not exist in the view.
//
// Processes that hold the old body open go on reading it, as after an
// editor's atomic save: the FUSE layer moves a handle to a new body only
// from a workspace file (handle.fd), and the control layer invalidates the
// kernel's cache of p after a patch or a restore (passthrough retires a
// node whose backing file is the old body). Before, they read the new
// content, or a torn one in the middle of the write.
//
// It returns errInPlace, with nothing changed and fill not called, where a
// rename would be wrong or has no body to replace:
//   - immediate mode: the body is the workspace's own file, written as any
//     process writes it;
//   - a file with more than one name (hard links): a rename would split
//     them, so the in-place rewrite, and its crash window, stay;
//   - a file open for writing: its writer's later writes would go to the
//     old body, unlinked, and be lost; in place they land in the new one,
//     as before;
//   - an entry that is not a regular file: the in-place path answers with
//     the errors an open for writing gives (EISDIR, ELOOP).
func (e *Engine) replaceLocked(p string, c Caller, want *ownerMode, fill func(fd int) error) (bool, error) {
	if e.mode == Immediate {
		return false, errInPlace
	}
	c = e.named(c)
	l, err := e.locate(p)
	if err != nil && err != syscall.ENOENT {
		return false, err
	}
	var st *syscall.Stat_t
	if err == nil {
		st, err = e.statLoc(p, l)
		if err != nil && err != syscall.ENOENT {
			return false, err
		}
	}
	if st != nil {
		if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
			return false, errInPlace
		}
		if l.m != nil {
			if l.m.Kind != KindFile || st.Nlink > 1 || e.writers[l.m.uino] > 0 {
				return false, errInPlace
			}
		}
	}
	// The pre-image goes to open snapshots before anything changes, as
	// createLocked does.
	if err := e.capture(c, p); err != nil {
		return false, err
	}
	switch {
	case st == nil:
		return true, e.replaceAbsent(p, c, want, fill)
	case l.m == nil:
		return false, e.replaceBase(p, l, c, want, fill)
	}
	return false, e.replaceUpper(p, l.m, st, c, want, fill)
}

// replaceAbsent makes p, absent from the view, a new file with fill's
// content.
func (e *Engine) replaceAbsent(p string, c Caller, want *ownerMode, fill func(fd int) error) error {
	l, m, err := e.prepareNew(p, KindFile, c)
	if err != nil {
		return err
	}
	om := ownerMode{mode: 0o644, uid: c.Uid, gid: c.Gid}
	if want != nil {
		om = *want
	}
	if l.m != nil {
		// A whiteout or a deleted directory is in the way: placeNew
		// builds the file in work/ and renames it over the entry, or
		// refuses (a deleted directory that still hides workspace
		// entries).
		fd, err := e.placeNew(p, l, m, func(dirfd int, name string) (int, error) {
			return e.buildBody(dirfd, name, om, fill, nil)
		})
		if err != nil {
			return err
		}
		unix.Close(fd)
		return nil
	}
	if err := e.putBody(p, m, om, fill, nil, unix.RENAME_NOREPLACE); err != nil {
		return err
	}
	e.setEntry(p, m)
	return nil
}

// replaceBase stages the workspace file behind p with fill's content: a
// copy-up whose body is the new one instead of the workspace's (so no
// empty copy-up shows between the two, as an O_TRUNC open makes).
func (e *Engine) replaceBase(p string, l loc, c Caller, want *ownerMode, fill func(fd int) error) error {
	bst := e.baseStat(l)
	if bst == nil {
		return syscall.ENOENT
	}
	dir, _ := splitPath(p)
	if err := e.ensureUpperDir(dir); err != nil {
		return err
	}
	m := &meta{Kind: KindFile, Ino: e.baseInoAt(p, bst), Base: baselineOf(bst), Pid: c.Pid, Comm: c.Comm, Time: time.Now().UnixNano()}
	om := ownerMode{mode: bst.Mode & 0o7777, uid: bst.Uid, gid: bst.Gid}
	if want != nil {
		om = *want
	}
	// Truncating a file keeps its xattrs: so does replacing its body.
	xattrs := func(fd int) { copyXattrs(e.base, l.basePath, fd) }
	if err := e.putBody(p, m, om, fill, xattrs, unix.RENAME_NOREPLACE); err != nil {
		return err
	}
	e.setEntry(p, m)
	// A read-only handle on the workspace file moves to the pending copy
	// when the generation changes, as after copyUp.
	e.copyGen.Add(1)
	return nil
}

// replaceUpper swaps the pending body of p (meta m, attributes st) for one
// with fill's content.
func (e *Engine) replaceUpper(p string, m *meta, st *syscall.Stat_t, c Caller, want *ownerMode, fill func(fd int) error) error {
	nm := *m
	nm.AttrOnly = false // the body changes (changedBy)
	nm.Pid, nm.Comm = c.Pid, c.Comm
	nm.unsaved = false // written with the new body
	if nm.Ino == 0 {
		// The mount shows an entry without an inode number of its own by
		// its upper file's number, which the new body does not have: it
		// keeps the old one, so the kernel sees the same file.
		nm.Ino = m.shownIno()
	}
	om := ownerMode{mode: st.Mode & 0o7777, uid: st.Uid, gid: st.Gid}
	if want != nil {
		om = *want
	}
	xattrs := func(fd int) { copyXattrs(e.upper, p, fd) }
	if err := e.putBody(p, &nm, om, fill, xattrs, 0); err != nil {
		return err
	}
	*m = nm
	e.copyGen.Add(1)
	return nil
}

// putBody builds a body in work/ (fill's content, xattrs, om's owner and
// mode, m as its meta at p) and renames it to p's place in the upper tree
// with flags. m.uino is the new body's inode number after it.
func (e *Engine) putBody(p string, m *meta, om ownerMode, fill func(fd int) error, xattrs func(fd int), flags uint) error {
	tmp := e.tmpName()
	fd, err := e.buildBody(e.workFd, tmp, om, fill, xattrs)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	err = e.finishNew(fd, p, m)
	if err == nil {
		err = e.upper.withParent(p, func(dirfd int, name string) error {
			return renameFileAt(e.workFd, tmp, dirfd, name, flags)
		})
	}
	if err != nil {
		unix.Unlinkat(e.workFd, tmp, 0)
		return err
	}
	return nil
}

// buildBody creates the file name in dirfd with fill's content, xattrs
// (nil: none) and om's owner and mode, and returns it open. On failure it
// removes the file.
func (e *Engine) buildBody(dirfd int, name string, om ownerMode, fill func(fd int) error, xattrs func(fd int)) (int, error) {
	fd, err := openatRetry(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return -1, err
	}
	err = fill(fd)
	if err == nil && e.died("replace-body") {
		// A crash here leaves the new body in work/, which start-up
		// clears: p is as it was.
		err = errDied
	}
	if err == nil && xattrs != nil {
		xattrs(fd)
	}
	if err == nil {
		// A daemon that may not give files away leaves them its own,
		// as copy-up does.
		if cerr := unix.Fchown(fd, int(om.uid), int(om.gid)); cerr != nil && cerr != unix.EPERM {
			err = cerr
		}
	}
	if err == nil {
		// chown clears set-id bits, so the mode is set after it.
		err = unix.Fchmod(fd, om.mode&0o7777)
	}
	if err != nil {
		unix.Close(fd)
		unix.Unlinkat(dirfd, name, 0)
		return -1, err
	}
	return fd, nil
}

// ErrBusy is returned by PatchFile while a process has the file open for
// writing: its writes could land between the check and the write.
var ErrBusy = errors.New("a process has the file open for writing")

// PatchFile is a compare-and-swap of p's content: decide sees the current
// content and returns the new one (write false: leave it). The engine lock
// is held from the read to the write, so no process in the mount can open
// p for writing in between, and a file already open for writing is
// refused with ErrBusy. The control socket passes a Caller with Host set:
// the host's edit is captured into the open turn and unbound snapshots and
// clears redo, like any process's edit.
func (e *Engine) PatchFile(p string, c Caller, decide func(cur []byte, exists bool) (next []byte, write bool, err error)) error {
	e.lockText()
	defer e.unlockText()
	e.lockChange()
	defer e.unlockChange()
	e.pushForks(p)
	l, err := e.locate(p)
	if err != nil && err != syscall.ENOENT {
		return err
	}
	var cur []byte
	exists := false
	if err == nil {
		if l.m != nil && e.writers[l.m.uino] > 0 {
			return ErrBusy
		}
		st, serr := e.statLoc(p, l)
		if serr != nil && serr != syscall.ENOENT {
			return serr // e.g. a symlink where a directory should be
		}
		if serr == nil {
			if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
				return syscall.EISDIR
			}
			if st.Size > MaxReadBytes {
				return syscall.EFBIG
			}
			lyr, rel := e.base, l.basePath
			if l.m != nil {
				lyr, rel = e.upper, p
			}
			fd, oerr := lyr.open(rel, unix.O_RDONLY|unix.O_NONBLOCK, 0)
			if oerr != nil {
				return oerr
			}
			cur, err = io.ReadAll(io.LimitReader(fdio.Reader(fd), MaxReadBytes+1))
			unix.Close(fd)
			if err != nil {
				return err
			}
			exists = true
		}
	}
	next, write, err := decide(cur, exists)
	if err != nil || !write {
		return err
	}
	_, err = e.replaceLocked(p, c, nil, func(fd int) error { return writeAllSync(fd, next) })
	if err == errInPlace {
		err = e.patchInPlaceLocked(p, c, next)
	}
	if err != nil {
		return err
	}
	return e.recordOp(c, "patch", p, "", int64(len(next)))
}

// patchInPlaceLocked is PatchFile's write of a body replaceLocked leaves
// in place: a crash between the truncate and the end of the write leaves
// it empty or partial.
func (e *Engine) patchInPlaceLocked(p string, c Caller, next []byte) error {
	f, _, _, err := e.createLocked(p, unix.O_WRONLY|unix.O_TRUNC, 0o644, c)
	if err != nil {
		return err
	}
	if e.died("replace-body") {
		return errDied
	}
	err = writeAllSync(f.Fd, next)
	if f.uino != 0 {
		if e.writers[f.uino]--; e.writers[f.uino] <= 0 {
			delete(e.writers, f.uino)
		}
	}
	unix.Close(f.Fd)
	return err
}

// Diff returns the pending changes at or below paths as file changes
// against the workspace, for a unified diff.
func (e *Engine) Diff(paths []string) ([]unidiff.FileChange, error) {
	e.rlock()
	defer e.runlock()
	var out []unidiff.FileChange
	for _, p := range e.selectLocked(paths, false, nil) {
		m := e.index[p]
		switch {
		case m.Kind == KindFile || m.Kind == KindSymlink:
			ch := unidiff.FileChange{Path: p}
			ch.Old, ch.OldMode = e.baseBody(p)
			ch.New, ch.NewMode = e.viewBody(p)
			out = append(out, ch)
		case m.Kind == KindWhiteout:
			out = e.baseTreeDeletes(p, out)
		case m.Kind == KindDir && m.Redirect != "":
			out = e.viewTreeCreates(p, out)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// gitMode maps a stat mode to the modes git records.
func gitMode(mode uint32) uint32 {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFLNK:
		return 0o120000
	case syscall.S_IFREG:
		if mode&0o111 != 0 {
			return 0o100755
		}
		return 0o100644
	}
	return 0
}

// baseBody reads the workspace's file or symlink at p (mode 0: absent or
// another type).
func (e *Engine) baseBody(p string) ([]byte, uint32) {
	st, err := e.base.lstat(p)
	if err != nil {
		return nil, 0
	}
	return e.bodyOf(e.base, p, st.Mode, st.Size)
}

// viewBody reads the merged view's file or symlink at p.
func (e *Engine) viewBody(p string) ([]byte, uint32) {
	l, err := e.locate(p)
	if err != nil {
		return nil, 0
	}
	st, err := e.statLoc(p, l)
	if err != nil {
		return nil, 0
	}
	if l.m != nil {
		if l.m.Kind == KindSymlink {
			t, err := e.readUpperSymlink(p)
			if err != nil {
				return nil, 0
			}
			return []byte(t), gitMode(st.Mode)
		}
		return e.bodyOf(e.upper, p, st.Mode, st.Size)
	}
	return e.bodyOf(e.base, l.basePath, st.Mode, st.Size)
}

func (e *Engine) bodyOf(l layer, rel string, mode uint32, size int64) ([]byte, uint32) {
	gm := gitMode(mode)
	switch gm {
	case 0:
		return nil, 0
	case 0o120000:
		t, err := l.readlink(rel)
		if err != nil {
			return nil, 0
		}
		return []byte(t), gm
	}
	if size > MaxReadBytes {
		// Too large to diff: shown as a binary change.
		return []byte("\x00(file too large to diff)"), gm
	}
	fd, err := l.open(rel, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0
	}
	defer unix.Close(fd)
	b, err := io.ReadAll(io.LimitReader(fdio.Reader(fd), MaxReadBytes))
	if err != nil {
		return nil, 0
	}
	if b == nil {
		b = []byte{}
	}
	return b, gm
}

// baseTreeDeletes adds deletions of the workspace's files at or below p.
func (e *Engine) baseTreeDeletes(p string, out []unidiff.FileChange) []unidiff.FileChange {
	st, err := e.base.lstat(p)
	if err != nil {
		return out
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		if b, mode := e.baseBody(p); mode != 0 {
			out = append(out, unidiff.FileChange{Path: p, Old: b, OldMode: mode})
		}
		return out
	}
	fd, err := e.base.openDirRead(p)
	if err != nil {
		return out
	}
	ents, _ := readDirents(fd)
	unix.Close(fd)
	for _, d := range ents {
		out = e.baseTreeDeletes(joinPath(p, d.Name), out)
	}
	return out
}

// viewTreeCreates adds creations for the view's files below the renamed
// directory p that have no pending entry of their own.
func (e *Engine) viewTreeCreates(p string, out []unidiff.FileChange) []unidiff.FileChange {
	ents, err := e.readDirLocked(p)
	if err != nil {
		return out
	}
	for _, d := range ents {
		q := joinPath(p, d.Name)
		if d.Mode == syscall.S_IFDIR {
			if m := e.index[q]; m == nil || m.Redirect == "" {
				out = e.viewTreeCreates(q, out)
			}
			continue
		}
		if m := e.index[q]; m != nil && m.isChange() {
			continue
		}
		if b, mode := e.viewBody(q); mode != 0 {
			out = append(out, unidiff.FileChange{Path: q, New: b, NewMode: mode})
		}
	}
	return out
}
