package snapshot

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"stagefs/internal/atomicfile"

	"stagefs/internal/contenthash"
	"stagefs/internal/lockorder"
)

// Kind says what a path was before its first mutation.
type Kind string

const (
	KindFile    Kind = "file"    // regular file: Hash, Size, Mode
	KindSymlink Kind = "symlink" // Target
	KindDir     Kind = "dir"     // Mode
	KindAbsent  Kind = "absent"  // the path did not exist
	KindMoved   Kind = "moved"   // a directory was renamed from From to Path; restore moves it back
)

// Entry is one captured pre-image.
type Entry struct {
	Path   string           `json:"path"` // workspace-relative, slash separated ("" is the root)
	Kind   Kind             `json:"kind"`
	Hash   contenthash.Hash `json:"hash,omitzero"` // sha256 of the body (files), hex in a manifest
	Size   int64            `json:"size,omitempty"`
	Mode   uint32           `json:"mode,omitempty"` // permission bits (and file type bits as in stat)
	Uid    uint32           `json:"uid,omitempty"`
	Gid    uint32           `json:"gid,omitempty"`
	Mtime  int64            `json:"mtime,omitempty"` // unix ns
	Target string           `json:"target,omitempty"`
	From   string           `json:"from,omitempty"`
	Time   int64            `json:"time"` // capture time, unix ns
	Pid    int              `json:"pid,omitempty"`
	Comm   string           `json:"comm,omitempty"`
	// Xattrs holds a file's or directory's extended attributes (user
	// visible ones), so a restore can put them back too.
	Xattrs map[string][]byte `json:"xattrs,omitempty"`
}

// Info describes one snapshot.
type Info struct {
	ID      string   `json:"id"` // unique, sorts by creation
	ScopeID string   `json:"scopeId"`
	Turn    string   `json:"turn,omitempty"`
	Pid     int      `json:"pid,omitempty"`   // bound process (0: any process)
	Label   string   `json:"label,omitempty"` // what a person reads to find it: a tool and its command or file
	Created int64    `json:"created"`         // unix ns
	Closed  bool     `json:"closed"`
	Paths   []string `json:"paths"` // captured paths, in capture order
	Bytes   int64    `json:"bytes"` // sum of the sizes of its distinct file bodies
	// Workspace is the workspace the snapshot was taken of.
	Workspace string `json:"workspace,omitempty"`
	// Uncaptured names the paths that changed while the snapshot was open
	// but whose pre-image could not be stored (a full disk, over the byte
	// cap): a snapshot with any is incomplete, and restore leaves them.
	Uncaptured []string `json:"uncaptured,omitempty"`
}

// Options configure a Store.
type Options struct {
	ByteCap   int64  // total bytes of bodies referenced by snapshots; 0 means 1 GiB; <0 means no cap
	NoSync    bool   // tests only: skip fsyncs
	Workspace string // recorded in each new snapshot's header
	// Lazy reports the scopes whose snapshots wait for the disk only once
	// they hold something: the header and the close marker are written
	// without an fsync, and the first entry's fsync makes the header
	// durable with it. Tool calls use it, so that opening and closing one
	// costs no disk flush. A power loss can then lose a snapshot that
	// captured nothing, or a close marker; so Open closes, after a reboot,
	// every lazy snapshot still open (its processes went with the
	// machine). Nil: no scope is lazy.
	Lazy func(scopeID string) bool
}

// DefaultByteCap is the byte cap used when Options.ByteCap is 0.
const DefaultByteCap int64 = 1 << 30

var (
	ErrCorrupt  = errors.New("snapshot: stored body does not match its hash")
	ErrNotFound = errors.New("snapshot: not found")
	ErrClosed   = errors.New("snapshot: snapshot is closed")
	ErrExists   = errors.New("snapshot: an open snapshot with this scope id exists")
	ErrOverCap  = errors.New("snapshot: the body does not fit the byte cap")
)

// tmpPrefix starts the names of files that are being written. Open removes
// any it finds: they are leftovers of a crash and nothing refers to them.
const tmpPrefix = ".tmp-"

// snap is the in-memory state of one snapshot.
type snap struct {
	info    Info // Closed, Paths and Bytes are kept current
	entries []Entry
	has     map[string]struct{}        // captured paths, for Has and first-capture-wins
	hashes  map[contenthash.Hash]int64 // distinct bodies it refers to, with their sizes
	size    int64                      // manifest length on disk: where the next line goes
	broken  error                      // set when an append failed in a way that forbids more
	lazy    bool                       // header and close marker are not fsynced (Options.Lazy)
	// uncapturedSet is info.Uncaptured as a set, for isUncaptured: every
	// change of a branch's path asks it.
	uncapturedSet map[string]struct{}
	synced        bool // the manifest's name in DIR/snaps is durable
}

func newSnap(h header) *snap {
	return &snap{
		info: Info{
			ID:        h.ID,
			ScopeID:   h.ScopeID,
			Turn:      h.Turn,
			Pid:       h.Pid,
			Label:     h.Label,
			Created:   h.Created,
			Workspace: h.Workspace,
			Paths:     []string{},
		},
		entries: []Entry{},
		has:     map[string]struct{}{},
		hashes:  map[contenthash.Hash]int64{},
	}
}

// record adds e unless its path was captured already (first capture wins).
// It reports whether e added a body this snapshot did not refer to before.
func (sn *snap) record(e Entry) (newBody bool) {
	if _, dup := sn.has[entryKey(e)]; dup {
		return false
	}
	sn.has[entryKey(e)] = struct{}{}
	sn.entries = append(sn.entries, e)
	sn.info.Paths = append(sn.info.Paths, e.Path)
	if e.Kind != KindMoved {
		for i, q := range sn.info.Uncaptured {
			if q == e.Path {
				sn.info.Uncaptured = append(sn.info.Uncaptured[:i:i], sn.info.Uncaptured[i+1:]...)
				delete(sn.uncapturedSet, q)
				break
			}
		}
	}
	if e.Kind != KindFile {
		return false
	}
	if _, seen := sn.hashes[e.Hash]; seen {
		return false
	}
	sn.hashes[e.Hash] = e.Size
	sn.info.Bytes += e.Size
	return true
}

// entryKey is what "first capture wins" compares: the path, except for a
// directory move, which is recorded every time it happens (restore undoes
// the moves in reverse order), and never hides the pre-image of its path.
func entryKey(e Entry) string {
	if e.Kind == KindMoved {
		return "\x00moved\x00" + e.From + "\x00" + e.Path
	}
	return e.Path
}

// copyInfo returns the Info with its own Paths slice, so callers can keep it
// while the snapshot grows.
func (sn *snap) copyInfo() Info {
	i := sn.info
	i.Paths = make([]string, len(sn.info.Paths))
	copy(i.Paths, sn.info.Paths)
	i.Uncaptured = append([]string(nil), sn.info.Uncaptured...)
	return i
}

// uncaptured adds p to the snapshot's uncaptured paths, once.
// uncaptured notes p as given up on, unless it is captured. A later Add of
// p takes the mark back (record): the engine captures such a path again
// only when it knows that it has not changed since the capture failed.
func (sn *snap) uncaptured(p string) {
	if _, ok := sn.has[p]; ok || sn.isUncaptured(p) {
		return
	}
	sn.info.Uncaptured = append(sn.info.Uncaptured, p)
	if sn.uncapturedSet != nil {
		sn.uncapturedSet[p] = struct{}{}
	}
}

func (sn *snap) isUncaptured(p string) bool {
	if len(sn.uncapturedSet) != len(sn.info.Uncaptured) {
		// Kept in step with the list wherever it changes: rebuilt only
		// when it was not (a load, a removal).
		sn.uncapturedSet = make(map[string]struct{}, len(sn.info.Uncaptured))
		for _, q := range sn.info.Uncaptured {
			sn.uncapturedSet[q] = struct{}{}
		}
	}
	_, ok := sn.uncapturedSet[p]
	return ok
}

func (sn *snap) copyEntries() []Entry {
	es := make([]Entry, len(sn.entries))
	copy(es, sn.entries)
	return es
}

// ref is one body referred to by at least one snapshot.
type ref struct {
	count int   // snapshots referring to it
	size  int64 // counted in Store.total once, whatever count is
}

// Store keeps snapshots and their bodies in a directory. It is safe for
// concurrent use; one mutex guards all in-memory state.
type Store struct {
	blobDir   string
	snapDir   string
	noSync    bool
	workspace string
	byteCap   int64                     // <0: no cap
	lazy      func(scopeID string) bool // Options.Lazy; nil when the boot id is unknown
	flushes   atomic.Int64              // fsyncs asked for (also under NoSync), for tests
	onDrop    func(id string)           // see OnDrop
	held      map[string]int            // scope ids eviction must skip (Hold)

	mu          sync.Mutex
	order       []*snap                    // by creation, oldest first
	byScope     map[string]*snap           // newest snapshot of each scope id
	blobs       map[contenthash.Hash]int64 // blobs on disk: hash -> size
	refs        map[contenthash.Hash]*ref  // blobs some snapshot refers to
	pins        map[contenthash.Hash]int   // hash -> PutBody results not yet passed to Add
	total       int64                      // sum of refs' sizes
	lastCreated int64                      // Created of the newest snapshot ever made or loaded
}

// Open opens the store in dir, creating dir/blobs and dir/snaps as needed.
// It loads every manifest, truncating torn last lines away, and fails if
// any manifest is damaged otherwise. Then it removes temp files and blobs no
// manifest refers to, which a crash can leave behind.
func Open(dir string, opts Options) (*Store, error) {
	s := &Store{
		blobDir: filepath.Join(dir, "blobs"),
		snapDir: filepath.Join(dir, "snaps"),
		noSync:  opts.NoSync,
		byteCap: opts.ByteCap,
		lazy:    opts.Lazy,

		workspace: opts.Workspace,
		byScope:   map[string]*snap{},
		blobs:     map[contenthash.Hash]int64{},
		refs:      map[contenthash.Hash]*ref{},
		pins:      map[contenthash.Hash]int{},
	}
	if s.byteCap == 0 {
		s.byteCap = DefaultByteCap
	}
	for _, d := range []string{dir, s.blobDir, s.snapDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
	}
	if err := s.loadManifests(); err != nil {
		return nil, err
	}
	if err := s.closeAfterReboot(filepath.Join(dir, bootFile)); err != nil {
		return nil, err
	}
	if err := s.scanBlobs(); err != nil {
		return nil, err
	}
	// GC only now: every manifest loaded, so every reference is known.
	if _, err := s.gcLocked(); err != nil {
		return nil, fmt.Errorf("snapshot: removing unreferenced blobs: %w", err)
	}
	return s, nil
}

func (s *Store) loadManifests() error {
	des, err := os.ReadDir(s.snapDir)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	for _, de := range des {
		name := de.Name()
		p := filepath.Join(s.snapDir, name)
		if strings.HasPrefix(name, tmpPrefix) {
			if err := os.Remove(p); err != nil {
				return fmt.Errorf("snapshot: removing temp file: %w", err)
			}
			continue
		}
		id, ok := strings.CutSuffix(name, ".jsonl")
		if !ok || de.IsDir() {
			continue // not ours
		}
		if err := ValidID(id); err != nil {
			return fmt.Errorf("snapshot: manifest %s: file name is not a snapshot id", p)
		}
		sn, err := s.loadManifest(p, id)
		if err != nil {
			return err
		}
		if sn == nil {
			continue // removed: its header never reached the disk
		}
		s.order = append(s.order, sn)
	}
	sort.Slice(s.order, func(i, j int) bool {
		a, b := s.order[i].info, s.order[j].info
		if a.Created != b.Created {
			return a.Created < b.Created
		}
		return a.ID < b.ID
	})
	for _, sn := range s.order {
		s.byScope[sn.info.ScopeID] = sn // later (newer) ones win
		for h, size := range sn.hashes {
			s.addRef(h, size)
		}
		s.lastCreated = max(s.lastCreated, sn.info.Created)
	}
	return nil
}

func (s *Store) loadManifest(p, id string) (*snap, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if bytes.IndexByte(data, '\n') < 0 {
		// Not even the header line reached the disk whole: a lazy
		// snapshot's header is fsynced only with its first entry, so this
		// one captured nothing before a power loss. Nothing refers to it.
		if err := os.Remove(p); err != nil {
			return nil, fmt.Errorf("snapshot: removing manifest %s, whose header was lost: %w", p, err)
		}
		return nil, nil
	}
	d, err := decodeManifest(data)
	if err != nil {
		return nil, fmt.Errorf("snapshot: manifest %s: %w", p, err)
	}
	if d.hdr.ID != id {
		return nil, fmt.Errorf("snapshot: manifest %s: header id %q does not match the file name", p, d.hdr.ID)
	}
	if d.keep < len(data) {
		// A torn last line: cut it away now, so the next append does not
		// follow it and turn it into a bad middle line.
		if err := s.truncate(p, int64(d.keep)); err != nil {
			return nil, fmt.Errorf("snapshot: manifest %s: cutting torn last line: %w", p, err)
		}
	}
	sn := newSnap(d.hdr)
	for _, e := range d.entries {
		sn.record(e)
	}
	for _, p := range d.uncaptured {
		sn.uncaptured(p)
	}
	sn.info.Closed = d.closed
	sn.size = int64(d.keep)
	sn.lazy = s.lazy != nil && s.lazy(sn.info.ScopeID)
	sn.synced = true
	return sn, nil
}

func (s *Store) truncate(p string, size int64) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if err == nil {
		err = s.syncFile(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// scanBlobs fills s.blobs from the blob directory and removes temp files.
func (s *Store) scanBlobs() error {
	des, err := os.ReadDir(s.blobDir)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	for _, de := range des {
		name := de.Name()
		if strings.HasPrefix(name, tmpPrefix) {
			if err := os.Remove(filepath.Join(s.blobDir, name)); err != nil {
				return fmt.Errorf("snapshot: removing temp file: %w", err)
			}
			continue
		}
		if !de.IsDir() || len(name) != 2 || !lowerHex(name) {
			continue // not ours
		}
		fan := filepath.Join(s.blobDir, name)
		files, err := os.ReadDir(fan)
		if err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		for _, f := range files {
			h, err := contenthash.ParseHex(f.Name())
			if !f.Type().IsRegular() || err != nil || f.Name()[:2] != name {
				continue // not ours
			}
			fi, err := f.Info()
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return fmt.Errorf("snapshot: %w", err)
			}
			s.blobs[h] = fi.Size()
		}
	}
	return nil
}

// Create starts a new open snapshot for scopeID. It fails with ErrExists if
// an open snapshot with that scope id exists; a closed one is dropped first,
// so a scope id names at most one snapshot.
func (s *Store) Create(scopeID, turn string, pid int) (Info, error) {
	return s.CreateLabeled(scopeID, turn, "", pid)
}

// CreateLabeled is Create with a label for people (see Info.Label).
func (s *Store) CreateLabeled(scopeID, turn, label string, pid int) (Info, error) {
	if err := ValidScope(scopeID); err != nil {
		return Info{}, err
	}
	s.lock()
	defer s.unlock()
	if old := s.byScope[scopeID]; old != nil {
		if !old.info.Closed {
			return Info{}, fmt.Errorf("%w: %q", ErrExists, scopeID)
		}
		if err := s.dropScopeLocked(scopeID); err != nil {
			return Info{}, err
		}
		if _, err := s.gcLocked(); err != nil {
			return Info{}, err
		}
	}
	// Created strictly increases so that creation order survives a reopen
	// even for snapshots made within one clock tick.
	created := max(time.Now().UnixNano(), s.lastCreated+1)
	var rnd [4]byte
	rand.Read(rnd[:]) // never fails (it crashes the program instead)
	h := header{
		ID:        fmt.Sprintf("%016x-%s", created, hex.EncodeToString(rnd[:])),
		ScopeID:   scopeID,
		Turn:      turn,
		Pid:       pid,
		Label:     label,
		Created:   created,
		Workspace: s.workspace,
	}
	b, err := marshalLine(h)
	if err != nil {
		return Info{}, fmt.Errorf("snapshot: %w", err)
	}
	// The header is written whole under a temp name and renamed into place,
	// so a manifest never exists without a complete header. A lazy one is
	// not fsynced: the first entry's appendLine makes it durable.
	lazy := s.lazy != nil && s.lazy(scopeID)
	if err := s.writeAtomic(s.snapDir, s.manifestPath(h.ID), b, !lazy); err != nil {
		return Info{}, fmt.Errorf("snapshot: creating manifest: %w", err)
	}
	sn := newSnap(h)
	sn.size = int64(len(b))
	sn.lazy, sn.synced = lazy, !lazy
	s.order = append(s.order, sn)
	s.byScope[scopeID] = sn
	s.lastCreated = created
	return sn.copyInfo(), nil
}

// writeAtomic writes data to a temp file in dir and renames it to final;
// with durable, both the file and the rename are fsynced first.
func (s *Store) writeAtomic(dir, final string, data []byte, durable bool) error {
	if durable {
		s.flushes.Add(2) // the file and its directory
	}
	return atomicfile.WriteFunc(final, 0o600, atomicfile.Options{NoSync: !durable || s.noSync}, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

func (s *Store) manifestPath(id string) string {
	return filepath.Join(s.snapDir, id+".jsonl")
}

// Lookup returns the newest snapshot with that scope id.
func (s *Store) Lookup(scopeID string) (Info, bool) {
	s.lock()
	defer s.unlock()
	sn := s.byScope[scopeID]
	if sn == nil {
		return Info{}, false
	}
	return sn.copyInfo(), true
}

// Has reports whether path was captured already in the snapshot of scopeID.
func (s *Store) Has(scopeID, path string) bool {
	s.lock()
	defer s.unlock()
	sn := s.byScope[scopeID]
	if sn == nil {
		return false
	}
	_, ok := sn.has[path]
	return ok
}

// IsUncaptured reports whether path is marked as given up on in the
// snapshot of scopeID (MarkUncaptured) and not captured since.
func (s *Store) IsUncaptured(scopeID, path string) bool {
	s.lock()
	defer s.unlock()
	sn := s.byScope[scopeID]
	return sn != nil && sn.isUncaptured(path)
}

// Add appends e to the snapshot's manifest and fsyncs it before returning.
// Adding a path that was captured already is a no-op: the first capture is
// the pre-image. The snapshot must be open, and a file entry's body must
// have been stored with PutBody (its Size must match). A zero e.Time is set
// to the current time.
func (s *Store) Add(scopeID string, e Entry) error {
	if err := checkEntry(&e); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	s.lock()
	defer s.unlock()
	if e.Kind == KindFile {
		// Whatever happens below, the PutBody that produced this hash
		// has been answered; from here on only references keep the blob.
		s.unpin(e.Hash)
	}
	sn := s.byScope[scopeID]
	if sn == nil {
		return fmt.Errorf("%w: snapshot %q", ErrNotFound, scopeID)
	}
	if sn.info.Closed {
		return fmt.Errorf("%w: %q", ErrClosed, scopeID)
	}
	if sn.broken != nil {
		return sn.broken
	}
	if _, ok := sn.has[entryKey(e)]; ok {
		return nil
	}
	if e.Kind == KindFile {
		size, ok := s.blobs[e.Hash]
		if !ok {
			return fmt.Errorf("%w: body %s", ErrNotFound, e.Hash)
		}
		if size != e.Size {
			return fmt.Errorf("snapshot: entry %q: size %d, but body %s has %d bytes", e.Path, e.Size, e.Hash, size)
		}
		if err := s.makeRoomLocked(e.Hash, e.Size); err != nil {
			return err
		}
	}
	if e.Time == 0 {
		e.Time = time.Now().UnixNano()
	}
	b, err := marshalLine(e)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := s.appendLine(sn, b, true); err != nil {
		return err
	}
	if sn.record(e) {
		s.addRef(e.Hash, e.Size)
	}
	return nil
}

// appendLine writes b at the end of sn's manifest. With durable it fsyncs
// the file, and the first time also DIR/snaps, which makes a lazy header's
// rename durable.
func (s *Store) appendLine(sn *snap, b []byte, durable bool) error {
	p := s.manifestPath(sn.info.ID)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	// Writing at the known end rather than with O_APPEND means that bytes a
	// failed write left behind are overwritten by the next line.
	if _, err := f.WriteAt(b, sn.size); err != nil {
		// Cut back a partly written line so that no later line follows
		// it. If that fails too, a later line could turn the torn one
		// into a bad middle line, so refuse further lines.
		if terr := f.Truncate(sn.size); terr != nil {
			sn.broken = fmt.Errorf("snapshot: manifest %s is unusable after a failed write: %w", p, err)
		}
		f.Close()
		return fmt.Errorf("snapshot: manifest %s: %w", p, err)
	}
	if durable {
		err = s.syncFile(f)
		if err == nil && !sn.synced {
			err = s.syncDir(s.snapDir)
			sn.synced = err == nil
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// After a failed fsync the page cache may not match the disk
		// and a retry can report success for data that is gone.
		sn.broken = fmt.Errorf("snapshot: manifest %s is unusable after a failed fsync: %w", p, err)
		return sn.broken
	}
	sn.size += int64(len(b))
	return nil
}

// CloseSnapshot marks the snapshot closed (durably), then evicts the oldest
// closed snapshots while the bodies referenced exceed the byte cap. The
// snapshot just closed counts as closed too: if the open snapshots and it
// hold more than the cap, it is evicted as well. The returned Info is the
// closed snapshot's, also when err reports a failed eviction (Info.Closed
// is then true).
func (s *Store) CloseSnapshot(scopeID string) (Info, error) {
	s.lock()
	defer s.unlock()
	sn := s.byScope[scopeID]
	if sn == nil {
		return Info{}, fmt.Errorf("%w: snapshot %q", ErrNotFound, scopeID)
	}
	if sn.info.Closed {
		return Info{}, fmt.Errorf("%w: %q", ErrClosed, scopeID)
	}
	if sn.broken != nil {
		return Info{}, sn.broken
	}
	// A lazy snapshot's close marker may be lost to a power loss; Open
	// closes it again after the reboot.
	if err := s.appendLine(sn, closeMarker, !sn.lazy); err != nil {
		return Info{}, err
	}
	sn.info.Closed = true
	info := sn.copyInfo()
	if err := s.enforceCapLocked(0); err != nil {
		return info, fmt.Errorf("snapshot: enforcing the byte cap: %w", err)
	}
	return info, nil
}

// enforceCapLocked drops whole closed snapshots, oldest first, until the
// referenced bodies and extra more bytes fit the cap or no closed snapshot
// is left.
func (s *Store) enforceCapLocked(extra int64) error {
	if s.byteCap < 0 || s.total+extra <= s.byteCap {
		return nil
	}
	for s.total+extra > s.byteCap {
		var victim *snap
		for _, sn := range s.order {
			if sn.info.Closed && s.held[sn.info.ScopeID] == 0 {
				victim = sn
				break
			}
		}
		if victim == nil {
			break // only open or held snapshots left; they are never evicted
		}
		if err := s.dropLocked(victim); err != nil {
			return err
		}
	}
	_, err := s.gcLocked()
	return err
}

// makeRoomLocked makes room under the byte cap for body h of size bytes,
// about to be referenced. A body some snapshot refers to already costs
// nothing; otherwise closed snapshots are evicted, oldest first, until it
// fits. When it can not fit even with every closed snapshot gone (open
// snapshots hold the rest), nothing is evicted, the body is removed unless
// a PutBody not yet passed to Add holds it, and the error is ErrOverCap:
// the caller marks the path uncaptured.
func (s *Store) makeRoomLocked(h contenthash.Hash, size int64) error {
	if s.byteCap < 0 || s.refs[h] != nil || s.total+size <= s.byteCap {
		return nil
	}
	if kept := s.unevictableBytesLocked(); kept+size > s.byteCap {
		// Evicting every snapshot it may would not make room: keep them.
		s.removeUnpinnedLocked(h)
		return fmt.Errorf("%w: %d bytes, with %d of %d held by open snapshots", ErrOverCap, size, kept, s.byteCap)
	}
	// Pinned while closed snapshots go, so that their GC leaves it.
	s.pins[h]++
	err := s.enforceCapLocked(size)
	s.unpin(h)
	if err != nil {
		return fmt.Errorf("snapshot: evicting for the byte cap: %w", err)
	}
	if s.total+size <= s.byteCap {
		return nil
	}
	s.removeUnpinnedLocked(h)
	return fmt.Errorf("%w: %d bytes, with %d of %d held by snapshots", ErrOverCap, size, s.total, s.byteCap)
}

// unevictableBytesLocked sums the distinct bodies that open and held
// snapshots refer to: what no eviction can free.
func (s *Store) unevictableBytesLocked() int64 {
	seen := map[contenthash.Hash]bool{}
	var sum int64
	for _, sn := range s.order {
		if sn.info.Closed && s.held[sn.info.ScopeID] == 0 {
			continue
		}
		for h, size := range sn.hashes {
			if !seen[h] {
				seen[h] = true
				sum += size
			}
		}
	}
	return sum
}

// removeUnpinnedLocked removes blob h unless a snapshot refers to it or a
// PutBody not yet passed to Add holds it.
func (s *Store) removeUnpinnedLocked(h contenthash.Hash) {
	if s.refs[h] != nil || s.pins[h] > 0 {
		return
	}
	if err := os.Remove(s.blobPath(h)); err == nil || errors.Is(err, fs.ErrNotExist) {
		delete(s.blobs, h)
	}
}

// Fits reports whether a body of size bytes could fit the byte cap at all,
// so that a file larger than the whole cap is not copied only to be
// refused.
func (s *Store) Fits(size int64) bool {
	return s.byteCap < 0 || size <= s.byteCap
}

// MarkUncaptured records, durably, that path changed while scopeID's
// snapshot was open without its pre-image being stored: the snapshot is
// incomplete. When the line can not be written (the disk is full) the
// path is still kept in memory, and the error says so.
func (s *Store) MarkUncaptured(scopeID, path string) error {
	if err := validPath(path); err != nil || path == "" {
		return fmt.Errorf("snapshot: uncaptured path %q: not a workspace path", path)
	}
	s.lock()
	defer s.unlock()
	sn := s.byScope[scopeID]
	if sn == nil {
		return fmt.Errorf("%w: snapshot %q", ErrNotFound, scopeID)
	}
	if sn.info.Closed {
		return fmt.Errorf("%w: %q", ErrClosed, scopeID)
	}
	if _, ok := sn.has[path]; ok || sn.isUncaptured(path) {
		return nil // captured, or given up on, already
	}
	sn.uncaptured(path)
	if sn.broken != nil {
		return sn.broken
	}
	b, err := marshalLine(struct {
		Uncaptured string `json:"uncaptured"`
	}{path})
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	return s.appendLine(sn, b, true)
}

// Entries returns the snapshot's entries in capture order.
func (s *Store) Entries(scopeID string) ([]Entry, error) {
	s.lock()
	defer s.unlock()
	sn := s.byScope[scopeID]
	if sn == nil {
		return nil, fmt.Errorf("%w: snapshot %q", ErrNotFound, scopeID)
	}
	return sn.copyEntries(), nil
}

// List returns every snapshot, oldest first.
func (s *Store) List() []Info {
	s.lock()
	defer s.unlock()
	out := make([]Info, 0, len(s.order))
	for _, sn := range s.order {
		out = append(out, sn.copyInfo())
	}
	return out
}

// OpenSnapshots returns the open snapshots, oldest first.
func (s *Store) OpenSnapshots() []Info {
	s.lock()
	defer s.unlock()
	out := []Info{}
	for _, sn := range s.order {
		if !sn.info.Closed {
			out = append(out, sn.copyInfo())
		}
	}
	return out
}

// Drop removes every snapshot with that scope id (open or closed), then the
// blobs no snapshot refers to any more.
func (s *Store) Drop(scopeID string) error {
	s.lock()
	defer s.unlock()
	if s.byScope[scopeID] == nil {
		return fmt.Errorf("%w: snapshot %q", ErrNotFound, scopeID)
	}
	if err := s.dropScopeLocked(scopeID); err != nil {
		return err
	}
	_, err := s.gcLocked()
	return err
}

func (s *Store) dropScopeLocked(scopeID string) error {
	// Iterate over a copy: dropLocked edits s.order.
	for _, sn := range append([]*snap(nil), s.order...) {
		if sn.info.ScopeID == scopeID {
			if err := s.dropLocked(sn); err != nil {
				return err
			}
		}
	}
	return nil
}

// dropLocked removes sn's manifest, then forgets sn. Its blobs stay until
// the next GC.
func (s *Store) dropLocked(sn *snap) error {
	if err := os.Remove(s.manifestPath(sn.info.ID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshot: %w", err)
	}
	// Make the removal durable before any blob it referred to goes, so a
	// crash can not leave a manifest whose bodies are missing.
	if err := s.syncDir(s.snapDir); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	for i, o := range s.order {
		if o == sn {
			s.order = append(s.order[:i], s.order[i+1:]...)
			break
		}
	}
	if s.byScope[sn.info.ScopeID] == sn {
		delete(s.byScope, sn.info.ScopeID)
		for i := len(s.order) - 1; i >= 0; i-- {
			if s.order[i].info.ScopeID == sn.info.ScopeID {
				s.byScope[sn.info.ScopeID] = s.order[i]
				break
			}
		}
	}
	for h := range sn.hashes {
		s.dropRef(h)
	}
	if s.onDrop != nil {
		s.onDrop(sn.info.ID)
	}
	return nil
}

// Hold keeps the snapshots of scopeIDs from eviction until the returned
// release is called: an operation that will read them (a rollback
// restoring its turns) must not see a capture it makes meanwhile evict
// them. Drop still removes them.
func (s *Store) Hold(scopeIDs ...string) (release func()) {
	s.lock()
	defer s.unlock()
	if s.held == nil {
		s.held = map[string]int{}
	}
	for _, id := range scopeIDs {
		s.held[id]++
	}
	return func() {
		s.lock()
		defer s.unlock()
		for _, id := range scopeIDs {
			if s.held[id]--; s.held[id] <= 0 {
				delete(s.held, id)
			}
		}
	}
}

// OnDrop sets f to be called with the id of every snapshot the store drops
// from now on (Drop, eviction, a closed scope id used again), so that a
// user of the store can remove what it keeps beside a snapshot. f runs
// under the store's lock: it must not call the store.
func (s *Store) OnDrop(f func(id string)) {
	s.lock()
	defer s.unlock()
	s.onDrop = f
}

func (s *Store) addRef(h contenthash.Hash, size int64) {
	r := s.refs[h]
	if r == nil {
		r = &ref{size: size}
		s.refs[h] = r
		s.total += size
	}
	r.count++
}

func (s *Store) dropRef(h contenthash.Hash) {
	r := s.refs[h]
	if r == nil {
		return
	}
	r.count--
	if r.count <= 0 {
		delete(s.refs, h)
		s.total -= r.size
	}
}

// TotalBytes returns the sizes of the distinct blobs snapshots refer to.
func (s *Store) TotalBytes() int64 {
	s.lock()
	defer s.unlock()
	return s.total
}

func (s *Store) syncFile(f *os.File) error {
	s.flushes.Add(1)
	if s.noSync {
		return nil
	}
	return f.Sync()
}

func (s *Store) syncDir(dir string) error {
	s.flushes.Add(1)
	if s.noSync {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// bootFile, in the store's directory, holds the boot id of the machine run
// that last opened the store.
const bootFile = "boot"

// closeAfterReboot closes, durably, every lazy snapshot left open when the
// machine has booted since the store was last opened: a power loss may have
// lost its close marker, and the processes it covered are gone anyway
// (after a reboot a bound pid may even name another process). Then it
// records this boot. Where the boot id cannot be read, nothing is lazy.
func (s *Store) closeAfterReboot(p string) error {
	if s.lazy == nil {
		return nil
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil || len(bytes.TrimSpace(boot)) == 0 {
		s.lazy = nil
		for _, sn := range s.order {
			sn.lazy = false
		}
		return nil
	}
	last, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshot: %w", err)
	}
	if bytes.Equal(last, boot) {
		return nil
	}
	// With no record at all (a new store, or one from before boot ids
	// were kept, whose close markers were all fsynced) only this boot is
	// recorded.
	for _, sn := range s.order {
		if err == nil && sn.lazy && !sn.info.Closed {
			if err := s.appendLine(sn, closeMarker, true); err != nil {
				return fmt.Errorf("snapshot: closing %q after a reboot: %w", sn.info.ScopeID, err)
			}
			sn.info.Closed = true
		}
	}
	if err := s.writeAtomic(filepath.Dir(p), p, boot, true); err != nil {
		return fmt.Errorf("snapshot: recording the boot id: %w", err)
	}
	return nil
}

// lock and unlock take and let go of mu, telling lockorder (which checks
// the order in builds made with -tags lockorder).
func (s *Store) lock() {
	lockorder.Acquire(lockorder.Snapshots)
	s.mu.Lock()
}

func (s *Store) unlock() {
	s.mu.Unlock()
	lockorder.Release(lockorder.Snapshots)
}
