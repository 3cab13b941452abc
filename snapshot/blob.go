package snapshot

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"stagefs/internal/contenthash"
	"stagefs/internal/fdio"
)

func (s *Store) blobPath(h contenthash.Hash) string {
	name := h.Hex()
	return filepath.Join(s.blobDir, name[:2], name)
}

// PutBody stores the content read from r and returns its hash and size. The
// content is hashed while it is copied to a temp file in the blob directory
// (without the store's lock, since r may be slow), fsynced, and renamed to
// its hash name. If a blob with that hash exists already the temp file is
// removed instead (dedupe).
//
// The blob is pinned until a file entry with that hash is passed to Add
// (whatever Add then does), so a GC or an eviction running in between does
// not remove it. A body that is never passed to Add stays pinned until the
// store is opened again, when it is removed as unreferenced.
func (s *Store) PutBody(r io.Reader) (contenthash.Hash, int64, error) {
	tmp, err := os.CreateTemp(s.blobDir, tmpPrefix+"*")
	if err != nil {
		return contenthash.Hash{}, 0, fmt.Errorf("snapshot: %w", err)
	}
	h := contenthash.New()
	// The file comes first: MultiWriter stops at the first failing writer
	// and a hash never fails.
	size, err := io.Copy(io.MultiWriter(tmp, h), r)
	return s.storeTemp(tmp, size, h, err)
}

// PutFile stores the content of the open file fd, from its current offset
// to its end, as PutBody does, but copies it in the kernel
// (copy_file_range: a reflink where the file system shares extents, else
// a copy that never reaches user space) and then hashes the copy, so the
// hash is of exactly the bytes stored even if the file changes meanwhile.
// Where the kernel cannot copy between the two files it falls back to
// reading and writing (fdio.Copy).
func (s *Store) PutFile(fd int) (contenthash.Hash, int64, error) {
	tmp, err := os.CreateTemp(s.blobDir, tmpPrefix+"*")
	if err != nil {
		return contenthash.Hash{}, 0, fmt.Errorf("snapshot: %w", err)
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	var size int64
	if err == nil {
		size, err = fdio.Copy(fd, int(tmp.Fd()), st.Size)
	}
	h := contenthash.New()
	if err == nil {
		_, err = io.Copy(h, io.NewSectionReader(tmp, 0, size))
	}
	return s.storeTemp(tmp, size, h, err)
}

// storeTemp finishes a PutBody or PutFile: fsyncs the temp file holding
// size bytes hashed by h (unless err already says the copy failed),
// renames it to its hash name or drops it when that body is stored
// already, and pins the body.
func (s *Store) storeTemp(tmp *os.File, size int64, h *contenthash.Hasher, err error) (contenthash.Hash, int64, error) {
	if err == nil {
		err = s.syncFile(tmp)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp.Name())
		return contenthash.Hash{}, 0, fmt.Errorf("snapshot: storing body: %w", err)
	}
	sum := h.Sum()
	fanout := sum.Hex()[:2]

	s.lock()
	defer s.unlock()
	if _, ok := s.blobs[sum]; ok {
		os.Remove(tmp.Name())
	} else {
		// Under the lock, so that a second PutBody can not rename into a
		// new fan-out directory before the first has made it durable.
		err := s.makeFanout(fanout)
		if err == nil {
			err = os.Rename(tmp.Name(), s.blobPath(sum))
		}
		if err != nil {
			os.Remove(tmp.Name())
			return contenthash.Hash{}, 0, fmt.Errorf("snapshot: storing body: %w", err)
		}
		s.blobs[sum] = size
		// A manifest line may refer to the blob only once the rename is
		// durable, which takes a sync of the directory.
		if err := s.syncDir(filepath.Join(s.blobDir, fanout)); err != nil {
			return contenthash.Hash{}, 0, fmt.Errorf("snapshot: storing body: %w", err)
		}
	}
	s.pins[sum]++
	return sum, size, nil
}

// makeFanout creates the blob subdirectory named by the first two hex digits
// of a hash, syncing the blob directory when it is new. Fan-out
// directories are never removed.
func (s *Store) makeFanout(name string) error {
	err := os.Mkdir(filepath.Join(s.blobDir, name), 0o700)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return s.syncDir(s.blobDir)
}

func (s *Store) unpin(h contenthash.Hash) {
	if s.pins[h] <= 1 {
		delete(s.pins, h)
		return
	}
	s.pins[h]--
}

// OpenBody opens a stored body for reading. The reader hashes what it reads
// and, at the end, returns an error wrapping ErrCorrupt instead of io.EOF if
// the content does not match hash, so a damaged body is never restored
// silently. A body that is not stored yields an error wrapping ErrNotFound.
func (s *Store) OpenBody(hash contenthash.Hash) (io.ReadCloser, error) {
	if hash.IsZero() {
		return nil, errors.New("snapshot: no body hash")
	}
	// No lock: a blob removed by a GC after this open stays readable
	// through the open file.
	f, err := os.Open(s.blobPath(hash))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: body %s", ErrNotFound, hash)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return &bodyReader{f: f, h: contenthash.New(), want: hash}, nil
}

// bodyReader checks a body against its hash while it is read.
type bodyReader struct {
	f    *os.File
	h    *contenthash.Hasher
	want contenthash.Hash
	err  error // sticky: once the end or an error was reported
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.f.Read(p)
	b.h.Write(p[:n])
	if err == io.EOF {
		if got := b.h.Sum(); got != b.want {
			err = fmt.Errorf("%w: body %s hashes to %s", ErrCorrupt, b.want.Hex(), got.Hex())
		}
	}
	if err != nil {
		b.err = err
	}
	return n, err
}

func (b *bodyReader) Close() error {
	return b.f.Close()
}

// GC removes the blobs that no snapshot refers to and no PutBody result
// waiting for its Add has pinned. It returns how many it removed.
func (s *Store) GC() (removed int, err error) {
	s.lock()
	defer s.unlock()
	return s.gcLocked()
}

// gcLocked works from the in-memory set of blobs, so it does not list the
// blob directory; it holds the lock throughout so that a PutBody can not put
// back a blob between the decision and the removal.
func (s *Store) gcLocked() (int, error) {
	removed := 0
	var errs []error
	for h := range s.blobs {
		if s.refs[h] != nil || s.pins[h] > 0 {
			continue
		}
		// A crash before the removal reaches the disk only leaves an
		// unreferenced blob, which the next Open removes again; so no
		// directory fsync here.
		if err := os.Remove(s.blobPath(h)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		delete(s.blobs, h)
		removed++
	}
	if len(errs) > 0 {
		return removed, fmt.Errorf("snapshot: gc: %w", errors.Join(errs...))
	}
	return removed, nil
}
