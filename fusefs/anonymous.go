package fusefs

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// An anonymous file (open with O_TMPFILE) has no path, so its node cannot
// ask the engine anything by name: it holds the descriptor the engine made
// it with (overlay.OpenAnonymous) and answers from that. linkat(2) of it
// reaches the target directory's Link, which names it through the engine;
// the name then has its own node, like any path.

// anonInoBit marks the inode numbers of anonymous files: kept apart from
// every number the engine shows (workspace inodes are far below it,
// pending-only ones carry 1<<62, reserved ones 1<<61), so the node of the
// name a link gives the file is never this one.
const anonInoBit = 1 << 60

var lastAnonIno atomic.Uint64

type anonNode struct {
	fs.Inode
	sys    *FS
	fd     int // closed when the kernel forgets the node
	closed atomic.Bool

	mu sync.Mutex
	// names are the nodes of the names linkat gave the file: the
	// kernel caches their attributes and pages apart from this node's,
	// so a change through this node must drop those (see changed).
	names []*fs.Inode
	// held are what the engine holds for each staged name while a
	// process has the file open (overlay.Engine.LinkAnonymous): handles
	// counts the open handles, the only way to write the file.
	held    []uint64
	handles int
}

// opened counts a new handle of the file.
func (a *anonNode) opened() *anonHandle {
	a.mu.Lock()
	a.handles++
	a.mu.Unlock()
	return &anonHandle{n: a}
}

// releaseHeld gives back to the engine what it holds for the file's
// names, once nothing can write the file any more.
func (a *anonNode) releaseHeld() {
	a.mu.Lock()
	held := a.held
	a.held = nil
	a.mu.Unlock()
	for _, h := range held {
		a.sys.eng.ReleaseAnonymous(h)
	}
}

// changed tells the kernel that what it caches of the file's names is
// stale after a write or setattr through the anonymous node, before the
// request is answered: a read through a name right after the write must
// see it. The names are other kernel inodes than the one the request
// holds locked, so the notification does not wait on this request.
func (a *anonNode) changed() {
	a.mu.Lock()
	names := append([]*fs.Inode(nil), a.names...)
	a.mu.Unlock()
	for _, in := range names {
		in.NotifyContent(0, 0)
	}
}

var (
	_ fs.NodeGetattrer   = (*anonNode)(nil)
	_ fs.NodeSetattrer   = (*anonNode)(nil)
	_ fs.NodeOpener      = (*anonNode)(nil)
	_ fs.NodeOnForgetter = (*anonNode)(nil)
	_ fs.NodeTmpfiler    = (*node)(nil)
)

// Tmpfile makes an anonymous file in the directory n.
func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	fd, st, err := n.sys.eng.OpenAnonymous(n.path(), mode, n.sys.caller(ctx))
	if err != nil {
		return nil, nil, 0, toErrno(err)
	}
	st.Ino = anonInoBit | lastAnonIno.Add(1)
	out.Attr.FromStat(st)
	a := &anonNode{sys: n.sys, fd: fd}
	child := n.NewInode(ctx, a, fs.StableAttr{Mode: syscall.S_IFREG, Ino: st.Ino})
	return child, a.opened(), 0, 0
}

func (a *anonNode) stat(out *fuse.Attr) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(a.fd, &st); err != nil {
		return toErrno(err)
	}
	out.FromStat(&st)
	out.Ino = a.StableAttr().Ino
	return 0
}

func (a *anonNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	return a.stat(&out.Attr)
}

func (a *anonNode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	errno := setAttrFd(a.fd, setAttrOf(in), &out.Attr)
	out.Ino = a.StableAttr().Ino
	if errno == 0 {
		a.changed()
	}
	return errno
}

// Open serves an open of the file through /proc/self/fd of a descriptor
// the caller holds: every handle reads and writes the node's descriptor,
// at the offsets the kernel gives.
func (a *anonNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_TRUNC != 0 {
		if err := unix.Ftruncate(a.fd, 0); err != nil {
			return nil, 0, toErrno(err)
		}
		a.changed()
	}
	return a.opened(), 0, 0
}

// OnForget closes the descriptor: the kernel forgets the node only once
// nothing has it open, so the file is either named by now or gone.
func (a *anonNode) OnForget() {
	if a.closed.CompareAndSwap(false, true) {
		unix.Close(a.fd)
		a.releaseHeld()
	}
}

// anonHandle is an open file of an anonymous node.
type anonHandle struct{ n *anonNode }

var (
	_ fs.FileReader    = (*anonHandle)(nil)
	_ fs.FileWriter    = (*anonHandle)(nil)
	_ fs.FileFsyncer   = (*anonHandle)(nil)
	_ fs.FileGetattrer = (*anonHandle)(nil)
	_ fs.FileAllocater = (*anonHandle)(nil)
	_ fs.FileReleaser  = (*anonHandle)(nil)
)

// Release ends the handle; the last one ends what the engine holds for the
// file's names (the kernel forgets the node only later).
func (h *anonHandle) Release(ctx context.Context) syscall.Errno {
	h.n.mu.Lock()
	h.n.handles--
	last := h.n.handles == 0
	h.n.mu.Unlock()
	if last {
		h.n.releaseHeld()
	}
	return 0
}

func (h *anonHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := unix.Pread(h.n.fd, dest, off)
	if err != nil {
		return nil, toErrno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (h *anonHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := unix.Pwrite(h.n.fd, data, off)
	if err != nil {
		return 0, toErrno(err)
	}
	h.n.changed()
	return uint32(n), 0
}

func (h *anonHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return toErrno(unix.Fsync(h.n.fd))
}

func (h *anonHandle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return h.n.stat(&out.Attr)
}

func (h *anonHandle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	if err := unix.Fallocate(h.n.fd, mode, int64(off), int64(size)); err != nil {
		return toErrno(err)
	}
	h.n.changed()
	return 0
}

// linkAnonymous names the anonymous file a name in the directory n.
func (n *node) linkAnonymous(ctx context.Context, a *anonNode, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	st, held, err := n.sys.eng.LinkAnonymous(a.fd, n.child(name), n.sys.caller(ctx))
	if err != nil {
		n.sys.eng.ReleaseAnonymous(held)
		return nil, toErrno(err)
	}
	child := n.newChild(ctx, st, out, "")
	a.mu.Lock()
	a.names = append(a.names, child)
	closed := a.handles == 0 || a.closed.Load()
	if !closed {
		a.held = append(a.held, held)
	}
	a.mu.Unlock()
	if closed {
		// Closed meanwhile: nothing will release it later.
		n.sys.eng.ReleaseAnonymous(held)
	}
	return child, 0
}
