package branch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"stagefs/control"
	"stagefs/internal/contenthash"
	"stagefs/internal/fdio"
	"stagefs/overlay"
	"stagefs/snapshot"
)

// version is what a view shows at a path, as far as a merge compares it:
// the kind, the permission bits, and the content or link target. Times
// and owners are not compared; a merge carries them over with the rest.
type version struct {
	kind   string // "absent", "file", "dir", "symlink" or "special"
	mode   uint32 // permission bits
	hash   contenthash.Hash
	size   int64
	target string
	// at is where in the branch's view a rebuilt fork version's content
	// can be read ("" for a captured one, whose body the snapshot holds).
	at string
}

func (v version) same(o version) bool {
	if v.kind != o.kind {
		return false
	}
	switch v.kind {
	case "absent":
		return true
	case "file":
		return v.hash == o.hash && v.mode == o.mode
	case "symlink":
		return v.target == o.target
	}
	return v.mode == o.mode
}

func (v version) String() string {
	switch v.kind {
	case "file":
		return fmt.Sprintf("file %s (%d bytes, mode %04o)", v.hash, v.size, v.mode)
	case "symlink":
		return "symlink to " + v.target
	case "dir", "special":
		return fmt.Sprintf("%s (mode %04o)", v.kind, v.mode)
	}
	return v.kind
}

// entryVersion is the version a fork point's snapshot captured.
func entryVersion(e snapshot.Entry) version {
	switch e.Kind {
	case snapshot.KindFile:
		return version{kind: "file", mode: e.Mode & 0o7777, hash: e.Hash, size: e.Size}
	case snapshot.KindDir:
		return version{kind: "dir", mode: e.Mode & 0o7777}
	case snapshot.KindSymlink:
		return version{kind: "symlink", target: e.Target}
	}
	return version{kind: "absent"}
}

// viewVersion reads the version eng's view has at p.
func viewVersion(eng *overlay.Engine, p string) (version, error) {
	st, err := eng.Stat(p)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
		return version{kind: "absent"}, nil
	}
	if err != nil {
		return version{}, err
	}
	mode := st.Mode & 0o7777
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return version{kind: "dir", mode: mode}, nil
	case syscall.S_IFLNK:
		target, err := eng.Readlink(p)
		return version{kind: "symlink", target: target}, err
	case syscall.S_IFREG:
		f, err := eng.Open(p, unix.O_RDONLY, overlay.Caller{})
		if err != nil {
			return version{}, err
		}
		defer eng.Release(p, f, overlay.Caller{})
		h, err := contenthash.Of(fdio.Reader(f.Fd))
		return version{kind: "file", mode: mode, hash: h, size: st.Size}, err
	}
	return version{kind: "special", mode: mode}, nil
}

// change is one path a merge looks at: what it was at the fork, in the
// branch and in the parent now.
type change struct {
	path                 string
	fork, branch, parent version
	unknown              bool // the fork's version was not captured
	// rename is the index of the directory rename the path is part of
	// (-1: none): a rename merges whole or not at all. gone marks a path
	// the parent has under a directory the branch renamed away: the
	// rename removes it, though the branch never had it.
	rename int
	gone   bool
	// removedDir is a directory above the path that the branch kept as
	// it was at the fork and the parent removed since: putting the path
	// there would bring it back.
	removedDir string
}

// Merge applies what branch p.Name changed since its fork point to its
// parent's pending set.
func (m *Manager) Merge(ctx context.Context, p control.MergeParams) (control.MergeResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.started(); err != nil {
		return control.MergeResult{}, err
	}
	r := m.recordLocked(p.Name)
	if r == nil {
		return control.MergeResult{}, control.Errorf(control.CodeNotFound, "no branch %q (stagefs branches lists them)", p.Name)
	}
	if p.Into != "" && p.Into != r.Parent {
		return control.MergeResult{}, control.Errorf(control.CodeInvalidParams, "branch %s was forked from %s: it merges only into %s", p.Name, r.Parent, r.Parent)
	}
	paths, err := m.relPaths(p.Paths)
	if err != nil {
		return control.MergeResult{}, err
	}
	if bv := m.views[r.Name]; bv != nil {
		// As a commit does: a tool's close(2) returns before the kernel
		// sends the release, and a merge right after it must not find
		// the file busy.
		bv.Engine.AwaitReleases()
	}
	res, err := m.mergeLocked(r, overlay.MergeIntent{Branch: p.Name, Paths: paths, Force: p.Force})
	if pv, _ := m.viewLocked(r.Parent); pv != nil && pv.Invalidate != nil && len(res.Merged) > 0 {
		pv.Invalidate(withAncestors(res.Merged))
	}
	return res, err
}

// withAncestors returns paths with every directory above them, each once:
// a merge may make the directories a path goes in (makeParents), and the
// kernel may hold their names as absent.
func withAncestors(paths []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range paths {
		for dir := p; dir != ""; {
			if seen[dir] {
				break
			}
			seen[dir] = true
			out = append(out, dir)
			i := strings.LastIndexByte(dir, '/')
			if i < 0 {
				break
			}
			dir = dir[:i]
		}
	}
	return out
}

// mergeLocked merges the branch r into its parent: plans, journals the
// intent in the parent, applies, moves the branch's fork point, and ends
// the intent. It is also what finishes a merge a crash interrupted: a path
// applied already shows the branch's version in the parent, and is
// counted merged again.
func (m *Manager) mergeLocked(r *record, in overlay.MergeIntent) (control.MergeResult, error) {
	res := control.MergeResult{Merged: []string{}, Conflicts: []control.MergeConflict{}, Failed: []control.Failure{}}
	bv := m.views[r.Name]
	pv, err := m.viewLocked(r.Parent)
	if bv == nil || err != nil {
		return res, control.Errorf(control.CodeInvalidState, "branch %s or its parent %s is not served", r.Name, r.Parent)
	}
	// Nothing changes in the branch until its fork point has moved.
	release := bv.Engine.HoldChanges()
	defer release()
	scope := overlay.ForkScope(r.Fork)
	entries, err := bv.Snapshots.Entries(scope)
	if err != nil {
		return res, fmt.Errorf("branch %s: its fork point: %w", r.Name, err)
	}
	info, _ := bv.Snapshots.Lookup(scope)
	var changes []change
	done := map[string]bool{} // merged or the same on both sides: leaves the fork point
	planned, keep := m.plan(bv, pv, entries, info.Uncaptured, in, &res)
	held := map[int]bool{} // renames with a conflict: applied not at all
	for _, c := range planned {
		switch {
		case c.branch.same(c.fork) && !c.unknown && !c.gone:
			// Changed and changed back: nothing to merge.
			done[c.path] = true
		case c.parent.same(c.branch):
			done[c.path] = true
			res.Merged = append(res.Merged, c.path)
		case (c.unknown || !c.parent.same(c.fork) || c.removedDir != "") && !in.Force:
			fork := c.fork.String()
			if c.unknown {
				fork = "not captured (the snapshot store was full, or the path matches --no-capture)"
			}
			parent := c.parent.String()
			if c.removedDir != "" && c.parent.kind == "absent" {
				parent = "absent: " + c.removedDir + " was removed since the fork"
			}
			res.Conflicts = append(res.Conflicts, control.MergeConflict{Path: c.path, Fork: fork, Branch: c.branch.String(), Parent: parent})
			if c.rename >= 0 {
				held[c.rename] = true
			}
		default:
			changes = append(changes, c)
		}
	}
	kept := changes[:0]
	for _, c := range changes {
		if c.rename >= 0 && held[c.rename] {
			continue
		}
		if anc := conflictAbove(c.path, res.Conflicts); anc != "" {
			// What goes in a directory waits for the directory.
			res.Conflicts = append(res.Conflicts, control.MergeConflict{Path: c.path, Fork: c.fork.String(), Branch: c.branch.String(), Parent: c.parent.String() + " (and " + anc + " above it is a conflict)"})
			continue
		}
		kept = append(kept, c)
	}
	changes = kept
	if len(changes) > 0 {
		paths := make([]string, 0, len(changes))
		for _, c := range changes {
			paths = append(paths, c.path)
		}
		if err := pv.Engine.NoteMergeBegin(overlay.MergeIntent{Branch: r.Name, Paths: paths, Force: in.Force}); err != nil {
			return res, fmt.Errorf("journal the merge: %w", err)
		}
		for _, c := range applyOrder(changes) {
			if !in.Force {
				// The parent is not held still: what it shows may have
				// changed since the plan read it. (Not closed: a change
				// between this check and the write still loses.)
				if now, err := viewVersion(pv.Engine, c.path); err != nil || !now.same(c.parent) {
					res.Conflicts = append(res.Conflicts, control.MergeConflict{Path: c.path, Fork: c.fork.String(), Branch: c.branch.String(), Parent: now.String() + " (changed during the merge)"})
					continue
				}
			}
			if err := apply(bv.Engine, pv.Engine, c); err != nil {
				res.Failed = append(res.Failed, control.Failure{Path: c.path, Reason: err.Error()})
				continue
			}
			done[c.path] = true
			res.Merged = append(res.Merged, c.path)
		}
	}
	if err := m.moveForkPoint(r, bv, entries, info.Uncaptured, func(i int) bool { return keep(i, done) }, done); err != nil {
		res.Failed = append(res.Failed, control.Failure{Path: "", Reason: "move the branch's fork point: " + err.Error()})
	}
	if len(changes) > 0 {
		sum, _ := json.Marshal(map[string]int{"merged": len(res.Merged), "conflicts": len(res.Conflicts), "failed": len(res.Failed)})
		if err := pv.Engine.NoteMergeEnd(string(sum)); err != nil {
			m.cfg.Logf("branches: journal the end of a merge of %s: %v", r.Name, err)
		}
	}
	sort.Strings(res.Merged)
	return res, nil
}

// plan lists the paths the fork point captured (at or below only, when
// given), with their three versions, and says which fork-point entries a
// merge must keep when it leaves some paths unmerged (keep).
//
// A directory the branch renamed (a "moved" entry: newp from oldp) is
// merged as what it is to the parent: everything under oldp removed,
// everything under newp new. What was under oldp at the fork is rebuilt
// from the branch: what is under newp now, but for the paths captured
// since (before the move under their old names, after it under their new
// ones), whose captured versions are the fork's. A path the parent added
// under oldp since the fork is a conflict.
func (m *Manager) plan(bv, pv *View, entries []snapshot.Entry, uncaptured []string, in overlay.MergeIntent, res *control.MergeResult) (out []change, keep func(i int, done map[string]bool) bool) {
	pl := &planner{bv: bv, pv: pv, res: res, seen: map[string]bool{}, selected: func(p string) bool { return selected(p, in.Paths) }}
	// A tree is touched by the selection when a selected path is in it or
	// above it.
	pl.touches = func(dir string) bool {
		for _, q := range in.Paths {
			if under(q, dir) || !in.Exact && under(dir, q) {
				return true
			}
		}
		return len(in.Paths) == 0
	}
	if in.Exact {
		exact := map[string]bool{}
		for _, p := range in.Paths {
			exact[p] = true
		}
		pl.selected = func(p string) bool { return exact[p] }
	}
	rn := traceRenames(entries)
	// The fork's version of each path, the first capture winning.
	fork := map[string]version{}
	for i, e := range entries {
		if e.Kind == snapshot.KindMoved || rn.group[i] >= 0 && rn.failed[rn.group[i]] {
			continue
		}
		if _, ok := fork[rn.final[i]]; !ok {
			fork[rn.final[i]] = entryVersion(e)
		}
	}
	for _, k := range rn.moves {
		pl.rename(k, entries[k], fork, rn.failed[k])
	}
	pl.fork = fork
	for i, e := range entries {
		if e.Kind != snapshot.KindMoved && rn.group[i] < 0 {
			pl.add(rn.final[i], entryVersion(e), false, -1, false)
		}
	}
	for _, p := range uncaptured {
		pl.add(p, version{kind: "absent"}, true, -1, false)
	}
	// A rename's entries stay together at the next fork point unless all
	// of its paths were merged.
	keep = func(i int, done map[string]bool) bool {
		g := rn.group[i]
		if g < 0 {
			return !done[rn.final[i]]
		}
		mv := entries[g]
		for p := range pl.seen {
			if (under(p, mv.Path) || under(p, mv.From)) && !done[p] {
				return true
			}
		}
		return rn.failed[g]
	}
	return pl.out, keep
}

// planner collects a merge's changes, each path once.
type planner struct {
	bv, pv *View
	// selected says whether a path is one the merge was asked for;
	// touches whether one of those is in or above the tree at p.
	selected, touches func(p string) bool
	res               *control.MergeResult
	seen              map[string]bool
	out               []change
	// fork holds the fork point's version of each path it captured.
	fork map[string]version
}

// add plans the path p, whose version at the fork was fork, unless it is
// not selected or planned already.
func (pl *planner) add(p string, fork version, unknown bool, rename int, gone bool) {
	if pl.seen[p] || !pl.selected(p) {
		return
	}
	pl.seen[p] = true
	if pl.bv.Engine.OpenForWriting(p) {
		pl.res.Failed = append(pl.res.Failed, control.Failure{Path: p, Reason: "busy: a process in the branch has it open for writing; merge it once it is closed"})
		return
	}
	b, err := viewVersion(pl.bv.Engine, p)
	if err != nil {
		pl.res.Failed = append(pl.res.Failed, control.Failure{Path: p, Reason: "read it in the branch: " + err.Error()})
		return
	}
	pa, err := viewVersion(pl.pv.Engine, p)
	if err != nil {
		pl.res.Failed = append(pl.res.Failed, control.Failure{Path: p, Reason: "read it in the parent: " + err.Error()})
		return
	}
	if fork.kind == "dir" && fork.mode == anyMode {
		fork.mode = pa.mode // rebuilt: its mode is not known, and not compared
	}
	c := change{path: p, fork: fork, branch: b, parent: pa, unknown: unknown, rename: rename, gone: gone}
	if rename < 0 && b.kind != "absent" {
		c.removedDir = pl.removedAbove(p)
	}
	pl.out = append(pl.out, c)
}

// removedAbove returns the shallowest directory above p that the parent's
// view lacks though the branch never changed it (the fork point did not
// capture it): the parent removed it since the fork. "" when there is
// none.
func (pl *planner) removedAbove(p string) string {
	dir := ""
	for _, name := range strings.Split(p, "/")[:strings.Count(p, "/")] {
		dir = joinPath(dir, name)
		if _, captured := pl.fork[dir]; captured {
			return "" // the branch made or changed it: what is below is the branch's too
		}
		if _, err := pl.pv.Engine.Stat(dir); errors.Is(err, syscall.ENOENT) {
			return dir
		}
	}
	return ""
}

// rename plans the directory rename mv (entry k): everything under
// mv.From removed, everything under mv.Path new.
func (pl *planner) rename(k int, mv snapshot.Entry, fork map[string]version, failed bool) {
	if !pl.touches(mv.Path) && !pl.touches(mv.From) {
		return
	}
	// A rename merges whole or not at all: a path selected in it selects
	// all of it, the old name's removal with the new name's entries.
	only := pl.selected
	pl.selected = func(string) bool { return true }
	defer func() { pl.selected = only }()
	if failed {
		pl.res.Failed = append(pl.res.Failed, control.Failure{Path: mv.Path, Reason: fmt.Sprintf("the branch renamed %s to %s, and renamed within or over it too: this is not merged; merge the other paths, or copy it in the branch instead", mv.From, mv.Path)})
		pl.seen[mv.Path], pl.seen[mv.From] = true, true
		return
	}
	// What was under From at the fork, by path relative to it.
	old := map[string]version{"": {kind: "dir", mode: anyMode}}
	err := walkView(pl.bv.Engine, mv.Path, func(rel string, now version) {
		if rel == "" {
			return
		}
		if v, ok := fork[joinRel(mv.Path, rel)]; ok {
			now = v
		} else {
			now.at = joinRel(mv.Path, rel)
		}
		if now.kind != "absent" {
			old[rel] = now
		}
	})
	if err != nil {
		pl.res.Failed = append(pl.res.Failed, control.Failure{Path: mv.Path, Reason: "read it in the branch: " + err.Error()})
		return
	}
	for p, v := range fork {
		if rel, ok := relUnder(p, mv.Path); ok && rel != "" && v.kind != "absent" {
			old[rel] = v // removed from the moved directory since
		}
	}
	// In the parent, everything under From goes unless it is new there
	// (a conflict); everything under the new name is new.
	pold := map[string]bool{}
	walkView(pl.pv.Engine, mv.From, func(rel string, _ version) { pold[rel] = true })
	var rels []string
	for rel := range old {
		rels = append(rels, rel)
	}
	for rel := range pold {
		if _, ok := old[rel]; !ok {
			rels = append(rels, rel)
		}
	}
	sort.Strings(rels)
	for _, rel := range rels {
		v, ok := old[rel]
		if !ok {
			v = version{kind: "absent"}
		}
		pl.add(joinRel(mv.From, rel), v, false, k, !ok)
	}
	walkView(pl.bv.Engine, mv.Path, func(rel string, _ version) {
		pl.add(joinRel(mv.Path, rel), version{kind: "absent"}, false, k, false)
	})
	for p := range fork {
		if under(p, mv.Path) {
			pl.add(p, version{kind: "absent"}, false, k, false) // removed since: nothing to add
		}
	}
}

// renames is where a fork point's entries are now, given the directory
// renames captured among them.
type renames struct {
	final  []string     // each entry's path now: moved along by the renames captured after it
	group  []int        // the rename an entry belongs to, -1: none
	moves  []int        // the renames' indexes
	failed map[int]bool // renames within or over another: not merged
}

func traceRenames(entries []snapshot.Entry) renames {
	rn := renames{final: make([]string, len(entries)), group: make([]int, len(entries)), failed: map[int]bool{}}
	for i, e := range entries {
		rn.final[i], rn.group[i] = e.Path, -1
		if e.Kind == snapshot.KindMoved {
			rn.moves = append(rn.moves, i)
		}
	}
	for _, i := range rn.moves {
		for _, j := range rn.moves {
			a, b := entries[i], entries[j]
			if i != j && (under(a.Path, b.Path) || under(a.Path, b.From) || under(a.From, b.Path) || under(a.From, b.From)) {
				rn.failed[i] = true
			}
		}
	}
	for i, e := range entries {
		if e.Kind == snapshot.KindMoved {
			rn.group[i] = i
			continue
		}
		for _, k := range rn.moves {
			mv := entries[k]
			switch {
			case k > i && under(e.Path, mv.From):
				rn.final[i], rn.group[i] = mv.Path+strings.TrimPrefix(e.Path, mv.From), k
			case k < i && under(e.Path, mv.Path):
				rn.group[i] = k
			case e.Path == mv.Path:
				rn.group[i] = k // the destination's own pre-image
			}
		}
	}
	return rn
}

// anyMode marks a rebuilt directory version whose mode is not known.
const anyMode = ^uint32(0)

// under reports whether p is dir or below it.
func under(p, dir string) bool {
	return dir == "" || p == dir || strings.HasPrefix(p, dir+"/")
}

// relUnder returns p relative to dir ("" for dir itself) when p is under it.
func relUnder(p, dir string) (string, bool) {
	if p == dir {
		return "", true
	}
	if strings.HasPrefix(p, dir+"/") {
		return p[len(dir)+1:], true
	}
	return "", false
}

func joinRel(dir, rel string) string {
	if rel == "" {
		return dir
	}
	return joinPath(dir, rel)
}

// walkView calls fn with every path at or below root in eng's view,
// relative to root, and its version, parents first.
func walkView(eng *overlay.Engine, root string, fn func(rel string, v version)) error {
	var walk func(rel string) error
	walk = func(rel string) error {
		p := joinRel(root, rel)
		v, err := viewVersion(eng, p)
		if err != nil {
			return err
		}
		if v.kind == "absent" {
			return nil
		}
		fn(rel, v)
		if v.kind != "dir" {
			return nil
		}
		ents, err := eng.ReadDir(p)
		if err != nil {
			return err
		}
		for _, d := range ents {
			if err := walk(joinRel(rel, d.Name)); err != nil {
				return err
			}
		}
		return nil
	}
	return walk("")
}

// conflictAbove returns a conflicting path that p is below ("" when none).
func conflictAbove(p string, conflicts []control.MergeConflict) string {
	for _, x := range conflicts {
		if strings.HasPrefix(p, x.Path+"/") {
			return x.Path
		}
	}
	return ""
}

// selected reports whether p is at or below one of only (all when none).
func selected(p string, only []string) bool {
	if len(only) == 0 {
		return true
	}
	for _, q := range only {
		if q == "" || p == q || strings.HasPrefix(p, q+"/") {
			return true
		}
	}
	return false
}

// applyOrder puts removals first, deepest first, then the rest,
// shallowest first: a directory is emptied before it goes, and made before
// what goes in it.
func applyOrder(cs []change) []change {
	depth := func(p string) int { return strings.Count(p, "/") }
	out := append([]change(nil), cs...)
	sort.SliceStable(out, func(i, j int) bool {
		ai, aj := out[i].branch.kind == "absent", out[j].branch.kind == "absent"
		if ai != aj {
			return ai
		}
		if ai {
			return depth(out[i].path) > depth(out[j].path)
		}
		return depth(out[i].path) < depth(out[j].path)
	})
	return out
}

// mergeCaller makes the merge's changes in the parent: a host edit, so the
// parent's open snapshots and turn capture them like any other change.
var mergeCaller = overlay.Caller{Host: true, Comm: "stagefs-merge"}

// apply makes the parent's view show at c.path what the branch's shows.
func apply(b, p *overlay.Engine, c change) error {
	switch c.branch.kind {
	case "absent":
		return removeEntry(p, c.path)
	case "file", "dir", "symlink":
	default:
		return fmt.Errorf("a %s is not merged; copy it in the parent", c.branch.kind)
	}
	if err := makeParents(b, p, c.path); err != nil {
		return err
	}
	// What is in the way goes first, unless it can be changed in place.
	if c.parent.kind != "absent" && !(c.parent.kind == c.branch.kind && (c.branch.kind == "file" || c.branch.kind == "dir")) {
		if err := removeEntry(p, c.path); err != nil {
			return err
		}
	}
	switch c.branch.kind {
	case "dir":
		if c.parent.kind != "dir" {
			if _, err := p.Mkdir(c.path, c.branch.mode, ownerOf(b, c.path)); err != nil {
				return err
			}
		}
		// Not its times: entries merged into it later change them.
		if err := carryOwnerAndTimes(b, p, c.path, false); err != nil {
			return err
		}
		return chmod(p, c.path, c.branch.mode)
	case "symlink":
		_, err := p.Symlink(c.branch.target, c.path, ownerOf(b, c.path))
		return err
	case "file":
		if err := copyFile(b, p, c.path, c.branch.mode, c.branch.size, c.parent.kind == "file"); err != nil {
			return err
		}
		// The owner before the mode: a chown clears set-id bits.
		if err := carryOwnerAndTimes(b, p, c.path, true); err != nil {
			return err
		}
		return chmod(p, c.path, c.branch.mode)
	}
	return fmt.Errorf("a %s is not merged", c.branch.kind)
}

// carryOwnerAndTimes gives path in the parent the owner the branch's has
// and, with times, its access and modification times: a merged build
// output or an extracted tree keeps what make or tar rely on.
func carryOwnerAndTimes(b, p *overlay.Engine, path string, times bool) error {
	bst, err := b.Stat(path)
	if err != nil {
		return err
	}
	pst, err := p.Stat(path)
	if err != nil {
		return err
	}
	var a overlay.SetAttr
	if pst.Uid != bst.Uid || pst.Gid != bst.Gid {
		a.Uid, a.Gid = &bst.Uid, &bst.Gid
	}
	if times && (pst.Mtim != bst.Mtim || pst.Atim != bst.Atim) {
		atime, mtime := unix.Timespec(bst.Atim), unix.Timespec(bst.Mtim)
		a.Atime, a.Mtime = &atime, &mtime
	}
	if a == (overlay.SetAttr{}) {
		return nil
	}
	_, err = p.Setattr(path, -1, a, mergeCaller)
	return err
}

// copyFile writes the branch's file p into the parent.
func copyFile(b, p *overlay.Engine, path string, mode uint32, size int64, exists bool) error {
	src, err := b.Open(path, unix.O_RDONLY, overlay.Caller{})
	if err != nil {
		return err
	}
	defer b.Release(path, src, overlay.Caller{})
	var dst *overlay.File
	if exists {
		dst, err = p.Open(path, unix.O_WRONLY|unix.O_TRUNC, mergeCaller)
	} else {
		dst, _, err = p.Create(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, mode, ownerOf(b, path))
	}
	if err != nil {
		return err
	}
	_, err = fdio.Copy(src.Fd, dst.Fd, size)
	p.Release(path, dst, mergeCaller)
	return err
}

// ownerOf is the merge's caller for making path in the parent: owned as
// the branch has it.
func ownerOf(b *overlay.Engine, path string) overlay.Caller {
	c := mergeCaller
	if st, err := b.Stat(path); err == nil {
		c.Uid, c.Gid = st.Uid, st.Gid
	}
	return c
}

func chmod(p *overlay.Engine, path string, mode uint32) error {
	st, err := p.Stat(path)
	if err != nil {
		return err
	}
	if st.Mode&0o7777 == mode {
		return nil
	}
	_, err = p.Setattr(path, -1, overlay.SetAttr{Mode: &mode}, mergeCaller)
	return err
}

// makeParents makes the directories above path that the parent lacks,
// with the branch's modes.
func makeParents(b, p *overlay.Engine, path string) error {
	dir := ""
	for _, name := range strings.Split(path, "/")[:strings.Count(path, "/")] {
		dir = joinPath(dir, name)
		st, err := p.Stat(dir)
		if err == nil && st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			continue
		}
		if err == nil {
			return fmt.Errorf("%s is not a directory in the parent: merge it first", dir)
		}
		mode := uint32(0o755)
		if bst, err := b.Stat(dir); err == nil {
			mode = bst.Mode & 0o7777
		}
		if _, err := p.Mkdir(dir, mode, ownerOf(b, dir)); err != nil && !errors.Is(err, syscall.EEXIST) {
			return err
		}
	}
	return nil
}

// removeEntry removes path from the parent's view. A directory goes only
// when empty: the branch's removals of what was in it come first (deepest
// first), and what the parent put in it since the fork is not the
// branch's to remove.
func removeEntry(p *overlay.Engine, path string) error {
	st, err := p.Stat(path)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return p.Unlink(path, mergeCaller)
	}
	err = p.Rmdir(path, mergeCaller)
	if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
		return errors.New("the branch removed this directory, but in the parent it holds entries made since the fork: merge those or remove them first")
	}
	return err
}

func joinPath(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// moveForkPoint opens the branch's next fork point, carrying over the
// fork's versions of the paths the merge did not take (conflicts, failures,
// paths not selected), then drops the old one. The branch holds still
// meanwhile (HoldChanges), so nothing falls between the two.
func (m *Manager) moveForkPoint(r *record, bv *View, entries []snapshot.Entry, uncaptured []string, keep func(i int) bool, done map[string]bool) error {
	next := overlay.ForkScope(r.Fork + 1)
	bv.Snapshots.Drop(next) // a stray a crash left
	var carry []snapshot.Entry
	for i, e := range entries {
		if keep(i) {
			carry = append(carry, e)
		}
	}
	var stillUncaptured []string
	for _, p := range uncaptured {
		if !done[p] {
			stillUncaptured = append(stillUncaptured, p)
		}
	}
	// Carried before anything is captured into it (a file held open
	// for writing is captured as it opens), so that the fork's versions
	// win over the branch's current ones.
	if _, err := bv.Engine.OpenSnapshotWith(next, carry, stillUncaptured); err != nil {
		bv.Snapshots.Drop(next)
		return err
	}
	old := r.Fork
	r.Fork, r.ForkedAt = r.Fork+1, time.Now().UnixNano()
	if err := m.saveLocked(); err != nil {
		r.Fork = old
		bv.Snapshots.Drop(next)
		return err
	}
	if err := bv.Engine.DropSnapshot(overlay.ForkScope(old)); err != nil {
		m.cfg.Logf("branches: drop the old fork point of %s: %v", r.Name, err)
	}
	return nil
}

// finishMerges finishes the merges a crash interrupted, as the views'
// journals show them.
func (m *Manager) finishMerges() error {
	var errs []error
	views := []*View{m.main}
	for _, r := range m.reg {
		views = append(views, m.views[r.Name])
	}
	for _, v := range views {
		if v == nil || v.UnfinishedMerge == nil {
			continue
		}
		in := *v.UnfinishedMerge
		// The intent lists exactly the paths the merge had found free
		// of conflicts (or was told to force); one it stopped half way
		// through (a file truncated, not yet written) now looks changed
		// in the parent too, and must be applied all the same. Nothing
		// else could change the parent while the daemon was down.
		in.Force, in.Exact = true, true
		r := m.recordLocked(in.Branch)
		switch {
		case r == nil:
			m.cfg.Logf("a merge of branch %s was interrupted, but the branch is gone: nothing to finish", in.Branch)
		case m.views[r.Name] == nil:
			errs = append(errs, fmt.Errorf("a merge of branch %s was interrupted and is finished when the branch is served again", in.Branch))
			continue
		default:
			res, err := m.mergeLocked(r, in)
			if err != nil {
				errs = append(errs, fmt.Errorf("finish the merge of %s: %w", in.Branch, err))
				continue
			}
			m.cfg.Logf("finished an interrupted merge of %s: %d merged, %d conflicts, %d failed", in.Branch, len(res.Merged), len(res.Conflicts), len(res.Failed))
		}
		// Ended whatever the re-run wrote, so no later start takes the
		// intent up again.
		if err := v.Engine.NoteMergeEnd(`{"finished":"at start-up"}`); err != nil {
			errs = append(errs, fmt.Errorf("journal the end of the merge of %s: %w", in.Branch, err))
			continue
		}
		v.UnfinishedMerge = nil
	}
	return errors.Join(errs...)
}
