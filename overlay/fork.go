package overlay

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A fork copies this engine's pending set, as it is at one instant, into
// a new state dir, so that an engine opened there over the same workspace
// shows what this one showed, inode numbers included, and from then on
// changes on its own (a branch). Fork takes the instant: under the change
// gate it notes the paths to copy (the fork's manifest) and copies at once
// only the files a process holds open for writing, whose passthrough
// writes the engine never sees. Everything else is copied by
// ForkCopy.Run, while this engine goes on changing: every change first
// pushes into the copy what it is about to change of the manifest
// (pushForks, called by every operation that changes the upper tree as
// soon as it holds e.mu: restores and rollbacks change through those
// operations), and the daemon's changes of the whole pending set (commit,
// discard, a mode switch) finish the copy first (finishForks). The cost at
// the instant is that of listing the pending set in memory and copying the
// files held open for writing; the copy's, that of the pending set, never
// the workspace's. A change of a file the copy has not reached yet waits
// for that file's copy.

// ForkCopy is a fork whose instant is taken and whose copy is not done.
type ForkCopy struct {
	e *Engine
	f *forkCopy
	// left holds the manifest's paths not copied yet; keys the whole
	// manifest. Both, and f, are used under e.mu until the copy is
	// done: the copier holds it shared, a change that pushes holds it
	// alone.
	left map[string]bool
	keys []string
	dst  string
	err  error // the first copy that failed; the fork fails with it
	// rootTimes are the upper tree's root's at the instant: the view
	// shows its mtime when it is the later (Engine.rootTimes).
	rootTimes []unix.Timespec
	// inomapSize is the inode map's length at the instant: a commit
	// only appends to it, so its first inomapSize bytes are the
	// instant's map.
	inomapSize int64
}

// Fork takes a fork's instant into the new state dir dst; Run copies the
// rest. Until Run returns, this engine copies what it changes of the
// manifest into dst first.
func (e *Engine) Fork(dst string) (*ForkCopy, error) {
	// The gate keeps every change out until the fork is attached; the
	// engine lock is shared meanwhile, so reads go on while the files
	// held open are copied.
	e.lockGate()
	defer e.unlockGate()
	fk, err := e.forkInstant(dst)
	if err != nil {
		return nil, err
	}
	e.lockMu()
	e.forks = append(e.forks, fk)
	e.unlockMu()
	return fk, nil
}

// forkInstant notes what Fork copies, and copies the files held open for
// writing; the caller holds the change gate.
func (e *Engine) forkInstant(dst string) (*ForkCopy, error) {
	e.rlock()
	defer e.runlock()
	if e.mode != Staged {
		return nil, errors.New("only a staged mount can fork: in immediate mode nothing is pending")
	}
	f, err := newForkCopy(e, dst)
	if err != nil {
		return nil, err
	}
	fk := &ForkCopy{e: e, f: f, dst: dst, left: make(map[string]bool, len(e.index)), keys: make([]string, 0, len(e.index))}
	var rst unix.Stat_t
	if err := unix.Fstat(e.upper.fd, &rst); err != nil {
		f.close()
		return nil, err
	}
	fk.rootTimes = []unix.Timespec{rst.Atim, rst.Mtim}
	if e.inos != nil {
		fk.inomapSize = e.inos.length()
	}
	for p := range e.index {
		fk.keys = append(fk.keys, p)
		fk.left[p] = true
	}
	for p, m := range e.index {
		if m.Kind == KindFile && e.writers[m.uino] > 0 {
			fk.push(p)
		}
	}
	if fk.err != nil {
		f.close()
		return nil, fk.err
	}
	return fk, nil
}

// Run copies what is left of the fork, makes the copy durable and ends
// the engine's pushes into it. It returns the first failure, after which
// dst is incomplete and must go.
func (fk *ForkCopy) Run() error {
	defer fk.f.close()
	// Deferred, so that a copy that panics does not leave the engine
	// pushing into it.
	defer fk.detach()
	// Parents before their entries (sorted by depth, then name).
	sort.Slice(fk.keys, func(i, j int) bool {
		if di, dj := depth(fk.keys[i]), depth(fk.keys[j]); di != dj {
			return di < dj
		}
		return fk.keys[i] < fk.keys[j]
	})
	for i := 0; i < len(fk.keys); {
		i += fk.copyLeft(fk.keys[i:])
	}
	// Everything is copied now, by the loop or by a change's push: no
	// push can fail any more.
	if fk.err != nil {
		return fk.err
	}
	// A directory's mode and times last, deepest first: making its
	// entries moved its times, and its mode may forbid making them.
	for i := len(fk.f.dirs) - 1; i >= 0; i-- {
		if err := fk.f.dirAttrs(fk.f.dirs[i]); err != nil {
			return fmt.Errorf("fork %s: %w", fk.f.dirs[i].path, err)
		}
	}
	if err := unix.UtimesNano(filepath.Join(fk.dst, "upper"), fk.rootTimes); err != nil {
		return fmt.Errorf("fork the root's times: %w", err)
	}
	if err := copyPrefix(filepath.Join(fk.e.opts.StateDir, "inomap"), filepath.Join(fk.dst, "inomap"), fk.inomapSize); err != nil {
		return fmt.Errorf("fork the inode map: %w", err)
	}
	return unix.Syncfs(fk.f.dst.fd)
}

// A batch of the copy holds the engine lock for at most batchEntries
// entries or batchBytes bytes (a batch of small files takes about half a
// millisecond), so that changes waiting for the lock get it between them.
const (
	batchEntries = 16
	batchBytes   = 4 << 20
)

// copyLeft copies what is left of a batch of paths' first ones, holding
// the engine lock shared, and returns how many it went through.
func (fk *ForkCopy) copyLeft(paths []string) int {
	fk.e.rlock()
	defer fk.e.runlock()
	start := fk.f.bytes
	for i, p := range paths {
		fk.copyIfLeft(p)
		if i+1 == batchEntries || fk.f.bytes-start >= batchBytes {
			return i + 1
		}
	}
	return len(paths)
}

// detach ends the engine's pushes into the fork.
func (fk *ForkCopy) detach() {
	fk.e.lockMu()
	defer fk.e.unlockMu()
	fk.e.forks = slices.DeleteFunc(fk.e.forks, func(x *ForkCopy) bool { return x == fk })
}

// pushForks copies into every fork in progress what it has left to copy
// of the paths about to change: each path, what the index holds below it
// (a directory moved or removed), and the directories above it (whose
// times the change moves). The caller holds e.mu alone.
func (e *Engine) pushForks(paths ...string) {
	for _, fk := range e.forks {
		for _, p := range paths {
			fk.push(p)
		}
	}
}

// finishForks copies everything the forks in progress have left: for a
// change of the whole pending set. The caller holds e.mu alone.
func (e *Engine) finishForks() { e.pushForks("") }

func (fk *ForkCopy) push(p string) {
	if len(fk.left) == 0 {
		return
	}
	if p != "" {
		dir := ""
		for _, name := range strings.Split(p, "/") {
			fk.copyIfLeft(joinPath(dir, name))
			dir = joinPath(dir, name)
		}
	}
	var below func(string)
	below = func(d string) {
		for name := range fk.e.children[d] {
			q := joinPath(d, name)
			fk.copyIfLeft(q)
			below(q)
		}
	}
	below(p)
}

// copyIfLeft copies p if the fork has it left to copy.
func (fk *ForkCopy) copyIfLeft(p string) {
	if !fk.left[p] || fk.err != nil {
		return
	}
	delete(fk.left, p)
	m := fk.e.index[p]
	if m == nil {
		fk.err = fmt.Errorf("fork %s: gone from the pending set before it was copied", p)
		return
	}
	// Failed until it is done: a copy that panics inside a change's push
	// (which the control server recovers) must not leave a fork that
	// silently lacks p.
	fk.err = fmt.Errorf("fork %s: its copy stopped", p)
	if err := fk.f.entry(p, m); err != nil {
		fk.err = fmt.Errorf("fork %s: %w", p, err)
		return
	}
	fk.err = nil
}

// forkCopy copies upper entries of e into dst's upper tree.
type forkCopy struct {
	e     *Engine
	dst   layer
	links map[uint64]string // upper inode -> its first copy (hard links stay one file)
	dirs  []forkedDir       // the directories copied, in the order copied (parents first)
	// dirIno holds the inode numbers of the copies' directories, for the
	// metas placed in them.
	dirIno map[string]uint64
	// names and value are the xattr buffers, reused for every entry.
	names, value []byte
	bytes        int64 // copied so far
}

// forkedDir is a directory copied, with the mode and times it had then.
type forkedDir struct {
	path         string
	mode         uint32
	atime, mtime unix.Timespec
}

func newForkCopy(e *Engine, dst string) (*forkCopy, error) {
	if err := os.MkdirAll(filepath.Join(dst, "upper"), 0o700); err != nil {
		return nil, err
	}
	root, err := unix.Open(filepath.Join(dst, "upper"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	var rst unix.Stat_t
	if err := unix.Fstat(root, &rst); err != nil {
		unix.Close(root)
		return nil, err
	}
	// The copy's directories are cached as the upper tree's are: without
	// it every step of every entry opened its directory from the root.
	return &forkCopy{e: e, dst: layer{fd: root, dirs: newDirCache()}, links: map[uint64]string{}, dirIno: map[string]uint64{"": rst.Ino},
		names: make([]byte, 64<<10), value: make([]byte, 64<<10)}, nil
}

func (f *forkCopy) close() {
	f.dst.dirs.flush()
	unix.Close(f.dst.fd)
}

// entry copies the upper entry p, whose meta is m. Its directory is
// copied already.
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
		err = f.dst.withDir(dir, func(dirfd int) error {
			if err := unix.Mkdirat(dirfd, name, 0o700); err != nil {
				return err
			}
			return chownAt(dirfd, name, st)
		})
		f.dirs = append(f.dirs, forkedDir{path: p, mode: st.Mode & 0o7777, atime: unix.Timespec(st.Atim), mtime: unix.Timespec(st.Mtim)})
	case syscall.S_IFREG:
		// Another name of a file copied already: names the manifest
		// holds at once are alive together, so one number is one file.
		if first, ok := f.links[st.Ino]; ok {
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
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		return nil
	}
	return f.dst.withParent(p, func(dirfd int, name string) error {
		ts := []unix.Timespec{unix.Timespec(st.Atim), unix.Timespec(st.Mtim)}
		return unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
	})
}

// chownAt gives the entry name in dirfd the owner in st, as far as the
// daemon may (one not root keeps its own).
func chownAt(dirfd int, name string, st *syscall.Stat_t) error {
	if err := unix.Fchownat(dirfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.EPERM) {
		return err
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
			f.bytes += st.Size
		}
		// The owner, then the mode, then (in entry) the xattrs: a chown
		// clears set-id bits and a file capability, and a write the
		// capability too. The mode after the copy: a body may be
		// read-only to its owner.
		if err := chownAt(dirfd, name, st); err != nil {
			return err
		}
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

// dirAttrs gives the copy of a directory the mode and times it had.
func (f *forkCopy) dirAttrs(d forkedDir) error {
	return f.dst.withParent(d.path, func(dirfd int, name string) error {
		if err := unix.Fchmodat(dirfd, name, d.mode, 0); err != nil {
			return err
		}
		return unix.UtimesNanoAt(dirfd, name, []unix.Timespec{d.atime, d.mtime}, unix.AT_SYMLINK_NOFOLLOW)
	})
}

// copyPrefix copies the first n bytes of the file src to dst (not made
// durable: Run's syncfs does); nothing when n is 0.
func copyPrefix(src, dst string, n int64) error {
	if n == 0 {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(out, in, n); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
