package overlay

import (
	"errors"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"stagefs/internal/fdio"
)

// writeMeta stores m on the upper entry at p.
func (e *Engine) writeMeta(p string, m *meta) error {
	return e.writeMetaFor(p, p, m)
}

// writeMetaFor stores on the upper entry at p the meta m describes it with
// once it is at dest (a rename writes it before it moves the entry).
func (e *Engine) writeMetaFor(p, dest string, m *meta) error {
	if p == dest {
		m.Was = nil // it is where it is: nothing to put back
	}
	e.placeMeta(m, dest)
	if err := e.upper.setxattr(p, metaXattr, m.encode(), 0); err != nil {
		return err
	}
	if p == dest {
		e.noteShown(p, m) // a number changed in place (a rename notes it as it moves the entry)
	}
	m.unsaved = false
	return nil
}

// placeMeta sets the place m is written for (see meta.Dir).
func (e *Engine) placeMeta(m *meta, p string) {
	dir, name := splitPath(p)
	m.Dir, m.NameSum = e.upperDirIno(dir), nameSum(name)
}

// upperDirIno returns the inode number of the upper directory dir, 0 when
// it has none.
func (e *Engine) upperDirIno(dir string) uint64 {
	if dir == "" {
		return e.upperRootIno
	}
	if m := e.index[dir]; m != nil && m.Kind == KindDir {
		return m.uino
	}
	return 0
}

// ensureUpperDir makes sure the directory p of the merged view has an upper
// directory, creating containers (copies of the base directory's mode,
// owner and times) for it and its ancestors.
func (e *Engine) ensureUpperDir(p string) error {
	if p == "" {
		return nil
	}
	if m := e.index[p]; m != nil {
		if m.Kind != KindDir || m.Deleted {
			return syscall.ENOTDIR
		}
		return nil
	}
	dir, name := splitPath(p)
	if err := e.ensureUpperDir(dir); err != nil {
		return err
	}
	l, err := e.locate(p)
	if err != nil {
		return err
	}
	st := e.baseStat(l)
	if st == nil {
		return syscall.ENOENT
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return syscall.ENOTDIR
	}
	m := &meta{Kind: KindDir, Container: true, Ino: e.baseInoAt(p, st), Base: baselineOf(st), Time: time.Now().UnixNano()}
	restoreTimes := e.keepDirTimes(dir)
	defer restoreTimes()
	err = e.upper.withParent(p, func(dirfd int, _ string) error {
		if err := unix.Mkdirat(dirfd, name, st.Mode&0o7777); err != nil {
			return err
		}
		fd, err := openatRetry(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		// The view reads a staged directory's xattrs from its upper
		// directory, so the container carries the workspace's.
		copyXattrs(e.base, l.basePath, fd)
		return e.finishUpper(fd, p, st, m)
	})
	if err != nil {
		return err
	}
	e.setEntry(p, m)
	return nil
}

// finishUpper gives a new upper entry (open as fd, to be at p) the owner,
// mode, times and meta it must have.
func (e *Engine) finishUpper(fd int, p string, st *syscall.Stat_t, m *meta) error {
	var ust unix.Stat_t
	if err := unix.Fstat(fd, &ust); err != nil {
		return err
	}
	m.uino = ust.Ino
	if ust.Uid != st.Uid || ust.Gid != st.Gid { // (a new file of the daemon's own is not chowned)
		if err := unix.Fchown(fd, int(st.Uid), int(st.Gid)); err != nil && err != unix.EPERM {
			return err
		}
	}
	// chown clears set-id bits, so the mode is set after it.
	if err := unix.Fchmod(fd, st.Mode&0o7777); err != nil {
		return err
	}
	e.placeMeta(m, p)
	if err := unix.Fsetxattr(fd, metaXattr, m.encode(), 0); err != nil {
		return err
	}
	ts := []unix.Timespec{unix.Timespec(st.Atim), unix.Timespec(st.Mtim)}
	return unix.UtimesNanoAt(unix.AT_FDCWD, fdPath(fd), ts, 0)
}

// copyFor says what a copy-up is for.
type copyFor uint8

const (
	// forContent: the body may change (open for writing, a truncate to a
	// non-zero size, rename, link).
	forContent copyFor = iota
	// forTruncate: the body is about to be emptied (O_TRUNC, truncate to
	// 0), so it is not copied.
	forTruncate
	// forAttrs: only attributes change (chmod, chown, utimens, xattrs):
	// the copy is marked AttrOnly.
	forAttrs
)

// copyUp gives the non-directory p an upper copy of its base entry, unless
// it already has one, which it returns as it is (the caller notes its
// change with changedBy). c is recorded as the process behind the change,
// for status.
func (e *Engine) copyUp(p string, l loc, why copyFor, c Caller) (*meta, error) {
	return e.copyUpFrom(p, l, nil, why, c)
}

// copyUpFrom is copyUp for a caller that has the base entry's lstat
// already (bst; nil: copyUp takes it).
func (e *Engine) copyUpFrom(p string, l loc, bst *syscall.Stat_t, why copyFor, c Caller) (*meta, error) {
	if p == "" {
		// The root is the workspace's own directory: it has no pending
		// entry to copy up to (see rootSetattrLocked).
		return nil, syscall.EPERM
	}
	if l.m != nil {
		if l.deleted() {
			return nil, syscall.ENOENT
		}
		return l.m, nil
	}
	st := bst
	if st == nil {
		if st = e.baseStat(l); st == nil {
			return nil, syscall.ENOENT
		}
	}
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		if err := e.ensureUpperDir(p); err != nil {
			return nil, err
		}
		return e.index[p], nil
	}
	dir, name := splitPath(p)
	if err := e.ensureUpperDir(dir); err != nil {
		return nil, err
	}
	c = e.named(c)
	m := &meta{Ino: e.baseInoAt(p, st), Base: baselineOf(st), Pid: c.Pid, Comm: c.Comm, Time: time.Now().UnixNano(), AttrOnly: why == forAttrs}
	if st.Nlink > 1 {
		// One name of a workspace hard link, copied up alone: a file of
		// its own from now on, with a number of its own (the upper
		// file's), or the kernel would take it for its other names.
		m.Ino = 0
	}
	tmp := e.tmpName()
	dst, err := unix.Openat(e.workFd, tmp, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		unix.Close(dst)
		if !ok {
			unix.Unlinkat(e.workFd, tmp, 0)
		}
	}()
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		m.Kind = KindFile
		if why == forTruncate {
			// Not even opened: truncating a file keeps only its xattrs.
			copyXattrs(e.base, l.basePath, dst)
			break
		}
		if err := e.copyBody(l.basePath, dst, st.Size); err != nil {
			return nil, err
		}
	case syscall.S_IFLNK:
		m.Kind = KindSymlink
		target, err := e.base.readlink(l.basePath)
		if err != nil {
			return nil, err
		}
		if _, err := unix.Write(dst, []byte(target)); err != nil {
			return nil, err
		}
	default:
		m.Kind, m.Mode, m.Rdev = KindSpecial, st.Mode, st.Rdev
	}
	if m.Kind != KindFile {
		// The upper file stands for the symlink or special and keeps
		// its xattrs (trusted.*, security.*; user.* cannot be on one).
		copyXattrs(e.base, l.basePath, dst)
	}
	fst := *st
	if m.Kind != KindFile {
		fst.Mode = syscall.S_IFREG | 0o644
	}
	if err := e.finishUpper(dst, p, &fst, m); err != nil {
		return nil, err
	}
	restoreTimes := e.keepDirTimes(dir)
	if err := e.upper.withParent(p, func(dirfd int, _ string) error {
		return renameFileAt(e.workFd, tmp, dirfd, name, unix.RENAME_NOREPLACE)
	}); err != nil {
		return nil, err
	}
	restoreTimes()
	ok = true
	e.setEntry(p, m)
	e.copyGen.Add(1)
	return m, nil
}

// keepDirTimes returns a function that gives the upper directory dir back
// the times it has now, when dir only mirrors a workspace directory (a
// container, or the root): a copy-up adds a name to it, which moves its
// mtime, while the view gained no entry there, and a local disk keeps a
// directory's times when a file in it only changes (the commit writes the
// container's times to the workspace).
func (e *Engine) keepDirTimes(dir string) func() {
	var st unix.Stat_t
	path := fdPath(e.upper.fd)
	if dir != "" {
		if m := e.index[dir]; m == nil || m.Kind != KindDir || !m.Container {
			return func() {}
		}
		ust, err := e.upper.lstat(dir)
		if err != nil {
			return func() {}
		}
		st = unix.Stat_t{Atim: unix.Timespec(ust.Atim), Mtim: unix.Timespec(ust.Mtim)}
		return func() {
			e.upper.withParent(dir, func(dirfd int, name string) error {
				return unix.UtimesNanoAt(dirfd, name, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
			})
		}
	}
	if unix.Fstat(e.upper.fd, &st) != nil {
		return func() {}
	}
	return func() { unix.UtimesNanoAt(unix.AT_FDCWD, path, []unix.Timespec{st.Atim, st.Mtim}, 0) }
}

// copyBody copies a base file's content and xattrs into dst, the content
// with copy_file_range so filesystems that can share extents (reflink) or
// copy in the kernel do.
func (e *Engine) copyBody(basePath string, dst int, size int64) error {
	src, err := e.base.open(basePath, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer unix.Close(src)
	if err := copyFd(src, dst, size); err != nil {
		return err
	}
	eachXattrOf(src, func(name string, val []byte) { unix.Fsetxattr(dst, name, val, 0) })
	return nil
}

// copyFd copies src, from its offset to its end, onto dst (fdio.Copy:
// in the kernel where it can); size, from a stat, only tells an empty file.
func copyFd(src, dst int, size int64) error {
	_, err := fdio.Copy(src, dst, size)
	return err
}

// copyXattrs copies the entry's xattrs (but stagefs's own) to fd.
// Failures are ignored: some namespaces need privileges the daemon lacks,
// and a missing xattr must not fail the write that caused the copy-up.
func copyXattrs(l layer, rel string, fd int) {
	eachXattr(l, rel, func(name string, val []byte) { unix.Fsetxattr(fd, name, val, 0) })
}

// eachXattr calls fn with the name and value of every xattr of the entry
// rel (not following a symlink), but stagefs's own. val is only valid
// during the call.
func eachXattr(l layer, rel string, fn func(name string, val []byte)) {
	forEachXattr(func(buf []byte) (int, error) { return l.listxattr(rel, buf) },
		func(name string, val []byte) (int, error) { return l.getxattr(rel, name, val) }, fn)
}

// eachXattrOf is eachXattr for an open file.
func eachXattrOf(fd int, fn func(name string, val []byte)) {
	forEachXattr(func(buf []byte) (int, error) { return unix.Flistxattr(fd, buf) },
		func(name string, val []byte) (int, error) { return unix.Fgetxattr(fd, name, val) }, fn)
}

func forEachXattr(list func(buf []byte) (int, error), get func(name string, val []byte) (int, error), fn func(name string, val []byte)) {
	// Small buffers first (a commit copies every file): the kernel says
	// ERANGE when a list or value needs more, up to its 64 KiB limit.
	buf := make([]byte, 1<<10)
	n, err := list(buf)
	if errors.Is(err, unix.ERANGE) {
		buf = make([]byte, 64<<10)
		n, err = list(buf)
	}
	if err != nil || n <= 0 {
		return
	}
	val := make([]byte, 1<<10)
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" || strings.HasPrefix(name, xattrPrefix) {
			continue
		}
		vn, err := get(name, val)
		if errors.Is(err, unix.ERANGE) {
			val = make([]byte, 64<<10)
			vn, err = get(name, val)
		}
		if err != nil {
			continue
		}
		fn(name, val[:vn])
	}
}

func (l layer) readlink(rel string) (string, error) {
	var target string
	err := l.withParent(rel, func(dirfd int, name string) error {
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return err
		}
		target = string(buf[:n])
		return nil
	})
	return target, err
}
