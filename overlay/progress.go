package overlay

import (
	"sync"
	"time"
)

// Progress is how far a long operation (commit, discard, restore) has
// come: Done of Total paths, Bytes of file content written so far.
type Progress struct {
	Op          string // "commit", "discard", "restore"
	Done, Total int
	Bytes       int64
	Final       bool // the operation has ended
}

// progressEvery spaces the reports of one operation by default: a person
// watching needs a few a second, and each costs an event.
const progressEvery = 250 * time.Millisecond

func (e *Engine) progressEvery() time.Duration {
	if e.opts.ProgressEvery > 0 {
		return e.opts.ProgressEvery
	}
	return progressEvery
}

// progress counts one operation's steps and reports them to
// Options.OnProgress, at most every progressEvery and once at the end.
// The first report waits as long: a short operation reports only its end.
type progress struct {
	e     *Engine
	mu    sync.Mutex
	p     Progress
	start time.Time
	last  time.Time
}

func (e *Engine) startProgress(op string, total int) *progress {
	now := time.Now()
	return &progress{e: e, p: Progress{Op: op, Total: total}, start: now, last: now}
}

// step counts one path done, with bytes of content written.
func (pr *progress) step(bytes int64) {
	if pr == nil || pr.e.opts.OnProgress == nil {
		return
	}
	pr.mu.Lock()
	pr.p.Done++
	pr.p.Bytes += bytes
	now := time.Now()
	send := now.Sub(pr.last) >= pr.e.progressEvery()
	if send {
		pr.last = now
	}
	p := pr.p
	pr.mu.Unlock()
	if send {
		pr.e.opts.OnProgress(p)
	}
}

// finish reports the end, if anything was reported before it.
func (pr *progress) finish() {
	if pr == nil || pr.e.opts.OnProgress == nil {
		return
	}
	pr.mu.Lock()
	p := pr.p
	reported := pr.last.After(pr.start)
	pr.mu.Unlock()
	if reported {
		p.Final = true
		pr.e.opts.OnProgress(p)
	}
}
