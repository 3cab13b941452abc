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
// listing (FOPEN_CACHE_DIR). A READDIR then comes without a handle: it is
// served through a handle opened on go-fuse's node API for that one
// request and released before the reply. No handle outlives a request:
// the kernel may forget a node at any time between requests, and go-fuse
// would then no longer know the node a late release names. A listing
// longer than one reply goes on in the listing kept for it (keptListings).
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
}

// keptListings holds the listings of directories read part way, by node
// and by the offset the next READDIR starts at, so that a reader goes on
// in the listing its offsets are positions in: a fresh listing, after
// entries before the offset were removed (git clean unlinks while it
// reads), would skip or repeat entries nobody touched. Two readers of one
// directory each find their own. A listing not asked for again within
// keptFor, or past keptMax, goes.
type keptListings struct {
	mu sync.Mutex
	m  map[keptKey]keptListing
}

type keptKey struct {
	n   *node
	off uint64
}

type keptListing struct {
	entries []fuse.DirEntry
	at      time.Time
}

const (
	keptFor = time.Minute
	keptMax = 256
)

func (k *keptListings) keep(n *node, off uint64, entries []fuse.DirEntry) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[keptKey]keptListing{}
	}
	now := time.Now()
	var oldest keptKey
	for key, l := range k.m {
		if now.Sub(l.at) > keptFor {
			delete(k.m, key)
		} else if oldest.n == nil || l.at.Before(k.m[oldest].at) {
			oldest = key
		}
	}
	if len(k.m) >= keptMax {
		delete(k.m, oldest)
	}
	k.m[keptKey{n, off}] = keptListing{entries: entries, at: now}
}

// take returns, and forgets, the listing kept for n at off.
func (k *keptListings) take(n *node, off uint64) []fuse.DirEntry {
	k.mu.Lock()
	defer k.mu.Unlock()
	key := keptKey{n, off}
	l, ok := k.m[key]
	delete(k.m, key)
	if !ok || time.Since(l.at) > keptFor || off > uint64(len(l.entries)) {
		return nil
	}
	return l.entries
}

func newOpenlessDirs(raw fuse.RawFileSystem) *openlessDirs {
	return &openlessDirs{RawFileSystem: raw}
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
	var opened fuse.OpenOut
	open := fuse.OpenIn{InHeader: in.InHeader, Flags: uint32(syscall.O_RDONLY | syscall.O_DIRECTORY)}
	if st := o.RawFileSystem.OpenDir(cancel, &open, &opened); !st.Ok() {
		return st
	}
	own := *in
	own.Fh = opened.Fh
	st := read(cancel, &own, out)
	o.RawFileSystem.ReleaseDir(&fuse.ReleaseIn{InHeader: in.InHeader, Fh: opened.Fh})
	return st
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
