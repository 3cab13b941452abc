package sandbox

// A mount's sandbox settings and its scratch layer, both kept in the state
// dir:
//
//	STATE/sandbox.json       the mount's Settings, written by the daemon
//	STATE/scratch/lock       every confined run holds it shared; a drop
//	                         takes it alone
//	STATE/scratch/tmp/       /tmp inside
//	STATE/scratch/var-tmp/   /var/tmp inside
//	STATE/scratch/home-H/    the layer over one $HOME (H: a hash of its path)
//	    path                 that $HOME
//	    lock                 held by the one run that mounts the layer
//	    upper/, work/        overlayfs's upper and work dirs
//
// The locks are open file description locks (fcntl F_OFD_*): like flock
// they go with the file when the run's init exits, and unlike flock a
// third party can ask who holds one (F_OFD_GETLK) without taking it, so
// `stagefs status` never makes a run wait nor sees a lock of its own.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// What a sandbox does outside the workspace (Settings.Outside).
const (
	// OutsideReadOnly: everything outside the workspace is read-only but
	// the scratch layer over $HOME, the private /tmp and /var/tmp, /dev
	// and the --allow paths.
	OutsideReadOnly = "ro"
	// OutsideWritable: the command writes outside the workspace as the
	// caller would (the behaviour before issue #22).
	OutsideWritable = "rw"
)

// Settings are a mount's choices for the sandboxes of its runs (`stagefs
// mount --outside, --allow`). The daemon records them in the state dir, so
// every run, agent command and ACP proxy of the mount uses the same.
type Settings struct {
	Outside string   `json:"outside"`
	Allow   []string `json:"allow"` // real, absolute paths writable for real
}

// DefaultSettings are a mount's settings when it chose none, and those of
// a state dir that holds none (a daemon older than the file).
func DefaultSettings() Settings { return Settings{Outside: OutsideReadOnly, Allow: []string{}} }

// Validate checks what a settings file or a command line holds.
func (s Settings) Validate() error {
	if s.Outside != OutsideReadOnly && s.Outside != OutsideWritable {
		return fmt.Errorf("outside must be %q or %q, not %q", OutsideReadOnly, OutsideWritable, s.Outside)
	}
	for _, p := range s.Allow {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return fmt.Errorf("allowed path %q is not a clean absolute path below /", p)
		}
	}
	return nil
}

const settingsFile = "sandbox.json"

// SaveSettings records s in the state dir, replacing what was there.
func SaveSettings(state string, s Settings) error {
	if s.Allow == nil {
		s.Allow = []string{}
	}
	if err := s.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	// A temporary file renamed over the old one: a run never reads half.
	tmp := filepath.Join(state, settingsFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("record the sandbox settings: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(state, settingsFile)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("record the sandbox settings: %w", err)
	}
	return nil
}

// LoadSettings reads the settings the daemon recorded; a state dir with
// none gets DefaultSettings.
func LoadSettings(state string) (Settings, error) {
	b, err := os.ReadFile(filepath.Join(state, settingsFile))
	if errors.Is(err, os.ErrNotExist) {
		return DefaultSettings(), nil
	}
	if err != nil {
		return Settings{}, fmt.Errorf("read the mount's sandbox settings: %w", err)
	}
	var s Settings
	if err := json.Unmarshal(b, &s); err != nil {
		return Settings{}, fmt.Errorf("read the mount's sandbox settings %s: %v", filepath.Join(state, settingsFile), err)
	}
	if err := s.Validate(); err != nil {
		return Settings{}, fmt.Errorf("the mount's sandbox settings %s: %v", filepath.Join(state, settingsFile), err)
	}
	return s, nil
}

// ScratchDir is where a mount keeps its scratch layer.
func ScratchDir(state string) string { return filepath.Join(state, "scratch") }

const (
	scratchLock   = "lock"
	scratchTmp    = "tmp"
	scratchVarTmp = "var-tmp"
	homePrefix    = "home-"
	homePathFile  = "path"
)

// homeLayerDir is the layer over the $HOME at home (a real path).
func homeLayerDir(state, home string) string {
	sum := sha256.Sum256([]byte(home))
	return filepath.Join(ScratchDir(state), homePrefix+hex.EncodeToString(sum[:])[:12])
}

// lockFile opens (and makes) a lock file of the scratch layer.
func lockFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
}

// lock takes an open file description lock on all of f: typ is
// unix.F_RDLCK (shared) or unix.F_WRLCK (alone); wait says whether to wait
// for it. It reports false when it would have to wait and wait is unset.
func lock(f *os.File, typ int16, wait bool) (bool, error) {
	cmd := unix.F_OFD_SETLK
	if wait {
		cmd = unix.F_OFD_SETLKW
	}
	for {
		err := unix.FcntlFlock(f.Fd(), cmd, &unix.Flock_t{Type: typ, Whence: 0})
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EACCES):
			return false, nil
		}
		return false, err
	}
}

// heldBy reports the kind of lock someone holds on path: unix.F_RDLCK,
// unix.F_WRLCK, or unix.F_UNLCK when nobody does (or there is no file).
func heldBy(path string) int16 {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return unix.F_UNLCK
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return unix.F_UNLCK
	}
	return lk.Type
}

// ScratchEntry is one thing the scratch layer holds.
type ScratchEntry struct {
	// Path is where the command sees it: under $HOME, /tmp or /var/tmp.
	Path string `json:"path"`
	// Kind is "new" (nothing there outside), "changed" (it hides the real
	// one, which is unchanged) or "deleted" (it hides the real one).
	Kind  string `json:"kind"`
	Bytes int64  `json:"bytes"` // the bytes of the files at and below Path
}

// ScratchArea is one place the scratch layer covers inside the sandbox.
type ScratchArea struct {
	Path    string         `json:"path"` // $HOME's path, /tmp or /var/tmp
	Home    bool           `json:"home"` // a layer over a $HOME
	Dir     string         `json:"dir"`  // where it is kept, in the state dir
	Bytes   int64          `json:"bytes"`
	Entries []ScratchEntry `json:"entries"`
}

// Scratch is what a mount's scratch layer holds.
type Scratch struct {
	Dir   string        `json:"dir"`
	Bytes int64         `json:"bytes"`
	InUse bool          `json:"inUse"` // a run has it now
	Areas []ScratchArea `json:"areas"`
}

// ListScratch lists what the scratch layer of the mount whose state dir is
// state holds: for a $HOME, the highest paths that differ from the real
// $HOME; for /tmp and /var/tmp, their entries. It reads with lstat only,
// and costs as much as the layer holds files.
func ListScratch(state string) (Scratch, error) {
	dir := ScratchDir(state)
	out := Scratch{Dir: dir, Areas: []ScratchArea{}}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return out, err
	}
	out.InUse = heldBy(filepath.Join(dir, scratchLock)) == unix.F_RDLCK
	for _, e := range ents {
		var area ScratchArea
		switch name := e.Name(); {
		case name == scratchTmp:
			area = listPlain(filepath.Join(dir, name), "/tmp")
		case name == scratchVarTmp:
			area = listPlain(filepath.Join(dir, name), "/var/tmp")
		case strings.HasPrefix(name, homePrefix) && e.IsDir():
			b, err := os.ReadFile(filepath.Join(dir, name, homePathFile))
			if err != nil {
				continue // made by a run that died before it wrote the path: nothing in it
			}
			area = listHome(filepath.Join(dir, name), strings.TrimSpace(string(b)))
		default:
			continue
		}
		if len(area.Entries) == 0 {
			continue
		}
		out.Bytes += area.Bytes
		out.Areas = append(out.Areas, area)
	}
	// $HOME first: that is where the tools' caches are.
	sort.Slice(out.Areas, func(i, j int) bool {
		a, b := out.Areas[i], out.Areas[j]
		if a.Home != b.Home {
			return a.Home
		}
		return a.Path < b.Path
	})
	return out, nil
}

// listPlain lists a private /tmp or /var/tmp: every entry is new.
func listPlain(dir, at string) ScratchArea {
	area := ScratchArea{Path: at, Dir: dir, Entries: []ScratchEntry{}}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		n := treeBytes(filepath.Join(dir, e.Name()))
		area.Entries = append(area.Entries, ScratchEntry{Path: filepath.Join(at, e.Name()), Kind: "new", Bytes: n})
		area.Bytes += n
	}
	return area
}

// listHome lists a layer over home by walking its upper dir against the
// real home: a directory on both sides is walked into unless the layer
// made it opaque; anything else is reported where it is.
func listHome(dir, home string) ScratchArea {
	area := ScratchArea{Path: home, Home: true, Dir: dir, Entries: []ScratchEntry{}}
	upper := filepath.Join(dir, "upper")
	var walk func(rel string)
	walk = func(rel string) {
		ents, _ := os.ReadDir(filepath.Join(upper, rel))
		for _, e := range ents {
			r := filepath.Join(rel, e.Name())
			up := filepath.Join(upper, r)
			st, err := os.Lstat(up)
			if err != nil {
				continue
			}
			real, realErr := os.Lstat(filepath.Join(home, r))
			if whiteout(st) {
				if realErr == nil {
					area.Entries = append(area.Entries, ScratchEntry{Path: filepath.Join(home, r), Kind: "deleted"})
				}
				continue
			}
			if st.IsDir() && realErr == nil && real.IsDir() && !opaque(up) {
				walk(r)
				continue
			}
			kind := "new"
			if realErr == nil {
				kind = "changed"
			}
			n := treeBytes(up)
			area.Entries = append(area.Entries, ScratchEntry{Path: filepath.Join(home, r), Kind: kind, Bytes: n})
			area.Bytes += n
		}
	}
	walk("")
	return area
}

// whiteout reports whether st is overlayfs's mark of a deleted path: a
// character device 0/0.
func whiteout(st fs.FileInfo) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && st.Mode()&fs.ModeCharDevice != 0 && sys.Rdev == 0
}

// opaque reports whether overlayfs marked the directory p as hiding
// everything below it in the real $HOME (the sandbox mounts with
// userxattr, so the mark is a user.overlay xattr).
func opaque(p string) bool {
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(p, "user.overlay.opaque", buf)
	return err == nil && n > 0 && buf[0] == 'y'
}

// treeBytes sums the sizes of the regular files at and below p, without
// following symlinks; what it cannot read it skips.
func treeBytes(p string) int64 {
	var n int64
	filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			n += info.Size()
		}
		return nil
	})
	return n
}

// ScratchInUse reports whether a run of the mount whose state dir is state
// is running now (it holds the scratch layer).
func ScratchInUse(state string) bool {
	return heldBy(filepath.Join(ScratchDir(state), scratchLock)) == unix.F_RDLCK
}

// ErrScratchInUse is DropScratch's answer while a run uses the layer.
var ErrScratchInUse = errors.New("a run of this mount is using the scratch layer; drop it when no stagefs run, agent command or acp proxy of the mount is running")

// DropScratch deletes everything the scratch layer holds. It refuses while
// a run uses the layer, and a run that starts meanwhile waits for it.
func DropScratch(state string) error {
	dir := ScratchDir(state)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	f, err := lockFile(filepath.Join(dir, scratchLock))
	if err != nil {
		return err
	}
	defer f.Close()
	ok, err := lock(f, unix.F_WRLCK, false)
	if err != nil {
		return fmt.Errorf("lock the scratch layer: %w", err)
	}
	if !ok {
		return ErrScratchInUse
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name() == scratchLock {
			continue
		}
		if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// removeTree is os.RemoveAll for trees an overlay mount has used:
// overlayfs leaves its work dirs with mode 000, which only root may read,
// so every directory is first opened to its owner. The walk follows no
// symlink: it opens each directory with O_NOFOLLOW and changes the mode
// through that descriptor.
func removeTree(p string) error {
	filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			if fd, err := unix.Open(q, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
				unix.Fchmod(fd, 0o700)
				unix.Close(fd)
			}
		}
		return nil
	})
	return os.RemoveAll(p)
}
