package fusefs

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"stagefs/overlay"
)

// WatchedTimeout is how long the kernel may cache names and attributes in a
// directory whose workspace counterpart is watched. Every change made
// there outside the mount is reported by inotify and dropped from the
// kernel's caches at once, so the timeout only bounds what a lost event
// could cost.
const WatchedTimeout = time.Minute

// watchMask is what a watched directory reports: entries made, removed or
// moved, attribute changes (chmod, touch), writes and files closed after
// writing. Writes count because a writer outside may keep its file open
// (a log): a reader in the mount (tail -f) must see the file grow, and
// the attributes an fstat of its open file returns are cached as long as
// a stat's. inotify merges a run of writes to one file that the daemon
// has not read yet into one event. Writes through a shared mmap are not
// reported (see keepPages for what covers them).
const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_ATTRIB | unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF |
	unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// watcher keeps the kernel's caches right when the workspace is changed
// outside the mount (an editor, git, the user's shell). Without it the
// kernel may cache a name or attribute only for the short Options.Timeout
// and must ask again after it: a warm `git status` or `find` is then a
// round trip per file. Each directory the kernel looks up is watched with
// inotify (a watch per directory seen, none for the rest of the
// workspace); its entries get WatchedTimeout, and each event drops what
// it changed. A directory made through the mount, or opaque, is covered by
// its parent's watch (add). One under a pending rename, and any that
// cannot be watched, keeps the short timeout.
type watcher struct {
	sys  *FS
	file *os.File // the inotify instance; closing it ends run
	fd   int
	done chan struct{}

	// events counts the batches of events applied (see dirHandle.load).
	events atomic.Uint64

	mu      sync.Mutex
	byWd    map[int32]string // watch -> merged directory path
	byPath  map[string]int32
	covered map[string]bool // pending-only directories the watches cover
	full    bool            // the watch limit was hit (logged once)
}

// newWatcher makes a watcher, or returns nil when inotify is unavailable.
// Its events are read once start is called (the mount serves).
func newWatcher(sys *FS) *watcher {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil
	}
	w := &watcher{
		sys: sys, fd: fd, done: make(chan struct{}),
		file:    os.NewFile(uintptr(fd), "inotify"),
		byWd:    map[int32]string{},
		byPath:  map[string]int32{},
		covered: map[string]bool{},
	}
	return w
}

// start reads and applies events until close.
func (w *watcher) start() {
	if w != nil {
		go w.run()
	}
}

// close stops the watcher and waits for it.
func (w *watcher) close() {
	if w == nil {
		return
	}
	w.file.Close()
	<-w.done
}

// add decides how the merged directory p, which the kernel is about to
// cache, is kept right: a watch on its workspace directory when the view
// shows that directory in place; nothing when the view is the pending
// set's alone and the workspace cannot add to it (opaque), or can only by
// making a directory at p, which the watch covering p's parent reports. A
// renamed directory is not covered: its entries keep the short timeout.
func (w *watcher) add(p string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	_, watched := w.byPath[p]
	covered := w.covered[p]
	w.mu.Unlock()
	if watched || covered {
		return
	}
	src, dirfd := w.sys.eng.DirSourceOf(p)
	switch src {
	case overlay.FromOpaque:
		w.mu.Lock()
		w.covered[p] = true
		w.mu.Unlock()
		return
	case overlay.FromUpperOnly:
		dir, _ := splitPath(p)
		w.mu.Lock()
		if _, ok := w.byPath[dir]; (ok || w.covered[dir]) && p != "" {
			w.covered[p] = true
		}
		w.mu.Unlock()
		return
	case overlay.FromBaseInPlace:
	default:
		return
	}
	defer unix.Close(dirfd)
	// The lock is held from before the watch exists until it is recorded,
	// so events about p parsed meanwhile wait and then see the record.
	w.mu.Lock()
	defer w.mu.Unlock()
	// Through the descriptor, so the watch is on the directory the engine
	// resolved (beneath the workspace, no symlinks), not on a path
	// resolved again.
	wd, err := unix.InotifyAddWatch(w.fd, fdPath(dirfd), watchMask)
	if err != nil {
		if err == unix.ENOSPC && !w.full {
			w.full = true
			w.sys.logf("inotify watch limit reached (fs.inotify.max_user_watches): directories seen from now on are cached for %v only", w.sys.timeout)
		}
		return
	}
	// The directory may have been removed or replaced between the open
	// and the watch, which would then report nothing about p: check that
	// p still names it now that later changes are reported.
	if !w.sameDir(p, dirfd) {
		if _, ok := w.byWd[int32(wd)]; !ok {
			unix.InotifyRmWatch(w.fd, uint32(wd))
		}
		return
	}
	// The same directory reached under a new path (renamed in the
	// workspace) keeps its watch, which now reports for the new path.
	if old, ok := w.byWd[int32(wd)]; ok {
		delete(w.byPath, old)
	}
	w.byWd[int32(wd)] = p
	w.byPath[p] = int32(wd)
}

// sameDir reports whether the workspace directory p shows is the one open
// as dirfd.
func (w *watcher) sameDir(p string, dirfd int) bool {
	src, fd := w.sys.eng.DirSourceOf(p)
	if src != overlay.FromBaseInPlace {
		return false
	}
	defer unix.Close(fd)
	var a, b unix.Stat_t
	if unix.Fstat(dirfd, &a) != nil || unix.Fstat(fd, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino && a.Nlink > 0
}

// forgetLocked stops trusting what is known of each path in gone and of
// everything below it (watches and covered pending-only directories): an
// entry there was made, removed, moved, committed or discarded. One pass
// over the maps serves a whole batch (a commit, a read of events), each
// key checked against its own ancestors.
func (w *watcher) forgetLocked(gone map[string]bool) {
	if len(gone) == 0 {
		return
	}
	under := func(q string) bool {
		for {
			if gone[q] {
				return true
			}
			if q == "" {
				return false
			}
			q, _ = splitPath(q)
		}
	}
	for q, wd := range w.byPath {
		if under(q) {
			delete(w.byPath, q)
			delete(w.byWd, wd)
			unix.InotifyRmWatch(w.fd, uint32(wd))
		}
	}
	for q := range w.covered {
		if under(q) {
			delete(w.covered, q)
		}
	}
}

// forget is forgetLocked for the mount's own renames and removals of
// directories and for what commit, discard and restore changed.
func (w *watcher) forget(paths ...string) {
	if w == nil || len(paths) == 0 {
		return
	}
	gone := make(map[string]bool, len(paths))
	for _, p := range paths {
		gone[p] = true
	}
	w.mu.Lock()
	w.forgetLocked(gone)
	w.mu.Unlock()
}

// covers reports whether every change of the entries of the merged
// directory p reaches the kernel at once.
func (w *watcher) covers(p string) bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	_, ok := w.byPath[p]
	ok = ok || w.covered[p]
	w.mu.Unlock()
	return ok
}

// timeoutIn is how long the kernel may cache names in the directory dir and
// the attributes of its entries.
func (sys *FS) timeoutIn(dir string) time.Duration {
	if sys.watch.covers(dir) {
		return WatchedTimeout
	}
	return sys.timeout
}

// invalidation is what one batch of events asks the kernel to drop.
type invalidation struct {
	entries map[string]bool // dir/name: the name and its directory's listing
	nodes   map[string]bool // path: attributes and cached pages of the node
	all     bool            // the queue overflowed: everything
}

func (w *watcher) run() {
	defer close(w.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			return
		}
		inv := invalidation{entries: map[string]bool{}, nodes: map[string]bool{}}
		w.parse(buf[:n], &inv)
		w.apply(&inv)
	}
}

// parse turns a read's events into what to drop. The watch maps are read
// and updated here, under mu; the kernel is told afterwards, without it
// (a lookup waiting for mu while the kernel waits for that lookup would
// deadlock).
func (w *watcher) parse(b []byte, inv *invalidation) {
	w.mu.Lock()
	defer w.mu.Unlock()
	gone := map[string]bool{}
	defer func() { w.forgetLocked(gone) }()
	for len(b) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		end := unix.SizeofInotifyEvent + int(ev.Len)
		if end > len(b) {
			return
		}
		name := strings.TrimRight(string(b[unix.SizeofInotifyEvent:end]), "\x00")
		b = b[end:]
		if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
			// Events were lost, so what the maps say may be wrong:
			// start over, as the kernel will after dropping all.
			inv.all = true
			for wd := range w.byWd {
				unix.InotifyRmWatch(w.fd, uint32(wd))
			}
			w.byWd, w.byPath, w.covered = map[int32]string{}, map[string]int32{}, map[string]bool{}
			continue
		}
		dir, ok := w.byWd[ev.Wd]
		if !ok {
			continue
		}
		if ev.Mask&unix.IN_IGNORED != 0 {
			delete(w.byWd, ev.Wd)
			if w.byPath[dir] == ev.Wd {
				delete(w.byPath, dir)
			}
			continue
		}
		if ev.Mask&(unix.IN_MOVE_SELF|unix.IN_DELETE_SELF) != 0 {
			// The path no longer names this directory: stop
			// trusting it, and drop what the kernel has below it
			// (its parent's watch reports the entry too, unless the
			// path was a pending rename's).
			if w.byPath[dir] == ev.Wd {
				delete(w.byPath, dir)
			}
			delete(w.byWd, ev.Wd)
			unix.InotifyRmWatch(w.fd, uint32(ev.Wd))
			if dir != "" {
				inv.entries[dir] = true
			}
			continue
		}
		if name == "" {
			inv.nodes[dir] = true // the directory's own attributes
			continue
		}
		p := joinPath(dir, name)
		if ev.Mask&(unix.IN_CREATE|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO) != 0 {
			inv.entries[p] = true
			// A subdirectory made, replaced, moved or gone: what was
			// known of p speaks for another directory now. The next
			// lookup of p decides afresh.
			gone[p] = true
		}
		inv.nodes[p] = true
	}
}

// eventCount is the number of event batches applied so far (0 without a
// watcher).
func (w *watcher) eventCount() uint64 {
	if w == nil {
		return 0
	}
	return w.events.Load()
}

// apply tells the kernel to drop what a batch of events changed.
func (w *watcher) apply(inv *invalidation) {
	w.events.Add(1)
	root := &w.sys.root.Inode
	if inv.all {
		dropAll(root)
		w.add("") // the maps were emptied: watch the root again
		time.AfterFunc(relistAfterEvent, func() { dropAll(root) })
		return
	}
	listings := map[*fs.Inode]bool{}
	for p := range inv.nodes {
		if n := lookupPath(root, p); n != nil {
			n.NotifyContent(0, 0)
		}
	}
	for p := range inv.entries {
		dir, name := splitPath(p)
		if parent := lookupPath(root, dir); parent != nil {
			parent.NotifyEntry(name)
			listings[parent] = true
		}
		// A directory made, removed or moved here: what the kernel
		// listed in and below it may come from elsewhere now (a
		// directory made in the workspace under one made through the
		// mount), and a name looked up again can lead to the same node.
		if n := lookupPath(root, p); n != nil {
			dirsBelow(n, listings)
		}
	}
	later := make([]*fs.Inode, 0, len(listings))
	for d := range listings {
		d.NotifyContent(0, 0)
		later = append(later, d)
	}
	// A READDIR answered before this batch may reach the kernel's cache
	// after it (see openlessDirs).
	dropListingsAfter(relistAfterEvent, later...)
}

// dirsBelow adds n, when it is a directory, and the directories below it
// that the kernel knows to dirs.
func dirsBelow(n *fs.Inode, dirs map[*fs.Inode]bool) {
	if !n.IsDir() {
		return
	}
	dirs[n] = true
	for _, c := range n.Children() {
		dirsBelow(c, dirs)
	}
}

// dropAll drops every cached name and attribute below n.
func dropAll(n *fs.Inode) {
	n.NotifyContent(0, 0)
	for name, c := range n.Children() {
		dropAll(c)
		n.NotifyEntry(name)
	}
}

// lookupPath finds the node of the merged path p, nil when the kernel has
// none.
func lookupPath(root *fs.Inode, p string) *fs.Inode {
	n := root
	if p == "" {
		return n
	}
	for _, c := range strings.Split(p, "/") {
		if n = n.GetChild(c); n == nil {
			return nil
		}
	}
	return n
}

func joinPath(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

func splitPath(p string) (dir, name string) {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "", p
	}
	return p[:i], p[i+1:]
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// attrTimeout is how long the kernel may cache the attributes st of p: a
// change of them in the workspace is reported by the watch on p's parent
// (the root's by its own). A file with more than one name may be changed
// through a name in a directory nothing watches, which inotify reports
// only there: it keeps the short timeout.
func (sys *FS) attrTimeout(p string, st *syscall.Stat_t) time.Duration {
	dir, _ := splitPath(p)
	return sys.attrTimeoutIn(dir, st)
}

// attrTimeoutIn is attrTimeout for an entry of the directory dir.
func (sys *FS) attrTimeoutIn(dir string, st *syscall.Stat_t) time.Duration {
	if st.Nlink > 1 && st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return sys.timeout
	}
	return sys.timeoutIn(dir)
}
