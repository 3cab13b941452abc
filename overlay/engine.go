package overlay

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"stagefs/snapshot"
)

// Mode says where writes go.
type Mode string

const (
	// Staged: writes land in the pending set; the workspace changes only on
	// commit.
	Staged Mode = "staged"
	// Immediate: writes go straight to the workspace.
	Immediate Mode = "immediate"
)

// ParseMode accepts "staged" or "immediate".
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case Staged, Immediate:
		return Mode(s), nil
	}
	return "", fmt.Errorf("unknown mode %q (want staged or immediate)", s)
}

// Caller identifies the process behind an operation, for ownership of new
// files and for the journal.
type Caller struct {
	Pid int
	Uid uint32
	Gid uint32
	// Comm is the process's command name; the engine reads it from /proc
	// (cached) when it is empty.
	Comm string
	// Host marks an edit the host makes itself through the control socket
	// (fs/safe_text_patch): the agent's edit, captured like a process's
	// into the open turn and unbound snapshots (capture.go).
	Host bool
}

// Journal is the append-only log the engine records every operation in.
// Append must make the record durable before it returns.
type Journal interface {
	Append(payload []byte) (uint64, error)
	AppendNoWait(payload []byte) (uint64, error)
	Sync() error
}

// Options configure an Engine.
type Options struct {
	Workspace string // absolute path of the workspace (the base)
	StateDir  string // absolute path of the state dir; upper/ and work/ live here
	Mode      Mode
	Journal   Journal // nil: nothing is journaled (tests)
	OnChange  func()  // called after the pending set changed; must not block
	Logf      func(string, ...any)
	// Snapshots is the content store pre-images are captured into; nil
	// disables snapshots.
	Snapshots *snapshot.Store
	Turns     TurnOptions
	// Deny and Hide are --deny and --hide globs (see policy.go).
	Deny, Hide []string
	// CaptureFailure is "allow" (default: the mutation proceeds and the
	// snapshot is marked incomplete) or "deny" (the mutation fails with
	// ENOSPC) when a pre-image cannot be stored.
	CaptureFailure string
	// OnCaptureFailed is told about each pre-image that could not be
	// stored; it must not block.
	OnCaptureFailed func(scope, path string, err error)
	// OnRenumbered is told about pending paths whose inode number changed
	// (see Discard), so the kernel forgets what it cached under the old
	// one. It is called without engine locks.
	OnRenumbered func(paths []string)
	// Hidden are workspace-relative paths that the merged view never shows
	// and that cannot be created through it (a state dir inside the
	// workspace).
	Hidden []string
	// JournalSync is how long a staging operation's record may wait to be
	// durable (--journal-sync). 0, the default, makes each one durable
	// before the operation is answered. A positive interval answers at
	// once and syncs the journal that often, and at every fsync in the
	// mount; commit, discard, snapshot and restore records stay durable
	// before they are answered.
	JournalSync time.Duration
	// OnProgress is told how far a long commit, discard or restore has
	// come (see progress.go); it is called with engine locks held and
	// must not block.
	OnProgress func(Progress)
	// ProgressEvery spaces the progress reports of one operation (0: a
	// quarter of a second).
	ProgressEvery time.Duration
}

// Engine is the merged view of a workspace and its pending set.
type Engine struct {
	base    layer
	upper   layer
	workFd  int
	rootDev uint64
	// upperRootIno is the upper tree's root directory's inode number
	// (see meta.Dir).
	upperRootIno uint64
	opts         Options
	journal      Journal
	onChange     func()
	logf         func(string, ...any)
	stopSync     chan struct{} // stops the --journal-sync ticker
	syncDone     chan struct{}

	// textMu orders ReadFile after or before a whole PatchFile: a patch
	// that cannot swap the body by a rename (a hard-linked file, immediate
	// mode) rewrites it in place, and a read between its truncate and its
	// write would return content the file never had. Taken before mu.
	textMu sync.RWMutex
	// mu guards index, children, mode and forks, and serializes namespace
	// changes.
	mu       sync.RWMutex
	index    map[string]*meta           // upper entries by path
	children map[string]map[string]bool // upper dir path -> names of its upper entries
	// forks are the forks whose copy runs (fork.go).
	forks []*ForkCopy
	// showing and shownAt: which pending paths show which workspace
	// inode number (shownino.go).
	showing map[uint64][]string
	shownAt map[string]uint64
	mode    Mode
	writers map[uint64]int // upper inode -> open writable handles (commit refuses those files)
	// strayTemps are commit temporaries a commit could not remove, its
	// directory being out of reach then (replaced by a symlink, say);
	// every commit tries again first. Guarded by mu.
	strayTemps []preparedFile

	// copyGen counts copy-ups, so an open read-only handle on a base file
	// can tell cheaply that it may have to move to the upper copy.
	copyGen atomic.Uint64
	tmpSeq  atomic.Uint64

	snaps     *snapshot.Store
	openSnaps atomic.Int64 // open snapshots: capture is skipped cheaply when 0
	// heldWriters lists the files held open for writing through
	// passthrough (set by the FUSE layer).
	heldWriters atomic.Pointer[func() []HeldWriter]
	// failStamps holds, by scope and path, the stat of each path whose
	// capture failed, so that its capture is tried again only if it has
	// not changed since (unchangedSinceFailure).
	failMu     sync.Mutex
	failStamps map[string]pathStamp

	// trash lists committed upper files moved into work/, which a
	// background unlink (trashWG) removes after the commit (toTrash).
	trashMu  sync.Mutex
	trash    []string
	trashWG  sync.WaitGroup
	procs    procCache
	inos     *inoMap // inode numbers kept across commit
	upperIno atomic.Uint64

	userMu   sync.Mutex
	userPids map[int]bool // processes marked as the user's (userMu)

	turnOpts TurnOptions
	// commitMu serializes commits: one commit's copies, made before it
	// takes mu, must not meet another's (commitprep.go).
	commitMu sync.Mutex
	// changeGate is passed, shared, by every change on its way to mu
	// (lockChange). A commit holds it alone from its selection to its
	// end, so that it can let go of mu between its steps (commitRun.yield)
	// for lookups, stats and reads, while no change can slip in and the
	// pending set stays what the commit selected. The close of a file,
	// which changes no entry, passes by it.
	changeGate sync.RWMutex
	turnMu     sync.Mutex  // serializes turn starts, rollbacks and redo
	redos      []redoLevel // the rollbacks redo can take back, newest last (turnMu)
	redoSeq    int         // (turnMu)
	redoValid  atomic.Bool // cleared by the first tool mutation after a rollback or redo
	turns      turnState   // turns' bookkeeping in memory (turns.go)

	// die, set only by tests, is asked at the points where a crash
	// leaves an operation half done on disk; true stops the operation
	// there, as if the process had died (errDied).
	die func(point string) bool
}

// errDied is what an operation returns when a test stopped it where a
// crash could (Engine.die).
var errDied = errors.New("overlay: stopped by a test where a crash could stop it")

func (e *Engine) died(point string) bool { return e.die != nil && e.die(point) }

// ScratchFile returns an unnamed file on the upper tree's file system, for
// the FUSE layer to try passthrough with. The caller closes it.
func (e *Engine) ScratchFile() (int, error) {
	return unix.Openat(e.workFd, ".", unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
}

// New opens the workspace and the state dir and loads the pending set.
func New(opts Options) (*Engine, error) {
	if opts.Mode == "" {
		opts.Mode = Staged
	}
	if !filepath.IsAbs(opts.Workspace) || !filepath.IsAbs(opts.StateDir) {
		return nil, errors.New("overlay: workspace and state dir must be absolute paths")
	}
	e := &Engine{
		opts:     opts,
		journal:  opts.Journal,
		onChange: opts.OnChange,
		logf:     opts.Logf,
		index:    map[string]*meta{},
		children: map[string]map[string]bool{},
		showing:  map[uint64][]string{},
		shownAt:  map[string]uint64{},
		mode:     opts.Mode,
		writers:  map[uint64]int{},
		base:     layer{fd: -1},
		upper:    layer{fd: -1, dirs: newDirCache()},
		workFd:   -1,
	}
	if e.logf == nil {
		e.logf = func(string, ...any) {}
	}
	e.turnOpts = opts.Turns
	if e.turnOpts.MaxTurns <= 0 {
		e.turnOpts.MaxTurns = 50
	}
	if e.turnOpts.MaxAge <= 0 {
		e.turnOpts.MaxAge = 7 * 24 * time.Hour
	}
	if e.snaps = opts.Snapshots; e.snaps != nil {
		e.snaps.OnDrop(func(id string) {
			os.Remove(e.postFile(id))
			e.dropMoveStates(id)
		})
		e.removeStalePosts()
		e.startTurns()
		e.openSnaps.Store(int64(len(e.snaps.OpenSnapshots())))
	}
	var err error
	if e.base.fd, err = unix.Open(opts.Workspace, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("open workspace %s: %w", opts.Workspace, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(e.base.fd, &st); err != nil {
		e.Close()
		return nil, err
	}
	e.rootDev = st.Dev
	for _, d := range []string{"upper", "work"} {
		if err := os.MkdirAll(filepath.Join(opts.StateDir, d), 0o700); err != nil {
			e.Close()
			return nil, err
		}
	}
	if e.upper.fd, err = unix.Open(filepath.Join(opts.StateDir, "upper"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		e.Close()
		return nil, err
	}
	if err := unix.Fstat(e.upper.fd, &st); err != nil {
		e.Close()
		return nil, err
	}
	e.upperRootIno = st.Ino
	e.removeCommitStage() // a commit's copies a crash left behind
	if err := e.cleanWork(); err != nil {
		e.Close()
		return nil, err
	}
	if e.workFd, err = unix.Open(filepath.Join(opts.StateDir, "work"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		e.Close()
		return nil, err
	}
	if e.inos, err = loadInoMap(opts.StateDir); err != nil {
		e.Close()
		return nil, err
	}
	if err := e.checkXattrs(); err != nil {
		e.Close()
		return nil, err
	}
	if err := e.loadIndex(""); err != nil {
		e.Close()
		return nil, fmt.Errorf("load pending set from %s: %w", filepath.Join(opts.StateDir, "upper"), err)
	}
	e.seedUpperIno()
	if e.snaps != nil {
		e.saveMissingPosts()
	}
	if opts.JournalSync > 0 && e.journal != nil {
		e.stopSync, e.syncDone = make(chan struct{}), make(chan struct{})
		go e.syncEvery(opts.JournalSync)
	}
	return e, nil
}

// syncEvery makes the journal durable every interval (--journal-sync).
func (e *Engine) syncEvery(interval time.Duration) {
	defer close(e.syncDone)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-e.stopSync:
			return
		case <-t.C:
			if err := e.journal.Sync(); err != nil {
				e.logf("journal: %v", err)
			}
		}
	}
}

// Close releases the engine's directory descriptors.
func (e *Engine) Close() error {
	e.trashWG.Wait() // it unlinks in work/
	if e.stopSync != nil {
		close(e.stopSync)
		<-e.syncDone
		e.stopSync = nil
		e.Sync()
	}
	if e.upper.fd >= 0 {
		e.saveChangers()
	}
	e.upper.dirs.flush()
	for _, fd := range []*int{&e.base.fd, &e.upper.fd, &e.workFd} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	return nil
}

// Mode returns the current mode.
func (e *Engine) Mode() Mode {
	e.rlock()
	defer e.runlock()
	return e.mode
}

// SetMode switches between staged and immediate. Switching to immediate
// while changes are pending is refused: they would be hidden by writes that
// go around them. c is who asked (a control socket client); the journal
// records its pid and command.
func (e *Engine) SetMode(m Mode, c Caller) (Mode, error) {
	var prev Mode
	err := e.locked(func() error {
		e.finishForks()
		prev = e.mode
		if m == Immediate && prev != Immediate {
			if n := e.pendingCountLocked(); n > 0 {
				return &StateError{fmt.Sprintf("%d pending change(s): commit or discard them before switching to immediate mode", n)}
			}
		}
		e.mode = m
		return nil
	})
	if err != nil {
		return prev, err
	}
	e.note(Record{Op: "set_mode", Pid: c.Pid, Detail: string(prev) + " -> " + string(m)})
	return prev, nil
}

// StateError is an operation refused because of the engine's state.
type StateError struct{ Msg string }

func (e *StateError) Error() string { return e.Msg }

func (e *Engine) pendingCountLocked() int {
	n := 0
	for _, m := range e.index {
		if m.isChange() {
			n++
		}
	}
	return n
}

// cleanWork removes leftovers of operations a crash interrupted: nothing in
// work/ is ever part of the pending set.
func (e *Engine) cleanWork() error {
	work := filepath.Join(e.opts.StateDir, "work")
	ents, err := os.ReadDir(work)
	if err != nil {
		return err
	}
	for _, ent := range ents {
		if err := os.RemoveAll(filepath.Join(work, ent.Name())); err != nil {
			return err
		}
	}
	return nil
}

// checkXattrs fails early, with a clear message, on a state dir whose
// filesystem cannot hold user xattrs.
func (e *Engine) checkXattrs() error {
	name := e.tmpName()
	fd, err := unix.Openat(e.workFd, name, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("state dir %s is not writable: %w", e.opts.StateDir, err)
	}
	defer unix.Close(fd)
	defer unix.Unlinkat(e.workFd, name, 0)
	if err := unix.Fsetxattr(fd, metaXattr, []byte("{}"), 0); err != nil {
		return fmt.Errorf("the state dir's filesystem (%s) does not support user extended attributes (%v): put the state dir on ext4, xfs, btrfs or tmpfs with --state", e.opts.StateDir, err)
	}
	return nil
}

func (e *Engine) tmpName() string {
	return fmt.Sprintf("t%d.%d", selfPid, e.tmpSeq.Add(1))
}

// selfPid names the daemon's temporary files (asked once: a getpid per
// new file showed in every unlink's system calls).
var selfPid = os.Getpid()

// loadIndex walks the upper tree below dir and fills the index.
func (e *Engine) loadIndex(dir string) error {
	fd, err := e.upper.openDirRead(dir)
	if err != nil {
		return err
	}
	ents, err := readDirents(fd)
	unix.Close(fd)
	if err != nil {
		return err
	}
	for _, d := range ents {
		p := joinPath(dir, d.Name)
		st, err := e.upper.lstat(p)
		if err != nil {
			return err
		}
		m, err := e.readMeta(p, st, e.upperDirIno(dir))
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		e.setEntry(p, m)
		if m.Kind == KindDir {
			if err := e.loadIndex(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// readMeta reads the meta of the upper entry p, in the upper directory
// whose inode number is dirIno. An entry without one was created just
// before a crash, before its meta was written: a directory is taken as a
// container, a file as a new file whose baseline is the base's now.
func (e *Engine) readMeta(p string, st *syscall.Stat_t, dirIno uint64) (*meta, error) {
	buf := make([]byte, 4096)
	n, err := e.upper.getxattr(p, metaXattr, buf)
	if err == nil {
		m, err := decodeMeta(buf[:n])
		if err != nil {
			return nil, err
		}
		m.uino = st.Ino
		_, name := splitPath(p)
		// Metas written before they named their place (NameSum 0) are
		// taken as in place, and a directory number 0 as unknown.
		misplaced := m.NameSum != 0 && (m.NameSum != nameSum(name) || (m.Dir != 0 && m.Dir != dirIno))
		switch {
		case m.Kind != KindDir && st.Nlink > 1 && (misplaced || m.NameSum == 0):
			e.relinkBaseline(p, &m)
		case misplaced:
			e.rebaseMisplaced(p, &m)
		}
		return &m, nil
	}
	if err != unix.ENODATA {
		return nil, err
	}
	m := &meta{uino: st.Ino, Time: time.Now().UnixNano()}
	if bst, _ := e.loadBaseStat(p); bst != nil {
		m.Base = baselineOf(bst)
		m.Ino = e.baseInoAt(p, bst)
	}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		m.Kind, m.Container = KindDir, true
	case syscall.S_IFREG:
		m.Kind = KindFile
	default:
		return nil, fmt.Errorf("unexpected file type %o in the upper tree", st.Mode&syscall.S_IFMT)
	}
	e.logf("overlay: %s had no meta (interrupted operation); taken as %s", p, m.Kind)
	return m, nil
}

// rebaseMisplaced fixes the meta of an entry that a crash caught in the
// middle of a rename, after rename wrote the meta for the destination and
// before it moved the entry there: the rename did not happen, and the
// baseline (what the workspace had at the destination), redirect and
// opacity are not this place's. The rename kept those of this place in
// Was. A meta written before Was existed gets what the workspace has here
// now, the best knowledge left: wrong only if the workspace changed here
// from outside since the entry was staged.
func (e *Engine) rebaseMisplaced(p string, m *meta) {
	if w := m.Was; w != nil {
		// The rename kept what the entry was here.
		m.Base, m.Redirect, m.Opaque, m.Container, m.AttrOnly = w.Base, w.Redirect, w.Opaque, w.Container, w.AttrOnly
		e.logf("overlay: %s: a rename from here was interrupted; the entry stays", p)
		if err := e.writeMeta(p, m); err != nil {
			e.logf("overlay: %s: %v", p, err)
		}
		return
	}
	bst, basePath := e.loadBaseStat(p)
	m.Base = Baseline{}
	if bst != nil {
		m.Base = baselineOf(bst)
	}
	if m.Kind == KindDir && m.Redirect != "" && m.Redirect == basePath {
		m.Redirect = "" // where the base has it: not a rename
	}
	e.logf("overlay: %s: a rename from here was interrupted; its baseline is the workspace's now (%s)", p, m.Base)
	if err := e.writeMeta(p, m); err != nil {
		e.logf("overlay: %s: %v", p, err)
	}
}

// loadBaseStat returns, while the index loads, what the base has behind
// the view's path p and that path in the base: under a renamed directory
// it is not p. p's ancestors are loaded already (loadIndex goes top down).
func (e *Engine) loadBaseStat(p string) (*syscall.Stat_t, string) {
	l, err := e.locate(p)
	if err != nil {
		return nil, ""
	}
	return e.baseStat(l), l.basePath
}

// relinkBaseline fixes the baseline of one name of a hard-linked upper
// file. The names share one inode, hence one meta, which holds the baseline
// of the name it was last written for: a name whose base entry is not the
// one that baseline describes gets what the base has there now (as for an
// entry without meta). The parent directories are loaded already, so
// locate finds the name's base path.
func (e *Engine) relinkBaseline(p string, m *meta) {
	bst, _ := e.loadBaseStat(p)
	if m.Base.Exists && bst != nil && bst.Ino == m.Base.Ino {
		return
	}
	m.Base = Baseline{}
	if bst != nil {
		m.Base = baselineOf(bst)
	}
}

// setEntry puts m at p in the index.
func (e *Engine) setEntry(p string, m *meta) {
	e.index[p] = m
	e.noteShown(p, m)
	dir, name := splitPath(p)
	c := e.children[dir]
	if c == nil {
		c = map[string]bool{}
		e.children[dir] = c
	}
	c[name] = true
}

// dropEntry removes p (and everything the index holds below it).
func (e *Engine) dropEntry(p string) {
	if m := e.index[p]; m != nil && m.Kind == KindDir {
		for name := range e.children[p] {
			e.dropEntry(joinPath(p, name))
		}
		delete(e.children, p)
	}
	delete(e.index, p)
	e.dropShown(p)
	dir, name := splitPath(p)
	if c := e.children[dir]; c != nil {
		delete(c, name)
		if len(c) == 0 {
			delete(e.children, dir)
		}
	}
}

// moveEntries renames p and everything below it in the index to q.
func (e *Engine) moveEntries(p, q string) {
	type kv struct {
		k string
		m *meta
	}
	var moved []kv
	var walk func(string)
	walk = func(x string) {
		m := e.index[x]
		if m == nil {
			return
		}
		moved = append(moved, kv{x, m})
		if m.Kind == KindDir {
			for name := range e.children[x] {
				walk(joinPath(x, name))
			}
		}
	}
	walk(p)
	e.dropEntry(p)
	for _, x := range moved {
		e.setEntry(q+strings.TrimPrefix(x.k, p), x.m)
	}
}

// baseIno is the inode number shown for a base entry. Entries on other
// filesystems mounted inside the workspace get their device mixed in, so
// numbers stay unique.
func (e *Engine) baseIno(st *syscall.Stat_t) uint64 {
	if st.Dev != e.rootDev {
		return st.Ino ^ (st.Dev << 40)
	}
	if e.inos == nil {
		return st.Ino
	}
	return e.inos.shownFor(st.Ino)
}

// isBaseOf reports whether baseline b (which holds the workspace's real
// inode number) describes the base entry that the mount shows as shown.
func (e *Engine) isBaseOf(b Baseline, shown uint64) bool {
	if b.Ino == 0 {
		return false
	}
	if b.Ino == shown || isReservedOf(shown, b.Ino) {
		return true
	}
	return e.inos != nil && e.inos.shownFor(b.Ino) == shown
}

// upperInoBit marks inode numbers of entries that exist only in the pending
// set, so they never collide with a workspace inode.
const upperInoBit = 1 << 62

func (m *meta) shownIno() uint64 {
	if m.Ino != 0 {
		return m.Ino
	}
	return m.uino | upperInoBit
}

// newUpperIno gives a new entry of the pending set an inode number never
// shown before in this mount. The upper file's own number would do only
// until the filesystem reuses it for another file while the kernel still
// knows the old one: the kernel would then take the new file for the old,
// cached pages included.
func (e *Engine) newUpperIno() uint64 {
	return upperInoBit | e.upperIno.Add(1)
}

// seedUpperIno starts newUpperIno above every number already in use: the
// pending set's and the ones commits keep for the workspace.
func (e *Engine) seedUpperIno() {
	top := uint64(0)
	note := func(ino uint64) {
		if ino&upperInoBit != 0 && ino&^upperInoBit > top {
			top = ino &^ upperInoBit
		}
	}
	for _, m := range e.index {
		note(m.shownIno())
	}
	note(e.inos.maxShown(upperInoBit))
	e.upperIno.Store(top)
}

// loc is where a path of the merged view lives.
type loc struct {
	m        *meta  // upper entry at the path; nil when none
	basePath string // the path's counterpart in the base (differs under a renamed dir)
	hasBase  bool   // whether the base is consulted for the path at all
}

// visible reports whether the upper entry hides the path (deleted).
func (l loc) deleted() bool {
	return l.m != nil && (l.m.Kind == KindWhiteout || l.m.Deleted)
}

// locate finds p's layers. It fails with ENOENT or ENOTDIR when an ancestor
// does not exist or is not a directory in the upper tree; ancestors that
// live only in the base are checked by the *at calls that follow.
func (e *Engine) locate(p string) (loc, error) {
	if e.isHidden(p) {
		return loc{}, syscall.ENOENT
	}
	if e.mode == Immediate {
		return loc{basePath: p, hasBase: true}, nil
	}
	l := loc{hasBase: true}
	cur, basePath, rest := "", "", p
	for rest != "" {
		name := rest
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			name, rest = rest[:i], rest[i+1:]
		} else {
			rest = ""
		}
		cur = joinPath(cur, name)
		basePath = joinPath(basePath, name)
		m := e.index[cur]
		if rest == "" {
			l.m = m
			break
		}
		if m == nil {
			if !l.hasBase {
				return loc{}, syscall.ENOENT
			}
			continue
		}
		if m.Kind == KindWhiteout || m.Deleted {
			return loc{}, syscall.ENOENT
		}
		if m.Kind != KindDir {
			return loc{}, syscall.ENOTDIR
		}
		if m.Opaque {
			// Also when a redirect is kept (a renamed directory deleted
			// and made again): its base contents stay hidden.
			l.hasBase = false
		} else if m.Redirect != "" {
			basePath, l.hasBase = m.Redirect, true
		}
	}
	l.basePath = basePath
	return l, nil
}

// isHidden reports whether p is, or is below, a hidden path.
func (e *Engine) isHidden(p string) bool {
	if p == "" {
		return false
	}
	if isCommitTemp(p) {
		return true
	}
	for _, h := range e.opts.Hidden {
		if isUnder(p, h) {
			return true
		}
	}
	return matchAny(e.opts.Hide, p)
}

// statLoc returns the merged view's attributes of p.
func (e *Engine) statLoc(p string, l loc) (*syscall.Stat_t, error) {
	if l.m != nil {
		if l.deleted() {
			return nil, syscall.ENOENT
		}
		st, err := e.upper.lstat(p)
		if err != nil {
			return nil, err
		}
		decorate(st, l.m)
		return st, nil
	}
	if !l.hasBase {
		return nil, syscall.ENOENT
	}
	st, err := e.base.lstat(l.basePath)
	if err != nil {
		return nil, err
	}
	st.Ino = e.viewIno(st)
	if p == "" {
		e.rootTimes(st)
	}
	return st, nil
}

// rootTimes gives the view's root the times a directory shows: changed by
// what is staged in it too. The root has no pending entry of its own (it
// is the workspace's, always); the upper tree's root changes with every
// staged entry in it, and the later of the two times is the view's.
func (e *Engine) rootTimes(st *syscall.Stat_t) {
	if e.mode != Staged || len(e.children[""]) == 0 {
		return
	}
	var ust unix.Stat_t
	if unix.Fstat(e.upper.fd, &ust) != nil {
		return
	}
	if later(ust.Mtim, unix.Timespec(st.Mtim)) {
		st.Mtim = syscall.Timespec(ust.Mtim)
	}
	if later(ust.Ctim, unix.Timespec(st.Ctim)) {
		st.Ctim = syscall.Timespec(ust.Ctim)
	}
}

// later reports whether a is after b.
func later(a, b unix.Timespec) bool {
	return a.Sec > b.Sec || a.Sec == b.Sec && a.Nsec > b.Nsec
}

// decorate turns an upper file's attributes into those of the entry it
// stands for.
func decorate(st *syscall.Stat_t, m *meta) {
	st.Ino = m.shownIno()
	switch m.Kind {
	case KindSymlink:
		st.Mode = syscall.S_IFLNK | 0o777
	case KindSpecial:
		st.Mode = m.Mode
		st.Rdev = m.Rdev
		st.Size = 0
	}
}

// baseStat returns the base's entry behind a loc, nil when there is none.
func (e *Engine) baseStat(l loc) *syscall.Stat_t {
	if !l.hasBase {
		return nil
	}
	st, err := e.base.lstat(l.basePath)
	if err != nil {
		return nil
	}
	return st
}

// Stat returns the attributes of p in the merged view.
func (e *Engine) Stat(p string) (*syscall.Stat_t, error) {
	e.rlock()
	defer e.runlock()
	return e.statLocked(p)
}

// LookupStat is Stat for a lookup, which also says whether p names an
// unchanged workspace file that other workspace names share (a hard
// link): the view treats each name as a file of its own, which a write
// copies up alone, so the kernel must not take the names for one file
// (fusefs gives each its own node).
func (e *Engine) LookupStat(p string) (st *syscall.Stat_t, sharedName bool, err error) {
	e.rlock()
	defer e.runlock()
	l, err := e.locate(p)
	if err != nil {
		return nil, false, err
	}
	st, err = e.statLoc(p, l)
	return st, err == nil && l.sharedBaseName(st), err
}

// sharedBaseName reports whether st, the stat of the view at l, is that
// of a workspace file with other names (see LookupStat).
func (l loc) sharedBaseName(st *syscall.Stat_t) bool {
	return l.m == nil && l.hasBase && st.Mode&syscall.S_IFMT != syscall.S_IFDIR && st.Nlink > 1
}

// statLocked is Stat for a caller holding the engine's lock.
func (e *Engine) statLocked(p string) (*syscall.Stat_t, error) {
	l, err := e.locate(p)
	if err != nil {
		return nil, err
	}
	return e.statLoc(p, l)
}

// OpenForWriting reports whether a process has p's pending body open for
// writing (a merge, like a commit, leaves such a file for later).
func (e *Engine) OpenForWriting(p string) bool {
	e.rlock()
	defer e.runlock()
	m := e.index[p]
	return m != nil && m.Kind == KindFile && e.writers[m.uino] > 0
}

// PendingBodyIno returns the inode number of p's pending body (the upper
// file a staged regular file reads from), 0 when p has none.
func (e *Engine) PendingBodyIno(p string) uint64 {
	e.rlock()
	defer e.runlock()
	if m := e.index[p]; m != nil && m.Kind == KindFile {
		return m.uino
	}
	return 0
}

// IsStaged reports whether p has an upper entry (for handles that must move
// to the upper copy after a copy-up).
func (e *Engine) IsStaged(p string) bool {
	e.rlock()
	defer e.runlock()
	m := e.index[p]
	return m != nil && m.Kind != KindWhiteout && !m.Deleted
}

// CopyGeneration changes whenever a copy-up happened anywhere.
func (e *Engine) CopyGeneration() uint64 { return e.copyGen.Load() }

// Statfs reports the workspace filesystem's statistics.
func (e *Engine) Statfs() (*syscall.Statfs_t, error) {
	var st syscall.Statfs_t
	err := syscall.Fstatfs(e.base.fd, &st)
	return &st, err
}
