package overlay

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ForkHooks are called by Fork while it holds the change gate.
type ForkHooks struct {
	// Forked is called once the gate is held, before the copy: the fork's
	// instant. An error stops the fork before anything was copied.
	Forked func() error
	// Copied is called once the copy is durable, before the gate is let
	// go of: the last moment at which nothing has changed since Forked.
	Copied func() error
}

// Fork writes, into the new state dir dst, a pending set equal to this
// engine's at this instant: a copy of the upper tree with each meta placed
// for its new directory, and the inode map, so that an engine opened on
// dst over the same workspace shows what this one shows, inode numbers
// included, and from then on changes on its own (a branch). The change
// gate is held throughout, so no change falls half into the copy; the cost
// is that of copying the pending set, never the workspace. The hooks let a
// caller answer at the fork's instant and finish before changes resume.
func (e *Engine) Fork(dst string, hooks ForkHooks) error {
	e.lockGate()
	defer e.unlockGate()
	e.rlock()
	defer e.runlock()
	if e.mode != Staged {
		return errors.New("only a staged mount can fork: in immediate mode nothing is pending")
	}
	if hooks.Forked != nil {
		if err := hooks.Forked(); err != nil {
			return err
		}
	}
	if err := e.forkCopy(dst); err != nil {
		return err
	}
	if hooks.Copied != nil {
		return hooks.Copied()
	}
	return nil
}

// forkCopy is Fork's copy, made under its locks.
func (e *Engine) forkCopy(dst string) error {
	if err := os.MkdirAll(filepath.Join(dst, "upper"), 0o700); err != nil {
		return err
	}
	root, err := unix.Open(filepath.Join(dst, "upper"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(root)
	var rst unix.Stat_t
	if err := unix.Fstat(root, &rst); err != nil {
		return err
	}
	// The copy's directories are cached as the upper tree's are: without
	// it every step of every entry opened its directory from the root.
	dirs := newDirCache()
	defer dirs.flush()
	f := &forkCopy{e: e, dst: layer{fd: root, dirs: dirs}, links: map[uint64]string{}, dirIno: map[string]uint64{"": rst.Ino},
		names: make([]byte, 64<<10), value: make([]byte, 64<<10)}
	paths := make([]string, 0, len(e.index))
	for p := range e.index {
		paths = append(paths, p)
	}
	// Parents before their entries (sorted by depth, then name), and a
	// directory's times set only after everything in it was made.
	sort.Slice(paths, func(i, j int) bool {
		if di, dj := depth(paths[i]), depth(paths[j]); di != dj {
			return di < dj
		}
		return paths[i] < paths[j]
	})
	for _, p := range paths {
		if err := f.entry(p, e.index[p]); err != nil {
			return fmt.Errorf("fork %s: %w", p, err)
		}
	}
	for i := len(f.dirs) - 1; i >= 0; i-- {
		if err := f.dirMode(f.dirs[i]); err != nil {
			return fmt.Errorf("fork %s: %w", f.dirs[i], err)
		}
		if err := f.times(f.dirs[i]); err != nil {
			return fmt.Errorf("fork %s: %w", f.dirs[i], err)
		}
	}
	if err := copyFileIfExists(filepath.Join(e.opts.StateDir, "inomap"), filepath.Join(dst, "inomap")); err != nil {
		return fmt.Errorf("fork the inode map: %w", err)
	}
	return unix.Syncfs(root)
}

// forkCopy is one Fork's copy of the upper tree into dst.
type forkCopy struct {
	e     *Engine
	dst   layer
	links map[uint64]string // upper inode -> its first copy (hard links stay one file)
	dirs  []string          // the directories copied, parents first
	// dirIno holds the inode numbers of the copies' directories, for the
	// metas placed in them.
	dirIno map[string]uint64
	// names and value are the xattr buffers, reused for every entry.
	names, value []byte
}

// entry copies the upper entry p, whose meta is m.
func (f *forkCopy) entry(p string, m *meta) error {
	src := f.e.upper
	st, err := src.lstat(p)
	if err != nil {
		return err
	}
	dir, name := splitPath(p)
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		// 0700 until everything in it is made (its mode, which may
		// forbid that, comes with its times, last).
		err = f.dst.withDir(dir, func(dirfd int) error { return unix.Mkdirat(dirfd, name, 0o700) })
		f.dirs = append(f.dirs, p)
	case syscall.S_IFREG:
		if first, ok := f.links[st.Ino]; ok && st.Nlink > 1 {
			return f.dst.withParent(first, func(fdir int, fname string) error {
				return f.dst.withDir(dir, func(dirfd int) error { return unix.Linkat(fdir, fname, dirfd, name, 0) })
			})
		}
		f.links[st.Ino] = p
		err = f.file(p, st)
	default:
		// The upper tree holds only directories and regular files (a
		// symlink's target and a special file's kind are in their metas).
		return fmt.Errorf("unexpected file type %o in the upper tree", st.Mode&syscall.S_IFMT)
	}
	if err != nil {
		return err
	}
	if err := f.xattrs(p); err != nil {
		return err
	}
	// The meta, placed for the copy's directory (see meta.Dir).
	dstDir, ok := f.dirIno[dir]
	if !ok {
		dst, err := f.dst.lstat(dir)
		if err != nil {
			return err
		}
		dstDir = dst.Ino
		f.dirIno[dir] = dstDir
	}
	nm := *m
	nm.Dir, nm.NameSum = dstDir, nameSum(name)
	if err := f.dst.setxattr(p, metaXattr, nm.encode(), 0); err != nil {
		return err
	}
	if err := f.dst.withParent(p, func(dirfd int, name string) error {
		return unix.Fchownat(dirfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
	}); err != nil && !errors.Is(err, unix.EPERM) {
		return err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return f.times(p)
	}
	return nil
}

// file copies the regular upper file p (stat st): in the kernel, a reflink
// where the file system shares extents.
func (f *forkCopy) file(p string, st *syscall.Stat_t) error {
	in, err := f.e.upper.open(p, unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(in)
	dir, name := splitPath(p)
	return f.dst.withDir(dir, func(dirfd int) error {
		out, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return err
		}
		defer unix.Close(out)
		if st.Size > 0 {
			if err := copyFd(in, out, st.Size); err != nil {
				return err
			}
		}
		// The mode after the copy: a body may be read-only to its owner.
		return unix.Fchmod(out, st.Mode&0o7777)
	})
}

// xattrs copies every xattr of the upper entry p, stagefs's own included.
func (f *forkCopy) xattrs(p string) error {
	n, err := f.e.upper.listxattr(p, f.names)
	if err != nil || n <= 0 {
		return err
	}
	for _, name := range strings.Split(string(f.names[:n]), "\x00") {
		if name == "" || name == metaXattr {
			continue
		}
		vn, err := f.e.upper.getxattr(p, name, f.value)
		if err != nil {
			return err
		}
		if err := f.dst.setxattr(p, name, f.value[:vn], 0); err != nil {
			return err
		}
	}
	return nil
}

// dirMode gives the copy of the directory p the upper directory's mode.
func (f *forkCopy) dirMode(p string) error {
	st, err := f.e.upper.lstat(p)
	if err != nil {
		return err
	}
	return f.dst.withParent(p, func(dirfd int, name string) error {
		return unix.Fchmodat(dirfd, name, st.Mode&0o7777, 0)
	})
}

// times gives the copy of p the upper entry's times.
func (f *forkCopy) times(p string) error {
	st, err := f.e.upper.lstat(p)
	if err != nil {
		return err
	}
	ts := []unix.Timespec{unix.Timespec(st.Atim), unix.Timespec(st.Mtim)}
	return f.dst.withParent(p, func(dirfd int, name string) error {
		return unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
	})
}

// copyFileIfExists copies the file src to dst, made durable; nothing when
// src does not exist.
func copyFileIfExists(src, dst string) error {
	b, err := os.ReadFile(src)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}
