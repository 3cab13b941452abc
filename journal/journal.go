package journal

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"

	"stagefs/internal/lockorder"
)

// fileHeader opens every journal file: magic "SFSJ" and version 1 (uint32 LE).
var fileHeader = [8]byte{'S', 'F', 'S', 'J', 1, 0, 0, 0}

const (
	fileHeaderLen = int64(len(fileHeader))
	fileVersion   = 1
	// filePerm keeps the journal private: it describes the user's files.
	filePerm = 0o600
)

// Options tune a journal.
type Options struct {
	// NoSync skips fsync (tests and benchmarks only).
	NoSync bool
}

// RecoverInfo tells what Open found.
type RecoverInfo struct {
	// Records are the valid records read: those after the checkpoint, or
	// all of them without one.
	Records int
	// CheckpointSeq is the last record before the checkpoint Open started
	// from (0: none, the whole journal was read). No commit was in flight
	// at a checkpoint, so none starts before it.
	CheckpointSeq uint64
	LastSeq       uint64 // sequence number of the last valid record, 0 when none
	TornBytes     int64  // bytes cut off the tail (0 when clean)
	BrokenCopy    string // path of the saved copy of the torn bytes, "" when none
}

// CorruptError is returned by Open when a record in the middle of the log is
// damaged: a bad record followed by at least one valid one, or a break in the
// sequence numbers. The file is left untouched.
type CorruptError struct {
	Path   string
	Offset int64 // where the damaged record starts
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("journal %s: corrupt record at offset %d: %s; "+
		"move the journal aside or truncate it to %d bytes with: truncate -s %d %s; "+
		"the records after it are lost",
		e.Path, e.Offset, e.Reason, e.Offset, e.Offset, e.Path)
}

// Journal is an open append-only log. Its methods are safe for concurrent use.
type Journal struct {
	path   string
	noSync bool
	// syncFile makes the file's data durable. It is a field so tests can
	// observe or fail fsyncs; it is a no-op with NoSync.
	syncFile func(*os.File) error

	mu   sync.Mutex
	cond sync.Cond // on mu; signalled when a sync round ends or on Close

	f         *os.File
	size      int64  // bytes written to the file, header included
	lastSeq   uint64 // last sequence number written to the file
	syncedSeq uint64 // every record with seq <= syncedSeq is durable
	syncing   bool   // an fdatasync is running (without mu held)
	closed    bool
	err       error  // sticky write/fsync failure; refuses further appends
	marks     []mark // the sparse index (index.go), oldest first
}

// Open opens the journal at path, creating it if it is missing, and recovers
// it as described in the package documentation. On a damaged middle record it
// returns a *CorruptError and leaves the file untouched.
func Open(path string, opts Options) (*Journal, RecoverInfo, error) {
	j := &Journal{path: path, noSync: opts.NoSync, syncFile: datasync}
	if opts.NoSync {
		j.syncFile = func(*os.File) error { return nil }
	}
	j.cond.L = &j.mu

	f, err := openOrCreate(path)
	if err != nil {
		return nil, RecoverInfo{}, err
	}
	if err := lockFile(f); err != nil {
		f.Close()
		return nil, RecoverInfo{}, fmt.Errorf("journal %s: already in use (flock: %w)", path, err)
	}
	j.f = f
	info, err := j.recover()
	if err != nil {
		// Closing the descriptor also drops the flock.
		f.Close()
		return nil, RecoverInfo{}, err
	}
	j.lastSeq = info.LastSeq
	j.syncedSeq = info.LastSeq
	return j, info, nil
}

// openOrCreate opens path for appending, creating it if it does not exist.
// O_APPEND makes every write land at the end, wherever recovery left the
// file offset. The header of a new file is written by recover, which treats
// a new file like an empty one.
func openOrCreate(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	if errors.Is(err, fs.ErrNotExist) {
		// O_EXCL is not needed: two creators both get the same empty file
		// and the flock taken next lets only one of them use it.
		f, err = os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, filePerm)
	}
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	return f, nil
}

// fsync runs fn, an fsync of some kind, unless NoSync is set.
func (j *Journal) fsync(what string, fn func() error) error {
	if j.noSync {
		return nil
	}
	if err := fn(); err != nil {
		return fmt.Errorf("journal %s: fsync %s: %w", j.path, what, err)
	}
	return nil
}

// syncDir makes directory entries in dir (a new file) durable.
func syncDir(dir string) error {
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

// closedError is returned by every method after Close.
func (j *Journal) closedError() error {
	return fmt.Errorf("journal %s: %w", j.path, os.ErrClosed)
}

// failLocked records a write or fsync failure. The journal refuses further
// appends from then on: after a failed fsync Linux may have dropped the dirty
// pages, so a retry could report success for data that is gone.
func (j *Journal) failLocked(op string, err error) error {
	j.err = fmt.Errorf("journal %s: %s failed, the journal refuses further appends until it is reopened: %w",
		j.path, op, err)
	j.cond.Broadcast()
	return j.err
}

// writeLocked writes one record with a single write call and returns its seq.
func (j *Journal) writeLocked(payload []byte) (uint64, error) {
	if j.closed {
		return 0, j.closedError()
	}
	if j.err != nil {
		return 0, j.err
	}
	if len(payload) > MaxPayload {
		// Refusing is harmless: nothing was written.
		return 0, fmt.Errorf("journal %s: payload of %d bytes exceeds MaxPayload (%d)", j.path, len(payload), MaxPayload)
	}
	seq := j.lastSeq + 1
	frame := encodeFrame(seq, payload)
	off := j.size
	n, err := j.f.Write(frame)
	if err != nil {
		// A failed write (a full disk) leaves nothing durable behind once
		// the partial frame is cut off, so the journal can go on when
		// space comes back. Only when the cut fails does it stop, and
		// Open cuts the torn tail then.
		if terr := j.f.Truncate(j.size); terr != nil {
			return 0, j.failLocked(fmt.Sprintf("write at offset %d", j.size), err)
		}
		return 0, fmt.Errorf("journal %s: write at offset %d: %w", j.path, j.size, err)
	}
	j.size += int64(n)
	j.lastSeq = seq
	j.noteMark(seq, off)
	return seq, nil
}

// waitDurableLocked returns once every record up to seq is durable. The first
// caller that finds no fdatasync running starts one covering everything
// written so far; the others wait for it. mu is held on entry and on return
// but released during the fdatasync, so appends continue meanwhile.
func (j *Journal) waitDurableLocked(seq uint64) error {
	for j.syncedSeq < seq {
		if j.err != nil {
			return j.err
		}
		if j.syncing {
			// Whatever sync is running may have started before our write;
			// wait for it to end and check again.
			j.cond.Wait()
			continue
		}
		// Close holds mu for its final sync and leaves syncedSeq == lastSeq
		// (or err set), so the file is still open whenever we get here.
		j.syncing = true
		target := j.lastSeq
		j.unlock()
		err := j.syncFile(j.f)
		j.lock()
		j.syncing = false
		if err != nil {
			j.failLocked("fdatasync", err)
		} else if target > j.syncedSeq {
			j.syncedSeq = target
		}
		j.cond.Broadcast()
	}
	return nil
}

// Append writes one record and returns after it is durable. Concurrent
// Appends share fdatasyncs.
func (j *Journal) Append(payload []byte) (uint64, error) {
	j.lock()
	defer j.unlock()
	seq, err := j.writeLocked(payload)
	if err != nil {
		return 0, err
	}
	if err := j.waitDurableLocked(seq); err != nil {
		return 0, err
	}
	return seq, nil
}

// AppendNoWait writes one record to the file and returns without waiting for
// it to be durable; the next Append, Sync or Close makes it durable.
func (j *Journal) AppendNoWait(payload []byte) (uint64, error) {
	j.lock()
	defer j.unlock()
	return j.writeLocked(payload)
}

// Sync makes every record written so far durable.
func (j *Journal) Sync() error {
	j.lock()
	defer j.unlock()
	if j.closed {
		return j.closedError()
	}
	return j.waitDurableLocked(j.lastSeq)
}

// LastSeq returns the sequence number of the last record written (durable or
// not), 0 for an empty journal.
func (j *Journal) LastSeq() uint64 {
	j.lock()
	defer j.unlock()
	return j.lastSeq
}

// Size returns the number of bytes in the journal file, header included.
func (j *Journal) Size() int64 {
	j.lock()
	defer j.unlock()
	return j.size
}

// Close makes every record written so far durable and closes the file. It
// returns the journal's sticky error if a write or fsync failed earlier, since
// some records may then not be durable.
func (j *Journal) Close() error {
	j.lock()
	defer j.unlock()
	if j.closed {
		return j.closedError()
	}
	j.closed = true // refuses new appends from here on
	for j.syncing {
		j.cond.Wait()
	}
	err := j.err
	if err == nil && j.syncedSeq < j.lastSeq {
		// mu stays held so no waiter can start a sync on a closing file.
		if serr := j.syncFile(j.f); serr != nil {
			err = j.failLocked("fdatasync", serr)
		} else {
			j.syncedSeq = j.lastSeq
		}
	}
	// Wake waiters: they now see syncedSeq == lastSeq or the error.
	j.cond.Broadcast()
	if cerr := j.f.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("journal %s: close: %w", j.path, cerr)
	}
	return err
}

// Scan calls fn for each record with Seq > since, oldest first, reading the
// file from disk through its own descriptor. It sees the records written
// before it started. fn runs without journal locks held; a non-nil error from
// fn stops the scan and Scan returns it unchanged.
func (j *Journal) Scan(since uint64, fn func(Record) error) error {
	j.lock()
	closed, size := j.closed, j.size
	j.unlock()
	if closed {
		return j.closedError()
	}
	f, err := os.Open(j.path)
	if err != nil {
		return fmt.Errorf("journal: scan: %w", err)
	}
	defer f.Close()
	// Stop at the size seen above: a frame being written right now may be
	// only partly visible to a reader. Start at the index's mark before
	// since: the cost follows the records asked for.
	start := j.startOf(since)
	fr := newFrameReader(io.NewSectionReader(f, start, size-start), start)
	for {
		rec, err := fr.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("journal %s: scan: record at offset %d: %w", j.path, fr.off, err)
		}
		if rec.Seq <= since {
			continue
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
}

// lock and unlock take and let go of mu, telling lockorder (which checks
// the order in builds made with -tags lockorder).
func (j *Journal) lock() {
	lockorder.Acquire(lockorder.Journal)
	j.mu.Lock()
}

func (j *Journal) unlock() {
	j.mu.Unlock()
	lockorder.Release(lockorder.Journal)
}
