package control

import "context"

// Turn methods: a turn groups the tool calls for one user message; every
// path's first mutation in a turn is captured, so whole turns can be rolled
// back and the rollback redone.
const (
	MethodTurn        = "session/turn"
	MethodCheckpoints = "session/checkpoints"
	MethodRollback    = "session/rollback"
	MethodRedo        = "session/redo"
	MethodMarkUser    = "session/mark_user"

	// EventRolledBack is published after a rollback or redo, with Paths.
	EventRolledBack = "rolled_back"
)

// TurnParams starts a turn (ending the previous one). An empty TurnID gets
// the next number.
type TurnParams struct {
	TurnID string `json:"turnId,omitempty"`
	Label  string `json:"label,omitempty"`
}

// TurnInfo describes one turn.
type TurnInfo struct {
	TurnID  string   `json:"turnId"`
	Label   string   `json:"label,omitempty"`
	Started string   `json:"started"` // RFC3339Nano
	Open    bool     `json:"open"`
	Files   int      `json:"files"`
	Bytes   int64    `json:"bytes"`
	Paths   []string `json:"paths,omitempty"`
	// Uncaptured are paths the turn changed whose pre-image could not be
	// stored (a full state dir): rollback cannot put them back.
	Uncaptured []string `json:"uncaptured,omitempty"`
}

// CheckpointsResult lists turns, newest first.
type CheckpointsResult struct {
	Turns []TurnInfo `json:"turns"`
}

// RollbackParams returns the view to the start of TurnID (default: the
// latest turn), undoing later turns too; with Paths only those. Diff shows
// what would change without changing it.
type RollbackParams struct {
	TurnID string   `json:"turnId,omitempty"`
	Paths  []string `json:"paths,omitempty"`
	Force  bool     `json:"force,omitempty"`
	Diff   bool     `json:"diff,omitempty"`
}

// RollbackResult reports a rollback (or, with Diff, what it would do).
type RollbackResult struct {
	TurnID        string     `json:"turnId"`
	RestoredPaths []string   `json:"restoredPaths"`
	Conflicts     []Conflict `json:"conflicts"`
	Failed        []Failure  `json:"failed"`
	Diff          string     `json:"diff,omitempty"`
}

// RedoParams takes back the last rollback. A path changed since the
// rollback by someone else is a conflict: kept, unless Force.
type RedoParams struct {
	Force bool `json:"force,omitempty"`
}

// MarkUserParams marks a process (and its descendants) as the user's, or
// with Remove unmarks it: its changes are never part of a turn, and a path
// it changes during a turn is a conflict for a rollback of that turn.
type MarkUserParams struct {
	Pid    int  `json:"pid"`
	Remove bool `json:"remove,omitempty"`
}

// Validate implements Validator.
func (p MarkUserParams) Validate() error {
	if p.Pid <= 0 {
		return invalidParams("pid", "pid must be a positive process id")
	}
	return nil
}

// MarkUserResult confirms a mark.
type MarkUserResult struct {
	Pid  int  `json:"pid"`
	User bool `json:"user"`
}

func (c *Client) MarkUser(ctx context.Context, p MarkUserParams) (MarkUserResult, error) {
	var r MarkUserResult
	return r, c.Call(ctx, MethodMarkUser, p, &r)
}

func (c *Client) Turn(ctx context.Context, p TurnParams) (TurnInfo, error) {
	var r TurnInfo
	return r, c.Call(ctx, MethodTurn, p, &r)
}

func (c *Client) Checkpoints(ctx context.Context) (CheckpointsResult, error) {
	var r CheckpointsResult
	return r, c.Call(ctx, MethodCheckpoints, struct{}{}, &r)
}

func (c *Client) Rollback(ctx context.Context, p RollbackParams) (RollbackResult, error) {
	var r RollbackResult
	return r, c.Call(ctx, MethodRollback, p, &r)
}

func (c *Client) Redo(ctx context.Context, p RedoParams) (RollbackResult, error) {
	var r RollbackResult
	return r, c.Call(ctx, MethodRedo, p, &r)
}
