package overlay

import (
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// File is an open file of the merged view. Fd refers to a pending body
// (Upper) or, for reads of unchanged files and in immediate mode, to the
// workspace file itself.
type File struct {
	Fd       int
	Upper    bool
	Writable bool
	Gen      uint64 // CopyGeneration when opened
	uino     uint64 // upper inode of a writable staged handle (0: none)
}

// trackWriter counts f as an open writer of its pending body.
func (e *Engine) trackWriter(f *File) {
	var st unix.Stat_t
	if f.Upper && f.Writable && unix.Fstat(f.Fd, &st) == nil {
		f.uino = st.Ino
		e.writers[st.Ino]++
	}
}

const writeFlags = unix.O_WRONLY | unix.O_RDWR | unix.O_TRUNC

// WantsWrite reports whether open flags write to the file (and so stage
// it).
func WantsWrite(flags int) bool { return flags&writeFlags != 0 }

// openFlags are the flags the daemon passes on for an open by a client: the
// creation flags were handled already, and the daemon never blocks on a FIFO
// or follows a final symlink.
func openFlags(flags int) int {
	return flags&^(unix.O_CREAT|unix.O_EXCL|unix.O_NOCTTY) | unix.O_NOFOLLOW | unix.O_CLOEXEC
}

// Open opens p. Opening for writing (or with O_TRUNC) copies the file up
// first, so the write lands in the pending set.
func (e *Engine) Open(p string, flags int, c Caller) (*File, error) {
	write := WantsWrite(flags)
	if !write {
		var f *File
		err := e.rlocked(func() error {
			l, err := e.locate(p)
			if err != nil {
				return err
			}
			if l.deleted() {
				return syscall.ENOENT
			}
			if l.m != nil && l.m.Kind == KindSymlink {
				// The upper file holds the link's target: never open
				// it as the file (a base symlink fails the same way,
				// O_NOFOLLOW).
				return syscall.ELOOP
			}
			f = &File{Gen: e.copyGen.Load()}
			if l.m != nil {
				f.Upper = true
				f.Fd, err = e.upper.open(p, openFlags(flags), 0)
			} else if l.hasBase {
				f.Fd, err = e.base.open(l.basePath, openFlags(flags), 0)
			} else {
				err = syscall.ENOENT
			}
			return err
		})
		return f, err
	}
	c = e.named(c)
	var f *File
	var restaged bool
	err := e.locked(func() (err error) {
		e.pushForks(p)
		m := e.index[p]
		// Only the first write-open of a path changes the pending set's
		// structure (the copy-up); its record must be durable before
		// the open returns. Later ones are journaled lazily, like the
		// data they write.
		restaged = e.mode == Immediate || (m != nil && m.Kind != KindWhiteout && !m.Deleted)
		f, err = e.openWriteLocked(p, flags, c)
		return err
	})
	if err != nil {
		return nil, err
	}
	op := "open_write"
	if flags&unix.O_TRUNC != 0 {
		op = "open_trunc"
	}
	r := Record{Op: op, Path: p, Pid: c.Pid, Comm: c.Comm}
	if restaged {
		e.recordLazy(r)
	} else if err := e.recordStaging(r); err != nil {
		e.abandon(f)
		return nil, err
	}
	e.changed()
	return f, nil
}

func (e *Engine) openWriteLocked(p string, flags int, c Caller) (*File, error) {
	if err := e.capture(c, p); err != nil {
		return nil, err
	}
	l, err := e.locate(p)
	if err != nil {
		return nil, err
	}
	f := &File{Upper: true, Writable: true}
	if e.mode == Immediate {
		f.Upper = false
		f.Fd, err = e.base.open(p, openFlags(flags), 0)
		return f, err
	}
	// Writing a symlink would replace its target (its upper body). The
	// workspace entry's lstat serves the copy-up too.
	var bst *syscall.Stat_t
	if l.m == nil {
		if bst = e.baseStat(l); bst == nil {
			return nil, syscall.ENOENT
		}
		if bst.Mode&syscall.S_IFMT == syscall.S_IFLNK {
			return nil, syscall.ELOOP
		}
	} else if l.m.Kind == KindSymlink && !l.deleted() {
		return nil, syscall.ELOOP
	}
	why := forContent
	if flags&unix.O_TRUNC != 0 {
		why = forTruncate
	}
	m, err := e.copyUpFrom(p, l, bst, why, c)
	if err != nil {
		return nil, err
	}
	if err := e.changedBy(p, m, c, true); err != nil {
		return nil, err
	}
	if f.Fd, err = e.upper.open(p, openFlags(flags), 0); err != nil {
		return nil, err
	}
	f.Gen = e.copyGen.Load()
	e.trackWriter(f)
	return f, nil
}

// abandon closes a file whose open could not be journaled.
func (e *Engine) abandon(f *File) {
	if f.uino != 0 {
		e.lockMu()
		if e.writers[f.uino]--; e.writers[f.uino] <= 0 {
			delete(e.writers, f.uino)
		}
		e.unlockMu()
	}
	unix.Close(f.Fd)
}

// Release journals the close of a file opened for writing, with its size.
func (e *Engine) Release(p string, f *File, c Caller) {
	if f.Writable {
		var st unix.Stat_t
		var size int64
		if unix.Fstat(f.Fd, &st) == nil {
			size = st.Size
		}
		e.recordLazy(Record{Op: "close_write", Path: p, Pid: c.Pid, Size: size})
		e.changed()
	}
	if f.uino != 0 {
		e.lockMu()
		if e.writers[f.uino]--; e.writers[f.uino] <= 0 {
			delete(e.writers, f.uino)
		}
		e.unlockMu()
	}
	unix.Close(f.Fd)
}

// immediateCreate makes a new entry at p in the workspace (immediate
// mode) with make, owned by the caller, and returns its attributes.
func (e *Engine) immediateCreate(p string, c Caller, make func(dirfd int, name string) error) (*syscall.Stat_t, error) {
	if err := e.immediateHidden("", p); err != nil {
		return nil, err
	}
	err := e.base.withParent(p, func(dirfd int, name string) error {
		if err := make(dirfd, name); err != nil {
			return err
		}
		if c.Uid != 0 || c.Gid != 0 {
			unix.Fchownat(dirfd, name, int(c.Uid), int(c.Gid), unix.AT_SYMLINK_NOFOLLOW)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return e.statLoc(p, loc{basePath: p, hasBase: true})
}

// immediateHidden refuses in immediate mode, where operations go straight
// to the workspace, what locate and prepareNew refuse in staged mode: a
// hidden path does not exist (ENOENT) and cannot be created (EACCES).
// Either argument may be "" (none).
func (e *Engine) immediateHidden(existing, created string) error {
	if e.isHidden(existing) {
		return syscall.ENOENT
	}
	if e.isHidden(created) {
		return syscall.EACCES
	}
	return nil
}

// parentIsDir checks that p's parent exists in the merged view as a
// directory.
func (e *Engine) parentIsDir(p string) error {
	dir, _ := splitPath(p)
	l, err := e.locate(dir)
	if err != nil {
		return err
	}
	st, err := e.statLoc(dir, l)
	if err != nil {
		return err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return syscall.ENOTDIR
	}
	return nil
}

// prepareNew checks that p can be created (parent is a directory, p does
// not exist), makes the parent's upper directory, and returns the meta a new
// entry at p starts with: its baseline is what the base has at p, carried
// over from a whiteout that p replaces.
func (e *Engine) prepareNew(p string, kind Kind, c Caller) (loc, *meta, error) {
	if e.isHidden(p) {
		return loc{}, nil, syscall.EACCES
	}
	if err := e.parentIsDir(p); err != nil {
		return loc{}, nil, err
	}
	l, err := e.locate(p)
	if err != nil {
		return loc{}, nil, err
	}
	if _, err := e.statLoc(p, l); err == nil {
		return loc{}, nil, syscall.EEXIST
	}
	dir, _ := splitPath(p)
	if err := e.ensureUpperDir(dir); err != nil {
		return loc{}, nil, err
	}
	c = e.named(c)
	m := &meta{Kind: kind, Pid: c.Pid, Comm: c.Comm, Time: time.Now().UnixNano(), Ino: e.newUpperIno()}
	if l.m != nil {
		m.Base = l.m.Base
	} else if st := e.baseStat(l); st != nil {
		m.Base = baselineOf(st)
	}
	return l, m, nil
}

// placeNew puts a new upper entry at p. A regular file with nothing in the
// way is created in place (the common case: one create, no rename): a crash
// before its meta is written leaves a file without one, which start-up
// takes for just what it is, a new file. Anything else is built in work/,
// meta included, and renamed into place, because an entry caught without
// its meta would load as something else: a symlink or special file (both
// regular files in the upper tree) as a regular file, a directory as a
// mere container that commit never makes. The rename also replaces a
// whiteout in the way in one step (a deleted directory in the way is
// removed first, see below).
// build creates the entry at (dirfd, name) and returns an fd on it.
func (e *Engine) placeNew(p string, l loc, m *meta, build func(dirfd int, name string) (int, error)) (int, error) {
	var fd int
	if l.m == nil && m.Kind == KindFile {
		err := e.upper.withParent(p, func(dirfd int, name string) error {
			var err error
			fd, err = build(dirfd, name)
			return err
		})
		if err != nil {
			return -1, err
		}
		if err := e.finishNew(fd, p, m); err != nil {
			unix.Close(fd)
			e.upper.withParent(p, func(dirfd int, name string) error { return removeAt(dirfd, name) })
			return -1, err
		}
		e.setEntry(p, m)
		return fd, nil
	}
	tmp := e.tmpName()
	fd, err := build(e.workFd, tmp)
	if err != nil {
		return -1, err
	}
	if err := e.finishNew(fd, p, m); err != nil {
		unix.Close(fd)
		removeAt(e.workFd, tmp)
		return -1, err
	}
	if e.died("place-new") {
		// work/ is emptied at start-up: the entry never existed.
		unix.Close(fd)
		return -1, errDied
	}
	if l.m != nil && l.m.Kind == KindDir {
		// A deleted directory (holding whiteouts) is replaced by a file:
		// the base directory's children must still go at commit, so the
		// old upper directory is removed only when nothing in the base
		// needs it. Keep it simple: move it aside is not possible, so a
		// file may not replace a deleted directory that has base content.
		if e.hasWhiteoutsBelow(p) {
			unix.Close(fd)
			removeAt(e.workFd, tmp)
			return -1, syscall.EEXIST
		}
		e.upper.withParent(p, func(dirfd int, name string) error { return removeAllAt(dirfd, name) })
	}
	err = e.upper.withParent(p, func(dirfd int, name string) error {
		switch {
		case l.m == nil && m.Kind == KindDir:
			// Nothing is in the way (prepareNew checked, under the lock):
			// NOREPLACE only guards that.
			return placeDirAt(e.workFd, tmp, dirfd, name, unix.RENAME_NOREPLACE)
		case l.m == nil:
			// A symlink or special file is a regular file in the upper
			// tree: no directory moves, the directory caches stay.
			return renameFileAt(e.workFd, tmp, dirfd, name, unix.RENAME_NOREPLACE)
		case m.Kind == KindDir && l.m.Kind != KindDir:
			// rename(2) cannot put a directory over the whiteout file:
			// swap the two (still atomic), then drop the whiteout, now
			// in work/.
			if err := placeDirAt(e.workFd, tmp, dirfd, name, unix.RENAME_EXCHANGE); err != nil {
				return err
			}
			unix.Unlinkat(e.workFd, tmp, 0)
			return nil
		case m.Kind != KindDir:
			// A file over a whiteout or file (an upper directory in the
			// way was removed above): the caches stay.
			return renameFileAt(e.workFd, tmp, dirfd, name, 0)
		}
		return renameAt(e.workFd, tmp, dirfd, name, 0)
	})
	if err != nil {
		unix.Close(fd)
		removeAt(e.workFd, tmp)
		return -1, err
	}
	e.dropEntry(p)
	e.setEntry(p, m)
	return fd, nil
}

// finishNew writes the meta of a new upper entry, open as fd, to be at p.
func (e *Engine) finishNew(fd int, p string, m *meta) error {
	e.placeMeta(m, p)
	if err := unix.Fsetxattr(fd, metaXattr, m.encode(), 0); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	m.uino = st.Ino
	return nil
}

// holdsBaseChanges reports whether the upper directory p, or an entry
// below it, stands for a change of a workspace entry at its own path (a
// whiteout, a deleted directory, an entry that replaced a workspace one).
// Renamed directories below are consistent on their own and not entered.
func (e *Engine) holdsBaseChanges(p string) bool {
	m := e.index[p]
	if m == nil {
		return false
	}
	if m.Kind == KindWhiteout || m.Deleted || m.Base.Exists {
		return true
	}
	if m.Kind != KindDir || m.Redirect != "" {
		return false
	}
	for name := range e.children[p] {
		if e.holdsBaseChanges(joinPath(p, name)) {
			return true
		}
	}
	return false
}

func (e *Engine) hasWhiteoutsBelow(p string) bool {
	for name := range e.children[p] {
		q := joinPath(p, name)
		m := e.index[q]
		if m.Kind == KindWhiteout || m.Deleted || m.Redirect != "" || (m.Kind == KindDir && e.hasWhiteoutsBelow(q)) {
			return true
		}
	}
	return false
}

func chownFd(fd int, c Caller) {
	if c.Uid != 0 || c.Gid != 0 {
		unix.Fchown(fd, int(c.Uid), int(c.Gid))
	}
}

// Create creates and opens the regular file p (open with O_CREAT).
func (e *Engine) Create(p string, flags int, mode uint32, c Caller) (*File, *syscall.Stat_t, error) {
	c = e.named(c)
	var f *File
	var st *syscall.Stat_t
	var created bool
	err := e.locked(func() (err error) {
		e.pushForks(p)
		f, st, created, err = e.createLocked(p, flags, mode, c)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	op := "open_write"
	if created {
		op = "create"
	}
	if err := e.recordOp(c, op, p, "", 0); err != nil {
		e.abandon(f)
		return nil, nil, err
	}
	return f, st, nil
}

func (e *Engine) createLocked(p string, flags int, mode uint32, c Caller) (*File, *syscall.Stat_t, bool, error) {
	if err := e.capture(c, p); err != nil {
		return nil, nil, false, err
	}
	if e.mode == Immediate {
		if err := e.immediateHidden("", p); err != nil {
			return nil, nil, false, err
		}
		fd, err := e.base.open(p, flags|unix.O_CREAT, mode&0o7777)
		if err != nil {
			return nil, nil, false, err
		}
		chownFd(fd, c)
		st, err := e.fstatShown(fd, nil)
		return &File{Fd: fd, Writable: WantsWrite(flags)}, st, true, err
	}
	l, m, err := e.prepareNew(p, KindFile, c)
	if err == syscall.EEXIST {
		if flags&unix.O_EXCL != 0 {
			return nil, nil, false, err
		}
		f, err := e.openWriteLocked(p, flags, c)
		if err != nil {
			return nil, nil, false, err
		}
		st, err := e.fstatShown(f.Fd, e.index[p])
		return f, st, false, err
	}
	if err != nil {
		return nil, nil, false, err
	}
	// The file is made readable and writable by its owner until it has
	// been opened again with the caller's flags: POSIX lets a process
	// create a file read-only and still write it (git makes its objects
	// 0444 with O_RDWR), but a daemon that is not root could not open such
	// a file a second time.
	fd, err := e.placeNew(p, l, m, func(dirfd int, name string) (int, error) {
		fd, err := openatRetry(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, mode&0o7777|0o600)
		if err == nil {
			chownFd(fd, c)
		}
		return fd, err
	})
	if err != nil {
		return nil, nil, false, err
	}
	unix.Close(fd)
	f := &File{Upper: true, Writable: true, Gen: e.copyGen.Load()}
	if f.Fd, err = e.upper.open(p, openFlags(flags)&^unix.O_TRUNC, 0); err != nil {
		return nil, nil, false, err
	}
	if mode&0o600 != 0o600 {
		if err := unix.Fchmod(f.Fd, mode&0o7777); err != nil {
			unix.Close(f.Fd)
			return nil, nil, false, err
		}
	}
	e.trackWriter(f)
	st, err := e.fstatShown(f.Fd, m)
	return f, st, true, err
}

// fstatShown stats an open file and decorates it as the merged view shows it.
func (e *Engine) fstatShown(fd int, m *meta) (*syscall.Stat_t, error) {
	var ust unix.Stat_t
	if err := unix.Fstat(fd, &ust); err != nil {
		return nil, err
	}
	st := toSyscallStat(&ust)
	if m != nil {
		decorate(st, m)
	} else {
		st.Ino = e.viewIno(st)
	}
	return st, nil
}

// Mkdir creates the directory p.
func (e *Engine) Mkdir(p string, mode uint32, c Caller) (*syscall.Stat_t, error) {
	c = e.named(c)
	st, err := underLock(e, func() (*syscall.Stat_t, error) {
		e.pushForks(p)
		return e.mkdirLocked(p, mode, c)
	})
	if err == nil {
		err = e.recordOp(c, "mkdir", p, "", 0)
	}
	return st, err
}

func (e *Engine) mkdirLocked(p string, mode uint32, c Caller) (*syscall.Stat_t, error) {
	if err := e.capture(c, p); err != nil {
		return nil, err
	}
	if e.mode == Immediate {
		return e.immediateCreate(p, c, func(dirfd int, name string) error {
			return unix.Mkdirat(dirfd, name, mode&0o7777)
		})
	}
	l, m, err := e.prepareNew(p, KindDir, c)
	if err != nil {
		return nil, err
	}
	if l.m != nil && l.m.Kind == KindDir && l.m.Deleted {
		// Recreating a deleted directory: keep its whiteouts (commit
		// still has to remove the base's children) and hide the base.
		old := l.m
		nm := *old
		nm.Deleted, nm.Opaque, nm.Container, nm.Time = false, true, false, m.Time
		nm.Pid, nm.Comm = c.Pid, c.Comm
		if err := e.writeMeta(p, &nm); err != nil {
			return nil, err
		}
		if err := e.upper.withParent(p, func(dirfd int, name string) error {
			if err := unix.Fchmodat(dirfd, name, mode&0o7777, 0); err != nil {
				return err
			}
			return unix.Fchownat(dirfd, name, int(c.Uid), int(c.Gid), unix.AT_SYMLINK_NOFOLLOW)
		}); err != nil {
			return nil, err
		}
		*old = nm
		return e.statLoc(p, loc{m: old})
	}
	// Anything the base has at p is hidden by the new directory.
	m.Opaque = m.Base.Exists || !l.hasBase
	fd, err := e.placeNew(p, l, m, func(dirfd int, name string) (int, error) {
		if err := unix.Mkdirat(dirfd, name, mode&0o7777); err != nil {
			return -1, err
		}
		fd, err := openatRetry(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil {
			chownFd(fd, c)
		}
		return fd, err
	})
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return e.fstatShown(fd, m)
}

// Symlink creates the symlink p pointing to target.
func (e *Engine) Symlink(target, p string, c Caller) (*syscall.Stat_t, error) {
	c = e.named(c)
	st, err := underLock(e, func() (*syscall.Stat_t, error) {
		e.pushForks(p)
		return e.symlinkLocked(target, p, c)
	})
	if err == nil {
		err = e.recordStaging(Record{Op: "symlink", Path: p, Pid: c.Pid, Comm: c.Comm, Detail: target})
		e.changed()
	}
	return st, err
}

func (e *Engine) symlinkLocked(target, p string, c Caller) (*syscall.Stat_t, error) {
	if err := e.capture(c, p); err != nil {
		return nil, err
	}
	if e.mode == Immediate {
		return e.immediateCreate(p, c, func(dirfd int, name string) error {
			return unix.Symlinkat(target, dirfd, name)
		})
	}
	l, m, err := e.prepareNew(p, KindSymlink, c)
	if err != nil {
		return nil, err
	}
	fd, err := e.placeNew(p, l, m, func(dirfd int, name string) (int, error) {
		fd, err := openatRetry(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return -1, err
		}
		if _, err := unix.Write(fd, []byte(target)); err != nil {
			unix.Close(fd)
			return -1, err
		}
		chownFd(fd, c)
		return fd, nil
	})
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return e.fstatShown(fd, m)
}

// Mknod creates a FIFO, socket or device node (regular files go to Create).
func (e *Engine) Mknod(p string, mode uint32, rdev uint64, c Caller) (*syscall.Stat_t, error) {
	c = e.named(c)
	st, err := underLock(e, func() (*syscall.Stat_t, error) {
		e.pushForks(p)
		return e.mknodLocked(p, mode, rdev, c)
	})
	if err == nil {
		err = e.recordOp(c, "mknod", p, "", 0)
	}
	return st, err
}

func (e *Engine) mknodLocked(p string, mode uint32, rdev uint64, c Caller) (*syscall.Stat_t, error) {
	if err := e.capture(c, p); err != nil {
		return nil, err
	}
	if e.mode == Immediate {
		return e.immediateCreate(p, c, func(dirfd int, name string) error {
			return unix.Mknodat(dirfd, name, mode, int(rdev))
		})
	}
	kind := KindSpecial
	if mode&syscall.S_IFMT == syscall.S_IFREG || mode&syscall.S_IFMT == 0 {
		kind = KindFile
	}
	l, m, err := e.prepareNew(p, kind, c)
	if err != nil {
		return nil, err
	}
	if kind == KindSpecial {
		m.Mode, m.Rdev = mode, rdev
	}
	fd, err := e.placeNew(p, l, m, func(dirfd int, name string) (int, error) {
		fd, err := openatRetry(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, mode&0o7777)
		if err == nil {
			chownFd(fd, c)
		}
		return fd, err
	})
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return e.fstatShown(fd, m)
}

// Link makes newp another name of the file oldp.
func (e *Engine) Link(oldp, newp string, c Caller) (*syscall.Stat_t, error) {
	c = e.named(c)
	st, err := underLock(e, func() (*syscall.Stat_t, error) {
		e.pushForks(oldp, newp)
		return e.linkLocked(oldp, newp, c)
	})
	if err == nil {
		err = e.recordOp(c, "link", oldp, newp, 0)
	}
	return st, err
}

func (e *Engine) linkLocked(oldp, newp string, c Caller) (*syscall.Stat_t, error) {
	// In staged mode the old name is captured too: linking copies it up,
	// and its pre-image lets a restore drop that copy again.
	captured := []string{newp}
	if e.mode == Staged {
		captured = append(captured, oldp)
	}
	if err := e.capture(c, captured...); err != nil {
		return nil, err
	}
	if e.mode == Immediate {
		if err := e.immediateHidden(oldp, newp); err != nil {
			return nil, err
		}
		err := e.base.withParent(oldp, func(odir int, oname string) error {
			return e.base.withParent(newp, func(ndir int, nname string) error {
				return unix.Linkat(odir, oname, ndir, nname, 0)
			})
		})
		if err != nil {
			return nil, err
		}
		return e.statLoc(newp, loc{basePath: newp, hasBase: true})
	}
	ol, err := e.locate(oldp)
	if err != nil {
		return nil, err
	}
	ost, err := e.statLoc(oldp, ol)
	if err != nil {
		return nil, err
	}
	if ost.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		return nil, syscall.EPERM
	}
	nl, nm, err := e.prepareNew(newp, KindFile, c)
	if err != nil {
		return nil, err
	}
	om, err := e.copyUp(oldp, ol, forContent, c)
	if err != nil {
		return nil, err
	}
	if om.AttrOnly {
		// Once the file has a second name, its body can be written
		// through either: status can no longer promise it is the
		// workspace's.
		nm := *om
		nm.AttrOnly = false
		if err := e.writeMeta(oldp, &nm); err != nil {
			return nil, err
		}
		*om = nm
	}
	if nl.m != nil && nl.m.Kind == KindDir {
		return nil, syscall.EEXIST
	}
	err = e.upper.withParent(oldp, func(odir int, oname string) error {
		if nl.m == nil {
			return e.upper.withParent(newp, func(ndir int, nname string) error {
				return unix.Linkat(odir, oname, ndir, nname, 0)
			})
		}
		// A whiteout is in the way. Unlinking it before the link exists
		// would show the workspace's entry again in between, and for
		// good after a crash there, undoing an acknowledged delete. So
		// the link is made in work/ (the same file system) and renamed
		// over the whiteout: one step.
		tmp := e.tmpName()
		if err := unix.Linkat(odir, oname, e.workFd, tmp, 0); err != nil {
			return err
		}
		if e.died("link-over-whiteout") {
			return errDied // work/ is emptied at start-up
		}
		err := e.upper.withParent(newp, func(ndir int, nname string) error {
			return renameFileAt(e.workFd, tmp, ndir, nname, 0)
		})
		if err != nil {
			unix.Unlinkat(e.workFd, tmp, 0)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	// setEntry below replaces the whiteout's entry.
	lm := *om
	lm.Base = nm.Base
	lm.Pid, lm.Comm = c.Pid, c.Comm
	e.setEntry(newp, &lm)
	st, err := e.upper.lstat(newp)
	if err != nil {
		return nil, err
	}
	decorate(st, &lm)
	return st, nil
}

// Readlink returns the target of the symlink p.
func (e *Engine) Readlink(p string) (string, error) {
	e.rlock()
	defer e.runlock()
	l, err := e.locate(p)
	if err != nil {
		return "", err
	}
	if l.m != nil {
		if l.deleted() {
			return "", syscall.ENOENT
		}
		if l.m.Kind != KindSymlink {
			return "", syscall.EINVAL
		}
		return e.readUpperSymlink(p)
	}
	if !l.hasBase {
		return "", syscall.ENOENT
	}
	return e.base.readlink(l.basePath)
}

// ReadDir lists the directory p of the merged view.
func (e *Engine) ReadDir(p string) ([]Dirent, error) {
	e.rlock()
	defer e.runlock()
	return e.readDirLocked(p)
}

// listedBase returns the workspace directory whose entries the directory
// at l shows (false: none, it is opaque or new). A renamed directory shows
// the one it came from: locate applies a redirect only to the paths below
// it.
func (l loc) listedBase() (string, bool) {
	if l.m != nil && l.m.Opaque {
		return "", false
	}
	if l.m != nil && l.m.Redirect != "" {
		return l.m.Redirect, true
	}
	return l.basePath, l.hasBase
}

func (e *Engine) readDirLocked(p string) ([]Dirent, error) {
	l, err := e.locate(p)
	if err != nil {
		return nil, err
	}
	st, err := e.statLoc(p, l)
	if err != nil {
		return nil, err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return nil, syscall.ENOTDIR
	}
	var out []Dirent
	if basePath, ok := l.listedBase(); ok {
		if fd, err := e.base.openDirRead(basePath); err == nil {
			ents, err := readDirents(fd)
			unix.Close(fd)
			if err != nil {
				return nil, err
			}
			for _, d := range ents {
				q := joinPath(p, d.Name)
				if (e.mode == Staged && e.index[q] != nil) || e.isHidden(q) {
					continue
				}
				d.Ino = e.direntIno(d.Ino)
				out = append(out, d)
			}
		} else if l.m == nil {
			return nil, err
		}
	}
	if e.mode == Immediate {
		return out, nil
	}
	for name := range e.children[p] {
		m := e.index[joinPath(p, name)]
		if m.Kind == KindWhiteout || m.Deleted {
			continue
		}
		mode := uint32(syscall.S_IFREG)
		switch m.Kind {
		case KindDir:
			mode = syscall.S_IFDIR
		case KindSymlink:
			mode = syscall.S_IFLNK
		case KindSpecial:
			mode = m.Mode & syscall.S_IFMT
		}
		out = append(out, Dirent{Name: name, Mode: mode, Ino: m.shownIno()})
	}
	return out, nil
}

// baseInoDirent maps a d_ino from the base. Entries on other filesystems
// mounted in the workspace would need their device; d_ino is a hint that
// tools re-check with stat, which does map them.
func (e *Engine) baseInoDirent(ino uint64) uint64 { return e.inos.shownFor(ino) }

// isEmptyDir reports whether the directory p is empty in the merged view.
func (e *Engine) isEmptyDir(p string) (bool, error) {
	ents, err := e.readDirLocked(p)
	return len(ents) == 0, err
}

// removeAt removes a file or an empty directory.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == unix.EISDIR || err == unix.EPERM {
		err = rmdirAt(dirfd, name)
	}
	return err
}

// removeAllAt removes name and everything below it.
func removeAllAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR && err != unix.EPERM {
		return err
	}
	fd, err := openatRetry(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	ents, err := readDirents(fd)
	if err == nil {
		for _, d := range ents {
			if err = removeAllAt(fd, d.Name); err != nil {
				break
			}
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	return rmdirAt(dirfd, name)
}

// whiteoutAt replaces whatever the upper tree has at p with a whiteout
// carrying baseline b (built in work/ and renamed into place, so p is never
// missing from the upper tree in between: a crash there would show the
// workspace's entry again). A directory at p is swapped with the whiteout
// and removed from work/ afterwards; everything in it must be droppable.
func (e *Engine) whiteoutAt(p string, b Baseline, c Caller) error {
	dir, _ := splitPath(p)
	if err := e.ensureUpperDir(dir); err != nil {
		return err
	}
	c = e.named(c)
	m := &meta{Kind: KindWhiteout, Base: b, Pid: c.Pid, Comm: c.Comm, Time: time.Now().UnixNano()}
	tmp := e.tmpName()
	// Mode 0600, not 0: setting a user xattr needs write permission on
	// the inode, which a daemon that is not root lacks on a mode-0 file.
	fd, err := unix.Openat(e.workFd, tmp, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	err = e.finishNew(fd, p, m)
	unix.Close(fd)
	if err == nil && e.died("whiteout") {
		return errDied // work/ is emptied at start-up
	}
	old := e.index[p]
	swapDir := old != nil && old.Kind == KindDir
	if err == nil {
		err = e.upper.withParent(p, func(dirfd int, name string) error {
			if swapDir {
				// rename(2) cannot put a file over a directory.
				return renameAt(e.workFd, tmp, dirfd, name, unix.RENAME_EXCHANGE)
			}
			// A file over a file or nothing (the index holds every
			// upper entry): no directory moves, so the directory
			// caches stay. (renameAt emptied them at every unlink, and
			// the next operation walked from the root.)
			return renameFileAt(e.workFd, tmp, dirfd, name, 0)
		})
	}
	if err != nil {
		removeAt(e.workFd, tmp)
		return err
	}
	if swapDir {
		if e.died("whiteout-swapped") {
			return errDied
		}
		// tmp is the directory now. Should this fail, start-up empties
		// work/.
		removeAllAt(e.workFd, tmp)
	}
	e.dropEntry(p)
	e.setEntry(p, m)
	return nil
}

// Unlink removes the non-directory p.
func (e *Engine) Unlink(p string, c Caller) error {
	c = e.named(c)
	err := e.locked(func() error {
		e.pushForks(p)
		return e.unlinkLocked(p, c)
	})
	if err == nil {
		err = e.recordOp(c, "unlink", p, "", 0)
	}
	return err
}

func (e *Engine) unlinkLocked(p string, c Caller) error {
	if err := e.capture(c, p); err != nil {
		return err
	}
	if e.mode == Immediate {
		if err := e.immediateHidden(p, ""); err != nil {
			return err
		}
		return e.base.withParent(p, func(dirfd int, name string) error { return unix.Unlinkat(dirfd, name, 0) })
	}
	l, err := e.locate(p)
	if err != nil {
		return err
	}
	if l.m == nil && l.hasBase {
		// Only the workspace has p (rm -rf of a workspace tree): one
		// lstat serves both the check and the whiteout's baseline.
		bst, err := e.base.lstat(l.basePath)
		if err != nil {
			return err
		}
		if bst.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			return syscall.EISDIR
		}
		return e.whiteoutAt(p, baselineOf(bst), c)
	}
	st, err := e.statLoc(p, l)
	if err != nil {
		return err
	}
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		return syscall.EISDIR
	}
	return e.removeEntry(p, l, c)
}

// removeEntry deletes p from the merged view: a whiteout when the base has
// something there (or had, when p was first staged), else just the upper
// entry.
func (e *Engine) removeEntry(p string, l loc, c Caller) error {
	bst := e.baseStat(l)
	b := Baseline{}
	if l.m != nil {
		b = l.m.Base
	} else if bst != nil {
		b = baselineOf(bst)
	}
	if bst != nil || b.Exists {
		return e.whiteoutAt(p, b, c)
	}
	if err := e.upper.withParent(p, func(dirfd int, name string) error { return removeAllAt(dirfd, name) }); err != nil {
		return err
	}
	e.dropEntry(p)
	e.pruneContainers(p)
	return nil
}

// pruneContainers removes container directories above p that no longer
// hold any change, so an undone change leaves nothing behind.
func (e *Engine) pruneContainers(p string) {
	for dir, _ := splitPath(p); dir != ""; dir, _ = splitPath(dir) {
		m := e.index[dir]
		if m == nil || m.isChange() || len(e.children[dir]) > 0 {
			return
		}
		if e.upper.withParent(dir, func(dirfd int, name string) error {
			return rmdirAt(dirfd, name)
		}) != nil {
			return
		}
		e.dropEntry(dir)
	}
}

// Rmdir removes the empty directory p.
func (e *Engine) Rmdir(p string, c Caller) error {
	c = e.named(c)
	err := e.locked(func() error {
		e.pushForks(p)
		return e.rmdirLocked(p, c)
	})
	if err == nil {
		err = e.recordOp(c, "rmdir", p, "", 0)
	}
	return err
}

func (e *Engine) rmdirLocked(p string, c Caller) error {
	if err := e.capture(c, p); err != nil {
		return err
	}
	if p == "" {
		return syscall.EBUSY
	}
	if e.mode == Immediate {
		if err := e.immediateHidden(p, ""); err != nil {
			return err
		}
		return e.base.withParent(p, func(dirfd int, name string) error { return rmdirAt(dirfd, name) })
	}
	l, err := e.locate(p)
	if err != nil {
		return err
	}
	st, err := e.statLoc(p, l)
	if err != nil {
		return err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return syscall.ENOTDIR
	}
	if empty, err := e.isEmptyDir(p); err != nil {
		return err
	} else if !empty {
		return syscall.ENOTEMPTY
	}
	if l.m == nil || !e.hasWhiteoutsBelow(p) {
		// Nothing below needs to survive: a whiteout (or nothing) will do.
		if l.m != nil {
			if e.baseStat(l) != nil || l.m.Base.Exists {
				// The whiteout takes the directory's place in one step
				// (whiteoutAt): removing the directory first would
				// show the workspace's entry again until the whiteout
				// is in place, and for good after a crash there.
				return e.whiteoutAt(p, l.m.Base, c)
			}
			if err := e.upper.withParent(p, func(dirfd int, name string) error { return removeAllAt(dirfd, name) }); err != nil {
				return err
			}
			e.dropEntry(p)
			e.pruneContainers(p)
			return nil
		}
		return e.removeEntry(p, l, c)
	}
	// The whiteouts below must reach commit: keep the directory, marked
	// deleted.
	nm := *l.m
	nm.Deleted, nm.Container, nm.Time = true, false, time.Now().UnixNano()
	nm.Pid, nm.Comm = c.Pid, c.Comm
	if err := e.writeMeta(p, &nm); err != nil {
		return err
	}
	*l.m = nm
	return nil
}

// Rename moves oldp to newp (flags: RENAME_NOREPLACE; RENAME_EXCHANGE is
// not supported and fails with EINVAL).
func (e *Engine) Rename(oldp, newp string, flags uint32, c Caller) error {
	c = e.named(c)
	err := e.locked(func() error {
		e.pushForks(oldp, newp)
		return e.renameLocked(oldp, newp, flags, c)
	})
	if err == nil {
		err = e.recordOp(c, "rename", oldp, newp, 0)
	}
	return err
}

func (e *Engine) renameLocked(oldp, newp string, flags uint32, c Caller) error {
	if flags&^unix.RENAME_NOREPLACE != 0 {
		return syscall.EINVAL
	}
	if oldp == newp {
		return nil
	}
	if oldp == "" || newp == "" || isUnder(newp, oldp) {
		return syscall.EINVAL
	}
	if err := e.captureRename(c, oldp, newp); err != nil {
		return err
	}
	if e.mode == Immediate {
		if err := e.immediateHidden(oldp, newp); err != nil {
			return err
		}
		return e.base.withParent(oldp, func(odir int, oname string) error {
			return e.base.withParent(newp, func(ndir int, nname string) error {
				return renameAt(odir, oname, ndir, nname, uint(flags))
			})
		})
	}
	ol, err := e.locate(oldp)
	if err != nil {
		return err
	}
	ost, err := e.statLoc(oldp, ol)
	if err != nil {
		return err
	}
	if err := e.parentIsDir(newp); err != nil {
		return err
	}
	nl, err := e.locate(newp)
	if err != nil {
		return err
	}
	if noop, err := e.checkRenameTarget(oldp, newp, flags, ol, nl, ost); noop || err != nil {
		return err
	}
	// What the base had at newp: the moved entry's new baseline.
	var newBase Baseline
	if nl.m != nil {
		newBase = nl.m.Base
	} else if bst := e.baseStat(nl); bst != nil {
		newBase = baselineOf(bst)
	}
	oldBaseHas := e.baseStat(ol) != nil
	var oldBase Baseline
	if ol.m != nil {
		oldBase = ol.m.Base
	} else if bst := e.baseStat(ol); bst != nil {
		oldBase = baselineOf(bst)
	}
	// The moved entry needs an upper copy at oldp.
	om, err := e.copyUp(oldp, ol, forContent, c)
	if err != nil {
		return err
	}
	ndir, _ := splitPath(newp)
	if err := e.ensureUpperDir(ndir); err != nil {
		return err
	}
	// An upper directory in the way at newp is empty on disk: the view
	// shows nothing in it, and it holds no whiteouts or renamed entries
	// (EXDEV above). rename(2) of a directory replaces it in one step, as
	// it does a whiteout or a file; removing it first would, until the
	// move, show again what the workspace has at newp, or lose a new
	// directory, and for good after a crash there. A non-directory cannot
	// replace a directory, so for one (the directory is a deleted one, not
	// shown) it is still removed first.
	if nl.m != nil && nl.m.Kind == KindDir && om.Kind != KindDir {
		if err := e.upper.withParent(newp, func(dirfd int, name string) error { return removeAllAt(dirfd, name) }); err != nil {
			return err
		}
		e.dropEntry(newp)
	}
	nm := movedMeta(om, ol, nl, newBase, oldBaseHas, c)
	if err := e.writeMetaFor(oldp, newp, &nm); err != nil {
		return err
	}
	if e.died("rename") {
		return errDied
	}
	err = e.upper.withParent(oldp, func(odir int, oname string) error {
		return e.upper.withParent(newp, func(ndir int, nname string) error {
			if nm.Kind == KindDir && nl.m != nil && nl.m.Kind != KindDir {
				// rename(2) cannot put a directory over the whiteout
				// file at newp: swap the two, then drop the whiteout,
				// now at oldp (whiteoutAt below puts the right one
				// there when one is needed).
				if err := renameAt(odir, oname, ndir, nname, unix.RENAME_EXCHANGE); err != nil {
					return err
				}
				unix.Unlinkat(odir, oname, 0)
				return nil
			}
			return renameAt(odir, oname, ndir, nname, 0)
		})
	})
	if err != nil {
		e.writeMeta(oldp, om)
		return err
	}
	*om = nm
	e.dropEntry(newp)
	e.moveEntries(oldp, newp)
	if oldBaseHas || oldBase.Exists {
		if err := e.whiteoutAt(oldp, oldBase, c); err != nil {
			return err
		}
	} else {
		e.pruneContainers(oldp)
	}
	if !nm.isChange() && len(e.children[newp]) == 0 {
		// A directory moved back with nothing staged inside: nothing of
		// it needs to stay in the pending set.
		if e.upper.withParent(newp, func(dirfd int, name string) error {
			return rmdirAt(dirfd, name)
		}) == nil {
			e.dropEntry(newp)
			e.pruneContainers(newp)
		}
	}
	return nil
}

// checkRenameTarget applies rename(2)'s rules to what the view has at
// oldp (ost) and newp, and refuses with EXDEV the renames a commit could
// not apply; noop is set when the rename has nothing to do (two names of
// one file).
func (e *Engine) checkRenameTarget(oldp, newp string, flags uint32, ol, nl loc, ost *syscall.Stat_t) (noop bool, err error) {
	oldIsDir := ost.Mode&syscall.S_IFMT == syscall.S_IFDIR
	if nst, err := e.statLoc(newp, nl); err == nil {
		if flags&unix.RENAME_NOREPLACE != 0 {
			return false, syscall.EEXIST
		}
		newIsDir := nst.Mode&syscall.S_IFMT == syscall.S_IFDIR
		switch {
		case oldIsDir && !newIsDir:
			return false, syscall.ENOTDIR
		case !oldIsDir && newIsDir:
			return false, syscall.EISDIR
		case newIsDir:
			if empty, err := e.isEmptyDir(newp); err != nil {
				return false, err
			} else if !empty {
				return false, syscall.ENOTEMPTY
			}
		}
		if ost.Ino == nst.Ino && !oldIsDir {
			// Two names of one file: rename does nothing (POSIX).
			return true, nil
		}
	}
	if oldIsDir && ol.m != nil && ol.m.Redirect == "" && ol.m.Opaque && e.holdsBaseChanges(oldp) {
		// A directory recreated over a workspace directory carries, below
		// it, the deletions and replacements of that directory's entries:
		// they belong to the old place, and commit could not apply them
		// from the new one. EXDEV makes mv copy and delete instead.
		return false, syscall.EXDEV
	}
	if nl.m != nil && nl.m.Kind == KindDir && e.hasWhiteoutsBelow(newp) {
		// A directory in the way holds the deletions of base entries
		// (rm -rf d; mv x d): the moved entry would replace them, and
		// commit could not empty the workspace's d. EXDEV, as overlayfs
		// answers for renames it cannot do, makes mv copy instead.
		return false, syscall.EXDEV
	}
	return false, nil
}

// movedMeta returns the meta of the entry om (at oldp, located at ol)
// moved to newp (located at nl, where the base has newBase; oldBaseHas
// says whether the base has oldp) by c.
func movedMeta(om *meta, ol, nl loc, newBase Baseline, oldBaseHas bool, c Caller) meta {
	nm := *om
	nm.Base = newBase
	nm.Pid, nm.Comm, nm.Time = c.Pid, c.Comm, time.Now().UnixNano()
	// At its new place the entry stands for whatever the workspace has
	// there (or nothing): not the body it was copied from.
	nm.AttrOnly = false
	if nm.Kind == KindDir {
		// Container is left alone when a redirect is set (a redirect is a
		// change by itself), so a directory moved back where the base
		// has it is a plain container again unless it was changed.
		if nm.Redirect == "" && !nm.Opaque && ol.hasBase && oldBaseHas {
			nm.Redirect = ol.basePath
		}
		if nm.Redirect == "" {
			// Nothing of the base shows through the moved directory.
			nm.Opaque, nm.Container = true, false
		} else if nl.hasBase && nm.Redirect == nl.basePath {
			// Back where the base has it: no longer a rename (else
			// status, diff and commit would treat it as one).
			nm.Redirect = ""
		}
	}
	nm.Was = &placeState{Base: om.Base, Redirect: om.Redirect, Opaque: om.Opaque, Container: om.Container, AttrOnly: om.AttrOnly}
	return nm
}

// SetAttr is a change of attributes; nil fields are left alone.
type SetAttr struct {
	Mode  *uint32
	Uid   *uint32
	Gid   *uint32
	Size  *uint64
	Atime *unix.Timespec // UTIME_NOW / UTIME_OMIT allowed
	Mtime *unix.Timespec
}

// SetattrFd applies a to the open file fd, for a file that has no path
// any more (removed while open, or made with O_TMPFILE): nothing of it is
// in the pending set, so there is nothing to stage or journal.
func SetattrFd(fd int, a SetAttr) (*syscall.Stat_t, error) {
	if a.Size != nil {
		if err := unix.Ftruncate(fd, int64(*a.Size)); err != nil {
			return nil, err
		}
	}
	if a.Uid != nil || a.Gid != nil {
		uid, gid := -1, -1
		if a.Uid != nil {
			uid = int(*a.Uid)
		}
		if a.Gid != nil {
			gid = int(*a.Gid)
		}
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return nil, err
		}
	}
	if a.Mode != nil {
		if err := unix.Fchmod(fd, *a.Mode&0o7777); err != nil {
			return nil, err
		}
	}
	if a.Atime != nil || a.Mtime != nil {
		omit := unix.Timespec{Nsec: unix.UTIME_OMIT}
		ts := []unix.Timespec{omit, omit}
		if a.Atime != nil {
			ts[0] = *a.Atime
		}
		if a.Mtime != nil {
			ts[1] = *a.Mtime
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, fdPath(fd), ts, 0); err != nil {
			return nil, err
		}
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// Setattr changes p's attributes. fd, when >= 0, is a file the caller has
// open for writing on p (used for truncation so it works on unlinked files).
func (e *Engine) Setattr(p string, fd int, a SetAttr, c Caller) (*syscall.Stat_t, error) {
	c = e.named(c)
	staged := true
	st, err := underLock(e, func() (*syscall.Stat_t, error) {
		e.pushForks(p)
		// A denied path is refused (and journaled as denied) even when
		// the call would change nothing.
		if err := e.checkDeny(c, p); err != nil {
			return nil, err
		}
		if st, ok := e.unchangedBy(p, a); ok {
			staged = false
			return st, nil
		}
		// In staged mode the root has nothing to stage (rootSetattrLocked).
		staged = p != "" || e.mode == Immediate
		return e.setattrLocked(p, fd, a, c)
	})
	if err == nil && staged {
		op := "setattr"
		var size int64
		if a.Size != nil {
			op, size = "truncate", int64(*a.Size)
		}
		err = e.recordStaging(Record{Op: op, Path: p, Pid: c.Pid, Comm: c.Comm, Size: size, Detail: a.describe()})
		e.changed()
	}
	return st, err
}

// unchangedBy returns p's attributes and true when a would leave them as
// they are: a chown to the owner it has, a chmod to the mode it has, times
// set to the times it has. tar, cp -a, rsync and `chmod -R`/`chown -R`
// send such calls for most files; answering them from a stat saves a
// copy-up of a workspace file and a journal sync each. A truncate is
// never a no-op (it sets the mtime even to the same size), nor a chown
// of a set-id file (chown clears those bits), nor a time set to "now".
func (e *Engine) unchangedBy(p string, a SetAttr) (*syscall.Stat_t, bool) {
	if a.Size != nil {
		return nil, false
	}
	st, err := e.statLocked(p)
	if err != nil {
		return nil, false
	}
	kind := st.Mode & syscall.S_IFMT
	if a.Mode != nil && kind != syscall.S_IFLNK && *a.Mode&0o7777 != st.Mode&0o7777 {
		return nil, false
	}
	if a.Uid != nil || a.Gid != nil {
		if kind != syscall.S_IFDIR && st.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 {
			return nil, false
		}
		if a.Uid != nil && *a.Uid != st.Uid || a.Gid != nil && *a.Gid != st.Gid {
			return nil, false
		}
	}
	if !sameTime(a.Atime, st.Atim) || !sameTime(a.Mtime, st.Mtim) {
		return nil, false
	}
	return st, true
}

// sameTime reports whether setting ts leaves a time that is now cur.
func sameTime(ts *unix.Timespec, cur syscall.Timespec) bool {
	if ts == nil || ts.Nsec == unix.UTIME_OMIT {
		return true
	}
	return ts.Nsec != unix.UTIME_NOW && ts.Sec == cur.Sec && ts.Nsec == cur.Nsec
}

// describe lists the attributes a changes and their new values for the
// journal ("mode=0755 uid=1000 gid=1000 mtime=2024-05-01T10:00:00Z"), so
// `stagefs log` tells a chmod from a chown or a touch. Built with strconv
// into one buffer: it runs on every setattr.
func (a SetAttr) describe() string {
	b := make([]byte, 0, 96)
	if a.Mode != nil {
		b = appendKey(b, "mode=")
		m := strconv.FormatUint(uint64(*a.Mode&0o7777), 8)
		for i := len(m); i < 4; i++ {
			b = append(b, '0')
		}
		b = append(b, m...)
	}
	if a.Uid != nil {
		b = strconv.AppendUint(appendKey(b, "uid="), uint64(*a.Uid), 10)
	}
	if a.Gid != nil {
		b = strconv.AppendUint(appendKey(b, "gid="), uint64(*a.Gid), 10)
	}
	if a.Size != nil {
		b = strconv.AppendUint(appendKey(b, "size="), *a.Size, 10)
	}
	b = appendTime(b, "atime=", a.Atime)
	b = appendTime(b, "mtime=", a.Mtime)
	return string(b)
}

// appendKey appends key to a space-separated list.
func appendKey(b []byte, key string) []byte {
	if len(b) > 0 {
		b = append(b, ' ')
	}
	return append(b, key...)
}

// appendTime appends a time a SetAttr sets: "now" for UTIME_NOW, RFC 3339
// in UTC otherwise; nothing for nil or UTIME_OMIT.
func appendTime(b []byte, key string, ts *unix.Timespec) []byte {
	if ts == nil || ts.Nsec == unix.UTIME_OMIT {
		return b
	}
	b = appendKey(b, key)
	if ts.Nsec == unix.UTIME_NOW {
		return append(b, "now"...)
	}
	return time.Unix(ts.Sec, ts.Nsec).UTC().AppendFormat(b, time.RFC3339Nano)
}

func (e *Engine) setattrLocked(p string, fd int, a SetAttr, c Caller) (*syscall.Stat_t, error) {
	if err := e.capture(c, p); err != nil {
		return nil, err
	}
	var lyr layer
	var rel string
	var m *meta
	if e.mode == Immediate {
		if err := e.immediateHidden(p, ""); err != nil {
			return nil, err
		}
		lyr, rel = e.base, p
	} else {
		l, err := e.locate(p)
		if err != nil {
			return nil, err
		}
		if a.Size != nil {
			// Only regular files have a size to change; a staged
			// symlink's body is its target. Checked before the copy-up,
			// so a refused call stages nothing.
			st, err := e.statLoc(p, l)
			if err != nil {
				return nil, err
			}
			switch st.Mode & syscall.S_IFMT {
			case syscall.S_IFREG:
			case syscall.S_IFDIR:
				return nil, syscall.EISDIR
			default:
				return nil, syscall.EINVAL
			}
		}
		if p == "" {
			return e.rootSetattrLocked(a)
		}
		why := forAttrs
		if a.Size != nil {
			why = forContent
			if *a.Size == 0 {
				why = forTruncate
			}
		}
		if m, err = e.copyUp(p, l, why, c); err != nil {
			return nil, err
		}
		if m.Kind == KindDir && m.Container {
			if err := e.containerChanged(p, l, m, c); err != nil {
				return nil, err
			}
		} else if err := e.changedBy(p, m, c, a.Size != nil); err != nil {
			return nil, err
		}
		lyr, rel = e.upper, p
	}
	kind := KindFile
	if m != nil {
		kind = m.Kind
	}
	err := func() error {
		if a.Size != nil {
			if fd >= 0 {
				if err := unix.Ftruncate(fd, int64(*a.Size)); err != nil {
					return err
				}
			} else if err := lyr.truncate(rel, int64(*a.Size)); err != nil {
				return err
			}
		}
		return lyr.withParentOrRoot(rel, func(dirfd int, name string) error {
			if a.Uid != nil || a.Gid != nil {
				uid, gid := -1, -1
				if a.Uid != nil {
					uid = int(*a.Uid)
				}
				if a.Gid != nil {
					gid = int(*a.Gid)
				}
				if err := unix.Fchownat(dirfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					return err
				}
			}
			if a.Mode != nil && kind != KindSymlink {
				if kind == KindSpecial {
					m.Mode = m.Mode&syscall.S_IFMT | *a.Mode&0o7777
					if err := e.writeMeta(p, m); err != nil {
						return err
					}
					e.shareSpecialMode(p, m)
					if _, err := e.upper.getxattr(p, aclAccessXattr, nil); err == nil {
						// chmod rewrites an access ACL's entries;
						// the upper file's is the one shown.
						if err := unix.Fchmodat(dirfd, name, *a.Mode&0o777|0o600, 0); err != nil {
							return err
						}
					}
				} else if err := unix.Fchmodat(dirfd, name, *a.Mode&0o7777, 0); err != nil {
					return err
				}
			}
			if a.Atime != nil || a.Mtime != nil {
				omit := unix.Timespec{Nsec: unix.UTIME_OMIT}
				ts := []unix.Timespec{omit, omit}
				if a.Atime != nil {
					ts[0] = *a.Atime
				}
				if a.Mtime != nil {
					ts[1] = *a.Mtime
				}
				if err := unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	if err != nil {
		return nil, err
	}
	st, err := lyr.lstat(rel)
	if err != nil {
		return nil, err
	}
	if m != nil {
		decorate(st, m)
	} else {
		st.Ino = e.viewIno(st)
	}
	return st, nil
}

// rootSetattrLocked answers an attribute change of the mount's root in
// staged mode. The root is the workspace's own directory, which has no
// pending entry to hold a change, so a change of mode or owner is refused
// (EPERM) unless it changes nothing, and new times are accepted without
// being kept: tar, cp -a and rsync set the times of the directory they
// extract into, and failing that call would fail the whole copy.
func (e *Engine) rootSetattrLocked(a SetAttr) (*syscall.Stat_t, error) {
	st, err := e.base.lstat("")
	if err != nil {
		return nil, err
	}
	if (a.Mode != nil && *a.Mode&0o7777 != st.Mode&0o7777) ||
		(a.Uid != nil && *a.Uid != st.Uid) || (a.Gid != nil && *a.Gid != st.Gid) {
		e.logf("staged mode: refused an owner or mode change of the mount's root (the workspace's own directory is changed only in immediate mode)")
		return nil, syscall.EPERM
	}
	st.Ino = e.viewIno(st)
	return st, nil
}

// withParentOrRoot is withParent that also accepts the root (name ".").
func (l layer) withParentOrRoot(rel string, fn func(dirfd int, name string) error) error {
	if rel == "" {
		return fn(l.fd, ".")
	}
	return l.withParent(rel, fn)
}

func (l layer) truncate(rel string, size int64) error {
	fd, err := l.open(rel, unix.O_WRONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Ftruncate(fd, size)
}

// inPlaceContainer reports whether l is a container directory at the
// place of its workspace directory.
func inPlaceContainer(l loc) bool {
	return l.m != nil && l.m.Kind == KindDir && l.m.Container && l.m.Redirect == "" && l.hasBase
}

// containerChanged makes the container directory p a change of its own
// (its mode, owner, times or xattrs are about to change). Its xattrs are
// taken from the workspace directory again first: until now the view
// showed those (see xattrTarget), not the copy made with the container.
func (e *Engine) containerChanged(p string, l loc, m *meta, c Caller) error {
	if inPlaceContainer(l) && e.baseStat(l) != nil {
		err := e.upper.withParent(p, func(dirfd int, name string) error {
			fd, err := openatRetry(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			eachXattr(e.upper, p, func(name string, _ []byte) { unix.Fremovexattr(fd, name) })
			copyXattrs(e.base, l.basePath, fd)
			unix.Fremovexattr(fd, removedXattrs) // the workspace's, afresh
			return nil
		})
		if err != nil {
			return err
		}
	}
	nm := *m
	nm.Container, nm.Pid, nm.Comm = false, c.Pid, c.Comm
	if err := e.writeMeta(p, &nm); err != nil {
		return err
	}
	*m = nm
	return nil
}

// shareSpecialMode gives the mode of the special p (kept in its meta, not
// on its upper file) to its other names: it belongs to the inode they
// share. Only a special with more than one name pays for the search.
func (e *Engine) shareSpecialMode(p string, m *meta) {
	st, err := e.upper.lstat(p)
	if err != nil || st.Nlink < 2 {
		return
	}
	for q, om := range e.index {
		if q != p && om.uino == m.uino && om.Kind == KindSpecial && !om.Deleted {
			om.Mode = m.Mode
		}
	}
}

// aclAccessXattr holds a POSIX access ACL; setting it sets the permission
// bits too (cp -a and rsync -A preserve modes with it).
const aclAccessXattr = "system.posix_acl_access"

// specialModeFromACL takes the permission bits an access ACL just set on
// the special p's upper file into its mode, which lives in its meta.
func (e *Engine) specialModeFromACL(p string, m *meta) error {
	st, err := e.upper.lstat(p)
	if err != nil {
		return err
	}
	m.Mode = m.Mode&^0o777 | st.Mode&0o777
	if err := e.writeMeta(p, m); err != nil {
		return err
	}
	e.shareSpecialMode(p, m)
	return nil
}

// Getxattr reads an extended attribute; stagefs's own are invisible.
func (e *Engine) Getxattr(p, attr string, buf []byte) (int, error) {
	if strings.HasPrefix(attr, xattrPrefix) {
		return 0, unix.ENODATA
	}
	e.rlock()
	defer e.runlock()
	lyr, rel, err := e.xattrTarget(p)
	if err != nil {
		return 0, err
	}
	return lyr.getxattr(rel, attr, buf)
}

// Listxattr lists extended attribute names (NUL separated), without
// stagefs's own.
func (e *Engine) Listxattr(p string) ([]byte, error) {
	e.rlock()
	defer e.runlock()
	lyr, rel, err := e.xattrTarget(p)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 64<<10)
	n, err := lyr.listxattr(rel, buf)
	if err != nil {
		return nil, err
	}
	var out []byte
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name != "" && !strings.HasPrefix(name, xattrPrefix) {
			out = append(append(out, name...), 0)
		}
	}
	return out, nil
}

// xattrTarget returns where p's xattrs are kept: on its upper entry when
// it is staged (a symlink's or special's upper file holds theirs too), else
// on the workspace's entry, as for a container in its place, which only
// holds changes below it and shows the workspace directory's own xattrs as
// they are. (A container moved elsewhere, Redirect set, shows the copy
// made with it, which the move carried along.)
func (e *Engine) xattrTarget(p string) (layer, string, error) {
	l, err := e.locate(p)
	if err != nil {
		return layer{}, "", err
	}
	if inPlaceContainer(l) && e.baseStat(l) != nil {
		return e.base, l.basePath, nil
	}
	if l.m != nil {
		if l.deleted() {
			return layer{}, "", syscall.ENOENT
		}
		return e.upper, p, nil
	}
	if !l.hasBase {
		return layer{}, "", syscall.ENOENT
	}
	return e.base, l.basePath, nil
}

// Setxattr sets an extended attribute (copying p up first).
func (e *Engine) Setxattr(p, attr string, val []byte, flags int, c Caller) error {
	return e.changeXattr(p, attr, c, "setxattr", func(l layer, rel string) error {
		return l.setxattr(rel, attr, val, flags)
	})
}

// Removexattr removes an extended attribute (copying p up first).
func (e *Engine) Removexattr(p, attr string, c Caller) error {
	return e.changeXattr(p, attr, c, "removexattr", func(l layer, rel string) error {
		return l.removexattr(rel, attr)
	})
}

func (e *Engine) changeXattr(p, attr string, c Caller, op string, fn func(layer, string) error) error {
	if strings.HasPrefix(attr, xattrPrefix) {
		return syscall.EPERM
	}
	c = e.named(c)
	err := e.locked(func() error {
		e.pushForks(p)
		if err := e.capture(c, p); err != nil {
			return err
		}
		if e.mode == Immediate {
			if err := e.immediateHidden(p, ""); err != nil {
				return err
			}
			return fn(e.base, p)
		}
		l, err := e.locate(p)
		if err != nil {
			return err
		}
		m, err := e.copyUp(p, l, forAttrs, c)
		if err != nil {
			return err
		}
		if (m.Kind == KindSymlink || m.Kind == KindSpecial) && strings.HasPrefix(attr, "user.") {
			// As on ext4 and most local file systems: user xattrs
			// only on regular files and directories. The upper file
			// standing for the entry is a regular one and would take
			// them.
			return syscall.EPERM
		}
		if m.Kind == KindDir && m.Container {
			if err := e.containerChanged(p, l, m, c); err != nil {
				return err
			}
		} else if err := e.changedBy(p, m, c, false); err != nil {
			return err
		}
		if err := fn(e.upper, p); err != nil {
			return err
		}
		if m.Kind == KindDir {
			if err := e.noteDirXattr(p, attr, op == "removexattr"); err != nil {
				return err
			}
		}
		if m.Kind == KindSpecial && attr == aclAccessXattr {
			return e.specialModeFromACL(p, m)
		}
		return nil
	})
	if err == nil {
		err = e.recordStaging(Record{Op: op, Path: p, Pid: c.Pid, Comm: c.Comm, Detail: attr})
		e.changed()
	}
	return err
}

// DirStatter stats the entries of one directory of the view as Stat does,
// for a listing whose every entry the kernel looks up at once
// (READDIRPLUS). The workspace directory behind it is opened once, so an
// entry costs one fstatat instead of a walk from the workspace's root, an
// fstatat and a close. Each Stat is fresh; only the directory descriptor
// is kept, and it is used only while the directory's view still comes
// from the place it was opened at.
type DirStatter struct {
	e        *Engine
	dir      string
	basePath string // where baseFd was opened
	baseFd   int    // -1: no workspace directory behind dir
}

// OpenDirStatter opens a DirStatter for the directory p. Close releases it.
func (e *Engine) OpenDirStatter(p string) *DirStatter {
	s := &DirStatter{e: e, dir: p, baseFd: -1}
	e.rlock()
	defer e.runlock()
	l, err := e.locate(p)
	if err != nil || l.deleted() {
		return s
	}
	basePath, ok := l.listedBase()
	if !ok {
		return s
	}
	if fd, err := e.base.openDirRead(basePath); err == nil {
		s.baseFd, s.basePath = fd, basePath
	}
	return s
}

// LookupStat is Engine.LookupStat of the entry name of the directory.
func (s *DirStatter) LookupStat(name string) (*syscall.Stat_t, bool, error) {
	e := s.e
	p := joinPath(s.dir, name)
	e.rlock()
	defer e.runlock()
	l, err := e.locate(p)
	if err != nil {
		return nil, false, err
	}
	if l.m != nil || !l.hasBase || s.baseFd < 0 || l.basePath != joinPath(s.basePath, name) {
		st, err := e.statLoc(p, l)
		return st, err == nil && l.sharedBaseName(st), err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(s.baseFd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, false, err
	}
	sst := toSyscallStat(&st)
	sst.Ino = e.viewIno(sst)
	return sst, l.sharedBaseName(sst), nil
}

// Close releases the directory descriptor.
func (s *DirStatter) Close() {
	if s.baseFd >= 0 {
		unix.Close(s.baseFd)
		s.baseFd = -1
	}
}
