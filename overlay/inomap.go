package overlay

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// inoMap keeps inode numbers stable across commit. Commit writes a new
// file into the workspace, which gets a new inode; the mount must go on
// showing the number it showed before (git's index and make compare it).
// Each commit records workspace inode -> shown number, and the shown
// numbers are reserved, so a workspace file that later gets one of them as
// its real number is shown under another: no two entries ever show the same
// number. (A file that reuses a committed file's inode number after that
// one was deleted inherits its shown number; a number is still unique.)
// Stat and readdir map alike, so d_ino always equals st_ino.
//
// STATE/inomap is append-only, one "real shown" line per mapping.
type inoMap struct {
	mu       sync.Mutex
	byReal   map[uint64]inoMapping
	reserved map[uint64]bool
	path     string
}

type inoMapping struct {
	shown uint64
}

// reservedBit marks a workspace inode number that collides with a number
// the mount shows for a committed file.
const reservedBit = 1 << 61

func loadInoMap(stateDir string) (*inoMap, error) {
	m := &inoMap{byReal: map[uint64]inoMapping{}, reserved: map[uint64]bool{}, path: filepath.Join(stateDir, "inomap")}
	f, err := os.Open(m.path)
	if os.IsNotExist(err) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var real, shown uint64
		if n, _ := fmt.Sscanf(sc.Text(), "%d %d", &real, &shown); n == 2 {
			m.setLocked(real, shown)
		}
		// A torn last line (a crash while appending) is skipped: that
		// file then shows its new number, nothing worse.
	}
	return m, sc.Err()
}

func (m *inoMap) setLocked(real, shown uint64) {
	if old, ok := m.byReal[real]; ok {
		delete(m.reserved, old.shown)
	}
	m.byReal[real] = inoMapping{shown}
	m.reserved[shown] = true
}

// shownFor returns the number to show for a workspace entry whose real
// inode number is ino.
func (m *inoMap) shownFor(ino uint64) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.byReal[ino]; ok {
		return v.shown
	}
	if m.reserved[ino] {
		return ino | reservedBit
	}
	return ino
}

// add records mappings and makes them durable.
func (m *inoMap) add(entries [][2]uint64) error {
	if len(entries) == 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	f, err := os.OpenFile(m.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	for _, e := range entries {
		fmt.Fprintf(w, "%d %d\n", e[0], e[1])
		m.setLocked(e[0], e[1])
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Sync()
}
