package fusefs

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"stagefs/overlay"
)

// Passthrough: the kernel reads and writes a file opened with
// FOPEN_PASSTHROUGH directly in a backing file the daemon registered, so
// large I/O on pending bodies does not go through the daemon. Three rules
// keep it safe:
//
//   - Only a pending body (an upper file) is ever handed to the kernel,
//     never a workspace file: the kernel opens the backing file again with
//     each later open's flags, so a workspace backing file would take
//     writes behind the daemon's back.
//   - The kernel holds each inode in one mode at a time: while a
//     passthrough open exists, every open must be passthrough with the same
//     backing file, and while a cached open exists, none may be
//     passthrough; anything else fails with EIO. go-fuse registers one
//     backing file per node at its first passthrough open and reuses it
//     until the node's last one is released (after our Release returns).
//     ioModes counts both kinds of open per node and remembers the backing
//     file's upper inode.
//   - When an open cannot be served in the node's mode (its upper file was
//     committed, discarded, restored or copied up again while the node
//     still had, or may still have, another file as its backing), the node
//     is retired: lookups of its name make a new node (a new generation of
//     the same inode number). If no passthrough handle is open on the old
//     node, the open is served through the daemon; otherwise it fails with
//     ESTALE, on which the kernel looks the name up again and retries the
//     open once, on the new node. The old node keeps serving the handles
//     already open on it.
//
// Writes through passthrough never reach Write, so they cannot be captured
// as they happen. The engine captures at the write-open itself, and a
// snapshot that opens later captures the files then held open for writing
// (SetHeldWriters).

// ioModes is how the kernel serves a node's open files.
type ioModes struct {
	mu          sync.Mutex
	cached      int // open handles whose I/O goes through the daemon
	passthrough int // open passthrough handles
	// backing is the upper inode of the backing file go-fuse registered.
	// It is kept after the last passthrough handle closes, because go-fuse
	// drops its registration only after our Release returns: so the first
	// passthrough open of another body on this node (after a commit,
	// discard or restore) always retires the node, and the engine does
	// that open's work twice (it is idempotent: the copy-up is done, the
	// truncation repeated).
	backing uint64
	// What the kernel's page cache of this node holds (see keepPages):
	// pages is the stamp of the file it was last allowed to fill from,
	// zero when unknown; settled says that file's ctime was already
	// pageSettle old when the stamp was taken; mixed says a handle on
	// another file has read or written through the cache since.
	pages   pageStamp
	settled bool
	mixed   bool
	// open holds the node's open handles, for a SETATTR the kernel sends
	// without one (futimens, fchmod) of a file whose path is gone.
	open map[*handle]struct{}
	// orphans are its opens served by an orphan file (orphan.go).
	orphans map[*orphanHandle]struct{}
}

// pageStamp identifies one version of a file's content: a write changes
// the ctime, and a different body is a different inode.
type pageStamp struct {
	file         fileID
	size         int64
	mtime, ctime int64
}

// fileID names one file (not one version of it).
type fileID struct{ dev, ino uint64 }

func stampOf(fd int) (pageStamp, bool) {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return pageStamp{}, false
	}
	return pageStamp{file: fileID{st.Dev, st.Ino}, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}, true
}

// pageSettle is how old a file's ctime must be before the kernel may keep
// its pages across opens. Writes through a shared mmap change the ctime
// only at the first write to a clean page; the page stays writable, and
// later writes unseen, until writeback cleans it, at most
// dirty_expire_centisecs + dirty_writeback_centisecs later. The same rule
// covers kernels and file systems whose timestamps are coarse (a rewrite
// within one tick keeps the ctime). STAGEFS_PAGE_SETTLE overrides it
// (tests).
func pageSettle() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("STAGEFS_PAGE_SETTLE")); err == nil && d >= 0 {
		return d
	}
	settle := time.Second
	for _, name := range []string{"dirty_expire_centisecs", "dirty_writeback_centisecs"} {
		cs := 3000 // the kernel's defaults, the larger one
		if b, err := os.ReadFile("/proc/sys/vm/" + name); err == nil {
			if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v >= 0 {
				cs = v
			}
		}
		settle += time.Duration(cs) * 10 * time.Millisecond
	}
	return settle
}

// keepPages says whether this open may keep the pages the kernel cached
// for the node (FOPEN_KEEP_CACHE). Without it the kernel drops a file's
// pages at every open, so each `cat`, compiler or `git` read of an
// unchanged workspace file went to the daemon again. Only a read-only
// open the daemon serves keeps them, and only when they can hold nothing
// but this file's bytes as they are: they were filled after an open of
// the very same file version (the stamp), whose ctime was settled then,
// and no handle on another file (one still open on a discarded or
// replaced body) has read or written through them since. Every other
// open forgets the stamp; passthrough I/O bypasses this cache. Commit,
// discard, restore and workspace events drop the pages themselves
// (Invalidate, watcher).
func (n *node) keepPages(h *handle) bool {
	served := !h.passthrough
	var stamp pageStamp
	ok := false
	if served {
		stamp, ok = stampOf(h.f.Fd)
		h.file = stamp.file
	}
	readOnly := served && ok && !h.f.Writable
	m := &n.io
	m.mu.Lock()
	defer m.mu.Unlock()
	keep := readOnly && stamp == m.pages && m.settled && !m.mixed
	if served && !keep {
		// The kernel drops the node's pages at this open: what it
		// caches from now on is read after it.
		m.mixed = false
	}
	switch {
	case keep:
	case readOnly:
		m.pages = stamp
		m.settled = time.Since(time.Unix(0, stamp.ctime)) >= n.sys.pageSettle
	default:
		m.pages, m.settled = pageStamp{}, false
	}
	return keep
}

// cachedFrom notes that a handle on file moved bytes through the node's
// page cache (a READ or WRITE the daemon served).
func (n *node) cachedFrom(file fileID) {
	m := &n.io
	m.mu.Lock()
	if file != m.pages.file {
		m.mixed = true
	}
	m.mu.Unlock()
}

// admit decides whether the kernel may do h's I/O itself and counts the
// open on its node, or retires the node and returns ESTALE.
func (n *node) admit(h *handle) syscall.Errno {
	ino, eligible := n.passthroughIno(h.f)
	m := &n.io
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case eligible && m.cached == 0 && (m.backing == 0 || m.backing == ino):
		m.passthrough++
		m.backing = ino
		h.passthrough = true
	case eligible && m.cached > 0, !eligible && m.passthrough == 0:
		m.cached++
	case m.passthrough == 0:
		// The backing file go-fuse may still hold is another body, but
		// nothing is open through it: serve this open through the
		// daemon, and let later lookups make a new node that can pass
		// the new body through. (An ESTALE here could reach the program:
		// the kernel retries only once, and under churn the retry can
		// meet the same conflict.)
		n.sys.retire(n)
		m.cached++
	default:
		n.sys.retire(n)
		return syscall.ESTALE
	}
	if m.open == nil {
		m.open = map[*handle]struct{}{}
	}
	m.open[h] = struct{}{}
	return 0
}

// release uncounts h.
func (n *node) release(h *handle) {
	n.io.mu.Lock()
	if h.passthrough {
		n.io.passthrough--
	} else {
		n.io.cached--
	}
	delete(n.io.open, h)
	n.io.mu.Unlock()
}

// openHandles returns the handles open on n.
func (n *node) openHandles() []*handle {
	n.io.mu.Lock()
	defer n.io.mu.Unlock()
	hs := make([]*handle, 0, len(n.io.open))
	for h := range n.io.open {
		hs = append(hs, h)
	}
	return hs
}

// passthroughIno returns the upper inode of f when the kernel may read and
// write it directly: a pending body of a regular file, on a mount where
// passthrough works.
func (n *node) passthroughIno(f *overlay.File) (uint64, bool) {
	if !f.Upper || !n.sys.passthrough.Load() || n.StableAttr().Mode != syscall.S_IFREG {
		return 0, false
	}
	var st unix.Stat_t
	if unix.Fstat(f.Fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, false
	}
	return st.Ino, true
}

// retire makes later lookups of n's inode number create a new node.
func (sys *FS) retire(n *node) {
	a := n.StableAttr()
	sys.gensMu.Lock()
	if sys.gens[a.Ino] <= a.Gen {
		sys.gens[a.Ino] = a.Gen + 1
	}
	sys.gensMu.Unlock()
}

// generation is the node generation new lookups of ino get.
func (sys *FS) generation(ino uint64) uint64 {
	sys.gensMu.Lock()
	defer sys.gensMu.Unlock()
	return sys.gens[ino]
}

// heldWriter is an open for writing that may become a passthrough handle:
// its node, or before a create has made the node, its path.
type heldWriter struct {
	n    *node // guarded by FS.heldMu
	path string
	pid  int
}

// hold registers a write-open before the engine opens the file, so that a
// snapshot opening at any moment from here on either sees it here or is
// seen by the open's own capture.
func (sys *FS) hold(n *node, path string, pid int) *heldWriter {
	w := &heldWriter{n: n, path: path, pid: pid}
	sys.heldMu.Lock()
	sys.held[w] = true
	sys.heldMu.Unlock()
	return w
}

func (sys *FS) unhold(w *heldWriter) {
	if w == nil {
		return
	}
	sys.heldMu.Lock()
	delete(sys.held, w)
	sys.heldMu.Unlock()
}

// created sets the node of a held create.
func (sys *FS) created(w *heldWriter, n *node) {
	if w != nil {
		sys.heldMu.Lock()
		w.n = n
		sys.heldMu.Unlock()
	}
}

// heldWriters lists the held writers with their current paths.
func (sys *FS) heldWriters() []overlay.HeldWriter {
	sys.heldMu.Lock()
	held := make([]heldWriter, 0, len(sys.held))
	for w := range sys.held {
		held = append(held, *w)
	}
	sys.heldMu.Unlock()
	out := make([]overlay.HeldWriter, 0, len(held))
	for _, w := range held {
		p, ok := w.path, true
		if w.n != nil {
			p, ok = w.n.livePath()
		}
		if ok {
			out = append(out, overlay.HeldWriter{Path: p, Pid: w.pid})
		}
	}
	return out
}

// livePath is n's path, unless n is no longer in the tree (unlinked). A
// retired node keeps its place in go-fuse's tree beside its successor, so
// its path is the name's. Inode.Path would make up (and log) a placeholder
// path for an unlinked node instead of saying so.
func (n *node) livePath() (string, bool) {
	var names []string
	root := &n.sys.root.Inode
	for in := &n.Inode; in != root; {
		name, parent := in.Parent()
		if parent == nil {
			return "", false
		}
		names = append(names, name)
		in = parent
	}
	for i, j := 0, len(names)-1; i < j; i, j = i+1, j-1 {
		names[i], names[j] = names[j], names[i]
	}
	return strings.Join(names, "/"), true
}
