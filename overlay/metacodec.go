package overlay

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// The meta xattr is written in a compact binary form so that it fits in
// the inode itself (ext4 keeps about 90 bytes of xattrs in a 256-byte
// inode). A larger value gets a block of its own: one more journaled block
// for every staged file, and on a file system mounted with `discard` every
// unlink of an upper entry (discard, commit, rm) waits for the device to
// discard that block, 0.2-0.4 ms each on this project's machines. A new
// file's meta takes about 35 bytes, a copied-up workspace file's about 58.
//
// Layout: the version byte metaVersion, then varints (signed for times
// and sizes; strings are a length and the bytes) in this order: flags;
// the shown inode number (rotated so that stagefs's own numbers, which
// have bit 62 set, stay short); [baseline: mode, inode number as a
// difference from the shown one, size, mtime, ctime-mtime]; pid; comm;
// time; dir; name sum (8 bytes, little-endian); [redirect]; [mode, rdev];
// [was: flags, [baseline], [redirect]]. Bracketed parts are present when
// their flag says so. Metas written as JSON (before this form) are still
// read.
const metaVersion = 1

// The flags field: the Kind in the low three bits, then one bit each.
const (
	metaKindMask    = 0x7
	metaContainer   = 1 << 3
	metaDeleted     = 1 << 4
	metaOpaque      = 1 << 5
	metaAttrOnly    = 1 << 6
	metaHasBase     = 1 << 7
	metaHasRedirect = 1 << 8
	metaHasSpecial  = 1 << 9
	metaHasWas      = 1 << 10
)

var errShortMeta = errors.New("truncated")

func (m *meta) encode() []byte {
	b := make([]byte, 0, 64)
	b = append(b, metaVersion)
	flags := uint64(m.Kind) & metaKindMask
	flags |= placeFlags(m.Container, m.Opaque, m.AttrOnly, m.Base.Exists, m.Redirect != "")
	if m.Deleted {
		flags |= metaDeleted
	}
	if m.Kind == KindSpecial {
		flags |= metaHasSpecial
	}
	if m.Was != nil {
		flags |= metaHasWas
	}
	b = binary.AppendUvarint(b, flags)
	b = binary.AppendUvarint(b, bits.RotateLeft64(m.Ino, 2))
	b = appendBaseline(b, m.Base, m.Ino)
	b = binary.AppendUvarint(b, uint64(m.Pid))
	b = appendString(b, m.Comm)
	b = binary.AppendVarint(b, m.Time)
	b = binary.AppendUvarint(b, m.Dir)
	b = binary.LittleEndian.AppendUint64(b, m.NameSum)
	if m.Redirect != "" {
		b = appendString(b, m.Redirect)
	}
	if m.Kind == KindSpecial {
		b = binary.AppendUvarint(b, uint64(m.Mode))
		b = binary.AppendUvarint(b, m.Rdev)
	}
	if w := m.Was; w != nil {
		b = binary.AppendUvarint(b, placeFlags(w.Container, w.Opaque, w.AttrOnly, w.Base.Exists, w.Redirect != ""))
		b = appendBaseline(b, w.Base, m.Ino)
		if w.Redirect != "" {
			b = appendString(b, w.Redirect)
		}
	}
	return b
}

// placeFlags are the flags of the parts of a meta a rename keeps in Was.
func placeFlags(container, opaque, attrOnly, hasBase, hasRedirect bool) uint64 {
	var f uint64
	if container {
		f |= metaContainer
	}
	if opaque {
		f |= metaOpaque
	}
	if attrOnly {
		f |= metaAttrOnly
	}
	if hasBase {
		f |= metaHasBase
	}
	if hasRedirect {
		f |= metaHasRedirect
	}
	return f
}

// appendBaseline appends base, its inode number as a difference from ino
// (the entry's shown number, which is the baseline's for a copied-up
// workspace entry: one byte instead of four or five).
func appendBaseline(b []byte, base Baseline, ino uint64) []byte {
	if !base.Exists {
		return b
	}
	b = binary.AppendUvarint(b, uint64(base.Mode))
	b = binary.AppendVarint(b, int64(base.Ino-ino))
	b = binary.AppendVarint(b, base.Size)
	b = binary.AppendVarint(b, base.Mtime)
	// An untouched file's ctime is its mtime or close to it.
	return binary.AppendVarint(b, base.Ctime-base.Mtime)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// nameSum identifies an entry's name in its meta (meta.NameSum): a
// checksum rather than the name keeps the meta small whatever the name's
// length. 64 bits, so that names an agent picks cannot be made to collide
// by trying (it would take about 2^32 names in one directory). Never 0,
// which stands for "not recorded".
func nameSum(name string) uint64 {
	if s := xxhash.Sum64String(name); s != 0 {
		return s
	}
	return 1
}

// metaReader reads the fields of an encoded meta in order; the first
// failure sticks.
type metaReader struct {
	b   []byte
	err error
}

func (r *metaReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	r.skip(n)
	return v
}

func (r *metaReader) varint() int64 {
	v, n := binary.Varint(r.b)
	r.skip(n)
	return v
}

func (r *metaReader) uint64() uint64 {
	if len(r.b) < 8 {
		r.skip(0)
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.skip(8)
	return v
}

// skip moves past a field of n bytes; n <= 0 (a field that does not
// fit) is the sticky error. After an error every field reads as 0.
func (r *metaReader) skip(n int) {
	if n <= 0 {
		r.err, r.b = errShortMeta, nil
		return
	}
	r.b = r.b[n:]
}

func (r *metaReader) string() string {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.skip(0)
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *metaReader) baseline(flags, ino uint64) Baseline {
	if flags&metaHasBase == 0 {
		return Baseline{}
	}
	b := Baseline{Exists: true, Mode: uint32(r.uvarint())}
	b.Ino = ino + uint64(r.varint())
	b.Size, b.Mtime = r.varint(), r.varint()
	b.Ctime = b.Mtime + r.varint()
	return b
}

func decodeMeta(b []byte) (meta, error) {
	m, err := decodeMetaBytes(b)
	if err != nil {
		return meta{}, fmt.Errorf("bad %s: %w", metaXattr, err)
	}
	if m.Kind < KindFile || m.Kind > KindWhiteout {
		return meta{}, fmt.Errorf("bad %s: unknown kind %d", metaXattr, m.Kind)
	}
	return m, nil
}

func decodeMetaBytes(b []byte) (meta, error) {
	if len(b) > 0 && b[0] == '{' {
		// Written as JSON by an earlier stagefs, with the name itself.
		var old struct {
			meta
			Name string `json:"nm,omitempty"`
		}
		if err := json.Unmarshal(b, &old); err != nil {
			return meta{}, err
		}
		if old.Name != "" {
			old.NameSum = nameSum(old.Name)
		}
		return old.meta, nil
	}
	if len(b) == 0 || b[0] != metaVersion {
		return meta{}, errors.New("unknown version")
	}
	r := &metaReader{b: b[1:]}
	var m meta
	flags := r.uvarint()
	if flags >= metaHasWas<<1 {
		return meta{}, errors.New("unknown flags")
	}
	m.Kind = Kind(flags & metaKindMask)
	m.Container, m.Deleted = flags&metaContainer != 0, flags&metaDeleted != 0
	m.Opaque, m.AttrOnly = flags&metaOpaque != 0, flags&metaAttrOnly != 0
	m.Ino = bits.RotateLeft64(r.uvarint(), -2)
	m.Base = r.baseline(flags, m.Ino)
	m.Pid = int(r.uvarint())
	m.Comm = r.string()
	m.Time = r.varint()
	m.Dir = r.uvarint()
	m.NameSum = r.uint64()
	if flags&metaHasRedirect != 0 {
		m.Redirect = r.string()
	}
	if (flags&metaHasSpecial != 0) != (m.Kind == KindSpecial) {
		return meta{}, errors.New("device numbers on a kind that has none, or missing")
	}
	if flags&metaHasSpecial != 0 {
		m.Mode, m.Rdev = uint32(r.uvarint()), r.uvarint()
	}
	if flags&metaHasWas != 0 {
		wf := r.uvarint()
		if wf&^(metaContainer|metaOpaque|metaAttrOnly|metaHasBase|metaHasRedirect) != 0 {
			return meta{}, errors.New("unknown flags in was")
		}
		w := &placeState{Container: wf&metaContainer != 0, Opaque: wf&metaOpaque != 0, AttrOnly: wf&metaAttrOnly != 0}
		w.Base = r.baseline(wf, m.Ino)
		if wf&metaHasRedirect != 0 {
			w.Redirect = r.string()
		}
		m.Was = w
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = errors.New("trailing bytes")
	}
	return m, r.err
}
