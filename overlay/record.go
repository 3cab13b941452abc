package overlay

import (
	"encoding/json"
	"fmt"
	"syscall"
	"time"
)

// Record is one journal entry as the engine writes it: what happened, to
// which path(s), and who did it.
type Record struct {
	Seq    uint64 `json:"-"`
	Time   int64  `json:"t"` // unix ns
	Op     string `json:"op"`
	Path   string `json:"p,omitempty"`
	Path2  string `json:"p2,omitempty"`
	Pid    int    `json:"pid,omitempty"`
	Comm   string `json:"comm,omitempty"`
	Size   int64  `json:"sz,omitempty"`
	Mode   string `json:"mode,omitempty"`
	Detail string `json:"d,omitempty"`
}

// DecodeRecord parses a journal payload written by the engine.
func DecodeRecord(seq uint64, payload []byte) (Record, error) {
	var r Record
	err := json.Unmarshal(payload, &r)
	r.Seq = seq
	return r, err
}

// record appends r to the journal, durable before it returns. A failure is
// logged: the operation it describes has already happened and cannot be
// undone here.
func (e *Engine) record(r Record) error { return e.appendRecord(r, true) }

// recordStaging appends the record of a staging operation: durable before
// it returns, unless --journal-sync lets it wait for the next sync.
func (e *Engine) recordStaging(r Record) error {
	return e.appendRecord(r, e.opts.JournalSync == 0)
}

// note appends r durably, logging a failure: for records of what already
// happened and cannot be refused any more (a finished commit, a restore).
func (e *Engine) note(r Record) {
	if err := e.record(r); err != nil {
		e.logf("%v", err)
	}
}

// recordLazy appends r without waiting for it to be durable: for records
// that change nothing of the pending set's structure (a close, a write-open
// of a file already staged). The next durable record, fsync or Sync makes
// it durable, in order.
func (e *Engine) recordLazy(r Record) {
	if err := e.appendRecord(r, false); err != nil {
		e.logf("journal: %v", err)
	}
}

func (e *Engine) appendRecord(r Record, durable bool) error {
	e.noteTurnChange(r) // what the turn itself changed (turns.go)
	if e.journal == nil {
		return nil
	}
	if r.Time == 0 {
		r.Time = time.Now().UnixNano()
	}
	if r.Pid > 0 && r.Comm == "" {
		r.Comm = e.procs.comm(r.Pid)
	}
	b, _ := json.Marshal(r)
	var err error
	if durable {
		_, err = e.journal.Append(b)
	} else {
		_, err = e.journal.AppendNoWait(b)
	}
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	return nil
}

// Sync makes every journal record written so far durable (fsync of a file
// in the mount calls it, so the record of the change is as durable as the
// data).
func (e *Engine) Sync() error {
	if e.journal == nil {
		return nil
	}
	return e.journal.Sync()
}

// recordOp journals a staging operation by c and tells the listener. Its
// error (a full or failed disk under the state dir) is the operation's: no
// change is answered as done without its record.
func (e *Engine) recordOp(c Caller, op, p, p2 string, size int64) error {
	err := e.recordStaging(Record{Op: op, Path: p, Path2: p2, Pid: c.Pid, Comm: c.Comm, Size: size})
	e.changed()
	return err
}

func (e *Engine) changed() {
	if e.onChange != nil {
		e.onChange()
	}
}

// SyncPath makes p's entry (the pending one, or the workspace's when p is
// not staged) and the journal durable: fsync of a directory in the mount.
func (e *Engine) SyncPath(p string) error {
	err := e.rlocked(func() error {
		l, err := e.locate(p)
		if err != nil {
			return err
		}
		lyr, rel := e.base, l.basePath
		if l.m != nil {
			lyr, rel = e.upper, p
		}
		fd, err := lyr.open(rel, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		return syscall.Fsync(fd)
	})
	if err != nil {
		return err
	}
	return e.Sync()
}

// Process returns the process (thread group) a thread id belongs to: FUSE
// names the calling thread, and a multithreaded tool's writes must count as
// the tool's.
func (e *Engine) Process(tid int) int { return e.procs.process(tid) }
