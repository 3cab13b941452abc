package fusefs

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// An open can lose a race a local disk never loses: the kernel looked the
// name up, then another process removed it before the OPEN reached the
// daemon, which opens by path. Open answers ESTALE, on which the kernel
// looks the name up afresh and retries once. Under heavy churn the retry
// can lose the same race again (the name was made and removed again in
// between), and that second ESTALE would reach the program.
//
// On ext4 the open would simply have won: it holds the inode its lookup
// found, and the unlink after it leaves an open, nameless file. The second
// lost race of one caller is answered that way: an open for writing gets
// an orphan, an empty anonymous file no name will ever show (as if the
// name had been made anew, opened, then removed); a read-only open gets
// ENOENT (the name was removed before it).

// staleOpenWindow is how long after an open answered ESTALE the same
// caller's next lost race counts as the kernel's retry of it.
const staleOpenWindow = time.Second

// staleOpens remembers which callers were last answered ESTALE by Open.
type staleOpens struct {
	count atomic.Int32 // len(when), so that forget costs nothing when it is empty
	mu    sync.Mutex
	when  map[uint32]time.Time // caller's thread id -> when
}

// again records that pid's open lost the race and reports whether its
// previous one did too, within staleOpenWindow: then this is the kernel's
// retry, and no further retry will come.
func (s *staleOpens) again(pid uint32) bool {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.when == nil {
		s.when = map[uint32]time.Time{}
	}
	last, ok := s.when[pid]
	if ok && now.Sub(last) < staleOpenWindow {
		delete(s.when, pid)
		s.count.Store(int32(len(s.when)))
		return true
	}
	if len(s.when) >= 1024 {
		// Only fresh entries matter; this bounds the map.
		for p, t := range s.when {
			if now.Sub(t) >= staleOpenWindow {
				delete(s.when, p)
			}
		}
	}
	s.when[pid] = now
	s.count.Store(int32(len(s.when)))
	return false
}

// forget drops pid's record once its open succeeded.
func (s *staleOpens) forget(pid uint32) {
	if s.count.Load() == 0 {
		return
	}
	s.mu.Lock()
	delete(s.when, pid)
	s.count.Store(int32(len(s.when)))
	s.mu.Unlock()
}

// lostOpen answers an open of n whose name was found removed (errno
// ESTALE from the engine's ENOENT or from a retired node).
func (n *node) lostOpen(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	caller, ok := fuse.FromContext(ctx)
	if !ok || !n.sys.stale.again(caller.Pid) {
		return nil, 0, syscall.ESTALE
	}
	if flags&syscall.O_ACCMODE == syscall.O_RDONLY {
		return nil, 0, syscall.ENOENT
	}
	fd, _, err := n.sys.eng.OpenAnonymous("", 0o644, n.sys.caller(ctx))
	if err != nil {
		return nil, 0, toErrno(err)
	}
	o := &orphanHandle{anonHandle: anonHandle{n: &anonNode{sys: n.sys, fd: fd}}, node: n}
	n.io.mu.Lock()
	if n.io.orphans == nil {
		n.io.orphans = map[*orphanHandle]struct{}{}
	}
	n.io.orphans[o] = struct{}{}
	n.io.mu.Unlock()
	return o, 0, 0
}

// orphanHandle is the open, nameless file lostOpen hands out. Its node is
// the name's old one, whose path is gone: the node's Getattr, Setattr and
// Fsync answer from the handle.
type orphanHandle struct {
	anonHandle
	node *node
}

var _ fs.FileReleaser = (*orphanHandle)(nil)

func (h *orphanHandle) Release(ctx context.Context) syscall.Errno {
	h.node.io.mu.Lock()
	delete(h.node.io.orphans, h)
	h.node.io.mu.Unlock()
	h.n.OnForget() // closes the descriptor, and with it the file
	return 0
}

// anOrphan returns one of n's orphans, for a SETATTR the kernel sends
// without a handle (futimens through /proc/self/fd), or nil.
func (n *node) anOrphan() *orphanHandle {
	n.io.mu.Lock()
	defer n.io.mu.Unlock()
	for o := range n.io.orphans {
		return o
	}
	return nil
}

// setattr serves a SETATTR of the orphan's node (futimens, ftruncate).
func (h *orphanHandle) setattr(in *fuse.SetAttrIn, out *fuse.AttrOut, ino uint64) syscall.Errno {
	errno := setAttrFd(h.n.fd, setAttrOf(in), &out.Attr)
	out.Ino = ino
	return errno
}
