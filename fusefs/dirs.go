package fusefs

import (
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Directory opens cost a round trip each, twice (OPENDIR and RELEASEDIR),
// even when the kernel has the listing cached: a warm `git status` of the
// Go tree is 2,654 of them and about 80 other requests. openlessDirs
// answers OPENDIR with ENOSYS, which makes the kernel stop sending OPENDIR
// and RELEASEDIR for the whole mount (its no_opendir mode) and cache every
// listing (FOPEN_CACHE_DIR). A READDIR then comes without a handle; it is
// served through a handle the daemon opens on go-fuse's node API itself,
// kept while the same listing is read on in order.
//
// Every listing being cached, each must be dropped when it changes:
//   - changes through the mount: the kernel drops the listing itself (the
//     directory's change counter and mtime move);
//   - commit, discard, restore, rollback: Invalidate;
//   - edits in the workspace under a watched directory: the event
//     (watcher.apply), once at once and once again shortly after, since
//     a READDIR answered just before the event may reach the cache just
//     after it;
//   - a directory with pending entries that no watch keeps right (under
//     a pending rename, or past the watch limit): its listing is dropped
//     Options.Timeout after it was made, as its names are;
//   - any other directory shows the workspace's mtime, which the kernel
//     checks before it uses a cached listing.
type openlessDirs struct {
	fuse.RawFileSystem
	mu    sync.Mutex
	reads map[uint64]*dirRead // node id -> the listing read in order
}

// dirRead is a handle on a listing whose next READDIR is expected at
// offset next.
type dirRead struct {
	node, fh, next uint64
	used           time.Time
}

// readAgainWithin is how soon the next part of a listing must be asked
// for to be served from the same handle (the kernel asks right away).
const readAgainWithin = time.Second

func newOpenlessDirs(raw fuse.RawFileSystem) *openlessDirs {
	return &openlessDirs{RawFileSystem: raw, reads: map[uint64]*dirRead{}}
}

func (o *openlessDirs) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	return fuse.ENOSYS
}

func (o *openlessDirs) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return o.read(cancel, in, out, o.RawFileSystem.ReadDir)
}

func (o *openlessDirs) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return o.read(cancel, in, out, o.RawFileSystem.ReadDirPlus)
}

func (o *openlessDirs) read(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList, read func(<-chan struct{}, *fuse.ReadIn, *fuse.DirEntryList) fuse.Status) fuse.Status {
	if in.Fh != 0 {
		return read(cancel, in, out) // a handle the kernel has (never, after ENOSYS)
	}
	fh, st := o.take(cancel, in)
	if !st.Ok() {
		return st
	}
	own := *in
	own.Fh = fh
	st = read(cancel, &own, out)
	if st.Ok() && out.Offset != in.Offset {
		o.put(&dirRead{node: in.NodeId, fh: fh, next: out.Offset, used: time.Now()}) // entries came: more may follow
	} else {
		o.release(in.NodeId, fh) // the end, or an error
	}
	return st
}

// take returns the handle that read the listing of in's node up to in's
// offset, or opens a new one.
func (o *openlessDirs) take(cancel <-chan struct{}, in *fuse.ReadIn) (uint64, fuse.Status) {
	o.mu.Lock()
	r := o.reads[in.NodeId]
	if r != nil && r.next == in.Offset && time.Since(r.used) < readAgainWithin {
		delete(o.reads, in.NodeId)
		o.mu.Unlock()
		return r.fh, fuse.OK
	}
	o.mu.Unlock()
	var out fuse.OpenOut
	open := fuse.OpenIn{InHeader: in.InHeader, Flags: uint32(syscall.O_RDONLY | syscall.O_DIRECTORY)}
	if st := o.RawFileSystem.OpenDir(cancel, &open, &out); !st.Ok() {
		return 0, st
	}
	return out.Fh, fuse.OK
}

// put keeps fh for the next part of the listing, and releases handles
// nobody read on in time (a reader that stopped half way).
func (o *openlessDirs) put(r *dirRead) {
	var stale []*dirRead
	o.mu.Lock()
	if old := o.reads[r.node]; old != nil {
		stale = append(stale, old) // another reader's, at another offset
	}
	o.reads[r.node] = r
	for id, other := range o.reads {
		if time.Since(other.used) > 5*readAgainWithin {
			stale = append(stale, other)
			delete(o.reads, id)
		}
	}
	o.mu.Unlock()
	for _, s := range stale {
		o.release(s.node, s.fh)
	}
}

func (o *openlessDirs) release(node, fh uint64) {
	o.RawFileSystem.ReleaseDir(&fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: node}, Fh: fh})
}

// dropListingsAfter drops the kernel's cached listings of dirs after d,
// from a goroutine of its own (never inside a request handler).
func dropListingsAfter(d time.Duration, dirs ...*fs.Inode) {
	if len(dirs) == 0 {
		return
	}
	time.AfterFunc(d, func() {
		for _, n := range dirs {
			n.NotifyContent(0, 0)
		}
	})
}

// relistAfterEvent is how long after an event the listings it changed are
// dropped a second time (see openlessDirs).
const relistAfterEvent = 50 * time.Millisecond
