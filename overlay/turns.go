package overlay

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"stagefs/internal/atomicfile"
	"stagefs/internal/contenthash"
	"stagefs/internal/unidiff"
	"stagefs/snapshot"
)

// Turns group tool calls between two turn boundaries. While a turn is open,
// an unbound snapshot with scope "turn:ID" captures the first mutation of
// each path by any process. When the turn ends, the post-images of its
// paths are captured as "post:ID", so a later rollback can tell which paths
// someone changed after the turn. A rollback first captures what it is
// about to overwrite as "redo:N", so redo can take it back.
const (
	turnPrefix = "turn:"
	postPrefix = "post:"
	redoPrefix = "redo:"
	// forkPrefix names a branch's snapshot of what it changed since its
	// fork point (package branch).
	forkPrefix = "fork:"
)

// ToolCallScope reports whether a snapshot scope id names a tool call,
// not one of the engine's own snapshots of turns, rollbacks and redos.
func ToolCallScope(s string) bool { return !internalScope(s) }

// internalScope reports whether a scope belongs to turns rather than to a
// host's tool call.
// InternalScope reports whether s names one of the engine's own snapshots
// (a turn's, what a turn left, a redo), not a tool call's.
func InternalScope(s string) bool { return internalScope(s) }

func internalScope(s string) bool {
	return strings.HasPrefix(s, turnPrefix) || strings.HasPrefix(s, postPrefix) || strings.HasPrefix(s, redoPrefix) || strings.HasPrefix(s, forkPrefix)
}

// TurnOptions bound what turns keep.
type TurnOptions struct {
	MaxTurns  int           // turns kept (default 50)
	MaxAge    time.Duration // turns older than this are pruned (default 7 days)
	NoCapture []string      // globs of paths staged without capturing pre-images
}

// Turn describes one turn.
type Turn struct {
	ID      string
	Label   string
	Started time.Time
	Open    bool
	Paths   []string
	Bytes   int64
	// Uncaptured are paths the turn changed whose pre-image could not be
	// stored (a full state dir): a rollback cannot put them back.
	Uncaptured []string
}

type turnLabel struct {
	Label   string `json:"label,omitempty"`
	Started int64  `json:"started"`
}

func (e *Engine) turnsFile() string { return filepath.Join(e.opts.StateDir, "turns.json") }

func (e *Engine) loadTurnLabels() map[string]turnLabel {
	m := map[string]turnLabel{}
	if b, err := os.ReadFile(e.turnsFile()); err == nil {
		json.Unmarshal(b, &m)
	}
	return m
}

func (e *Engine) saveTurnLabels(m map[string]turnLabel) error {
	b, _ := json.Marshal(m)
	return atomicfile.Write(e.turnsFile(), b, 0o600)
}

// MarkUser marks pid (and its descendants) as the user's own processes,
// or unmarks it: their changes are never captured into a turn, and a path
// they change during a turn is a conflict for a rollback of that turn.
func (e *Engine) MarkUser(pid int, user bool) {
	e.userMu.Lock()
	defer e.userMu.Unlock()
	if e.userPids == nil {
		e.userPids = map[int]bool{}
	}
	if user {
		e.userPids[pid] = true
	} else {
		delete(e.userPids, pid)
	}
}

func (e *Engine) isUserProcess(pid int) bool {
	e.userMu.Lock()
	defer e.userMu.Unlock()
	for u := range e.userPids {
		if e.procs.descends(pid, u) {
			return true
		}
	}
	return false
}

// A turn's notes name the paths someone other than the agent changed
// while it was open; a rollback of the turn keeps them as conflicts.
const (
	userNote    = ".user"    // by a process marked as the user's
	outsideNote = ".outside" // from outside the mount (outsideChangesLocked)
)

func (e *Engine) noteFile(turn, kind string) string {
	return filepath.Join(e.opts.StateDir, "posts", turnPrefix+turn+kind)
}

// noteUserChange records, for the open turn, paths a user's process
// changed.
func (e *Engine) noteUserChange(paths []string) {
	if turn := e.CurrentTurn(); turn != "" {
		e.addNote(turn, userNote, paths)
	}
}

func (e *Engine) addNote(turn, kind string, paths []string) {
	os.MkdirAll(filepath.Dir(e.noteFile(turn, kind)), 0o700)
	f, err := os.OpenFile(e.noteFile(turn, kind), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		e.logf("note the user's change: %v", err)
		return
	}
	for _, p := range paths {
		fmt.Fprintf(f, "%s\n", p)
	}
	f.Close()
}

func (e *Engine) readNote(turn, kind string) map[string]bool {
	b, err := os.ReadFile(e.noteFile(turn, kind))
	if err != nil {
		return nil
	}
	out := map[string]bool{}
	for _, p := range strings.Split(string(b), "\n") {
		if p != "" {
			out[p] = true
		}
	}
	return out
}

// CurrentTurn returns the open turn's id, "" when none is open.
func (e *Engine) CurrentTurn() string {
	if e.snaps == nil {
		return ""
	}
	for _, s := range e.snaps.OpenSnapshots() {
		if strings.HasPrefix(s.ScopeID, turnPrefix) {
			return strings.TrimPrefix(s.ScopeID, turnPrefix)
		}
	}
	return ""
}

// StartTurn ends the open turn (capturing its post-images) and starts a
// new one. An empty id gets the next number.
func (e *Engine) StartTurn(id, label string) (Turn, error) {
	if e.snaps == nil {
		return Turn{}, errors.New("snapshots are not enabled")
	}
	e.lockTurns()
	defer e.unlockTurns()
	if err := e.endTurnLocked(); err != nil {
		return Turn{}, err
	}
	labels := e.loadTurnLabels()
	if id == "" {
		n := len(labels) + 1
		for {
			id = fmt.Sprintf("t%d", n)
			if _, ok := labels[id]; !ok {
				if _, ok := e.snaps.Lookup(turnPrefix + id); !ok {
					break
				}
			}
			n++
		}
	}
	if err := snapshot.ValidScope(turnPrefix + id); err != nil {
		return Turn{}, err
	}
	// A turn id used again replaces the old turn.
	e.dropTurn(id)
	start := time.Now().UnixNano()
	info, err := e.OpenSnapshot(turnPrefix+id, id, 0, nil)
	if err != nil {
		return Turn{}, err
	}
	e.beginTurnWrites(start)
	labels[id] = turnLabel{Label: label, Started: info.Created}
	if err := e.saveTurnLabels(labels); err != nil {
		return Turn{}, err
	}
	e.pruneTurns(labels)
	return Turn{ID: id, Label: label, Started: time.Unix(0, info.Created), Open: true}, nil
}

func (e *Engine) endTurnLocked() error {
	cur := e.CurrentTurn()
	if cur == "" {
		return nil
	}
	info, err := e.CloseSnapshot(turnPrefix + cur)
	if err != nil {
		return err
	}
	var outside []string
	e.rlocked(func() error {
		outside = e.outsideChangesLocked(uniqStrings(info.Paths))
		return nil
	})
	e.endTurnWrites()
	if len(outside) > 0 {
		e.addNote(cur, outsideNote, outside)
	}
	err = e.capturePost(cur, info.Paths)
	e.dropOrphans() // closing may have made the byte cap evict a turn
	return err
}

// beginTurnWrites starts noting the mount's changes for a turn opened at
// since (unix ns).
func (e *Engine) beginTurnWrites(since int64) {
	w := &e.turns
	w.mu.Lock()
	defer w.mu.Unlock()
	w.open, w.since, w.changed = true, since, map[string]int64{}
}

func (e *Engine) endTurnWrites() {
	w := &e.turns
	w.mu.Lock()
	defer w.mu.Unlock()
	w.open, w.changed = false, nil
}

// noteTurnChange notes, while a turn is open, that the mount has just
// changed the paths of r: appendRecord calls it for every journal record,
// and every change through the mount is journaled after it is made.
func (e *Engine) noteTurnChange(r Record) {
	w := &e.turns
	w.mu.Lock()
	defer w.mu.Unlock()
	switch r.Op {
	case "open_write", "open_trunc", "create":
		if w.writing == nil {
			w.writing = map[string]int{}
		}
		w.writing[r.Path]++
	case "close_write":
		// A handle renamed while open closes under its new name: the
		// old name then stays counted (its outside edits go unseen),
		// and the new one is never counted below zero.
		if w.writing[r.Path]--; w.writing[r.Path] <= 0 {
			delete(w.writing, r.Path)
		}
	}
	if !w.open {
		return
	}
	now := time.Now().UnixNano()
	switch {
	case r.Op == "commit_end":
		// A commit writes workspace files with no record per path: all
		// of them are the mount's up to now.
		w.since, w.changed = now, map[string]int64{}
	case r.Path != "" && r.Op != "denied":
		w.changed[r.Path] = now
		if r.Path2 != "" {
			w.changed[r.Path2] = now
		}
	}
}

// outsideChangesLocked returns the paths (of the open turn) whose file
// changed after the mount last changed it: someone changed it outside the
// mount, so what the turn left there is not what the view shows. A file's
// ctime tells, as only the kernel sets it. Only files the view shows from
// the workspace can change so: the daemon alone writes the upper tree.
// Directories are left out: their ctime changes with every entry made in
// them. An edit within a clock tick (a few ms) of the mount's last change
// can go unseen. Called under e.mu (read).
func (e *Engine) outsideChangesLocked(paths []string) []string {
	w := &e.turns
	known := make(map[string]int64, len(paths))
	w.mu.Lock()
	if !w.open {
		w.mu.Unlock()
		return nil
	}
	for _, p := range paths {
		if w.writing[p] > 0 {
			continue // open for writing through the mount
		}
		known[p] = max(w.since, w.changed[p])
	}
	w.mu.Unlock()
	var out []string
	for _, p := range paths {
		if _, ok := known[p]; !ok {
			continue
		}
		l, err := e.locate(p)
		if err != nil || l.m != nil || !l.hasBase {
			continue
		}
		st, err := e.base.lstat(l.basePath)
		if err != nil || st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			continue
		}
		if st.Ctim.Nano() > known[p] {
			out = append(out, p)
		}
	}
	return out
}

// capturePost records what the turn left at each path it changed.
func (e *Engine) capturePost(id string, paths []string) error {
	e.snaps.Drop(postPrefix + id)
	if len(paths) == 0 {
		return nil
	}
	scope := postPrefix + id
	if _, err := e.snaps.Create(scope, id, 0); err != nil {
		return err
	}
	e.openSnaps.Add(1)
	err := e.rlocked(func() error {
		for _, p := range uniqStrings(paths) {
			pre, err := e.preImage(p)
			if err == nil {
				err = e.snaps.Add(scope, *pre)
			}
			if errors.Is(err, snapshot.ErrOverCap) {
				// No room for this end state: rollback then treats the
				// path as it does one of an open turn (no later-change
				// check), rather than the turn failing to end.
				e.logf("end state of %s in turn %s: %v", p, id, err)
				continue
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if _, cerr := e.CloseSnapshot(scope); err == nil {
		err = cerr
	}
	return err
}

// startTurns picks up the turns a previous daemon left, as the engine
// starts.
func (e *Engine) startTurns() {
	e.dropStaleRedo()
	// Retention holds from the start, not only from the next turn.
	e.pruneTurns(e.loadTurnLabels())
	if e.CurrentTurn() != "" {
		// What changed while no daemon ran is not known: from now on.
		e.beginTurnWrites(time.Now().UnixNano())
	}
}

// dropStaleRedo removes redo snapshots a previous daemon left: redo does not
// survive a restart.
func (e *Engine) dropStaleRedo() {
	for _, s := range e.snaps.List() {
		if strings.HasPrefix(s.ScopeID, redoPrefix) {
			e.snaps.Drop(s.ScopeID)
		}
	}
}

func uniqStrings(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func (e *Engine) dropTurn(id string) {
	e.snaps.Drop(turnPrefix + id)
	e.snaps.Drop(postPrefix + id)
	os.Remove(e.noteFile(id, userNote))
	os.Remove(e.noteFile(id, outsideNote))
}

// dropOrphans drops what is left of turns whose snapshot is gone: the byte
// cap evicts snapshots one at a time, oldest first, so it can drop a turn's
// pre-images and leave its end state (post:ID), which then holds bytes and
// tells nothing. It reports whether it dropped any.
func (e *Engine) dropOrphans() bool {
	dropped := false
	for _, s := range e.snaps.List() {
		id, ok := strings.CutPrefix(s.ScopeID, postPrefix)
		if !ok {
			continue
		}
		if _, ok := e.snaps.Lookup(turnPrefix + id); !ok {
			e.dropTurn(id)
			dropped = true
		}
	}
	return dropped
}

// pruneTurns keeps the newest MaxTurns turns younger than MaxAge (the open
// turn always stays), then collects unreferenced bodies.
func (e *Engine) pruneTurns(labels map[string]turnLabel) {
	changed := e.dropOrphans()
	turns := e.turnSnapshots()
	cutoff := time.Now().Add(-e.turnOpts.MaxAge).UnixNano()
	// Closed turns that captured nothing hold nothing to roll back to: they do not
	// count against MaxTurns, so a burst of empty turns (prompts that
	// changed nothing, or a tool starting turns on purpose) cannot push
	// out the ones that did; only the newest few of them are kept.
	const keepEmpty = 8
	full, empty := 0, 0
	for i := len(turns) - 1; i >= 0; i-- {
		t := turns[i]
		tooMany := false
		if t.Closed && len(t.Paths) == 0 && len(t.Uncaptured) == 0 {
			empty++
			tooMany = empty > keepEmpty
		} else {
			full++
			tooMany = full > e.turnOpts.MaxTurns
		}
		if t.Closed && (tooMany || t.Created < cutoff) {
			id := strings.TrimPrefix(t.ScopeID, turnPrefix)
			e.dropTurn(id)
			delete(labels, id)
			changed = true
		}
	}
	for id := range labels {
		if _, ok := e.snaps.Lookup(turnPrefix + id); !ok {
			delete(labels, id)
			changed = true
		}
	}
	if changed {
		e.saveTurnLabels(labels)
		e.snaps.GC()
	}
}

// turnSnapshots lists the turn snapshots, oldest first.
func (e *Engine) turnSnapshots() []snapshot.Info {
	var out []snapshot.Info
	for _, s := range e.snaps.List() {
		if strings.HasPrefix(s.ScopeID, turnPrefix) {
			out = append(out, s)
		}
	}
	return out
}

// touchedPaths lists the paths a snapshot changes, in capture order: its
// entries' paths and the old names of the directories it moved.
func (e *Engine) touchedPaths(scope string) ([]string, error) {
	ents, err := e.snaps.Entries(scope)
	if err != nil {
		return nil, err
	}
	return uniqStrings(entryPaths(ents)), nil
}

// Turns lists the turns, newest first.
func (e *Engine) Turns() []Turn {
	if e.snaps == nil {
		return nil
	}
	labels := e.loadTurnLabels()
	ts := e.turnSnapshots()
	out := make([]Turn, 0, len(ts))
	for i := len(ts) - 1; i >= 0; i-- {
		s := ts[i]
		id := strings.TrimPrefix(s.ScopeID, turnPrefix)
		paths, _ := e.touchedPaths(s.ScopeID)
		out = append(out, Turn{ID: id, Label: labels[id].Label, Started: time.Unix(0, s.Created), Open: !s.Closed, Paths: paths, Bytes: s.Bytes, Uncaptured: s.Uncaptured})
	}
	return out
}

// RollbackResult reports a rollback or a redo.
type RollbackResult struct {
	Turn      string
	Restored  []string
	Conflicts []Conflict
	Failed    []Failure
}

// rollbackPlan is what a rollback to a turn would do.
type rollbackPlan struct {
	turns     []string                    // newest first
	post      map[string]*snapshot.Entry  // path -> what the newest turn touching it left
	pre       map[string][]snapshot.Entry // path -> its pre-images in those turns
	target    map[string]snapshot.Entry   // path -> the oldest pre-image: what the rollback restores
	moves     []snapshot.Entry            // directory moves, in the order the rollback undoes them
	paths     []string
	conflicts []Conflict
}

// planRollback finds the turns from turnID (default: the latest) to now,
// the paths they changed (within only, when given) and the conflicts: paths
// whose view is no longer what the turns left.
func (e *Engine) planRollback(turnID string, only []string, force bool) (*rollbackPlan, error) {
	ts := e.turnSnapshots()
	if len(ts) == 0 {
		return nil, fmt.Errorf("%w: no turns recorded", snapshot.ErrNotFound)
	}
	k := len(ts) - 1
	if turnID != "" {
		k = -1
		for i, t := range ts {
			if t.ScopeID == turnPrefix+turnID {
				k = i
			}
		}
		if k < 0 {
			return nil, fmt.Errorf("%w: no turn %q", snapshot.ErrNotFound, turnID)
		}
	}
	plan := &rollbackPlan{post: map[string]*snapshot.Entry{}, pre: map[string][]snapshot.Entry{}, target: map[string]snapshot.Entry{}}
	seen := map[string]bool{}
	var openPaths []string // the paths of the open turn, if it is one of them
	var allEnts []snapshot.Entry
	var uncaptured []string
	for i := len(ts) - 1; i >= k; i-- {
		id := strings.TrimPrefix(ts[i].ScopeID, turnPrefix)
		plan.turns = append(plan.turns, id)
		ents, err := e.snaps.Entries(ts[i].ScopeID)
		if err != nil {
			return nil, err
		}
		allEnts = append(allEnts, ents...)
		uncaptured = append(uncaptured, ts[i].Uncaptured...)
		for j := len(ents) - 1; j >= 0; j-- {
			ent := ents[j]
			if !within(ent.Path, only) {
				continue
			}
			if ent.Kind == snapshot.KindMoved {
				plan.moves = append(plan.moves, ent)
				continue
			}
			plan.pre[ent.Path] = append(plan.pre[ent.Path], ent)
			plan.target[ent.Path] = ent // older turns come later and win
		}
		posts, _ := e.snaps.Entries(postPrefix + id)
		byPath := map[string]*snapshot.Entry{}
		for j := range posts {
			byPath[posts[j].Path] = &posts[j]
		}
		touched, err := e.touchedPaths(ts[i].ScopeID)
		if err != nil {
			return nil, err
		}
		for _, p := range touched {
			if !within(p, only) {
				continue
			}
			if !ts[i].Closed {
				openPaths = append(openPaths, p)
			}
			if !seen[p] {
				seen[p] = true
				plan.paths = append(plan.paths, p)
				plan.post[p] = byPath[p] // the newest turn's post-image
			}
		}
	}
	sort.Strings(plan.paths)
	if force {
		return plan, nil
	}
	// A path changed during one of these turns by a process the host
	// marked as the user's, or from outside the mount, holds the user's
	// work: a conflict.
	reason := map[string]string{}
	for _, id := range plan.turns {
		for p := range e.readNote(id, outsideNote) {
			reason[p] = "changed outside the mount during the turn"
		}
		for p := range e.readNote(id, userNote) {
			reason[p] = "changed during the turn by a process marked as the user's"
		}
	}
	e.rlock()
	defer e.runlock()
	for _, p := range e.outsideChangesLocked(openPaths) {
		if reason[p] == "" {
			reason[p] = "changed outside the mount during the turn"
		}
	}
	// A directory the turns made that now holds entries they did not make
	// (the user's processes, an edit outside the mount): the rollback
	// would remove them with it.
	e.findLaterBelow(allEnts, uncaptured, func(top, p string) {
		if within(top, only) && reason[top] == "" {
			reason[top] = "holds " + p + ", which these turns did not make"
		}
	})
	for _, p := range plan.paths {
		if reason[p] != "" {
			plan.conflicts = append(plan.conflicts, Conflict{Path: p, Reason: reason[p]})
		}
	}
	for _, p := range plan.paths {
		post := plan.post[p]
		if reason[p] != "" {
			continue
		}
		if post == nil {
			continue // the turn is still open: what it left is the view
		}
		now, err := e.viewState(p)
		if err != nil {
			return nil, err
		}
		if !sameState(now, post) && !matchesAny(now, plan.pre[p]) {
			// Neither what the turns left nor a state a rollback of them
			// restores (an earlier rollback): someone else changed it.
			plan.conflicts = append(plan.conflicts, Conflict{Path: p, Reason: "changed after the turn by someone else", Expected: describe(post), Actual: describe(now)})
		}
	}
	plan.conflicts = append(plan.conflicts, heldMoves(plan)...)
	return plan, nil
}

// heldMoves keeps whole the directory moves that hold a conflict. A move
// rolls back whole or not at all: moving it back would replace what is
// kept at or below its old name, and rolling back only the rest would
// remove its new name with what it holds. Every path at or below either
// name becomes a conflict too (moves within a held one are held in turn).
func heldMoves(plan *rollbackPlan) []Conflict {
	held := map[string]bool{}
	for _, c := range plan.conflicts {
		held[c.Path] = true
	}
	var out []Conflict
	hold := func(p, reason string) {
		if !held[p] {
			held[p] = true
			out = append(out, Conflict{Path: p, Reason: reason})
		}
	}
	for again := true; again; {
		again = false
		for _, m := range plan.moves {
			if held[m.Path] && held[m.From] {
				continue
			}
			cause := ""
			for p := range held {
				if isUnder(p, m.Path) || isUnder(p, m.From) {
					cause = p
					break
				}
			}
			if cause == "" {
				continue
			}
			reason := fmt.Sprintf("in the move of %s to %s, which is kept whole: %s is a conflict", m.From, m.Path, cause)
			hold(m.Path, reason)
			hold(m.From, reason)
			for _, p := range plan.paths {
				if isUnder(p, m.Path) || isUnder(p, m.From) {
					hold(p, reason)
				}
			}
			again = true
		}
	}
	return out
}

// within reports whether p is at or below one of the paths (all when none).
func within(p string, paths []string) bool {
	if len(paths) == 0 {
		return true
	}
	for _, q := range paths {
		if isUnder(p, q) {
			return true
		}
	}
	return false
}

func matchesAny(now *snapshot.Entry, pres []snapshot.Entry) bool {
	for i := range pres {
		if sameState(now, &pres[i]) {
			return true
		}
	}
	return false
}

// sameState compares what a restore, rollback or redo would change at a
// path: its kind, its content (a file's hash, a symlink's target), its
// owner and, but for a symlink, its permission bits. Times are not
// compared: reading a file changes its atime, and restores set them anyway.
func sameState(a, b *snapshot.Entry) bool {
	if a.Kind != b.Kind || a.Uid != b.Uid || a.Gid != b.Gid {
		return false
	}
	switch a.Kind {
	case snapshot.KindFile:
		return a.Hash == b.Hash && a.Mode&0o7777 == b.Mode&0o7777
	case snapshot.KindSymlink:
		return a.Target == b.Target
	}
	return a.Mode&0o7777 == b.Mode&0o7777
}

func describe(e *snapshot.Entry) string {
	switch e.Kind {
	case snapshot.KindFile:
		return fmt.Sprintf("file sha256 %.12s…", e.Hash.Hex())
	case snapshot.KindSymlink:
		return "symlink to " + e.Target
	}
	return string(e.Kind)
}

// Rollback returns the view to its state at the start of turnID (default:
// the latest turn), undoing later turns too, newest first; with paths, only
// those. What it is about to overwrite is captured first, for Redo. Paths
// changed after their turn by someone else are conflicts: kept, unless
// force.
// c is who asked, for the journal.
func (e *Engine) Rollback(turnID string, paths []string, force bool, c Caller) (RollbackResult, error) {
	if e.snaps == nil {
		return RollbackResult{}, errors.New("snapshots are not enabled")
	}
	e.lockTurns()
	defer e.unlockTurns()
	if err := e.endTurnLocked(); err != nil {
		return RollbackResult{}, err
	}
	plan, err := e.planRollback(turnID, paths, force)
	if err != nil {
		return RollbackResult{}, err
	}
	// The redo capture below may need room under the byte cap: it must
	// not evict the turns this rollback is about to restore.
	var held []string
	for _, id := range plan.turns {
		held = append(held, turnPrefix+id, postPrefix+id)
	}
	defer e.snaps.Hold(held...)()
	res := RollbackResult{Turn: plan.turns[len(plan.turns)-1], Conflicts: plan.conflicts}
	skip := map[string]bool{}
	for _, c := range plan.conflicts {
		skip[c.Path] = true
	}
	var touched []string
	for _, p := range plan.paths {
		if !skip[p] {
			touched = append(touched, p)
		}
	}
	// A change since the last rollback or redo has cleared redo.
	if !e.redoValid.Load() {
		e.dropRedo()
	}
	// Redo: what the rollback overwrites, captured before it does, on top
	// of the rollbacks before it.
	newRedo := ""
	if len(touched) > 0 {
		e.redoSeq++
		scope := fmt.Sprintf("%s%d", redoPrefix, e.redoSeq)
		if err := e.captureRedo(scope, res.Turn, touched, plan.moves, skip); err != nil {
			e.snaps.Drop(scope)
			return res, fmt.Errorf("capture redo: %w", err)
		}
		newRedo = scope
	}
	seen := map[string]bool{}
	for _, id := range plan.turns {
		r, err := e.restoreFiltered(turnPrefix+id, func(p string) bool { return within(p, paths) && !skip[p] })
		if err != nil {
			// What was restored before the failure can still be taken
			// back: the redo level goes on the stack all the same.
			e.pushRedo(newRedo)
			return res, err
		}
		for _, p := range r.Restored {
			if !seen[p] {
				seen[p] = true
				res.Restored = append(res.Restored, p)
			}
		}
		res.Failed = append(res.Failed, r.Failed...)
	}
	sort.Strings(res.Restored)
	e.pushRedo(newRedo)
	e.note(Record{Op: "rollback", Pid: c.Pid, Detail: fmt.Sprintf("to the start of %s: %d restored, %d conflicts", res.Turn, len(res.Restored), len(res.Conflicts))})
	return res, nil
}

// captureRedo records what a rollback is about to overwrite: each path's
// current state (parents first), then the directory moves the rollback will
// undo, as moves the other way. Restore goes newest capture first, so redo
// moves the directories back before it puts their contents back.
func (e *Engine) captureRedo(scope, turn string, paths []string, moves []snapshot.Entry, skip map[string]bool) error {
	if _, err := e.snaps.Create(scope, turn, 0); err != nil {
		return err
	}
	e.openSnaps.Add(1)
	defer e.CloseSnapshot(scope)
	byDepth := append([]string(nil), paths...)
	sort.SliceStable(byDepth, func(i, j int) bool { return depth(byDepth[i]) < depth(byDepth[j]) })
	e.rlock()
	defer e.runlock()
	have := map[string]bool{}
	for _, p := range byDepth {
		have[p] = true
	}
	// The turns captured a change inside a directory they then moved
	// under its name from before the move, which is absent now: its state
	// is captured under the name it has now too (each move applied, oldest
	// first), the only record of an edit or a new file there. Redo moves
	// the directory again first, then puts these back. What the turns did
	// not touch comes back with the move itself.
	for _, p := range paths {
		q := p
		for i := len(moves) - 1; i >= 0; i-- {
			m := moves[i]
			if skip[m.Path] || skip[m.From] {
				continue
			}
			if rel, ok := strings.CutPrefix(q, m.From); ok && (rel == "" || rel[0] == '/') {
				q = m.Path + rel
			}
		}
		for dir := q; dir != "" && dir != p && !have[dir]; dir, _ = splitPath(dir) {
			have[dir] = true
			byDepth = append(byDepth, dir)
		}
	}
	sort.SliceStable(byDepth, func(i, j int) bool { return depth(byDepth[i]) < depth(byDepth[j]) })
	for _, p := range byDepth {
		pre, err := e.preImage(p)
		if err != nil {
			return err
		}
		if err := e.snaps.Add(scope, *pre); err != nil {
			return err
		}
	}
	for _, m := range moves {
		if skip[m.Path] || skip[m.From] {
			continue
		}
		// The rollback moves m.Path back to m.From; redo moves it again.
		if err := e.snaps.Add(scope, snapshot.Entry{Kind: snapshot.KindMoved, Path: m.From, From: m.Path}); err != nil {
			return err
		}
	}
	return nil
}

// RollbackDiff shows what a rollback would change, without changing it:
// directory moves as deletions at the new name and creations at the old,
// and without the conflicts the rollback would keep (unless force).
func (e *Engine) RollbackDiff(turnID string, paths []string, force bool) ([]unidiff.FileChange, []Conflict, error) {
	if e.snaps == nil {
		return nil, nil, errors.New("snapshots are not enabled")
	}
	plan, err := e.planRollback(turnID, paths, force)
	if err != nil {
		return nil, nil, err
	}
	skip := map[string]bool{}
	for _, c := range plan.conflicts {
		skip[c.Path] = true
	}
	e.rlock()
	defer e.runlock()
	type state struct {
		body []byte
		mode uint32
	}
	// after holds the state each changed path will have; a nil state is no
	// file. The rollback restores the pre-images first (at the names they
	// were captured under), and moves directories back after them.
	after := map[string]*state{}
	for p, ent := range plan.target {
		if skip[p] {
			continue
		}
		switch ent.Kind {
		case snapshot.KindFile:
			b, err := e.readBody(ent.Hash)
			if err != nil {
				return nil, nil, err
			}
			after[p] = &state{b, gitMode(ent.Mode)}
		case snapshot.KindSymlink:
			after[p] = &state{[]byte(ent.Target), 0o120000}
		default:
			after[p] = nil // absent, or a directory: no file there
		}
	}
	for _, m := range plan.moves {
		if skip[m.Path] || skip[m.From] {
			continue
		}
		moving := map[string]*state{}
		e.walkView(m.Path, func(q string) {
			if _, ok := after[q]; !ok {
				b, mode := e.viewBody(q)
				if mode != 0 {
					moving[q] = &state{b, mode}
				}
			}
		})
		for q, a := range after {
			if a != nil && isUnder(q, m.Path) {
				moving[q] = a
			}
		}
		for q, a := range moving {
			after[q] = nil
			after[m.From+strings.TrimPrefix(q, m.Path)] = a
		}
	}
	var out []unidiff.FileChange
	for p, a := range after {
		ch := unidiff.FileChange{Path: p}
		ch.Old, ch.OldMode = e.viewBody(p)
		if a != nil {
			ch.New, ch.NewMode = a.body, a.mode
			if ch.New == nil {
				ch.New = []byte{}
			}
		}
		if ch.OldMode == ch.NewMode && string(ch.Old) == string(ch.New) {
			continue
		}
		out = append(out, ch)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, plan.conflicts, nil
}

// walkView calls fn for every file and symlink at or below p in the view.
func (e *Engine) walkView(p string, fn func(string)) {
	l, err := e.locate(p)
	if err != nil {
		return
	}
	st, err := e.statLoc(p, l)
	if err != nil {
		return
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		fn(p)
		return
	}
	ents, err := e.readDirLocked(p)
	if err != nil {
		return
	}
	for _, d := range ents {
		e.walkView(joinPath(p, d.Name), fn)
	}
}

func (e *Engine) readBody(hash contenthash.Hash) ([]byte, error) {
	r, err := e.snaps.OpenBody(hash)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var buf strings.Builder
	_, err = copyBuffer(&buf, r)
	return []byte(buf.String()), err
}

// redoLevel is one rollback that redo can take back. Rollbacks stack as
// an editor's undo does: rollback t2, rollback t1, redo, redo returns to
// where the first rollback started. A change by any tool in between
// clears the whole stack.
type redoLevel struct {
	scope string // its redo snapshot: what the rollback overwrote
	// left is what the rollback left at each path the snapshot holds. A
	// path no longer in that state was changed by someone else since: a
	// conflict for redo.
	left map[string]*snapshot.Entry
}

// turnState is what the engine keeps in memory about turns.
type turnState struct {

	// While a turn is open, mu guards when the mount last changed each
	// path (changed, unix ns), and since when every change through the
	// mount is noted (since: the turn's start, the engine's start or the
	// last commit). outsideChangesLocked compares files' ctimes with it.
	mu      sync.Mutex
	open    bool
	since   int64
	changed map[string]int64
	// writing counts, turn or no turn, the mount's open writable handles
	// by path: a file written through one changes after its open record,
	// and must not look changed outside the mount.
	writing map[string]int
}

// viewStates reads the view's state of each path scope changes.
func (e *Engine) viewStates(scope string) map[string]*snapshot.Entry {
	paths, err := e.touchedPaths(scope)
	if err != nil {
		return nil
	}
	out := map[string]*snapshot.Entry{}
	e.rlocked(func() error {
		for _, p := range paths {
			if st, err := e.viewState(p); err == nil {
				out[p] = st
			}
		}
		return nil
	})
	return out
}

// Redo takes back the last rollback not taken back yet, if no process in
// the mount changed anything since. A path changed since the rollback by someone else (from
// outside the mount, which does not clear redo) is a conflict: kept, unless
// force. After a redo with conflicts, redo stays available, so that it can
// be forced.
func (e *Engine) Redo(force bool, c Caller) (RollbackResult, error) {
	e.lockTurns()
	defer e.unlockTurns()
	if len(e.redos) == 0 {
		return RollbackResult{}, fmt.Errorf("%w: nothing to redo", snapshot.ErrNotFound)
	}
	if !e.redoValid.Load() {
		e.dropRedo()
		return RollbackResult{}, fmt.Errorf("%w: files were changed after the rollback, so redo was cleared", snapshot.ErrNotFound)
	}
	top := &e.redos[len(e.redos)-1]
	ents, err := e.snaps.Entries(top.scope)
	if err != nil {
		e.dropRedo() // evicted by the byte cap
		return RollbackResult{}, err
	}
	var conflicts []Conflict
	if !force {
		conflicts = e.redoConflicts(ents, top.left)
	}
	keep := redoFilter(ents, conflicts)
	r, err := e.restoreFiltered(top.scope, keep)
	if err != nil {
		return RollbackResult{}, err
	}
	// Paths a conflict keeps back from a directory move are conflicts too.
	listed := map[string]bool{}
	for _, c := range conflicts {
		listed[c.Path] = true
	}
	for _, p := range uniqStrings(entryPaths(ents)) {
		if !keep(p) && !listed[p] {
			listed[p] = true
			conflicts = append(conflicts, Conflict{Path: p, Reason: "in a directory move that a conflict keeps back"})
		}
	}
	sort.Slice(conflicts, func(i, j int) bool { return conflicts[i].Path < conflicts[j].Path })
	if len(conflicts) == 0 {
		e.snaps.Drop(top.scope)
		e.redos = e.redos[:len(e.redos)-1]
	} else {
		// What redo did is now what it compares with, so only the
		// conflicts stay conflicts for a forced redo.
		now := e.viewStates(top.scope)
		if top.left == nil {
			top.left = map[string]*snapshot.Entry{}
		}
		for _, p := range r.Restored {
			top.left[p] = now[p]
		}
	}
	// The rollbacks below stay redoable: redo's own writes are the
	// daemon's and clear nothing.
	e.redoValid.Store(len(e.redos) > 0)
	e.note(Record{Op: "redo", Pid: c.Pid, Detail: fmt.Sprintf("%d restored, %d conflicts", len(r.Restored), len(conflicts))})
	return RollbackResult{Restored: r.Restored, Conflicts: conflicts, Failed: r.Failed}, nil
}

// redoConflicts compares each path the redo entries change with what the
// rollback left there. A directory redo removes or replaces conflicts
// when it holds files the rollback did not leave (made from outside since).
func (e *Engine) redoConflicts(ents []snapshot.Entry, left map[string]*snapshot.Entry) []Conflict {
	// Directory moves happen first: what is below their source goes with
	// them, and is not removed with a directory that redo removes.
	var away []string
	target := map[string]snapshot.Kind{}
	for _, ent := range ents {
		if ent.Kind == snapshot.KindMoved {
			away = append(away, ent.Path)
		} else {
			target[ent.Path] = ent.Kind
		}
	}
	var out []Conflict
	e.rlock()
	defer e.runlock()
	for _, p := range uniqStrings(entryPaths(ents)) {
		was := left[p]
		now, err := e.viewState(p)
		switch {
		case err != nil:
			out = append(out, Conflict{Path: p, Reason: "cannot be read: " + err.Error()})
		case was == nil:
			out = append(out, Conflict{Path: p, Reason: "what the rollback left is not known", Actual: describe(now)})
		case !sameState(now, was):
			out = append(out, Conflict{Path: p, Reason: "changed after the rollback by someone else", Expected: describe(was), Actual: describe(now)})
		case now.Kind == snapshot.KindDir && target[p] != "" && target[p] != snapshot.KindDir:
			if q := e.strayBelow(p, left, away); q != "" {
				out = append(out, Conflict{Path: p, Reason: "holds " + q + ", made after the rollback by someone else", Expected: describe(was), Actual: describe(now)})
			}
		}
	}
	return out
}

// strayBelow returns a file or symlink below the directory p that is not
// in known and not below one of away, "" when there is none.
func (e *Engine) strayBelow(p string, known map[string]*snapshot.Entry, away []string) string {
	stray := ""
	e.walkView(p, func(q string) {
		if stray != "" || q == p || known[q] != nil {
			return
		}
		for _, a := range away {
			if isUnder(q, a) {
				return
			}
		}
		stray = q
	})
	return stray
}

// redoFilter returns which paths redo restores: none of the conflicts,
// and nothing of a directory move whose source or destination conflicts.
func redoFilter(ents []snapshot.Entry, conflicts []Conflict) func(string) bool {
	skip := map[string]bool{}
	for _, c := range conflicts {
		skip[c.Path] = true
	}
	var trees []string
	for _, ent := range ents {
		if ent.Kind == snapshot.KindMoved && (skip[ent.Path] || skip[ent.From]) {
			trees = append(trees, ent.Path, ent.From)
		}
	}
	return func(p string) bool {
		if skip[p] {
			return false
		}
		for _, t := range trees {
			if isUnder(p, t) {
				return false
			}
		}
		return true
	}
}

// entryPaths lists the paths entries change: their paths and the old names
// of moved directories.
func entryPaths(ents []snapshot.Entry) []string {
	var out []string
	for _, ent := range ents {
		out = append(out, ent.Path)
		if ent.From != "" {
			out = append(out, ent.From)
		}
	}
	return out
}

// pushRedo puts the redo snapshot of a rollback just made on the stack
// (nothing when it overwrote nothing).
func (e *Engine) pushRedo(scope string) {
	if scope != "" {
		// Redo compares each path with what the rollback left, so it
		// overwrites nobody's later edit.
		e.redos = append(e.redos, redoLevel{scope: scope, left: e.viewStates(scope)})
	}
	e.redoValid.Store(len(e.redos) > 0)
}

func (e *Engine) dropRedo() {
	for _, l := range e.redos {
		e.snaps.Drop(l.scope)
	}
	e.redos = nil
	e.redoValid.Store(false)
}

// noCapture reports whether p matches a --no-capture glob: the glob matches
// p or one of its ancestors, and a glob without "/" matches any name in p.
func (e *Engine) noCapture(p string) bool { return matchAny(e.turnOpts.NoCapture, p) }
