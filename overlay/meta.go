package overlay

import (
	"fmt"
	"syscall"
	"time"
)

// metaXattr is the xattr on every upper entry that is more than a plain
// container. Names under xattrPrefix are stagefs's own: hidden from
// listxattr and refused to setxattr through the mount.
const (
	metaXattr   = "user.stagefs.meta"
	xattrPrefix = "user.stagefs."
)

// Kind is what an upper entry stands for in the merged view.
type Kind uint8

const (
	KindFile Kind = iota + 1
	KindDir
	KindSymlink
	KindSpecial
	KindWhiteout
)

func (k Kind) String() string {
	switch k {
	case KindFile:
		return "file"
	case KindDir:
		return "dir"
	case KindSymlink:
		return "symlink"
	case KindSpecial:
		return "special"
	case KindWhiteout:
		return "whiteout"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Baseline is what the base held at a path when the path was first staged.
// Commit compares it with the base's state then: a difference means someone
// changed the workspace meanwhile, which is a conflict.
type Baseline struct {
	Exists bool   `json:"e,omitempty"`
	Mode   uint32 `json:"m,omitempty"` // file type and permission bits
	Ino    uint64 `json:"i,omitempty"`
	Size   int64  `json:"s,omitempty"`
	Mtime  int64  `json:"t,omitempty"` // ns
	Ctime  int64  `json:"c,omitempty"` // ns
}

func baselineOf(st *syscall.Stat_t) Baseline {
	return Baseline{
		Exists: true,
		Mode:   st.Mode,
		Ino:    st.Ino,
		Size:   st.Size,
		Mtime:  st.Mtim.Nano(),
		Ctime:  st.Ctim.Nano(),
	}
}

// matches reports whether the base's current state (nil: absent) is still
// the baseline. Directories compare identity only, because their times change
// whenever an entry inside them changes.
func (b Baseline) matches(st *syscall.Stat_t) bool {
	if st == nil || !b.Exists {
		return st == nil && !b.Exists
	}
	if st.Mode&syscall.S_IFMT != b.Mode&syscall.S_IFMT || st.Ino != b.Ino {
		return false
	}
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		return true
	}
	return st.Size == b.Size && st.Mtim.Nano() == b.Mtime && st.Ctim.Nano() == b.Ctime
}

func (b Baseline) String() string {
	if !b.Exists {
		return "absent"
	}
	return fmt.Sprintf("ino %d size %d mtime %s", b.Ino, b.Size, time.Unix(0, b.Mtime).UTC().Format(time.RFC3339Nano))
}

// meta is the persistent description of one upper entry, stored in its
// metaXattr (metacodec.go). The json tags read metas that earlier versions
// wrote as JSON.
type meta struct {
	Kind      Kind     `json:"k"`
	Container bool     `json:"ct,omitempty"` // dir present only to hold staged children
	Deleted   bool     `json:"del,omitempty"`
	Opaque    bool     `json:"op,omitempty"`
	Redirect  string   `json:"rd,omitempty"` // dir renamed from this base path
	Mode      uint32   `json:"md,omitempty"` // special files: full mode
	Rdev      uint64   `json:"rdev,omitempty"`
	Ino       uint64   `json:"ino,omitempty"` // inode number shown (the base origin's), 0: upper's own
	Base      Baseline `json:"b"`
	Pid       int      `json:"pid,omitempty"`  // the process that last changed the entry
	Comm      string   `json:"comm,omitempty"` // its command name when it did
	Time      int64    `json:"tm,omitempty"`   // first staging, unix ns
	// AttrOnly marks a copy of a workspace entry whose attributes (mode,
	// owner, times, xattrs) changed but whose body is still the
	// workspace's: setattr or setxattr copied it up, and nothing has opened
	// it for writing, truncated, moved or linked it since. Status reports
	// it as a metadata change, not a write.
	AttrOnly bool `json:"ao,omitempty"`
	// Dir and NameSum are the place the meta was written for: the inode
	// number of the upper directory and a checksum of the entry's name in
	// it (nameSum; 0 in a meta written before metas named their place). The meta
	// lives on the entry's inode, which a rename moves, so rename writes
	// the meta for the new place before it moves the entry; an entry
	// found at start-up where its meta does not say it is was caught
	// between the two by a crash (or is another name of a hard link), and
	// its baseline, written for the other place, is not its own. A
	// directory's inode number survives its renames, so the entries in
	// it keep matching.
	Dir     uint64 `json:"pd,omitempty"`
	NameSum uint64 `json:"-"`
	// Was is what the entry was at its old place, written with the meta
	// for its new place by a rename: if a crash stops the rename before
	// the move, start-up finds the entry at the old place and puts this
	// back. An in-place write drops it.
	Was *placeState `json:"was,omitempty"`

	uino uint64 // the upper entry's own inode number (not persisted)
	// unsaved: Pid and Comm changed after the meta was last written. A
	// later change of an entry already staged updates them in memory only,
	// so the hot path (a write-open of a staged file) writes no xattr;
	// they reach the disk with the next meta write or at Close.
	unsaved bool
}

// placeState is the part of a meta that depends on where the entry is.
type placeState struct {
	Base      Baseline `json:"b"`
	Redirect  string   `json:"rd,omitempty"`
	Opaque    bool     `json:"op,omitempty"`
	Container bool     `json:"ct,omitempty"`
	AttrOnly  bool     `json:"ao,omitempty"`
}

// isChange reports whether the entry is itself a pending change (shown by
// status and applied by commit), rather than a container for changes below.
func (m *meta) isChange() bool {
	return !(m.Kind == KindDir && m.Container && !m.Deleted && !m.Opaque && m.Redirect == "")
}
