// Package journal frames, appends, fsyncs and recovers the records of an
// append-only log file.
//
// The package does not know what records mean: a payload is an opaque byte
// slice (stagefs stores JSON there). It only guarantees that every record
// Append reported as written is still there, whole and in order, after a
// crash, and that damage is either repaired when it is provably a torn tail or
// reported when it is not.
//
// # File format
//
// A journal file starts with an 8-byte header:
//
//	offset  size  field
//	0       4     magic "SFSJ"
//	4       4     format version, uint32 little-endian (currently 1)
//
// A file whose first bytes are not the magic is refused, so a foreign file
// given by mistake is never "repaired" (truncated). A file shorter than the
// header whose bytes are a prefix of the header (a crash while the journal was
// being created, including an empty file) gets the header written again.
//
// The header is followed by frames, one per record, back to back:
//
//	offset  size  field
//	0       4     frame magic: 0xF5 'S' 'F' 0x01
//	4       4     payload length, uint32 little-endian, at most MaxPayload
//	8       8     xxhash64 of bytes 16..end (the seq field and the payload), uint64 little-endian
//	16      8     sequence number, uint64 little-endian, never 0
//	24      n     payload
//
// The frame magic starts with 0xF5, a byte that never occurs in UTF-8 text,
// so a frame can not appear inside a JSON payload; this keeps the "is there a
// valid frame further on" test used by recovery (below) free of false hits
// on ordinary payloads. The checksum covers the sequence number so that a
// frame copied to the wrong place, or a damaged seq, is detected.
//
// Sequence numbers are assigned by Append: the first record is 1 and each
// next record is exactly one more, across reopens.
//
// # Recovery
//
// Open reads the frames from the start of the file and stops at the first
// frame that can not be decoded (a short frame at the end of the file, a bad
// magic, an impossible length, or a checksum mismatch). Let OFF be the offset
// where that frame starts. The rule, modelled on etcd's WAL, is:
//
//   - If no valid frame can be decoded at any offset after OFF, the bytes from
//     OFF to the end of the file are a torn tail: a write that was cut short
//     by a crash, zeros left by the file system, or garbage that holds no
//     record. They are copied to PATH.broken (or PATH.broken.1, .2, ... if
//     that name is taken), the copy and its directory are fsynced, and only
//     then is the journal truncated to OFF and fsynced. RecoverInfo reports
//     how many bytes were cut and where the copy is.
//   - If a valid frame (one Decode accepts: magic, length and checksum all
//     right, whatever its sequence number) starts at any offset after OFF,
//     records were written after the damaged one, so this is not a torn
//     write: Open returns a *CorruptError naming the file and OFF and leaves
//     the file untouched. Valid records are never dropped silently; an
//     operator decides.
//
// A frame that decodes but whose sequence number is not exactly one more than
// the previous one (a gap or a repeat; the first must be 1) is corruption
// too and also yields a *CorruptError.
//
// After recovery Open fdatasyncs the file once, so that records a crashed
// process left in the page cache count as durable from then on.
//
// Open takes an exclusive flock(2) on the file (on Linux, macOS and the
// BSDs) so that two processes, or two Opens in one process, can not append to
// the same journal at once.
//
// # Durability policy
//
// Every record is written with one write(2) call while a mutex is held, so
// frames never interleave.
//
//   - Append returns only after an fdatasync that started after its record
//     was written has completed: a record Append reported is durable.
//     Concurrent Appends share fdatasyncs (group commit): the first waiter
//     whose record is not yet durable runs one fdatasync covering every
//     record written so far, without holding the mutex, while the others
//     wait on a condition variable; appends that arrive meanwhile are written
//     at once and covered by the next fdatasync.
//   - AppendNoWait returns once the record is written to the file (the page
//     cache). It becomes durable at the next Append, Sync or Close.
//   - Sync makes every record written so far durable.
//   - Close makes every record written so far durable, then closes the file.
//
// A failed write (a full disk) is returned to its caller; the partial frame
// is cut off, and appends go on once there is space again. A failed
// fdatasync is returned to every caller waiting for it and makes the
// journal refuse all further appends (as does a write whose partial frame
// cannot be cut off): on Linux a failed fsync may already have dropped the
// dirty pages and a retry can report success for data that is gone, so the
// only safe way on is to Close and Open again, which recovers from the file
// as it really is on disk.
//
// Options.NoSync skips every fsync (appends, recovery and directories); it is
// for tests and benchmarks only.
//
// Scan reads the file from disk through its own file descriptor and sees
// every record written before it started, durable or not. Its callback runs
// without any journal lock held, so it may call Append.
package journal
