package overlay

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"stagefs/internal/atomicfile"
)

// inoMap keeps inode numbers stable across commit. Commit writes a new
// file into the workspace, which gets a new inode; the mount must go on
// showing the number it showed before (git's index and make compare it).
// Each commit records workspace inode -> shown number.
//
// The map is one-to-one: a shown number belongs to one workspace inode at
// a time. Committing a path again moves its shown number to the new inode
// and forgets the old inode, which the filesystem is free to reuse; a
// reused inode must not inherit a number that another file shows, or the
// kernel would take the two files for one (same inode, shared page cache).
// A workspace inode whose own number is shown by another file is shown
// with reservedBit set. Stat and readdir map alike, so d_ino equals st_ino.
//
// STATE/inomap is append-only, one "real shown" line per change; a line
// whose two numbers are equal removes real's mapping. It is rewritten
// compactly at start-up when most of its lines are obsolete.
type inoMap struct {
	mu      sync.Mutex
	byReal  map[uint64]uint64 // workspace inode -> shown number
	byShown map[uint64]uint64 // shown number -> workspace inode
	lines   int               // lines in the file
	path    string

	// size is the file's length up to the end of its last whole line:
	// what the last load, append or rewrite left.
	size int64
	// unsaved are mappings in use whose append failed (a full disk): the
	// next append writes them first.
	unsaved [][2]uint64
}

// reservedBit marks a workspace inode number that collides with a number
// the mount shows for another file.
const reservedBit = 1 << 61

func loadInoMap(stateDir string) (*inoMap, error) {
	m := &inoMap{byReal: map[uint64]uint64{}, byShown: map[uint64]uint64{}, path: filepath.Join(stateDir, "inomap")}
	data, err := os.ReadFile(m.path)
	if os.IsNotExist(err) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	// A last line without its newline is torn: a crash stopped its
	// append. Its numbers may be cut short ("123 46" of "123 4611…"),
	// so it is not read, and it is cut off the file, so the next append
	// is not glued onto it. The commit that wrote it is finished again
	// at start-up, which writes the line again.
	if end := bytes.LastIndexByte(data, '\n') + 1; end < len(data) {
		data = data[:end]
		if err := truncateDurably(m.path, int64(end)); err != nil {
			return nil, err
		}
	}
	m.size = int64(len(data))
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" {
			continue
		}
		m.lines++
		var real, shown uint64
		if n, _ := fmt.Sscanf(line, "%d %d", &real, &shown); n == 2 {
			m.setLocked(real, shown)
		}
	}
	if m.lines > 1024 && m.lines > 4*len(m.byReal) {
		if err := m.rewrite(); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// length is the file's length up to the end of its last whole line: a
// fork copies that much of it.
func (m *inoMap) length() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.size
}

// setLocked makes real show as shown, taking shown away from any other
// inode that had it.
func (m *inoMap) setLocked(real, shown uint64) {
	if old, ok := m.byReal[real]; ok {
		delete(m.byShown, old)
		delete(m.byReal, real)
	}
	if other, ok := m.byShown[shown]; ok {
		delete(m.byReal, other)
		delete(m.byShown, shown)
	}
	if real != shown {
		m.byReal[real] = shown
		m.byShown[shown] = real
	}
}

// changes reports whether setLocked(real, shown) would change the map.
func (m *inoMap) changes(real, shown uint64) bool {
	if real == shown {
		_, mapped := m.byReal[real]
		_, taken := m.byShown[shown]
		return mapped || taken
	}
	cur, ok := m.byReal[real]
	return !ok || cur != shown
}

// shownFor returns the number to show for a workspace entry whose real
// inode number is ino.
func (m *inoMap) shownFor(ino uint64) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.byReal[ino]; ok {
		return v
	}
	if _, taken := m.byShown[ino]; taken {
		return ino | reservedBit
	}
	return ino
}

// maxShown returns the largest shown number with bit set, 0 when none.
func (m *inoMap) maxShown(bit uint64) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	top := uint64(0)
	for shown := range m.byShown {
		if shown&bit != 0 && shown > top {
			top = shown
		}
	}
	return top
}

// add records that each entry's workspace inode (first) shows as its
// second number, and makes the change durable.
func (m *inoMap) add(entries [][2]uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	todo := m.unsaved
	for _, e := range entries {
		if m.changes(e[0], e[1]) {
			todo = append(todo, e)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	// The view uses the numbers at once, written or not; what is not
	// written is tried again with the next append.
	m.unsaved = todo
	for _, e := range todo {
		m.setLocked(e[0], e[1])
	}
	f, err := os.OpenFile(m.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	// Each append starts on a fresh line: an earlier one that failed half
	// way (a full disk) may have left a torn line after the last whole
	// one, which would take the first numbers of this append and be read
	// as a mapping at the next start. It is cut off first.
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() > m.size {
		if err := f.Truncate(m.size); err != nil {
			return err
		}
	}
	var buf bytes.Buffer
	for _, e := range todo {
		fmt.Fprintf(&buf, "%d %d\n", e[0], e[1])
	}
	n, err := f.Write(buf.Bytes())
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	m.size = min(st.Size(), m.size) + int64(n)
	m.lines += len(todo)
	m.unsaved = nil
	return nil
}

// truncateDurably cuts the file at path to size and makes that durable.
func truncateDurably(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return err
	}
	return f.Sync()
}

// rewrite replaces the file with one line per live mapping, atomically.
func (m *inoMap) rewrite() error {
	size := int64(0)
	err := atomicfile.WriteFunc(m.path, 0o600, atomicfile.Options{}, func(f io.Writer) error {
		w := bufio.NewWriter(f)
		for real, shown := range m.byReal {
			n, _ := fmt.Fprintf(w, "%d %d\n", real, shown)
			size += int64(n)
		}
		return w.Flush()
	})
	if err != nil {
		return fmt.Errorf("compact %s: %w", m.path, err)
	}
	m.lines = len(m.byReal)
	m.size = size
	return nil
}
