package backend

// Events for subscribers (events/subscribe), and the engine's callbacks
// that cause them. The engine calls OnChange, OnCaptureFailed and
// OnProgress with its lock held, so those never block: they publish to
// in-memory queues, or only mark the pending set dirty for publishLoop.

import (
	"context"
	"time"

	"stagefs/control"
	"stagefs/overlay"
)

func (b *Backend) publish(ev control.Event) {
	if ctl := b.ctl.Load(); ctl != nil {
		ctl.Publish(ev)
	}
}

// PendingChanged is the engine's change callback (overlay.Options
// OnChange): it only marks the pending set dirty; publishLoop sends at
// most ten staged_writes_pending events a second, and fewer when the
// pending set is large.
func (b *Backend) PendingChanged() {
	b.dirtyMu.Lock()
	b.dirty = true
	b.dirtyMu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// publishLoop computes the pending set's totals for staged_writes_pending.
// That walks the whole pending set (a status), so it is done only when
// someone subscribes, and the pause between two of them is at least ten
// times what the last one took: with 10,000 pending files computing them
// every 100 ms took most of the daemon's time and held the engine's lock
// against the very writes being counted.
func (b *Backend) publishLoop() {
	pause := 100 * time.Millisecond
	for range b.wake {
		time.Sleep(pause)
		b.dirtyMu.Lock()
		d := b.dirty
		b.dirty = false
		b.dirtyMu.Unlock()
		ctl := b.ctl.Load()
		if !d || ctl == nil || ctl.Subscribers() == 0 {
			continue
		}
		start := time.Now()
		st, err := b.Status(context.Background(), nil)
		pause = max(100*time.Millisecond, 10*time.Since(start))
		if err != nil {
			continue
		}
		b.publish(control.Event{Kind: control.EventStagedWritesPending, PendingCount: st.PendingCount, TotalBytes: st.TotalBytes})
	}
}

// CaptureFailed is the engine's OnCaptureFailed: it tells subscribers that
// a snapshot is incomplete.
func (b *Backend) CaptureFailed(scope, path string, err error) {
	b.publish(control.Event{Kind: "capture_failed", ToolCallID: scope, Paths: []string{path}, Detail: err.Error()})
}

// Progress is the engine's OnProgress: how far a long commit, discard or
// restore has come.
func (b *Backend) Progress(p overlay.Progress) {
	b.publish(control.Event{Kind: control.EventProgress, Detail: p.Op, Done: p.Done, Total: p.Total, Bytes: p.Bytes, Final: p.Final})
}

// Renumbered is the engine's OnRenumbered: the kernel must forget what it
// caches for paths whose inode numbers changed. The engine calls it
// without its locks, as invalidating needs.
func (b *Backend) Renumbered(paths []string) { b.invalidate(paths) }
