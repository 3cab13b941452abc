package control

import (
	"context"
	"fmt"
	"strings"

	"stagefs/internal/contenthash"
)

// Method names. Requests use all but MethodSessionUpdate, which is the
// notification the server sends to subscribers.
const (
	MethodInitialize    = "session/initialize"
	MethodSetMode       = "fs/set_mode"
	MethodStagedStatus  = "fs/staged_status"
	MethodCommitStaged  = "fs/commit_staged"
	MethodDiscardStaged = "fs/discard_staged"
	MethodDiff          = "fs/diff"
	MethodReadText      = "fs/read_text"
	MethodSafeTextPatch = "fs/safe_text_patch"
	MethodLog           = "session/log"
	MethodSubscribe     = "events/subscribe"

	MethodSessionUpdate = "session/update"
)

// Methods lists the request methods a Server made with a Backend answers:
// the Backend's and events/subscribe.
var Methods = []string{
	MethodInitialize,
	MethodSetMode,
	MethodStagedStatus,
	MethodCommitStaged,
	MethodDiscardStaged,
	MethodDiff,
	MethodReadText,
	MethodSafeTextPatch,
	MethodLog,
	MethodSnapshot,
	MethodCloseSnapshot,
	MethodRestore,
	MethodListSnapshots,
	MethodDropSnapshot,
	MethodTurn,
	MethodCheckpoints,
	MethodRollback,
	MethodRedo,
	MethodMarkUser,
	MethodSubscribe,
}

// Write modes of the mount.
const (
	ModeStaged    = "staged"
	ModeImmediate = "immediate"
)

// Kinds of pending changes in StatusEntry.Kind. The list is open: backends
// may report other kinds and clients should show unknown ones as they are.
const (
	KindWrite   = "write"  // a workspace file with new content
	KindCreate  = "create" // a new file (or FIFO, socket, device, hard link)
	KindDelete  = "delete" // a deleted file or symlink
	KindMkdir   = "mkdir"
	KindRmdir   = "rmdir"
	KindRename  = "rename" // a renamed directory; From holds its old path
	KindSymlink = "symlink"
	KindMeta    = "meta" // mode, owner, times or xattrs only

	// Older names of the same kinds, kept for Go hosts.
	KindCreated  = KindCreate
	KindModified = KindWrite
	KindDeleted  = KindDelete
	KindRenamed  = KindRename
	KindMetadata = KindMeta
)

// Values of SafeTextPatchResult.Result.
const (
	PatchApplied   = "applied"
	PatchStaleBase = "stale_base"
	PatchNoOp      = "no_op"
)

// Event kinds the control package itself knows about. Other kinds are
// chosen by the daemon and passed through untouched.
const (
	// EventStagedWritesPending reports the size of the pending set. Several
	// of them waiting in one subscriber's queue are merged into the newest.
	EventStagedWritesPending = "staged_writes_pending"
	// EventMissed tells a subscriber that Missed events were dropped because
	// its queue was full.
	EventMissed = "missed"
)

// Backend is what the server needs from the filesystem side: one method
// for every request method of the control socket but events/subscribe,
// which the server answers itself. Methods return an *Error to choose the
// JSON-RPC error sent back; any other error is sent as an internal error
// (-32603) with its message.
//
// Each method has the signature of the Client's method of the same name,
// so a Client is a Backend too.
type Backend interface {
	// The session and the pending set.
	Initialize(ctx context.Context) (InitializeResult, error)
	SetMode(ctx context.Context, mode string) (SetModeResult, error)
	Status(ctx context.Context, paths []string) (StatusResult, error)
	Commit(ctx context.Context, p CommitParams) (CommitResult, error)
	Discard(ctx context.Context, paths []string) (DiscardResult, error)
	Diff(ctx context.Context, paths []string) (DiffResult, error)
	ReadText(ctx context.Context, path string) (ReadTextResult, error)
	SafeTextPatch(ctx context.Context, p SafeTextPatchParams) (SafeTextPatchResult, error)
	Log(ctx context.Context, p LogParams) (LogResult, error)

	// Tool calls' snapshots (snapshots.go). RestoreWith answers
	// fs/restore: the Client's Restore is its short form, without
	// KeepLater.
	Snapshot(ctx context.Context, p SnapshotParams) (SnapshotInfo, error)
	CloseSnapshot(ctx context.Context, scopeID string) (SnapshotInfo, error)
	RestoreWith(ctx context.Context, p RestoreParams) (RestoreResult, error)
	ListSnapshots(ctx context.Context) (ListSnapshotsResult, error)
	DropSnapshot(ctx context.Context, scopeID string) (DropSnapshotResult, error)

	// Turns, rollback and redo (turns.go).
	Turn(ctx context.Context, p TurnParams) (TurnInfo, error)
	Checkpoints(ctx context.Context) (CheckpointsResult, error)
	Rollback(ctx context.Context, p RollbackParams) (RollbackResult, error)
	Redo(ctx context.Context, p RedoParams) (RollbackResult, error)
	MarkUser(ctx context.Context, p MarkUserParams) (MarkUserResult, error)
}

// Validator is implemented by params types that check themselves after
// decoding. Typed calls Validate and sends any error as -32602 (an *Error
// is sent as it is).
type Validator interface {
	Validate() error
}

// InitializeParams is the (empty) params object of session/initialize.
type InitializeParams struct{}

// InitializeResult describes the session.
type InitializeResult struct {
	Version   string `json:"version"`
	SessionID string `json:"sessionId"`
	Mode      string `json:"mode"`
	Workspace string `json:"workspace"`
	Mount     string `json:"mount"`
	// HookSocket is the hook channel's name (control/hooks.go), for the
	// agent integrations to hand to their hooks.
	HookSocket   string          `json:"hookSocket,omitempty"`
	Capabilities map[string]bool `json:"capabilities"`
	Policy       Policy          `json:"policy"`
	// Sandbox is what the commands that stagefs run, the agent commands
	// and stagefs acp start may write outside the workspace.
	Sandbox Sandbox `json:"sandbox"`
	// Branch names the branch this socket serves ("" for the main view);
	// Branches lists the mount's branches.
	Branch   string       `json:"branch,omitempty"`
	Branches []BranchInfo `json:"branches,omitempty"`
}

// Sandbox is a mount's choice for the sandboxes of its runs: `stagefs
// mount --outside` and `--allow`.
type Sandbox struct {
	// Outside is "ro" (the default: outside the workspace everything is
	// read-only, but for a scratch layer over $HOME, a private /tmp and
	// /var/tmp, /dev and Allow) or "rw" (writable as for the caller).
	Outside string `json:"outside"`
	// Allow lists the paths a command may write for real.
	Allow []string `json:"allow"`
	// Scratch says what the mount's scratch layer holds. Only
	// fs/staged_status of every path reports it: it walks the layer.
	Scratch *ScratchUsage `json:"scratch,omitempty"`
}

// ScratchUsage is the size of a mount's scratch layer (`stagefs scratch`
// lists it).
type ScratchUsage struct {
	Dir     string `json:"dir"`     // in the state dir
	Bytes   int64  `json:"bytes"`   // of the files it holds
	Entries int    `json:"entries"` // the paths it adds, changes or deletes
	InUse   bool   `json:"inUse"`   // a run has it mounted now
}

// Policy is what the mount refuses to every process in it: --deny globs
// are read-only, --hide globs invisible.
type Policy struct {
	Deny []string `json:"deny"`
	Hide []string `json:"hide"`
}

// SetModeParams selects the write mode.
type SetModeParams struct {
	Mode string `json:"mode"`
}

// Validate accepts only the two known modes.
func (p SetModeParams) Validate() error {
	if p.Mode != ModeStaged && p.Mode != ModeImmediate {
		return invalidParams("mode", "mode must be %q or %q, got %q", ModeStaged, ModeImmediate, p.Mode)
	}
	return nil
}

// SetModeResult reports the mode before and after the call.
type SetModeResult struct {
	Previous string `json:"previous"`
	Mode     string `json:"mode"`
}

// PathsParams restricts a call to some paths; no paths means all of them.
type PathsParams struct {
	Paths []string `json:"paths,omitempty"`
}

// Validate refuses empty path strings, which would otherwise be read as
// "the workspace root" by some backends and "nothing" by others.
func (p PathsParams) Validate() error {
	return validatePaths(p.Paths)
}

// StatusResult is the pending set.
type StatusResult struct {
	Entries            []StatusEntry `json:"entries"`
	PendingCount       int           `json:"pendingCount"`
	TotalBytes         int64         `json:"totalBytes"`
	OldestPendingAgeMs int64         `json:"oldestPendingAgeMs"`
	Mode               string        `json:"mode"`
	Policy             Policy        `json:"policy"`
	// Sandbox is the mount's sandbox settings and, for a status of every
	// path, its scratch layer; absent for a status of some paths.
	Sandbox *Sandbox `json:"sandbox,omitempty"`
}

// StatusEntry is one pending change.
type StatusEntry struct {
	Path  string `json:"path"`
	Kind  string `json:"kind"`
	From  string `json:"from,omitempty"` // rename source
	Bytes int64  `json:"bytes"`
	AgeMs int64  `json:"ageMs"`
	PID   int    `json:"pid"`
	Comm  string `json:"comm"`
}

// CommitParams selects what to commit. Force commits even where the base
// changed underneath the pending change.
type CommitParams struct {
	Paths []string `json:"paths,omitempty"`
	Force bool     `json:"force,omitempty"`
}

// Validate refuses empty path strings.
func (p CommitParams) Validate() error {
	return validatePaths(p.Paths)
}

// CommitResult splits the selected paths by outcome.
type CommitResult struct {
	Committed []string   `json:"committed"`
	Conflicts []Conflict `json:"conflicts"`
	Failed    []Failure  `json:"failed"`
}

// Conflict is a path that was not committed because its base changed.
type Conflict struct {
	Path     string `json:"path"`
	Reason   string `json:"reason"`
	Expected string `json:"expected,omitempty"`
	Actual   string `json:"actual,omitempty"`
	// For a file: the content hashes ("sha256:…") of the workspace's copy
	// now and of the staged one.
	WorkspaceHash string `json:"workspaceHash,omitempty"`
	StagedHash    string `json:"stagedHash,omitempty"`
}

// Failure is a path whose commit failed for another reason.
type Failure struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// DiscardResult lists the paths whose pending changes were dropped.
type DiscardResult struct {
	Discarded []string `json:"discarded"`
}

// DiffResult is a unified diff of pending changes against the base.
type DiffResult struct {
	Diff  string `json:"diff"`
	Files int    `json:"files"`
}

// PathParams names one path.
type PathParams struct {
	Path string `json:"path"`
}

// Validate requires the path.
func (p PathParams) Validate() error {
	if p.Path == "" {
		return invalidParams("path", "path is required")
	}
	return nil
}

// ReadTextResult is a file as the mount sees it (pending changes included).
type ReadTextResult struct {
	Path    string `json:"path"`
	Content string `json:"content"`
	SHA256  string `json:"sha256"`
	Size    int64  `json:"size"`
	Exists  bool   `json:"exists"`
}

// SafeTextPatchParams changes a text file only if it still has the content
// the caller saw. ExpectedHash is the sha256 (lowercase hex) of that
// content, or "" when the caller expects the file not to exist. Exactly one
// of Content (the whole new text) and Edits must be given.
type SafeTextPatchParams struct {
	Path         string     `json:"path"`
	ExpectedHash string     `json:"expectedHash"`
	Content      *string    `json:"content,omitempty"`
	Edits        []TextEdit `json:"edits,omitempty"`
}

// Validate checks the shape of the request; whether each edit's old text
// occurs exactly once is for the backend, which has the file.
func (p SafeTextPatchParams) Validate() error {
	if p.Path == "" {
		return invalidParams("path", "path is required")
	}
	if p.ExpectedHash != "" && !isSHA256Hex(p.ExpectedHash) {
		return invalidParams("expectedHash", "expectedHash must be 64 lowercase hex digits or empty")
	}
	switch {
	case p.Content != nil && p.Edits != nil:
		return invalidParams("content", "give either content or edits, not both")
	case p.Content == nil && p.Edits == nil:
		return invalidParams("content", "one of content or edits is required")
	case p.Edits != nil && len(p.Edits) == 0:
		return invalidParams("edits", "edits must not be empty")
	}
	for i, e := range p.Edits {
		if e.OldText == "" {
			// An empty oldText occurs everywhere, so it can never be unique.
			return invalidParams(fmt.Sprintf("edits[%d].oldText", i), "edits[%d].oldText must not be empty", i)
		}
	}
	return nil
}

// TextEdit replaces the single occurrence of OldText with NewText.
type TextEdit struct {
	OldText string `json:"oldText"`
	NewText string `json:"newText"`
}

// SafeTextPatchResult reports what happened and the file's new hash and size.
type SafeTextPatchResult struct {
	Result string `json:"result"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// LogParams selects journal records: those after Since, touching Paths (all
// paths if empty), at most Limit of them (0: all of them).
//
// Limit pages forward: the first Limit records after Since, oldest first;
// the next page starts after the last one's seq. Tail instead gives the
// newest Tail records after Since. At most one of them is set.
type LogParams struct {
	Since uint64   `json:"since,omitempty"`
	Paths []string `json:"paths,omitempty"`
	Limit int      `json:"limit,omitempty"`
	Tail  int      `json:"tail,omitempty"`
}

// Validate refuses a negative limit or tail, both at once, and empty
// paths.
func (p LogParams) Validate() error {
	if p.Limit < 0 {
		return invalidParams("limit", "limit must not be negative")
	}
	if p.Tail < 0 {
		return invalidParams("tail", "tail must not be negative")
	}
	if p.Limit > 0 && p.Tail > 0 {
		return invalidParams("tail", "give limit (page forward) or tail (the newest records), not both")
	}
	return validatePaths(p.Paths)
}

// LogResult is a page of journal records.
type LogResult struct {
	Records []LogEntry `json:"records"`
}

// LogEntry is one journal record.
type LogEntry struct {
	Seq    uint64 `json:"seq"`
	Time   string `json:"time"` // RFC 3339 with nanoseconds
	Op     string `json:"op"`
	Path   string `json:"path,omitempty"`
	Path2  string `json:"path2,omitempty"`
	PID    int    `json:"pid,omitempty"`
	Comm   string `json:"comm,omitempty"`
	Size   int64  `json:"size,omitempty"`
	Mode   string `json:"mode,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// SubscribeParams is the (empty) params object of events/subscribe.
type SubscribeParams struct{}

// SubscribeResult answers events/subscribe.
type SubscribeResult struct {
	Subscribed bool `json:"subscribed"`
}

// Event is the params of a session/update notification. Seq and Time are
// set by Server.Publish.
type Event struct {
	Kind          string   `json:"kind"`
	Seq           uint64   `json:"seq"`
	Time          string   `json:"time"`
	PendingCount  int      `json:"pendingCount,omitempty"`
	TotalBytes    int64    `json:"totalBytes,omitempty"`
	Paths         []string `json:"paths,omitempty"`
	ToolCallID    string   `json:"toolCallId,omitempty"`
	RestoredPaths []string `json:"restoredPaths,omitempty"`
	Missed        int      `json:"missed,omitempty"`
	Detail        string   `json:"detail,omitempty"`
	// Status and Meta follow the ACP tool_call_update shape for a
	// restored tool call: status "restored", _meta.stagefs.kind
	// "tool_call_restored" with the restored paths.
	Status string         `json:"status,omitempty"`
	Meta   map[string]any `json:"_meta,omitempty"`
	// Progress of a long commit, discard or restore (kind "progress";
	// Detail names the operation, Final marks its end).
	Done  int   `json:"done,omitempty"`
	Total int   `json:"total,omitempty"`
	Bytes int64 `json:"bytes,omitempty"`
	Final bool  `json:"final,omitempty"`
}

// EventProgress reports how far a long commit, discard or restore has come.
const EventProgress = "progress"

// invalidParams builds a -32602 error naming the offending field in data.
func invalidParams(field, format string, args ...any) *Error {
	return Errorf(CodeInvalidParams, "invalid params: "+format, args...).With("field", field)
}

func validatePaths(paths []string) error {
	for i, p := range paths {
		if p == "" {
			return invalidParams(fmt.Sprintf("paths[%d]", i), "paths[%d] is empty", i)
		}
	}
	return nil
}

// isSHA256Hex accepts a hash as the protocol spells it ("sha256:" and
// lowercase hex) or the bare lowercase hex.
func isSHA256Hex(s string) bool {
	_, err := contenthash.ParseHex(strings.TrimPrefix(s, contenthash.Prefix))
	return err == nil
}
