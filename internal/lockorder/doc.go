// Package lockorder checks that the engine's locks are taken in the order
// overlay's package doc lists: a goroutine may take a lock only while it
// holds none at its level or below. The check runs in builds made with
// -tags lockorder (scripts/test runs the engine's tests so); in every
// other build Acquire and Release are empty and cost nothing.
package lockorder

// Level is a lock's place in the order: a lock may be taken while holding
// only locks of lower levels.
type Level int

// The engine's locks, in the order of overlay's lock table. Locks that are
// never held together share a level.
const (
	TurnMu     Level = iota + 1 // overlay.Engine.turnMu
	CommitMu                    // overlay.Engine.commitMu
	HeldGate                    // a branch's Engine.changeGate, held whole by a merge from it
	TextMu                      // overlay.Engine.textMu
	ChangeGate                  // overlay.Engine.changeGate
	EngineMu                    // overlay.Engine.mu
	Snapshots                   // snapshot.Store.mu
	Journal                     // journal.Journal.mu
)

func (l Level) String() string {
	switch l {
	case TurnMu:
		return "Engine.turnMu"
	case CommitMu:
		return "Engine.commitMu"
	case HeldGate:
		return "Engine.changeGate (held by a merge)"
	case TextMu:
		return "Engine.textMu"
	case ChangeGate:
		return "Engine.changeGate"
	case EngineMu:
		return "Engine.mu"
	case Snapshots:
		return "snapshot.Store.mu"
	case Journal:
		return "journal.Journal.mu"
	}
	return "unknown lock"
}
