package fusefs

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"stagefs/fuseuring"
	"stagefs/overlay"
)

// Options configure a mount.
type Options struct {
	// Timeout is how long the kernel may cache names and attributes. Changes
	// made through the mount and by commit/discard are invalidated at once;
	// edits made directly in the workspace show after at most this long.
	Timeout time.Duration
	Debug   bool
	// Name shows in /proc/mounts as the source.
	Name string
	// NoPassthrough keeps all file I/O in the daemon even where the
	// kernel could pass pending bodies through (see passthrough.go).
	NoPassthrough bool
	// URing carries requests over io_uring where the kernel can (root,
	// Linux 6.14+; see uring.go and package fuseuring); URingPerQueue is
	// how many ring entries serve each CPU's queue (0: 4, fewer on
	// machines with many CPUs).
	URing         bool
	URingPerQueue int
	// Logf reports what an operator should know (nil: nothing).
	Logf func(format string, args ...any)
}

// FS is a mounted overlay.
type FS struct {
	eng     *overlay.Engine
	timeout time.Duration // Options.Timeout
	watch   *watcher      // nil when inotify is unavailable
	logf    func(format string, args ...any)
	root    *node
	server  *fuse.Server

	// passthrough is set once FUSE passthrough is known to work;
	// passthroughNote says why not.
	passthrough     atomic.Bool
	passthroughNote string
	gensMu          sync.Mutex
	gens            map[uint64]uint64 // inode number -> generation of new nodes, for retired nodes
	heldMu          sync.Mutex
	held            map[*heldWriter]bool // write-opens that are or may become passthrough handles
	kept            keptListings         // listings read part way (dirs.go)
	// mountpoint is where the file system is mounted; ownMount says the
	// daemon mounted it itself (mount.go).
	mountpoint string
	ownMount   bool
	stale      staleOpens // callers whose open lost a race (orphan.go)
	// ring serves requests over io_uring (uring.go); ringNote says why
	// not when it was asked for.
	ring       *fuseuring.Transport
	ringNote   string
	pageSettle time.Duration // see keepPages
}

// Mount mounts eng at mountpoint and returns once the kernel serves it.
func Mount(mountpoint string, eng *overlay.Engine, opts Options) (*FS, error) {
	if opts.Timeout == 0 {
		opts.Timeout = time.Second
	}
	if opts.Name == "" {
		opts.Name = "stagefs"
	}
	sys := &FS{eng: eng, timeout: opts.Timeout, logf: opts.Logf, gens: map[uint64]uint64{}, held: map[*heldWriter]bool{}, pageSettle: pageSettle()}
	if sys.logf == nil {
		sys.logf = func(string, ...any) {}
	}
	sys.root = &node{sys: sys}
	st, err := eng.Stat("")
	if err != nil {
		return nil, err
	}
	// Set before the kernel can send a request: the handlers read it.
	if sys.watch = newWatcher(sys); sys.watch == nil {
		sys.logf("inotify is unavailable: names and attributes are cached for %v only", opts.Timeout)
	}
	sys.watch.add("")
	timeout := opts.Timeout
	// go-fuse gives every negative entry this timeout; a lookup that sets
	// its own gets an uncached ENOENT instead (Lookup).
	negativeTimeout := timeout
	if sys.watch != nil {
		negativeTimeout = WatchedTimeout
	}
	mo := fuse.MountOptions{
		AllowOther:    os.Geteuid() == 0,
		FsName:        opts.Name,
		Name:          "stagefs",
		Debug:         opts.Debug,
		MaxBackground: 64,
		// go-fuse's default, set here: mountDevice passes it to the
		// kernel as max_read.
		MaxWrite: 128 << 10,
		// Reads answer with bytes (ReadResultData), which go-fuse would
		// still first try to splice: a pipe taken, grown, written and
		// drained for nothing, four system calls on every READ.
		DisableSplice: true,
		// The kernel checks permissions itself (other uids, sticky dirs).
		Options: []string{"default_permissions"},
	}
	raw := fs.NewNodeFS(sys.root, &fs.Options{
		MountOptions:    mo,
		EntryTimeout:    &timeout,
		AttrTimeout:     &timeout,
		NegativeTimeout: &negativeTimeout,
		RootStableAttr:  &fs.StableAttr{Ino: st.Ino, Mode: syscall.S_IFDIR},
		// Ownership comes from the engine; nothing is invented.
		NullPermissions: true,
	})
	var ring *fuseuring.Transport
	if opts.URing {
		ring, sys.ringNote = prepareRing(&mo, opts.URingPerQueue, sys.logf)
	}
	// failed undoes what the mount set up before it failed.
	failed := func(err error) (*FS, error) {
		if sys.watch != nil {
			sys.watch.file.Close()
		}
		if ring != nil {
			ring.Abandon()
		}
		return nil, err
	}
	target, devFD := mountpoint, -1
	if os.Geteuid() == 0 {
		fd, err := mountDevice(mountpoint, &mo) // mount.go
		if err != nil {
			return failed(err)
		}
		target, sys.ownMount, devFD = fmt.Sprintf("/dev/fd/%d", fd), true, fd
	}
	sys.mountpoint = mountpoint
	server, err := fuse.NewServer(newOpenlessDirs(raw), target, &mo)
	if err == nil {
		go server.Serve()
		err = server.WaitMount()
	}
	if err != nil {
		if sys.ownMount {
			syscall.Unmount(mountpoint, syscall.MNT_DETACH)
		}
		return failed(err)
	}
	sys.server = server
	if ring != nil {
		sys.ringNote = sys.startRing(ring, devFD)
	}
	sys.watch.start()
	go func() {
		server.Wait()
		sys.watch.close()
	}()
	if sys.passthroughNote = sys.probePassthrough(opts); sys.passthroughNote == "" {
		eng.SetHeldWriters(sys.heldWriters)
		sys.passthrough.Store(true)
	}
	return sys, nil
}

// probePassthrough returns why passthrough cannot be used, or "". It needs
// root (registering a backing file takes CAP_SYS_ADMIN), a kernel that
// offers it (6.9+, CONFIG_FUSE_PASSTHROUGH) and an upper tree the kernel
// accepts as backing (not too deeply stacked, e.g. on overlayfs). go-fuse
// would turn it off silently at the first failed registration, so one is
// tried here, on a scratch file, before any open depends on it.
func (sys *FS) probePassthrough(opts Options) string {
	switch {
	case opts.NoPassthrough:
		return "--no-passthrough"
	case os.Geteuid() != 0:
		return "not root"
	case sys.server.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH == 0:
		return "the kernel does not offer it"
	}
	fd, err := sys.eng.ScratchFile()
	if err != nil {
		return fmt.Sprintf("no scratch file in the state dir: %v", err)
	}
	defer unix.Close(fd)
	id, errno := sys.server.RegisterBackingFd(&fuse.BackingMap{Fd: int32(fd)})
	if errno != 0 {
		return fmt.Sprintf("the kernel refuses the state dir's files as backing files: %v", errno)
	}
	sys.server.UnregisterBackingFd(id)
	return ""
}

// Passthrough says whether pending bodies are passed through, or why not.
func (sys *FS) Passthrough() string {
	if sys.passthroughNote == "" {
		return "on"
	}
	return "off (" + sys.passthroughNote + ")"
}

// Invalidate drops the kernel's cached names, attributes and pages of the
// given paths, after commit or discard changed what they show, and returns
// when the kernel has them dropped. It must be called outside any FUSE
// handler and without engine locks (the control socket's goroutines), or
// the kernel and the daemon could wait on each other.
func (sys *FS) Invalidate(paths []string) {
	// What these paths show may come from elsewhere now (a directory
	// committed or discarded): decided afresh at their next lookup.
	sys.watch.forget(paths...)
	dirs := map[*fs.Inode]bool{}
	for _, p := range paths {
		dir, name := splitPath(p)
		parent := lookupPath(&sys.root.Inode, dir)
		if parent == nil || name == "" {
			continue
		}
		if child := parent.GetChild(name); child != nil {
			child.NotifyContent(0, 0)
			// A directory's listings below it may have come from
			// elsewhere (a discarded opaque directory shows the
			// workspace's again).
			dirsBelow(child, dirs)
		}
		parent.NotifyEntry(name)
		dirs[parent] = true
	}
	// The parents' cached listings go too, once each.
	for d := range dirs {
		d.NotifyContent(0, 0)
	}
}

// toErrno is the one translation of engine errors to kernel errnos: it
// unwraps, so a wrapped errno is not turned into ENOSYS, and anything
// unknown becomes EIO.
func toErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, os.ErrNotExist) {
		return syscall.ENOENT
	}
	return syscall.EIO
}

// caller identifies the process behind a request. The kernel names the
// calling thread; the engine counts it as its process.
func (sys *FS) caller(ctx context.Context) overlay.Caller {
	c, ok := fuse.FromContext(ctx)
	if !ok {
		return overlay.Caller{}
	}
	return overlay.Caller{Pid: sys.eng.Process(int(c.Pid)), Uid: c.Uid, Gid: c.Gid}
}

// node is one file or directory of the mount. Its identity is its path;
// the engine does the rest.
type node struct {
	fs.Inode
	sys *FS
	io  ioModes
	// removed holds the attributes of a directory removed or renamed
	// over, for a process that still has it open (see keepRemoved).
	removed atomic.Pointer[fuse.Attr]
}

var (
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeGetattrer      = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeReadlinker     = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeStatfser       = (*node)(nil)
	_ fs.NodeGetxattrer     = (*node)(nil)
	_ fs.NodeSetxattrer     = (*node)(nil)
	_ fs.NodeListxattrer    = (*node)(nil)
	_ fs.NodeRemovexattrer  = (*node)(nil)
)

func (n *node) path() string {
	return n.Path(&n.sys.root.Inode)
}

func (n *node) child(name string) string {
	p := n.path()
	if p == "" {
		return name
	}
	return p + "/" + name
}

// newChild returns the inode for a child with attributes st, reusing the
// existing one for the same inode number (hard links, copy-up). ownName,
// when not "", is the path of a name that needs a node of its own (see
// overlay.Engine.LookupStat): the same inode number, another generation.
// Shared, the kernel would serve the names as one file, and go-fuse answer
// for either with whichever path it knows first.
func (n *node) newChild(ctx context.Context, st *syscall.Stat_t, out *fuse.EntryOut, ownName string) *fs.Inode {
	out.Attr.FromStat(st)
	dir := n.path()
	out.SetEntryTimeout(n.sys.timeoutIn(dir))
	out.SetAttrTimeout(n.sys.attrTimeoutIn(dir, st))
	a := fs.StableAttr{Mode: st.Mode & syscall.S_IFMT, Ino: st.Ino, Gen: n.sys.generation(st.Ino)}
	if ownName != "" {
		a.Gen ^= nameGen(ownName)
	}
	return n.NewInode(ctx, &node{sys: n.sys}, a)
}

// nameGen is the generation bits that tell the nodes of one inode's names
// apart (newChild): a hash of the name's path, never zero.
func nameGen(p string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(p))
	return h.Sum64() | 1<<63
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if len(name) > 255 {
		return nil, syscall.ENAMETOOLONG
	}
	p := n.child(name)
	st, shared, err := n.sys.eng.LookupStat(p)
	return n.found(ctx, p, st, shared, err, out)
}

// found finishes a lookup of the child p whose stat gave st, err; shared
// says p needs a node of its own (newChild).
func (n *node) found(ctx context.Context, p string, st *syscall.Stat_t, shared bool, err error, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if err == syscall.ENOENT {
		// go-fuse turns ENOENT into a negative entry cached for
		// WatchedTimeout when the watcher runs, unless a timeout is set
		// here, in which case the kernel caches nothing: the right
		// thing where the workspace is not watched.
		if n.sys.watch != nil && !n.sys.watch.covers(n.path()) {
			out.SetEntryTimeout(n.sys.timeout)
		}
		return nil, syscall.ENOENT
	}
	if err != nil {
		return nil, toErrno(err)
	}
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		// Watched before the kernel can cache anything inside it.
		n.sys.watch.add(p)
	}
	ownName := ""
	if shared {
		ownName = p
	}
	return n.newChild(ctx, st, out, ownName), 0
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	// go-fuse hands a GETATTR without a handle one of the node's open
	// handles, which is quick to fstat, unless that handle holds a body
	// the path no longer shows (discarded or committed): then the node's
	// attributes are the path's, not those of what the handle holds.
	if o, ok := f.(*orphanHandle); ok {
		errno := o.n.stat(&out.Attr)
		out.Ino = n.StableAttr().Ino
		return errno
	}
	h, isHandle := asHandle(f)
	p := n.path()
	if isHandle && !h.leftBehind() {
		if errno := h.Getattr(ctx, out); errno != 0 {
			return errno
		}
		// An answer equal to what the path shows may be cached as long
		// as the path's own would be. Without this a file's attributes
		// expired a second after each fstat of an open file (tar's,
		// after reading it): every later stat (find, a rebuild) was a
		// round trip again.
		if st, err := n.sys.eng.Stat(p); err == nil && sameAttr(&out.Attr, st) {
			out.SetTimeout(n.sys.attrTimeout(p, st))
		}
		return 0
	}
	st, err := n.sys.eng.Stat(p)
	if err != nil {
		if err == syscall.ENOENT {
			if isHandle {
				return h.Getattr(ctx, out) // fstat of a file removed while open
			}
			if a := n.removed.Load(); a != nil {
				out.Attr = *a
				return 0
			}
			// The node was removed under an open reference.
			return syscall.ESTALE
		}
		return toErrno(err)
	}
	out.FromStat(st)
	out.SetTimeout(n.sys.attrTimeout(p, st))
	return 0
}

// sameAttr reports whether a, an answer for a node, says the same as st,
// the engine's stat of its path, inode number included.
func sameAttr(a *fuse.Attr, st *syscall.Stat_t) bool {
	var b fuse.Attr
	b.FromStat(st)
	return *a == b
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if o, ok := f.(*orphanHandle); ok {
		return o.setattr(in, out, n.StableAttr().Ino)
	}
	a := setAttrOf(in)
	fd := -1
	h, isHandle := asHandle(f)
	if isHandle && h.f.Writable {
		fd = h.f.Fd
	}
	st, err := n.sys.eng.Setattr(n.path(), fd, a, n.sys.caller(ctx))
	if err == syscall.ENOENT {
		// futimens, fchmod or ftruncate of a file removed while open
		// (another process's rm): it has no path, only a descriptor, as
		// on a local disk. The kernel names the handle only for a
		// truncate.
		handles := []*handle{h}
		if !isHandle {
			handles = n.openHandles()
		}
		for _, h := range handles {
			if errno, ok := n.setAttrThrough(h, a, out); ok {
				return errno
			}
		}
		if o := n.anOrphan(); o != nil && !isHandle {
			return o.setattr(in, out, n.StableAttr().Ino)
		}
	}
	if err != nil {
		return toErrno(err)
	}
	out.FromStat(st)
	// go-fuse sets no timeout on SETATTR replies; without one the kernel
	// asks again (GETATTR) before the next chown or chmod, which tar
	// sends right after setting the times.
	out.SetTimeout(n.sys.attrTimeout(n.path(), st))
	return 0
}

// setAttrThrough applies a to the file h has open, unless h was released
// since openHandles returned it (another process's close; ok false): h.mu
// orders this after or before the whole Release, which closes the
// descriptor.
func (n *node) setAttrThrough(h *handle, a overlay.SetAttr, out *fuse.AttrOut) (errno syscall.Errno, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n.io.mu.Lock()
	_, open := n.io.open[h]
	n.io.mu.Unlock()
	if !open {
		return 0, false
	}
	errno = setAttrFd(h.f.Fd, a, &out.Attr)
	out.Ino = n.StableAttr().Ino
	return errno, true
}

// setAttrOf reads a SETATTR request's changes.
func setAttrOf(in *fuse.SetAttrIn) overlay.SetAttr {
	var a overlay.SetAttr
	if m, ok := in.GetMode(); ok {
		a.Mode = &m
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok {
		a.Uid = &uid
	}
	if gok {
		a.Gid = &gid
	}
	if sz, ok := in.GetSize(); ok {
		a.Size = &sz
	}
	if in.Valid&fuse.FATTR_ATIME != 0 {
		ts := unix.Timespec{Sec: int64(in.Atime), Nsec: int64(in.Atimensec)}
		if in.Valid&fuse.FATTR_ATIME_NOW != 0 {
			ts = unix.Timespec{Nsec: unix.UTIME_NOW}
		}
		a.Atime = &ts
	}
	if in.Valid&fuse.FATTR_MTIME != 0 {
		ts := unix.Timespec{Sec: int64(in.Mtime), Nsec: int64(in.Mtimensec)}
		if in.Valid&fuse.FATTR_MTIME_NOW != 0 {
			ts = unix.Timespec{Nsec: unix.UTIME_NOW}
		}
		a.Mtime = &ts
	}
	return a
}

// setAttrFd applies a to the open file fd (overlay.SetattrFd) and
// reports its attributes in out; the caller sets the inode number the
// node shows.
func setAttrFd(fd int, a overlay.SetAttr, out *fuse.Attr) syscall.Errno {
	st, err := overlay.SetattrFd(fd, a)
	if err != nil {
		return toErrno(err)
	}
	out.FromStat(st)
	return 0
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	p := n.path()
	c := n.sys.caller(ctx)
	var hold *heldWriter
	if n.sys.passthrough.Load() && overlay.WantsWrite(int(flags)) {
		hold = n.sys.hold(n, "", c.Pid)
	}
	f, err := n.sys.eng.Open(p, int(flags), c)
	if err == syscall.ENOENT {
		// The name the kernel found was removed since (another
		// process's rm): ESTALE makes it walk the path again, asking
		// afresh, so an open with O_CREAT creates the file as on a
		// local disk instead of failing with ENOENT (orphan.go).
		n.sys.unhold(hold)
		return n.lostOpen(ctx, flags)
	}
	if err != nil {
		n.sys.unhold(hold)
		return nil, 0, toErrno(err)
	}
	fh, fuseFlags, errno := n.newHandle(p, f, hold, c)
	if caller, ok := fuse.FromContext(ctx); ok {
		if errno == syscall.ESTALE {
			n.sys.stale.again(caller.Pid) // the retry may find the name gone
		} else {
			n.sys.stale.forget(caller.Pid)
		}
	}
	return fh, fuseFlags, errno
}

// openReadahead is how much of a file an open the daemon serves starts
// reading ahead: the kernel's first read of a FUSE file asks for up to 128
// KiB.
const openReadahead = 128 << 10

// newHandle admits an open file f of n (see passthrough.go), or closes it.
func (n *node) newHandle(p string, f *overlay.File, hold *heldWriter, c overlay.Caller) (fs.FileHandle, uint32, syscall.Errno) {
	h := &handle{sys: n.sys, n: n, f: f, path: p}
	if errno := n.admit(h); errno != 0 {
		n.sys.unhold(hold)
		n.sys.eng.Release(p, f, c)
		return nil, 0, errno
	}
	// A handle with nothing of its own to push needs no FLUSH at
	// close(2), whose round trip Flush would answer doing nothing (locks
	// are the kernel's): a read-only one, and a passthrough one, whose
	// writes and shared mmaps go to the upper file itself (a bash
	// redirect closes twice: two round trips saved per created file). A
	// writable handle the daemon serves keeps it: before sending it the
	// kernel writes back the pages dirtied through shared mmaps, so they
	// are in the pending body when close returns.
	var openFlags uint32
	if !f.Writable || h.passthrough {
		openFlags = fuse.FOPEN_NOFLUSH
	}
	if n.keepPages(h) {
		openFlags |= fuse.FOPEN_KEEP_CACHE
	} else if !h.passthrough && !f.Writable {
		// The kernel will ask for the file's first pages as soon as the
		// open returns: start reading them from disk now, so a cold read
		// waits for the disk and the round trip at once, not one after
		// the other (a cold tar of the Go tree: 6% faster).
		unix.Fadvise(f.Fd, 0, openReadahead, unix.FADV_WILLNEED)
	}
	if h.passthrough {
		h.hold = hold
		return &passthroughHandle{h}, openFlags, 0
	}
	n.sys.unhold(hold)
	return h, openFlags, 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	p := n.child(name)
	c := n.sys.caller(ctx)
	var hold *heldWriter
	if n.sys.passthrough.Load() {
		hold = n.sys.hold(nil, p, c.Pid)
	}
	f, st, err := n.sys.eng.Create(p, int(flags), mode, c)
	if err != nil {
		n.sys.unhold(hold)
		return nil, nil, 0, toErrno(err)
	}
	child := n.newChild(ctx, st, out, "")
	n.sys.created(hold, child.Operations().(*node))
	// go-fuse keeps a created child as a node of its own (it never merges
	// it with a known node of the same inode), so admit starts afresh.
	h, flags, errno := child.Operations().(*node).newHandle(p, f, hold, c)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	if caller, ok := fuse.FromContext(ctx); ok {
		// The kernel's retry of a lost open may come as a CREATE: the
		// race is over (orphan.go).
		n.sys.stale.forget(caller.Pid)
	}
	return child, h, flags, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p := n.child(name)
	st, err := n.sys.eng.Mkdir(p, mode, n.sys.caller(ctx))
	if err != nil {
		return nil, toErrno(err)
	}
	n.sys.watch.add(p)
	return n.newChild(ctx, st, out, ""), 0
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	st, err := n.sys.eng.Mknod(n.child(name), mode, uint64(rdev), n.sys.caller(ctx))
	if err != nil {
		return nil, toErrno(err)
	}
	return n.newChild(ctx, st, out, ""), 0
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	st, err := n.sys.eng.Symlink(target, n.child(name), n.sys.caller(ctx))
	if err != nil {
		return nil, toErrno(err)
	}
	return n.newChild(ctx, st, out, ""), 0
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if a, ok := target.(*anonNode); ok {
		return n.linkAnonymous(ctx, a, name, out)
	}
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	st, err := n.sys.eng.Link(t.path(), n.child(name), n.sys.caller(ctx))
	if err != nil {
		return nil, toErrno(err)
	}
	return n.newChild(ctx, st, out, ""), 0
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return toErrno(n.sys.eng.Unlink(n.child(name), n.sys.caller(ctx)))
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	p := n.child(name)
	keep := n.keepRemoved(name)
	if err := n.sys.eng.Rmdir(p, n.sys.caller(ctx)); err != nil {
		return toErrno(err)
	}
	keep()
	n.sys.watch.forget(p)
	return 0
}

// keepRemoved prepares for the directory name of n to go (rmdir, or a
// rename over it): the function it returns, called once it has gone,
// keeps its attributes on its node with no links, because a process may
// still hold it open and fstat it, and its path answers nothing any more.
// On ext4 that fstat works; without this it would be ESTALE.
func (n *node) keepRemoved(name string) func() {
	child := n.GetChild(name)
	if child == nil || !child.IsDir() {
		return func() {}
	}
	cn, ok := child.Operations().(*node)
	if !ok {
		return func() {}
	}
	st, err := n.sys.eng.Stat(n.child(name))
	if err != nil {
		return func() {}
	}
	return func() {
		var a fuse.Attr
		a.FromStat(st)
		a.Nlink = 0
		cn.removed.Store(&a)
	}
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	oldp, newp := n.child(name), np.child(newName)
	moved := n.GetChild(name)
	keep := func() {}
	if flags&unix.RENAME_EXCHANGE == 0 {
		keep = np.keepRemoved(newName)
	}
	if err := n.sys.eng.Rename(oldp, newp, flags, n.sys.caller(ctx)); err != nil {
		return toErrno(err)
	}
	keep()
	// A renamed directory's entries come from elsewhere now, and what was
	// at the new name is gone: both are decided afresh at their next
	// lookup. What the kernel cached below the moved directory (missing
	// names too) was covered by watches that no longer report for its new
	// path: its entry is dropped, which drops everything below, once the
	// kernel has finished the rename (it holds the directories' locks
	// until this handler returns).
	n.sys.watch.forget(oldp, newp)
	if moved != nil && moved.IsDir() && n.sys.watch != nil {
		go np.NotifyEntry(newName)
	}
	return 0
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	t, err := n.sys.eng.Readlink(n.path())
	if err != nil {
		return nil, toErrno(err)
	}
	return []byte(t), 0
}

// OpendirHandle opens a listing for openlessDirs, which the kernel never
// sees: it caches every listing it reads (see dirs.go for what drops
// them). The listing is made at the first READDIR.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return &dirHandle{n: n}, 0, 0
}

// dirHandle is an open directory: its listing, made on first use, and a
// statter for the lookups of its entries that READDIRPLUS makes. It lives
// for one READDIR (openlessDirs); a listing longer than one reply goes on
// in the next from the node's kept copy.
type dirHandle struct {
	n       *node
	entries []fuse.DirEntry
	list    fs.DirStream
	pos     uint64 // the offset of the next entry Readdirent gives
	given   int    // entries Readdirent gave
	ended   bool   // the whole listing was read
	statter *overlay.DirStatter
}

var (
	_ fs.FileReaddirenter = (*dirHandle)(nil)
	_ fs.FileSeekdirer    = (*dirHandle)(nil)
	_ fs.FileReleasedirer = (*dirHandle)(nil)
	_ fs.FileLookuper     = (*dirHandle)(nil)
)

// Lookup is the lookup of an entry listed by READDIRPLUS: as node.Lookup,
// with the workspace directory opened once for all the entries.
func (d *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if d.statter == nil {
		d.statter = d.n.sys.eng.OpenDirStatter(d.n.path())
	}
	st, shared, err := d.statter.LookupStat(name)
	return d.n.found(ctx, d.n.child(name), st, shared, err, out)
}

func (d *dirHandle) load(ctx context.Context) syscall.Errno {
	if d.list != nil {
		return 0
	}
	sys := d.n.sys
	events := sys.watch.eventCount()
	entries, errno := d.n.listing()
	if errno != 0 {
		return errno
	}
	d.entries, d.list = entries, fs.NewListDirStream(entries)
	p := d.n.path()
	switch {
	case sys.watch.eventCount() != events:
		// An event came while the listing was made: it may be older
		// than the event's invalidation, which found nothing cached.
		dropListingsAfter(relistAfterEvent, &d.n.Inode)
	case !sys.watch.covers(p) && !sys.eng.Untouched(p):
		// Nothing reports workspace edits here, and the mtime the
		// kernel checks is the pending copy's: keep it as long as
		// names here are kept.
		dropListingsAfter(sys.timeout, &d.n.Inode)
	}
	return 0
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if errno := d.load(ctx); errno != 0 {
		return nil, errno
	}
	if !d.list.HasNext() {
		d.ended = true
		return nil, 0
	}
	e, errno := d.list.Next()
	d.pos++
	d.given++
	return &e, errno
}

// Seekdir goes on from where an earlier READDIR of the directory stopped,
// in the listing it was serving when it is recent: offsets are positions
// in one listing.
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if d.list == nil && off > 0 {
		if kept := d.n.sys.kept.take(d.n, off); kept != nil {
			d.entries, d.list = kept, fs.NewListDirStream(kept)
		}
	}
	if errno := d.load(ctx); errno != 0 {
		return errno
	}
	s, ok := d.list.(fs.FileSeekdirer)
	if !ok {
		return syscall.ENOTSUP
	}
	if off > uint64(len(d.entries)) {
		// A fresh listing, shorter than the one the offset came from
		// (entries were removed): the rest of that one is gone.
		off = uint64(len(d.entries))
	}
	if errno := s.Seekdir(ctx, off); errno != 0 {
		return errno
	}
	d.pos = off
	return 0
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	if d.list != nil {
		d.list.Close()
		switch {
		case d.ended && d.given > 0:
			// The kernel asks once more, at the end, to learn that
			// it is the end.
			d.n.sys.kept.keep(d.n, d.pos, d.entries)
		case d.ended:
			// That was the end, told: nothing more to read.
		case d.pos > 0:
			// go-fuse read one entry more than the reply held: the
			// next READDIR starts at it.
			d.n.sys.kept.keep(d.n, d.pos-1, d.entries)
		}
	}
	if d.statter != nil {
		d.statter.Close()
	}
}

// listing lists the directory, "." and ".." first.
func (n *node) listing() ([]fuse.DirEntry, syscall.Errno) {
	ents, err := n.sys.eng.ReadDir(n.path())
	if err != nil {
		return nil, toErrno(err)
	}
	list := make([]fuse.DirEntry, 0, len(ents)+2)
	list = append(list, fuse.DirEntry{Name: ".", Mode: syscall.S_IFDIR, Ino: n.StableAttr().Ino})
	parentIno := n.StableAttr().Ino
	if _, parent := n.Parent(); parent != nil {
		parentIno = parent.StableAttr().Ino
	}
	list = append(list, fuse.DirEntry{Name: "..", Mode: syscall.S_IFDIR, Ino: parentIno})
	for _, d := range ents {
		list = append(list, fuse.DirEntry{Name: d.Name, Mode: d.Mode, Ino: d.Ino})
	}
	return list, 0
}

// Fsync makes a file or directory durable: a directory's fsync reaches the
// node (go-fuse has no directory handle here), a file's goes to its handle.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if o, ok := f.(*orphanHandle); ok {
		return o.Fsync(ctx, flags)
	}
	if h, ok := asHandle(f); ok {
		return h.Fsync(ctx, flags)
	}
	return toErrno(n.sys.eng.SyncPath(n.path()))
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	st, err := n.sys.eng.Statfs()
	if err != nil {
		return toErrno(err)
	}
	out.FromStatfsT(st)
	return 0
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	sz, err := n.sys.eng.Getxattr(n.path(), attr, dest)
	if err != nil {
		return uint32(sz), toErrno(err)
	}
	return uint32(sz), 0
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return toErrno(n.sys.eng.Setxattr(n.path(), attr, data, int(flags), n.sys.caller(ctx)))
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return toErrno(n.sys.eng.Removexattr(n.path(), attr, n.sys.caller(ctx)))
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	b, err := n.sys.eng.Listxattr(n.path())
	if err != nil {
		return 0, toErrno(err)
	}
	if len(dest) == 0 {
		return uint32(len(b)), 0
	}
	if len(b) > len(dest) {
		return uint32(len(b)), syscall.ERANGE
	}
	return uint32(copy(dest, b)), 0
}

// handle is an open file. Reads of a workspace file move to the pending
// copy once the file has been copied up, so a reader sees what writers
// wrote through the mount.
type handle struct {
	sys  *FS
	n    *node
	path string
	// passthrough: the kernel does this handle's reads and writes
	// itself, in its node's backing file (see passthrough.go).
	passthrough bool
	hold        *heldWriter

	mu sync.Mutex // guards f.Fd, f.Upper and bodyIno while re-pointing
	f  *overlay.File
	// bodyIno is the inode number of the pending body a read-only handle
	// reads (0: not known yet).
	bodyIno uint64
	// file is what f.Fd reads and writes, for a handle the daemon serves
	// (see keepPages).
	file fileID
}

var (
	_ fs.FileReader    = (*handle)(nil)
	_ fs.FileWriter    = (*handle)(nil)
	_ fs.FileFsyncer   = (*handle)(nil)
	_ fs.FileFlusher   = (*handle)(nil)
	_ fs.FileReleaser  = (*handle)(nil)
	_ fs.FileGetattrer = (*handle)(nil)
	_ fs.FileLseeker   = (*handle)(nil)
	_ fs.FileAllocater = (*handle)(nil)

	_ fs.FilePassthroughFder = (*passthroughHandle)(nil)
)

// passthroughHandle is a handle whose I/O the kernel does itself. Only it has
// PassthroughFd: go-fuse makes every open of a node passthrough while the
// node has a backing file registered, if the handle has the method, even
// when it answers false.
type passthroughHandle struct{ *handle }

// PassthroughFd gives go-fuse the backing file for the node's first
// passthrough open; later ones reuse it (admit checks that they may).
func (h *passthroughHandle) PassthroughFd() (int, bool) { return h.f.Fd, true }

// asHandle returns the handle behind a file handle of either kind.
func asHandle(f fs.FileHandle) (*handle, bool) {
	switch h := f.(type) {
	case *handle:
		return h, true
	case *passthroughHandle:
		return h.handle, true
	}
	return nil, false
}

// fd returns the descriptor to read from, re-pointing a read-only handle
// on a workspace file at its pending copy after a copy-up, and one on a
// pending body at the body that replaced it (a patch, write or restore
// swaps whole bodies by rename), as every open of the file now reads.
func (h *handle) fd() int {
	fd, _ := h.target()
	return fd
}

// target is fd, with the file the descriptor reads (see keepPages).
func (h *handle) target() (int, fileID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	gen := h.sys.eng.CopyGeneration()
	if h.f.Writable || gen == h.f.Gen {
		return h.f.Fd, h.file
	}
	p := h.n.path()
	switch {
	case !h.f.Upper:
		if h.sys.eng.IsStaged(p) {
			h.reopen(p)
		}
	default:
		if h.bodyIno == 0 {
			var st unix.Stat_t
			if unix.Fstat(h.f.Fd, &st) == nil {
				h.bodyIno = st.Ino
			}
		}
		if cur := h.sys.eng.PendingBodyIno(p); cur != 0 && cur != h.bodyIno {
			h.reopen(p)
		}
	}
	h.f.Gen = gen
	return h.f.Fd, h.file
}

// reopen points the read-only handle at p's pending body now.
func (h *handle) reopen(p string) {
	nf, err := h.sys.eng.Open(p, unix.O_RDONLY, overlay.Caller{})
	if err != nil {
		return
	}
	if !nf.Upper {
		unix.Close(nf.Fd)
		return
	}
	unix.Close(h.f.Fd)
	h.f.Fd, h.f.Upper, h.bodyIno = nf.Fd, true, 0
	if st, ok := stampOf(nf.Fd); ok {
		h.file = st.file
	}
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	fd, file := h.target()
	n, err := unix.Pread(fd, dest, off)
	if err != nil {
		return nil, toErrno(err)
	}
	h.n.cachedFrom(file)
	return fuse.ReadResultData(dest[:n]), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if h.sys.eng.Capturing() {
		if err := h.sys.eng.BeforeWrite(h.n.path(), h.sys.caller(ctx)); err != nil {
			return 0, toErrno(err)
		}
	}
	n, err := unix.Pwrite(h.f.Fd, data, off)
	if err != nil {
		return 0, toErrno(err)
	}
	h.n.cachedFrom(h.file) // a writable handle is never re-pointed
	return uint32(n), 0
}

func (h *handle) Flush(ctx context.Context) syscall.Errno { return 0 }

// Fsync makes the file's data durable, and the journal records of the
// changes that led to it.
func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	var err error
	if flags&1 != 0 {
		err = unix.Fdatasync(h.f.Fd)
	} else {
		err = unix.Fsync(h.f.Fd)
	}
	if err == nil {
		err = h.sys.eng.Sync()
	}
	return toErrno(err)
}

func (h *handle) Release(ctx context.Context) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sys.eng.Release(h.path, h.f, h.sys.caller(ctx))
	h.n.release(h)
	h.sys.unhold(h.hold)
	return 0
}

// leftBehind reports whether h holds a pending body that its path no
// longer shows (discard or commit took it away while h stayed open).
func (h *handle) leftBehind() bool {
	h.mu.Lock()
	upper := h.f.Upper
	h.mu.Unlock()
	return upper && !h.sys.eng.IsStaged(h.n.path())
}

func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(h.fd(), &st); err != nil {
		return toErrno(err)
	}
	out.FromStat(&st)
	out.Ino = h.n.StableAttr().Ino
	return 0
}

func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	n, err := unix.Seek(h.fd(), int64(off), int(whence))
	if err != nil {
		return 0, toErrno(err)
	}
	return uint64(n), 0
}

func (h *handle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	if h.sys.eng.Capturing() {
		if err := h.sys.eng.BeforeWrite(h.n.path(), h.sys.caller(ctx)); err != nil {
			return toErrno(err)
		}
	}
	return toErrno(unix.Fallocate(h.f.Fd, mode, int64(off), int64(size)))
}
