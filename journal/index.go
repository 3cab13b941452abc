package journal

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"

	"stagefs/internal/atomicfile"
)

// indexEvery is how many records lie between two marks of the sparse
// index: a scan from any sequence number reads at most this many records
// it does not return.
const indexEvery = 1024

// mark says where the record with sequence number seq starts.
type mark struct {
	Seq uint64 `json:"seq"`
	Off int64  `json:"off"`
}

// checkpoint is what the journal's side file (path + ".ckpt") keeps between
// runs: that every record before Off was read and found whole at a clean
// close or start, and the marks of those records. Open then reads only the
// records after it, and a scan starts at the mark before what it asks for:
// their costs follow the records written since, not the journal's length.
type checkpoint struct {
	Off   int64  `json:"off"`   // where the first record after it starts
	Seq   uint64 `json:"seq"`   // the last record before Off
	Marks []mark `json:"marks"` // every indexEvery-th record before Off
}

func (j *Journal) checkpointPath() string { return j.path + ".ckpt" }

// loadCheckpoint returns the checkpoint if it fits the file: Off within
// the file, after the header, and the record at Off (if any) the one after
// Seq. Anything else, a missing file included, means a full read.
func (j *Journal) loadCheckpoint(size int64) (checkpoint, bool) {
	b, err := os.ReadFile(j.checkpointPath())
	if err != nil {
		return checkpoint{}, false
	}
	var c checkpoint
	if json.Unmarshal(b, &c) != nil || c.Off < fileHeaderLen || c.Off > size || (c.Seq == 0) != (c.Off == fileHeaderLen) {
		return checkpoint{}, false
	}
	if c.Off < size {
		var hdr [frameHeaderLen]byte
		if _, err := j.f.ReadAt(hdr[:], c.Off); err != nil {
			return checkpoint{}, false
		}
		if _, _, seq, err := parseHeader(hdr[:]); err != nil || seq != c.Seq+1 {
			return checkpoint{}, false
		}
	}
	for i, m := range c.Marks {
		if m.Off < fileHeaderLen || m.Off >= c.Off || (i > 0 && (m.Seq <= c.Marks[i-1].Seq || m.Off <= c.Marks[i-1].Off)) {
			return checkpoint{}, false
		}
	}
	return c, true
}

// Checkpoint records that every record written so far is whole and
// durable, so the next Open reads only what comes after. The caller takes
// it when nothing is in flight that a later start would need to see from
// before (stagefs: at start-up after recovery, and at a clean unmount).
func (j *Journal) Checkpoint() error {
	j.lock()
	if j.closed {
		j.unlock()
		return j.closedError()
	}
	if err := j.waitDurableLocked(j.lastSeq); err != nil {
		j.unlock()
		return err
	}
	c := checkpoint{Off: j.size, Seq: j.lastSeq, Marks: append([]mark(nil), j.marks...)}
	j.unlock()
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFunc(j.checkpointPath(), filePerm, atomicfile.Options{NoSync: j.noSync}, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	}); err != nil {
		return fmt.Errorf("journal %s: checkpoint: %w", j.path, err)
	}
	return nil
}

// noteMark adds a mark for the record seq at off when it is due.
func (j *Journal) noteMark(seq uint64, off int64) {
	if seq%indexEvery == 1 {
		j.marks = append(j.marks, mark{Seq: seq, Off: off})
	}
}

// startOf returns where a scan for the records after since may start: the
// last mark at or before since+1, else the first record.
func (j *Journal) startOf(since uint64) (off int64) {
	j.lock()
	defer j.unlock()
	i := sort.Search(len(j.marks), func(i int) bool { return j.marks[i].Seq > since+1 })
	if i == 0 {
		return fileHeaderLen
	}
	return j.marks[i-1].Off
}
