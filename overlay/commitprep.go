package overlay

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"
)

// A commit's slow part is writing the pending files' contents into the
// workspace and making them durable: 87% of a 10,000-file commit. Holding
// Engine.mu for it would stop every lookup and stat in the mount for the
// whole commit, so prepareCopies does it first, under no lock: it copies
// each selected regular file into a stage directory in the workspace root
// (hidden from the view) and syncs them. The commit proper, under the
// lock, then takes a prepared copy instead of writing the file when the
// pending file is still exactly as it was copied (same inode, size, times
// and mode: any write, truncate, chmod or xattr change moves its ctime),
// with a rename; anything changed since, or not prepared, is written under
// the lock as before. Copies no commit took are removed with the stage
// directory; a crash leaves it to the next commit or start-up.

// stageDir is this engine's stage directory's name in the workspace root:
// one per state dir, since a mount's branches are engines over the same
// workspace, and one's start-up must not remove another's copies.
func (e *Engine) stageDir() string {
	return fmt.Sprintf("%sstage-%016x", commitTempPrefix, xxhash.Sum64String(e.opts.StateDir))
}

// preparedCopy is a durable copy of a pending file in the stage directory.
type preparedCopy struct {
	name string         // in the stage directory
	st   syscall.Stat_t // the pending file as it was copied
}

// commitStage holds the copies one commit prepared.
type commitStage struct {
	fd     int // the stage directory (-1: none)
	copies map[string]preparedCopy
	// start is when the copying began: a file whose ctime is not well
	// before it may have been written again in the same clock tick as
	// its copy was made (file systems without fine-grained ctimes), which
	// its stat cannot show; such a file is written under the lock.
	start time.Time
}

// racyWindow is how far before the copying began a file's ctime must be
// for its copy to be trusted (git's "racily clean" rule; a coarse ctime
// ticks every 4 ms at 250 Hz).
const racyWindow = 10 * time.Millisecond

// prepareCopies copies the regular files a commit of paths would select
// into the stage directory, outside the engine lock, and makes them
// durable. What it cannot prepare the commit writes itself.
func (e *Engine) prepareCopies(paths []string) *commitStage {
	s := &commitStage{fd: -1}
	type want struct {
		p string
		m meta
	}
	var wants []want
	e.rlock()
	if e.mode == Staged {
		for _, p := range e.selectLocked(paths, true, commitAncestor) {
			m := e.index[p]
			if m != nil && m.Kind == KindFile && !m.Deleted && e.writers[m.uino] == 0 {
				wants = append(wants, want{p, *m})
			}
		}
	}
	e.runlock()
	e.removeCommitStage()
	if len(wants) < prepareMin {
		return s
	}
	if err := unix.Mkdirat(e.base.fd, e.stageDir(), 0o700); err != nil {
		e.logf("commit: stage directory: %v", err)
		return s
	}
	fd, err := unix.Openat(e.base.fd, e.stageDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		e.logf("commit: stage directory: %v", err)
		return s
	}
	s.fd, s.copies, s.start = fd, map[string]preparedCopy{}, time.Now()
	for i, w := range wants {
		ust, err := e.upper.lstat(w.p)
		if err != nil || ust.Nlink > 1 || ust.Mode&syscall.S_IFMT != syscall.S_IFREG {
			continue // gone, or hard links the commit keeps together
		}
		name := strconv.Itoa(i)
		if err := e.writeBaseEntry(w.p, &w.m, ust, fd, name, false); err != nil {
			unix.Unlinkat(fd, name, 0)
			if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
				break // the commit proper reports it, path by path
			}
			continue
		}
		s.copies[w.p] = preparedCopy{name: name, st: *ust}
	}
	if err := unix.Syncfs(fd); err != nil {
		e.logf("commit: sync the prepared copies: %v", err)
		s.copies = map[string]preparedCopy{}
	}
	return s
}

// prepareMin is the fewest files worth a stage directory: below it the
// commit writes them under the lock, which then is short anyway.
const prepareMin = syncOnceFiles

// claim returns the name in the stage directory of p's prepared copy when
// the pending file ust is still the one copied.
func (s *commitStage) claim(p string, ust *syscall.Stat_t) (string, bool) {
	c, ok := s.copies[p]
	if !ok {
		return "", false
	}
	delete(s.copies, p)
	settled := time.Unix(c.st.Ctim.Unix()).Before(s.start.Add(-racyWindow))
	return c.name, settled && sameVersion(&c.st, ust)
}

// sameVersion reports whether a and b, two stats of one pending path, show
// the same content and attributes.
func sameVersion(a, b *syscall.Stat_t) bool {
	return a.Ino == b.Ino && a.Size == b.Size && a.Mode == b.Mode && a.Uid == b.Uid && a.Gid == b.Gid &&
		a.Mtim == b.Mtim && a.Ctim == b.Ctim
}

// close removes the stage directory with the copies no commit took.
func (s *commitStage) close(e *Engine) {
	if s.fd < 0 {
		return
	}
	unix.Close(s.fd)
	s.fd = -1
	e.removeCommitStage()
}

// removeCommitStage removes the stage directory, a crashed commit's too.
func (e *Engine) removeCommitStage() {
	if err := removeAllAt(e.base.fd, e.stageDir()); err != nil && !errors.Is(err, syscall.ENOENT) {
		e.logf("commit: remove %s: %v", e.stageDir(), err)
	}
}

// isCommitTemp reports whether p is, or is below, a name a commit writes
// in the workspace (commitTempPrefix): the view never shows them.
func isCommitTemp(p string) bool {
	i := strings.Index(p, commitTempPrefix)
	return i == 0 || (i > 0 && strings.Contains(p, "/"+commitTempPrefix))
}
