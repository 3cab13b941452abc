package control

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The rest of fakeBackend (server_test.go): the snapshot and turn methods,
// which answer from their inputs too, leaving lists nil so that the test
// below sees the server turn them into arrays.

func (f *fakeBackend) Snapshot(ctx context.Context, p SnapshotParams) (SnapshotInfo, error) {
	return SnapshotInfo{SnapshotID: "snap-" + p.ScopeID, ScopeID: p.ScopeID, Pid: p.Pid, Label: p.Label, Open: true, Paths: p.Paths}, nil
}

func (f *fakeBackend) CloseSnapshot(ctx context.Context, scopeID string) (SnapshotInfo, error) {
	return SnapshotInfo{SnapshotID: "snap-" + scopeID, ScopeID: scopeID}, nil
}

func (f *fakeBackend) RestoreWith(ctx context.Context, p RestoreParams) (RestoreResult, error) {
	if p.ScopeID == "missing" {
		return RestoreResult{}, Errorf(CodeNotFound, "no snapshot for scope %q", p.ScopeID)
	}
	r := RestoreResult{RestoredPaths: []string{p.ScopeID + ".txt"}}
	if p.KeepLater {
		r.Kept = []string{"later.txt"}
	}
	return r, nil
}

func (f *fakeBackend) ListSnapshots(ctx context.Context) (ListSnapshotsResult, error) {
	return ListSnapshotsResult{}, nil
}

func (f *fakeBackend) DropSnapshot(ctx context.Context, scopeID string) (DropSnapshotResult, error) {
	return DropSnapshotResult{Dropped: scopeID != ""}, nil
}

func (f *fakeBackend) Turn(ctx context.Context, p TurnParams) (TurnInfo, error) {
	return TurnInfo{TurnID: p.TurnID, Label: p.Label, Open: true}, nil
}

func (f *fakeBackend) Checkpoints(ctx context.Context) (CheckpointsResult, error) {
	return CheckpointsResult{}, nil
}

func (f *fakeBackend) Rollback(ctx context.Context, p RollbackParams) (RollbackResult, error) {
	return RollbackResult{TurnID: p.TurnID, RestoredPaths: p.Paths}, nil
}

func (f *fakeBackend) Redo(ctx context.Context, p RedoParams) (RollbackResult, error) {
	if !p.Force {
		return RollbackResult{}, Errorf(CodeConflict, "redo needs force here")
	}
	return RollbackResult{TurnID: "redo"}, nil
}

func (f *fakeBackend) MarkUser(ctx context.Context, p MarkUserParams) (MarkUserResult, error) {
	return MarkUserResult{Pid: p.Pid, User: !p.Remove}, nil
}

// TestSnapshotAndTurnMethods checks that NewServer routes the snapshot
// and turn methods to the Backend with their params intact, validates
// those params first, and sends lists as arrays, never null.
func TestSnapshotAndTurnMethods(t *testing.T) {
	_, path := startServer(t, &fakeBackend{}, ServerOptions{})
	c := dialClient(t, path)
	ctx := testCtx(t)

	snap, err := c.Snapshot(ctx, SnapshotParams{ScopeID: "tc1", Pid: 7, Label: "Bash: make", Paths: []string{"a"}})
	require.NoError(t, err)
	require.Equal(t, SnapshotInfo{SnapshotID: "snap-tc1", ScopeID: "tc1", Pid: 7, Label: "Bash: make", Open: true, Paths: []string{"a"}}, snap)
	_, err = c.Snapshot(ctx, SnapshotParams{})
	require.True(t, IsCode(err, CodeInvalidParams), "%v", err)

	closed, err := c.CloseSnapshot(ctx, "tc1")
	require.NoError(t, err)
	require.Equal(t, []string{}, closed.Paths)

	restored, err := c.RestoreWith(ctx, RestoreParams{ScopeID: "tc1", KeepLater: true})
	require.NoError(t, err)
	require.Equal(t, RestoreResult{RestoredPaths: []string{"tc1.txt"}, Overwritten: []string{}, Kept: []string{"later.txt"},
		Uncaptured: []string{}, Conflicts: []Conflict{}, Failed: []Failure{}}, restored)
	_, err = c.Restore(ctx, "missing")
	require.True(t, IsCode(err, CodeNotFound), "%v", err)

	var raw map[string]json.RawMessage
	require.NoError(t, c.Call(ctx, MethodListSnapshots, nil, &raw))
	require.JSONEq(t, `[]`, string(raw["snapshots"]))
	dropped, err := c.DropSnapshot(ctx, "tc1")
	require.NoError(t, err)
	require.True(t, dropped.Dropped)

	turn, err := c.Turn(ctx, TurnParams{TurnID: "t1", Label: "fix it"})
	require.NoError(t, err)
	require.Equal(t, TurnInfo{TurnID: "t1", Label: "fix it", Open: true}, turn)
	require.NoError(t, c.Call(ctx, MethodCheckpoints, nil, &raw))
	require.JSONEq(t, `[]`, string(raw["turns"]))

	rb, err := c.Rollback(ctx, RollbackParams{TurnID: "t1", Paths: []string{"x"}})
	require.NoError(t, err)
	require.Equal(t, RollbackResult{TurnID: "t1", RestoredPaths: []string{"x"}, Conflicts: []Conflict{}, Failed: []Failure{}}, rb)
	_, err = c.Redo(ctx, RedoParams{})
	require.True(t, IsCode(err, CodeConflict), "%v", err)
	redo, err := c.Redo(ctx, RedoParams{Force: true})
	require.NoError(t, err)
	require.Equal(t, []string{}, redo.RestoredPaths)

	user, err := c.MarkUser(ctx, MarkUserParams{Pid: 42})
	require.NoError(t, err)
	require.Equal(t, MarkUserResult{Pid: 42, User: true}, user)
	_, err = c.MarkUser(ctx, MarkUserParams{})
	require.True(t, IsCode(err, CodeInvalidParams), "%v", err)
}

// fakeHooks answers the hook methods from their inputs.
type fakeHooks struct{}

func (fakeHooks) HookTurn(ctx context.Context, p HookTurnParams) (TurnInfo, error) {
	return TurnInfo{TurnID: p.TurnID, Label: p.Label}, nil
}

func (fakeHooks) HookToolCallStart(ctx context.Context, p HookToolCallStartParams) (HookToolCallStartResult, error) {
	return HookToolCallStartResult{ScopeID: p.SessionID + "/" + p.ScopeID}, nil
}

func (fakeHooks) HookToolCallBind(ctx context.Context, scopeID string) (HookToolCallBindResult, error) {
	return HookToolCallBindResult{ScopeID: scopeID, Pid: 1}, nil
}

func (fakeHooks) HookToolCallEnd(ctx context.Context, p HookToolCallEndParams) (HookToolCallEndResult, error) {
	return HookToolCallEndResult{ScopeID: p.ScopeID}, nil
}

func (fakeHooks) HookSessionEnd(ctx context.Context, sessionID string) (HookSessionEndResult, error) {
	return HookSessionEndResult{}, nil
}

// TestHookServer checks that the hook channel's server answers the hook
// methods and events/subscribe, and nothing of the control socket's.
func TestHookServer(t *testing.T) {
	s := NewHookServer(fakeHooks{}, ServerOptions{})
	require.ElementsMatch(t, append([]string{MethodSubscribe}, HookMethods...), s.Methods())
	path := filepath.Join(t.TempDir(), "h.sock")
	l, err := Listen(path)
	require.NoError(t, err)
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	c := dialClient(t, path)
	ctx := testCtx(t)

	start, err := c.HookToolCallStart(ctx, HookToolCallStartParams{SessionID: "s1", ScopeID: "tc1"})
	require.NoError(t, err)
	require.Equal(t, "s1/tc1", start.ScopeID)
	_, err = c.HookToolCallStart(ctx, HookToolCallStartParams{})
	require.True(t, IsCode(err, CodeInvalidParams), "%v", err)
	bound, err := c.HookToolCallBind(ctx, "tc1")
	require.NoError(t, err)
	require.Equal(t, HookToolCallBindResult{ScopeID: "tc1", Pid: 1}, bound)
	ended, err := c.HookSessionEnd(ctx, "s1")
	require.NoError(t, err)
	require.Equal(t, []string{}, ended.Closed)
	_, err = c.Commit(ctx, CommitParams{})
	require.True(t, IsCode(err, CodeMethodNotFound), "%v", err)
}
