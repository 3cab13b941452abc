// Package atomicfile writes a file so that, across a crash, it holds
// either its old content or its new content, never a mix or nothing:
// restic's local backend and etcd's snapshotter write their files the same
// way. Every durable state file of stagefs is written with it.
package atomicfile

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Options change how a file is written. The zero value is the durable
// default.
type Options struct {
	// NoSync skips the fsyncs: the file is still replaced atomically,
	// but may come back old after a power loss (tests; files the caller
	// makes durable some other way).
	NoSync bool
}

// Write replaces path with data: a temporary file in the same directory
// (so the rename cannot cross file systems) is written, fsynced and closed,
// renamed over path, and the directory fsynced; the temporary file is
// removed on any error.
func Write(path string, data []byte, perm os.FileMode) error {
	return WriteFunc(path, perm, Options{}, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFunc is Write with the content written by fill.
func WriteFunc(path string, perm os.FileMode, o Options, fill func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	// A crash leaves at most this temporary file, which nothing reads as
	// data; its prefix is the one the snapshot store clears from its
	// directories at start-up (elsewhere it stays, small and harmless).
	f, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(f.Name())
			err = fmt.Errorf("write %s: %w", path, err)
		}
	}()
	if err = f.Chmod(perm); err == nil {
		err = fill(f)
	}
	if err == nil && !o.NoSync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	if o.NoSync {
		return nil
	}
	return SyncDir(dir)
}

// SyncDir makes the entries of dir (a rename, a new file) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
