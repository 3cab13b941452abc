package overlay

import (
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// dirMoves counts the renames and directory removals this package has
// made, in any tree. A path held in a dirCache may name another directory
// (or none) after one of them, so a cache empties itself whenever the count
// moved since it opened its descriptors. renameAt and rmdirAt are the only
// ways the package renames or removes directory entries that may be
// directories, and they bump it (TestNoRawRenames keeps it so).
var dirMoves atomic.Uint64

// renameAt is renameat2(2) that tells the directory caches.
func renameAt(olddir int, oldname string, newdir int, newname string, flags uint) error {
	err := unix.Renameat2(olddir, oldname, newdir, newname, flags)
	dirMoves.Add(1)
	return err
}

// renameFileAt is renameat2(2) for a source known not to be a directory
// (a copy-up or a commit's temporary file): rename(2) cannot put one over a
// directory, so no directory moves and the caches stay.
func renameFileAt(olddir int, oldname string, newdir int, newname string, flags uint) error {
	return unix.Renameat2(olddir, oldname, newdir, newname, flags)
}

// placeDirAt is renameat2(2) for a directory just built in work/ (which
// no cache holds) moving to an upper name that holds no directory: nothing
// there (RENAME_NOREPLACE) or a whiteout file (RENAME_EXCHANGE). No cached
// path names another directory afterwards, so the caches stay: a mkdir
// must not cost every directory's next operation a walk from the root.
func placeDirAt(workdir int, tmp string, newdir int, newname string, flags uint) error {
	return unix.Renameat2(workdir, tmp, newdir, newname, flags)
}

// rmdirAt removes an empty directory and tells the directory caches.
func rmdirAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
	dirMoves.Add(1)
	return err
}

// dirCacheMax bounds the descriptors a cache holds; past it the cache
// starts over.
const dirCacheMax = 1024

// dirCache keeps O_PATH descriptors of the upper tree's directories by
// path. Without it every operation on a/b/c began with an openat2 walk from
// the root and ended with a close: two of the dozen system calls of a file
// create. Only the upper tree is cached: the engine is its only writer. The
// workspace is changed behind our back and is walked afresh each time.
//
// A descriptor is counted while in use and closed only when it is both
// dropped from the cache and unused, so emptying the cache never closes a
// descriptor another goroutine is calling with.
type dirCache struct {
	mu   sync.Mutex
	gen  uint64 // dirMoves when the cached descriptors were opened
	dirs map[string]*cachedDir
}

type cachedDir struct {
	fd      int
	refs    int  // callers using fd now
	dropped bool // no longer in the cache: close when refs reaches 0
}

func newDirCache() *dirCache {
	return &dirCache{dirs: map[string]*cachedDir{}, gen: dirMoves.Load()}
}

// get returns a descriptor of the upper directory rel (not the root),
// opening it through l when it is not cached. put must follow.
func (c *dirCache) get(l layer, rel string) (*cachedDir, error) {
	c.mu.Lock()
	if g := dirMoves.Load(); g != c.gen {
		c.flushLocked()
		c.gen = g
	}
	if d := c.dirs[rel]; d != nil {
		d.refs++
		c.mu.Unlock()
		return d, nil
	}
	gen := c.gen
	c.mu.Unlock()

	fd, err := l.openDir(rel)
	if err != nil {
		return nil, err
	}
	d := &cachedDir{fd: fd, refs: 1}
	c.mu.Lock()
	// A rename or removal while the walk ran may have let it reach a
	// directory that no longer has this path: use it once, keep it not.
	if dirMoves.Load() == gen && c.gen == gen && c.dirs[rel] == nil && len(c.dirs) < dirCacheMax {
		c.dirs[rel] = d
	} else {
		d.dropped = true
		if len(c.dirs) >= dirCacheMax {
			c.flushLocked()
		}
	}
	c.mu.Unlock()
	return d, nil
}

// put ends a use of d.
func (c *dirCache) put(d *cachedDir) {
	c.mu.Lock()
	d.refs--
	if d.dropped && d.refs == 0 {
		unix.Close(d.fd)
	}
	c.mu.Unlock()
}

// flush empties the cache (the engine closes).
func (c *dirCache) flush() {
	c.mu.Lock()
	c.flushLocked()
	c.mu.Unlock()
}

func (c *dirCache) flushLocked() {
	for _, d := range c.dirs {
		d.dropped = true
		if d.refs == 0 {
			unix.Close(d.fd)
		}
	}
	c.dirs = map[string]*cachedDir{}
}
