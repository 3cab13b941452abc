package overlay

import (
	"bytes"
	"errors"
	"io"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"

	"stagefs/internal/fdio"
	"stagefs/internal/unidiff"
)

// MaxReadBytes bounds what ReadFile and the diff load into memory for one
// file.
const MaxReadBytes = 64 << 20

// ReadFile returns p's content in the merged view; exists is false (and
// err nil) when p does not exist.
func (e *Engine) ReadFile(p string) (data []byte, exists bool, err error) {
	e.textMu.RLock()
	defer e.textMu.RUnlock()
	f, err := e.Open(p, unix.O_RDONLY, Caller{})
	if err == syscall.ENOENT {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer unix.Close(f.Fd)
	var st unix.Stat_t
	if err := unix.Fstat(f.Fd, &st); err != nil {
		return nil, true, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, true, syscall.EISDIR
	}
	if st.Size > MaxReadBytes {
		return nil, true, syscall.EFBIG
	}
	data, err = io.ReadAll(io.LimitReader(fdio.Reader(f.Fd), MaxReadBytes+1))
	return data, true, err
}

// WriteFile replaces p's content in the merged view (creating it with mode
// 0644 when absent), as a process in the mount would.
func (e *Engine) WriteFile(p string, data []byte, c Caller) error {
	f, _, err := e.Create(p, unix.O_WRONLY|unix.O_TRUNC, 0o644, c)
	if err != nil {
		return err
	}
	_, err = io.Copy(fdio.Writer(f.Fd), bytes.NewReader(data))
	if err == nil {
		err = unix.Fsync(f.Fd)
	}
	e.Release(p, f, c)
	return err
}

// ErrBusy is returned by PatchFile while a process has the file open for
// writing: its writes could land between the check and the write.
var ErrBusy = errors.New("a process has the file open for writing")

// PatchFile is a compare-and-swap of p's content: decide sees the current
// content and returns the new one (write false: leave it). The engine lock
// is held from the read to the write, so no process in the mount can open
// p for writing in between, and a file already open for writing is
// refused with ErrBusy. The control socket passes a Caller with Host set:
// the host's edit is captured into the open turn and unbound snapshots and
// clears redo, like any process's edit.
func (e *Engine) PatchFile(p string, c Caller, decide func(cur []byte, exists bool) (next []byte, write bool, err error)) error {
	e.textMu.Lock()
	defer e.textMu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	l, err := e.locate(p)
	if err != nil && err != syscall.ENOENT {
		return err
	}
	var cur []byte
	exists := false
	if err == nil {
		if l.m != nil && e.writers[l.m.uino] > 0 {
			return ErrBusy
		}
		st, serr := e.statLoc(p, l)
		if serr != nil && serr != syscall.ENOENT {
			return serr // e.g. a symlink where a directory should be
		}
		if serr == nil {
			if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
				return syscall.EISDIR
			}
			if st.Size > MaxReadBytes {
				return syscall.EFBIG
			}
			lyr, rel := e.base, l.basePath
			if l.m != nil {
				lyr, rel = e.upper, p
			}
			fd, oerr := lyr.open(rel, unix.O_RDONLY|unix.O_NONBLOCK, 0)
			if oerr != nil {
				return oerr
			}
			cur, err = io.ReadAll(io.LimitReader(fdio.Reader(fd), MaxReadBytes+1))
			unix.Close(fd)
			if err != nil {
				return err
			}
			exists = true
		}
	}
	next, write, err := decide(cur, exists)
	if err != nil || !write {
		return err
	}
	f, _, _, err := e.createLocked(p, unix.O_WRONLY|unix.O_TRUNC, 0o644, c)
	if err != nil {
		return err
	}
	_, err = io.Copy(fdio.Writer(f.Fd), bytes.NewReader(next))
	if err == nil {
		err = unix.Fsync(f.Fd)
	}
	if f.uino != 0 {
		if e.writers[f.uino]--; e.writers[f.uino] <= 0 {
			delete(e.writers, f.uino)
		}
	}
	unix.Close(f.Fd)
	if err != nil {
		return err
	}
	return e.recordOp(c, "patch", p, "", int64(len(next)))
}

// Diff returns the pending changes at or below paths as file changes
// against the workspace, for a unified diff.
func (e *Engine) Diff(paths []string) ([]unidiff.FileChange, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	var out []unidiff.FileChange
	for _, p := range e.selectLocked(paths, false, nil) {
		m := e.index[p]
		switch {
		case m.Kind == KindFile || m.Kind == KindSymlink:
			ch := unidiff.FileChange{Path: p}
			ch.Old, ch.OldMode = e.baseBody(p)
			ch.New, ch.NewMode = e.viewBody(p)
			out = append(out, ch)
		case m.Kind == KindWhiteout:
			out = e.baseTreeDeletes(p, out)
		case m.Kind == KindDir && m.Redirect != "":
			out = e.viewTreeCreates(p, out)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// gitMode maps a stat mode to the modes git records.
func gitMode(mode uint32) uint32 {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFLNK:
		return 0o120000
	case syscall.S_IFREG:
		if mode&0o111 != 0 {
			return 0o100755
		}
		return 0o100644
	}
	return 0
}

// baseBody reads the workspace's file or symlink at p (mode 0: absent or
// another type).
func (e *Engine) baseBody(p string) ([]byte, uint32) {
	st, err := e.base.lstat(p)
	if err != nil {
		return nil, 0
	}
	return e.bodyOf(e.base, p, st.Mode, st.Size)
}

// viewBody reads the merged view's file or symlink at p.
func (e *Engine) viewBody(p string) ([]byte, uint32) {
	l, err := e.locate(p)
	if err != nil {
		return nil, 0
	}
	st, err := e.statLoc(p, l)
	if err != nil {
		return nil, 0
	}
	if l.m != nil {
		if l.m.Kind == KindSymlink {
			t, err := e.readUpperSymlink(p)
			if err != nil {
				return nil, 0
			}
			return []byte(t), gitMode(st.Mode)
		}
		return e.bodyOf(e.upper, p, st.Mode, st.Size)
	}
	return e.bodyOf(e.base, l.basePath, st.Mode, st.Size)
}

func (e *Engine) bodyOf(l layer, rel string, mode uint32, size int64) ([]byte, uint32) {
	gm := gitMode(mode)
	switch gm {
	case 0:
		return nil, 0
	case 0o120000:
		t, err := l.readlink(rel)
		if err != nil {
			return nil, 0
		}
		return []byte(t), gm
	}
	if size > MaxReadBytes {
		// Too large to diff: shown as a binary change.
		return []byte("\x00(file too large to diff)"), gm
	}
	fd, err := l.open(rel, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0
	}
	defer unix.Close(fd)
	b, err := io.ReadAll(io.LimitReader(fdio.Reader(fd), MaxReadBytes))
	if err != nil {
		return nil, 0
	}
	if b == nil {
		b = []byte{}
	}
	return b, gm
}

// baseTreeDeletes adds deletions of the workspace's files at or below p.
func (e *Engine) baseTreeDeletes(p string, out []unidiff.FileChange) []unidiff.FileChange {
	st, err := e.base.lstat(p)
	if err != nil {
		return out
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		if b, mode := e.baseBody(p); mode != 0 {
			out = append(out, unidiff.FileChange{Path: p, Old: b, OldMode: mode})
		}
		return out
	}
	fd, err := e.base.openDirRead(p)
	if err != nil {
		return out
	}
	ents, _ := readDirents(fd)
	unix.Close(fd)
	for _, d := range ents {
		out = e.baseTreeDeletes(joinPath(p, d.Name), out)
	}
	return out
}

// viewTreeCreates adds creations for the view's files below the renamed
// directory p that have no pending entry of their own.
func (e *Engine) viewTreeCreates(p string, out []unidiff.FileChange) []unidiff.FileChange {
	ents, err := e.readDirLocked(p)
	if err != nil {
		return out
	}
	for _, d := range ents {
		q := joinPath(p, d.Name)
		if d.Mode == syscall.S_IFDIR {
			if m := e.index[q]; m == nil || m.Redirect == "" {
				out = e.viewTreeCreates(q, out)
			}
			continue
		}
		if m := e.index[q]; m != nil && m.isChange() {
			continue
		}
		if b, mode := e.viewBody(q); mode != 0 {
			out = append(out, unidiff.FileChange{Path: q, New: b, NewMode: mode})
		}
	}
	return out
}
