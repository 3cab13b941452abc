package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"stagefs/control"
	"stagefs/fusefs"
	"stagefs/journal"
	"stagefs/overlay"
	"stagefs/sandbox"
	"stagefs/snapshot"
)

// Config is what a Backend reports of its mount and checks clients' paths
// against; it does not change while the daemon runs.
type Config struct {
	Version   string // the daemon's, for session/initialize
	Workspace string // real and absolute
	Mount     string // the mount point, real and absolute
	StateDir  string
	Journal   *journal.Journal // read for session/log
	Deny      []string         // the mount's --deny globs
	Hide      []string         // the mount's --hide globs
	// Sandbox is what the mount's runs may write outside the workspace.
	Sandbox sandbox.Settings
	// Branch names the branch this backend serves ("" for the main
	// view): a branch commits only by a merge into its parent, and is
	// always staged.
	Branch string
	// Branches lists the mount's branches, for session/initialize (nil:
	// none).
	Branches func() []control.BranchInfo
}

// Backend answers the control socket's methods with the engine.
type Backend struct {
	cfg       Config
	sessionID string

	// Set by Start, before the control socket serves; read by its
	// handlers and by publishLoop, which Start begins.
	eng   *overlay.Engine
	snaps *snapshot.Store

	// Also set by Start, but read by the engine's callbacks too, which run
	// on the mount's goroutines as soon as it is up, before Start.
	fs  atomic.Pointer[fusefs.FS]
	ctl atomic.Pointer[control.Server]

	// dirty: the pending set changed since the last staged_writes_pending
	// event; wake tells publishLoop so. dirtyMu is a leaf, taken under
	// Engine.mu (PendingChanged is the engine's OnChange).
	dirtyMu sync.Mutex
	dirty   bool
	wake    chan struct{}
}

var _ control.Backend = (*Backend)(nil)

// New returns a Backend for the mount cfg describes. It is made before the
// engine, whose callbacks are its methods, and answers nothing until
// Start.
func New(cfg Config) *Backend {
	return &Backend{cfg: cfg, sessionID: newSessionID(), wake: make(chan struct{}, 1)}
}

// Start gives the backend the engine and snapshot store it answers with,
// the mount whose kernel caches it invalidates and the control server it
// publishes events through, and begins pacing staged_writes_pending
// events. Call it once the mount is up and before ctl serves.
func (b *Backend) Start(eng *overlay.Engine, snaps *snapshot.Store, fs *fusefs.FS, ctl *control.Server) {
	b.eng, b.snaps = eng, snaps
	b.fs.Store(fs)
	b.ctl.Store(ctl)
	go b.publishLoop()
}

func newSessionID() string {
	var b [8]byte
	f, err := os.Open("/dev/urandom")
	if err == nil {
		f.Read(b[:])
		f.Close()
	}
	return fmt.Sprintf("sess_%x", b)
}

// invalidate drops what the kernel caches for paths (all of them when
// paths is nil), so every process sees the change at once.
func (b *Backend) invalidate(paths []string) {
	if fs := b.fs.Load(); fs != nil {
		fs.Invalidate(paths)
	}
}

// ctlCaller returns the engine Caller for an operation a control socket
// client asked for: the client's pid (from SO_PEERCRED, which the server
// puts in the request's context), so the journal records who committed,
// discarded, switched the mode or patched, with the command name the
// engine looks up in /proc. Uid and Gid stay 0 on purpose: the engine
// would chown a file a patch creates to them, and a patch's file has
// always been owned by the daemon. Without a peer (a call from inside the
// daemon) the Caller is the zero one, as before.
func ctlCaller(ctx context.Context) overlay.Caller {
	peer, ok := control.PeerFrom(ctx)
	if !ok {
		return overlay.Caller{}
	}
	return overlay.Caller{Pid: peer.Pid}
}

// hostEdit is the Caller of the host's own edits (fs/safe_text_patch): the
// client's, marked as the agent's work, so that turns and unbound
// snapshots capture them and they clear redo.
func hostEdit(ctx context.Context) overlay.Caller {
	c := ctlCaller(ctx)
	c.Host = true
	return c
}

func (b *Backend) Initialize(ctx context.Context) (control.InitializeResult, error) {
	return control.InitializeResult{
		Version:    b.cfg.Version,
		SessionID:  b.sessionID,
		Mode:       string(b.eng.Mode()),
		Workspace:  b.cfg.Workspace,
		Mount:      b.cfg.Mount,
		HookSocket: control.HookSocketName(b.cfg.StateDir),
		Policy:     b.policy(),
		Sandbox:    b.sandboxSettings(),
		Branch:     b.cfg.Branch,
		Branches:   b.branches(),
		Capabilities: map[string]bool{
			"staged": true, "immediate": true, "commitPaths": true, "discardPaths": true,
			"diff": true, "readText": true, "safeTextPatch": true, "log": true, "events": true,
			"snapshots": true, "restoreToolCall": true, "turns": true, "rollback": true, "redo": true,
		},
	}, nil
}

func (b *Backend) branches() []control.BranchInfo {
	if b.cfg.Branches == nil {
		return nil
	}
	return b.cfg.Branches()
}

func (b *Backend) policy() control.Policy {
	return control.Policy{Deny: nonNil(b.cfg.Deny), Hide: nonNil(b.cfg.Hide)}
}

// sandboxSettings is what the mount lets its runs write outside the
// workspace (recorded for them in the state dir: sandbox.SaveSettings).
func (b *Backend) sandboxSettings() control.Sandbox {
	return control.Sandbox{Outside: b.cfg.Sandbox.Outside, Allow: nonNil(b.cfg.Sandbox.Allow)}
}

// sandboxStatus is sandboxSettings with the size of the scratch layer,
// which costs a walk of the layer (a status of every path only).
func (b *Backend) sandboxStatus() *control.Sandbox {
	s := b.sandboxSettings()
	if sc, err := sandbox.ListScratch(b.cfg.StateDir); err == nil {
		n := 0
		for _, a := range sc.Areas {
			n += len(a.Entries)
		}
		s.Scratch = &control.ScratchUsage{Dir: sc.Dir, Bytes: sc.Bytes, Entries: n, InUse: sc.InUse}
	}
	return &s
}

func (b *Backend) SetMode(ctx context.Context, mode string) (control.SetModeResult, error) {
	m, err := overlay.ParseMode(mode)
	if err != nil {
		return control.SetModeResult{}, control.Errorf(control.CodeInvalidParams, "%v", err)
	}
	if b.cfg.Branch != "" && m != overlay.Staged {
		return control.SetModeResult{}, control.Errorf(control.CodeInvalidState, "branch %s is always staged: its changes reach the workspace only through its parent (stagefs merge %s)", b.cfg.Branch, b.cfg.Branch)
	}
	prev, err := b.eng.SetMode(m, ctlCaller(ctx))
	if err != nil {
		var se *overlay.StateError
		if errors.As(err, &se) {
			return control.SetModeResult{}, control.Errorf(control.CodeInvalidState, "%s", se.Msg)
		}
		return control.SetModeResult{}, err
	}
	b.invalidate(nil)
	return control.SetModeResult{Previous: string(prev), Mode: string(m)}, nil
}

// nonNil gives a nil list as an empty one, which JSON shows as [], not
// null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
