package overlay

import "stagefs/internal/lockorder"

// The engine's locks are taken only through these helpers, which tell
// lockorder what is taken and let go of: a build with -tags lockorder
// (scripts/test) then panics on any acquisition against the order in the
// package doc. In other builds the notes compile to nothing.

// locked runs fn holding the engine's lock. The unlock is deferred for a
// reason: go-fuse answers a request whose handler panics with EIO and goes
// on serving, and a lock left held by the panicking request would hang
// every request after it; with the defer a bug costs one failed call.
func (e *Engine) locked(fn func() error) error {
	e.lockChange()
	defer e.unlockChange()
	return fn()
}

// underLock is locked for a call that returns a value too.
func underLock[T any](e *Engine, fn func() (T, error)) (T, error) {
	e.lockChange()
	defer e.unlockChange()
	return fn()
}

// rlocked is locked with the lock shared.
func (e *Engine) rlocked(fn func() error) error {
	e.rlock()
	defer e.runlock()
	return fn()
}

// lockChange takes the engine lock for a change: through the change gate
// first, which a running commit holds (see Engine.changeGate).
func (e *Engine) lockChange() {
	lockorder.Acquire(lockorder.ChangeGate)
	e.changeGate.RLock()
	e.lockMu()
}

func (e *Engine) unlockChange() {
	e.unlockMu()
	e.changeGate.RUnlock()
	lockorder.Release(lockorder.ChangeGate)
}

// lockMu takes Engine.mu alone, without the change gate: for what changes
// no entry (the count of a file's writers) and for the commit, which
// holds the gate itself.
func (e *Engine) lockMu() {
	lockorder.Acquire(lockorder.EngineMu)
	e.mu.Lock()
}

func (e *Engine) unlockMu() {
	e.mu.Unlock()
	lockorder.Release(lockorder.EngineMu)
}

// rlock takes Engine.mu shared, for a read.
func (e *Engine) rlock() {
	lockorder.Acquire(lockorder.EngineMu)
	e.mu.RLock()
}

func (e *Engine) runlock() {
	e.mu.RUnlock()
	lockorder.Release(lockorder.EngineMu)
}

// lockCommit takes what a commit holds before Engine.mu: commitMu for the
// whole commit (lockGate takes the change gate after its copies).
func (e *Engine) lockCommit() {
	lockorder.Acquire(lockorder.CommitMu)
	e.commitMu.Lock()
}

func (e *Engine) unlockCommit() {
	e.commitMu.Unlock()
	lockorder.Release(lockorder.CommitMu)
}

// lockGate takes the change gate alone: no change can start until
// unlockGate.
func (e *Engine) lockGate() {
	lockorder.Acquire(lockorder.ChangeGate)
	e.changeGate.Lock()
}

func (e *Engine) unlockGate() {
	e.changeGate.Unlock()
	lockorder.Release(lockorder.ChangeGate)
}

// HoldChanges stops every change to this engine's pending set until
// release is called: for a merge, which reads a branch whole while it
// writes to the branch's parent (another engine, whose change gate comes
// after this one in the lock order).
func (e *Engine) HoldChanges() (release func()) {
	lockorder.Acquire(lockorder.HeldGate)
	e.changeGate.Lock()
	return func() {
		e.changeGate.Unlock()
		lockorder.Release(lockorder.HeldGate)
	}
}

// lockTurns serializes turn starts, rollbacks and redo (turnMu).
func (e *Engine) lockTurns() {
	lockorder.Acquire(lockorder.TurnMu)
	e.turnMu.Lock()
}

func (e *Engine) unlockTurns() {
	e.turnMu.Unlock()
	lockorder.Release(lockorder.TurnMu)
}

// lockText and rlockText take textMu, for a whole PatchFile or ReadFile.
func (e *Engine) lockText() {
	lockorder.Acquire(lockorder.TextMu)
	e.textMu.Lock()
}

func (e *Engine) unlockText() {
	e.textMu.Unlock()
	lockorder.Release(lockorder.TextMu)
}

func (e *Engine) rlockText() {
	lockorder.Acquire(lockorder.TextMu)
	e.textMu.RLock()
}

func (e *Engine) runlockText() {
	e.textMu.RUnlock()
	lockorder.Release(lockorder.TextMu)
}
