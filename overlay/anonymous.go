package overlay

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// Anonymous files are what open(dir, O_TMPFILE) makes: a regular file with
// no name, gone when its last descriptor closes unless linkat(2) gives it
// one first (glibc's tmpfile(), and tools that write a file whole before it
// appears). Staged, the file is made in work/, on the upper tree's file
// system, so naming it is one link(2) into the upper tree; immediate, it is
// made in the workspace directory itself. Until it is named it is in no
// directory and no pending set: nothing to journal, status or commit.

// OpenAnonymous makes an anonymous regular file for the directory dir of
// the view, with permission bits mode, owned by the caller. The descriptor
// is the caller's to close; LinkAnonymous names the file.
func (e *Engine) OpenAnonymous(dir string, mode uint32, c Caller) (int, *syscall.Stat_t, error) {
	e.rlock()
	defer e.runlock()
	var fd int
	if e.mode == Immediate {
		if err := e.immediateHidden(dir, ""); err != nil {
			return -1, nil, err
		}
		dirfd, err := e.base.openDirRead(dir)
		if err != nil {
			return -1, nil, err
		}
		fd, err = unix.Openat(dirfd, ".", unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, mode&0o7777)
		unix.Close(dirfd)
		if err != nil {
			return -1, nil, err
		}
	} else {
		l, err := e.locate(dir)
		if err != nil {
			return -1, nil, err
		}
		st, err := e.statLoc(dir, l)
		if err != nil {
			return -1, nil, err
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			return -1, nil, syscall.ENOTDIR
		}
		// Readable and writable by its owner, as Create makes files: the
		// daemon opens it again through /proc when the caller does.
		fd, err = unix.Openat(e.workFd, ".", unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, mode&0o7777|0o600)
		if err != nil {
			return -1, nil, err
		}
	}
	chownFd(fd, c)
	if mode&0o600 != 0o600 {
		if err := unix.Fchmod(fd, mode&0o7777); err != nil {
			unix.Close(fd)
			return -1, nil, err
		}
	}
	st, err := e.fstatShown(fd, nil)
	if err != nil {
		unix.Close(fd)
		return -1, nil, err
	}
	return fd, st, nil
}

// LinkAnonymous names the anonymous file open as fd (from OpenAnonymous)
// p: a new file of the view, journaled and captured like any create. A
// file made in one mode and named after a switch to the other may be on
// another file system: that is EXDEV, as linkat says across mounts.
//
// A staged name makes fd a writer of the pending file, as an open for
// writing is, until ReleaseAnonymous(held): its writes bypass the engine,
// so a commit must leave the file for later and a fork copy it at once.
func (e *Engine) LinkAnonymous(fd int, p string, c Caller) (st *syscall.Stat_t, held uint64, err error) {
	c = e.named(c)
	link := func(dirfd int, name string) error {
		// Through /proc, following the link: AT_EMPTY_PATH would need
		// CAP_DAC_READ_SEARCH.
		return unix.Linkat(unix.AT_FDCWD, fdPath(fd), dirfd, name, unix.AT_SYMLINK_FOLLOW)
	}
	st, err = underLock(e, func() (*syscall.Stat_t, error) {
		e.pushForks(p)
		if err := e.capture(c, p); err != nil {
			return nil, err
		}
		if e.mode == Immediate {
			return e.immediateCreate(p, c, link)
		}
		l, m, err := e.prepareNew(p, KindFile, c)
		if err != nil {
			return nil, err
		}
		nfd, err := e.placeNew(p, l, m, func(dirfd int, name string) (int, error) {
			if err := link(dirfd, name); err != nil {
				return -1, err
			}
			return openatRetry(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		})
		if err != nil {
			return nil, err
		}
		defer unix.Close(nfd)
		st, err := e.fstatShown(nfd, m)
		if err != nil {
			return nil, err
		}
		held = m.uino // the upper file's inode, which finishNew noted
		e.writers[held]++
		return st, nil
	})
	if err != nil {
		return nil, 0, err
	}
	return st, held, e.recordOp(c, "create", p, "", 0)
}

// ReleaseAnonymous ends what LinkAnonymous held, once the anonymous
// file's descriptor is closed.
func (e *Engine) ReleaseAnonymous(held uint64) {
	if held == 0 {
		return
	}
	e.lockMu()
	defer e.unlockMu()
	if e.writers[held]--; e.writers[held] <= 0 {
		delete(e.writers, held)
	}
}
