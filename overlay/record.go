package overlay

import (
	"encoding/json"
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
func (e *Engine) record(r Record) { e.appendRecord(r, true) }

// recordLazy appends r without waiting for it to be durable: for records
// that change nothing of the pending set's structure (a close, a write-open
// of a file already staged). The next durable record, fsync or Sync makes
// it durable, in order.
func (e *Engine) recordLazy(r Record) { e.appendRecord(r, false) }

func (e *Engine) appendRecord(r Record, durable bool) {
	if e.journal == nil {
		return
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
		e.logf("journal: %v", err)
	}
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

// recordOp journals a staging operation by c and tells the listener.
func (e *Engine) recordOp(c Caller, op, p, p2 string, size int64) {
	e.record(Record{Op: op, Path: p, Path2: p2, Pid: c.Pid, Size: size})
	e.changed()
}

func (e *Engine) changed() {
	if e.onChange != nil {
		e.onChange()
	}
}

// Comm returns the command name of pid (cached briefly).
func (e *Engine) Comm(pid int) string { return e.procs.comm(pid) }

// Process returns the process (thread group) a thread id belongs to: FUSE
// names the calling thread, and a multithreaded tool's writes must count as
// the tool's.
func (e *Engine) Process(tid int) int { return e.procs.process(tid) }
