package overlay

import "syscall"

// A pending entry staged from a workspace file shows that file's inode
// number, so that the number does not change at a copy-up. The workspace
// file may go afterwards (the host removes or replaces it, an editor's
// save does), and the file system is then free to give its number to a
// new file; or the host renames it, and it shows at another path. Either
// way two files in the view would show one number, and the kernel would
// take them for one (one node, one page cache: a write through one name
// staged as a write of the other). So a workspace entry whose number a
// pending entry elsewhere shows is shown with one of its reserved numbers
// instead (unclaimedIno), as the inode map does for its own collisions.
//
// showing and shownAt keep which pending paths show which workspace
// number. They are kept from setEntry and dropEntry, which every entry
// put into or taken out of the index passes through, and from writeMeta,
// which every change of an entry's number in place passes through; they
// are read checked against the index, so a note that went stale answers
// nothing.

// noteShown notes that the entry at p shows m's number.
func (e *Engine) noteShown(p string, m *meta) {
	ino := m.Ino
	if ino&upperInoBit != 0 {
		ino = 0 // a number of the pending set's own: never a workspace file's
	}
	old, had := e.shownAt[p]
	if had && old == ino {
		return
	}
	if had {
		e.forgetShown(p, old)
	}
	if ino == 0 {
		return
	}
	e.shownAt[p] = ino
	e.showing[ino] = append(e.showing[ino], p)
}

// dropShown forgets the number p showed (its entry is gone).
func (e *Engine) dropShown(p string) {
	if ino, ok := e.shownAt[p]; ok {
		e.forgetShown(p, ino)
	}
}

func (e *Engine) forgetShown(p string, ino uint64) {
	delete(e.shownAt, p)
	ps := e.showing[ino]
	for i, q := range ps {
		if q == p {
			ps[i] = ps[len(ps)-1]
			ps = ps[:len(ps)-1]
			break
		}
	}
	if len(ps) == 0 {
		delete(e.showing, ino)
	} else {
		e.showing[ino] = ps
	}
}

// pendingShows reports whether a pending entry at a path other than
// except shows the number ino.
func (e *Engine) pendingShows(ino uint64, except string) bool {
	for _, q := range e.showing[ino] {
		if q == except {
			continue
		}
		if m := e.index[q]; m != nil && m.Ino == ino && m.Kind != KindWhiteout && !m.Deleted {
			return true
		}
	}
	return false
}

// viewIno is the number the view shows for the workspace entry st, which
// no pending entry covers.
func (e *Engine) viewIno(st *syscall.Stat_t) uint64 {
	return e.baseInoAt("", st)
}

// baseInoAt is the number for the workspace entry st as seen at p, where
// a pending entry being made or remade from it does not count.
func (e *Engine) baseInoAt(p string, st *syscall.Stat_t) uint64 {
	ino := e.baseIno(st)
	if st.Dev != e.rootDev {
		return ino
	}
	return e.unclaimedIno(ino, st.Ino, p)
}

// direntIno is viewIno for a directory entry of the workspace (d_ino must
// equal st_ino).
func (e *Engine) direntIno(ino uint64) uint64 {
	return e.unclaimedIno(e.baseInoDirent(ino), ino, "")
}

// reservedCount holds, with reservedBit, a count that tells apart the
// numbers a chain of such moves needs (stage a file, move its origin, stage
// that, move it again): workspace inode numbers are far below bit 48.
const reservedCount = (1<<12 - 1) << 48

// unclaimedIno returns ino, the number the workspace file of real inode
// real is shown with, unless a pending entry at a path other than except
// shows it: then the first of real's reserved numbers none shows.
func (e *Engine) unclaimedIno(ino, real uint64, except string) uint64 {
	if len(e.showing) == 0 || !e.pendingShows(ino, except) {
		return ino
	}
	for k := uint64(0); k<<48 <= reservedCount; k++ {
		if n := real | reservedBit | k<<48; n != ino && !e.pendingShows(n, except) {
			return n
		}
	}
	return ino // 4,096 pending files show real's numbers: never seen
}

// isReservedOf reports whether shown is one of the reserved numbers of the
// workspace inode real.
func isReservedOf(shown, real uint64) bool {
	return shown&reservedBit != 0 && shown&^(reservedBit|reservedCount) == real
}

// isBaseIno reports whether ino, a number a pending entry shows, is the
// one the workspace entry st is shown with (reserved or not).
func (e *Engine) isBaseIno(st *syscall.Stat_t, ino uint64) bool {
	return e.baseIno(st) == ino || (st.Dev == e.rootDev && isReservedOf(ino, st.Ino))
}
